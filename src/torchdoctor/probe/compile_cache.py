"""The job's compile caches, live (compile/fingerprint.py, compile/cachepack.py).

- `load(torch)`: with ``TORCHDOCTOR_CACHE_PACK`` set (`torchdoctor run --cache FILE`), loads the pack
  the moment torch is imported, before the job compiles anything; a pack made for another
  environment is refused with one line and the job compiles cold.
- `save(...)`: at exit of a job that compiled, writes ``caches/rank{R}.json`` under the run
  directory (fingerprint, cache directory and its size, hits and misses per cache, compile
  seconds) and, on rank 0, the Mega-Cache artefacts ``caches/rank0.megacache.bin`` that
  `torchdoctor cache pack` puts in a pack. After the job's last step: nothing here runs while it trains.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from torchdoctor.compile import cachepack, fingerprint
from torchdoctor.probe.errors import ERRORS

ENV_PACK = "TORCHDOCTOR_CACHE_PACK"
# What load() did in this process (the facts' compile.cache_pack): "loaded FILE ..." or "refused: ...".
LOADED: dict[str, Any] = {}
# Files walked at most when sizing the cache directory at exit.
MAX_WALK = 50_000
# torch._dynamo.utils.counters keys per cache (reference section 3.1).
COUNTERS = {"fx_graph": ("inductor", "fxgraph_cache_"), "aot_autograd": ("aot_autograd", "autograd_cache_")}


def launcher() -> bool:
    """This process is torchrun's launcher (it imports torch, never compiles): nothing to load."""
    argv0 = sys.argv[0] if sys.argv else ""
    return os.path.basename(argv0) == "torchrun" or argv0.endswith(os.path.join("torch", "distributed", "run.py"))


def load(torch: Any) -> None:
    path = os.environ.get(ENV_PACK)
    if not path or LOADED or launcher():
        return
    loader = getattr(getattr(torch, "compiler", None), "load_cache_artifacts", None)
    if loader is None:
        LOADED["refused"] = f"{path}: this torch has no torch.compiler.load_cache_artifacts (2.7+)"
    else:
        try:
            import torch._inductor.runtime.cache_dir_utils  # noqa: F401  (where Inductor keeps its caches)

            where = fingerprint.cache_dir(torch)
            if not where:
                raise cachepack.PackError(f"{path}: Inductor's cache directory is unknown on this torch")
            LOADED.update(cachepack.load_into(path, fingerprint.collect(torch), where, loader))
        except cachepack.PackError as exc:
            LOADED["refused"] = str(exc)
        except Exception as exc:
            ERRORS.record("cache.load", exc)
            LOADED["refused"] = f"{path}: {type(exc).__name__}: {exc}"
    if "refused" in LOADED and os.environ.get("RANK", "0") == "0":
        print(f"torchdoctor: cache pack not loaded: {LOADED['refused']} (the job compiles cold)", file=sys.stderr)


def counters() -> dict[str, int]:
    """{"fx_graph.hit": n, "aot_autograd.miss": n, ...} of this process; empty without Dynamo."""
    utils = sys.modules.get("torch._dynamo.utils")
    table = getattr(utils, "counters", None)
    out: dict[str, int] = {}
    if table is None:
        return out
    for cache, (group, prefix) in COUNTERS.items():
        for key, n in dict(table.get(group, {})).items():
            if str(key).startswith(prefix) and n:
                out[f"{cache}.{str(key)[len(prefix):]}"] = int(n)
    return out


def where() -> str | None:
    """Inductor's cache directory, once Inductor is loaded (None before: nothing to say)."""
    if "torch._inductor.runtime.cache_dir_utils" not in sys.modules:
        return None
    return fingerprint.cache_dir(None)


def is_default_dir() -> bool | None:
    """Whether the cache directory is Inductor's default (under the temporary directory)."""
    utils = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    default = getattr(utils, "default_cache_dir", None)
    here = where()
    if default is None or here is None:
        return None
    return os.path.realpath(here) == os.path.realpath(default())


def summary() -> str | None:
    """One line for the facts: the pack this process loaded, or why it was refused."""
    if not LOADED:
        return None
    if "refused" in LOADED:
        return f"refused: {LOADED['refused']}"
    return f"loaded {LOADED['file']} ({LOADED['kernels']} kernel files)"


def dir_size(path: str) -> tuple[int, int]:
    """(bytes, files) under `path`, walking at most MAX_WALK files."""
    total = files = 0
    for root, _, names in os.walk(path):
        for name in names:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                continue
            files += 1
            if files >= MAX_WALK:
                return total, files
    return total, files


def save(torch: Any, run_dir: str, rank: int, compile_s: float | None) -> None:
    """Write this rank's compile-cache record (and rank 0's artefacts); never raises."""
    try:
        folder = os.path.join(run_dir, cachepack.RUN_CACHES)
        os.makedirs(folder, exist_ok=True)
        where = fingerprint.cache_dir(torch)
        size = dir_size(where) if where and os.path.isdir(where) else (0, 0)
        record: dict[str, Any] = {"fingerprint": fingerprint.collect(torch), "cache_dir": where,
                                  "cache_bytes": size[0], "cache_files": size[1], "counters": counters(),
                                  "compile_time_s": compile_s, "pack": dict(LOADED) or None}
        saver = getattr(getattr(torch, "compiler", None), "save_cache_artifacts", None)
        if rank == 0 and saver is not None:
            got = saver()
            if got is not None:
                blob, info = got
                record["artifacts"] = {k: len(v) for k, v in dict(getattr(info, "artifacts", {}) or {}).items()}
                name = f"rank{rank}.megacache.bin"
                _atomic(os.path.join(folder, name), blob)
                record["megacache"] = name
        _atomic(os.path.join(folder, f"rank{rank}.json"), json.dumps(record, indent=1, default=str).encode())
    except Exception as exc:
        ERRORS.record("cache.save", exc)


def _atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
