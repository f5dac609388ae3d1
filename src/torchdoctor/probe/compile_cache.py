"""The job's compile caches, live (compile/fingerprint.py, compile/cachepack.py).

- `load(torch)`: with ``TORCHDOCTOR_CACHE_PACK`` set (`torchdoctor run --cache FILE`), loads the pack
  the moment the job imports Dynamo, before it compiles anything (DataLoader workers, which never
  import Dynamo, load nothing); a pack made for another environment is refused with one line and
  the job compiles cold.
- `save(...)`: at exit of a job that compiled, writes ``caches/rank{R}.json`` under the run
  directory (fingerprint, cache directory and its size, hits and misses per cache, compile
  seconds) and, on rank 0, the Mega-Cache artefacts ``caches/rank0.megacache.bin`` that
  `torchdoctor cache pack` puts in a pack. After the job's last step: nothing here runs while it trains.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from typing import Any

from torchdoctor.compile import cachepack, fingerprint
from torchdoctor.probe.errors import ERRORS

ENV_PACK = "TORCHDOCTOR_CACHE_PACK"
# What load() did in this process (the facts' compile.cache_pack): "loaded FILE ..." or "refused: ...".
LOADED: dict[str, Any] = {}
# Mega-Cache artefacts above this size are not written into the run directory (said in the record).
MAX_MEGACACHE_BYTES = 512 << 20
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
    cold = LOADED.get("cold_compile_s")
    return f"loaded {LOADED['file']} ({LOADED['kernels']} kernel files)" + (
        f"; the run that made it compiled for {cold:.1f} s" if isinstance(cold, (int, float)) else "")


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
                                  "compile_time_s": compile_s, "pack": dict(LOADED) or None, "graphs": list(GRAPHS)}
        saver = getattr(getattr(torch, "compiler", None), "save_cache_artifacts", None)
        if rank == 0 and saver is not None:
            got = saver()
            if got is not None:
                blob, info = got
                record["artifacts"] = {k: len(v) for k, v in dict(getattr(info, "artifacts", {}) or {}).items()}
                if len(blob) > MAX_MEGACACHE_BYTES:
                    record["megacache_skipped"] = f"{len(blob) / 1e6:.0f} MB, above {MAX_MEGACACHE_BYTES >> 20} MiB"
                else:
                    name = f"rank{rank}.megacache.bin"
                    _atomic(os.path.join(folder, name), blob)
                    record["megacache"] = name
        if rank == 0:
            record["output_code"] = save_output_code(folder)
        _atomic(os.path.join(folder, f"rank{rank}.json"), json.dumps(record, indent=1, default=str).encode())
    except Exception as exc:
        ERRORS.record("cache.save", exc)


def _atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
# Inductor's output code modules this process loaded (compiled or from the cache), at most MAX_CODE.
OUTPUT_CODE: list[str] = []
MAX_CODE = 64
MAX_CODE_BYTES = 2 << 20


def watch_output_code(codecache: Any, failed: Any) -> None:
    """Remember the path of every module Inductor loads (PyCodeCache.load_by_key_path, a classmethod,
    feature-detected): the output code of each compiled graph is among them (save() keeps those)."""
    import functools
    import inspect

    cls = getattr(codecache, "PyCodeCache", None)
    static = inspect.getattr_static(cls, "load_by_key_path", None) if cls is not None else None
    func = getattr(static, "__func__", None)
    if func is None or getattr(func, "_torchdoctor_code", False):
        return

    @functools.wraps(func)
    def load_by_key_path(owner: Any, key: Any, path: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            if len(OUTPUT_CODE) < MAX_CODE and isinstance(path, str) and path not in OUTPUT_CODE:
                OUTPUT_CODE.append(path)
        except Exception as exc:
            failed(exc)
        return func(owner, key, path, *args, **kwargs)

    load_by_key_path._torchdoctor_code = True  # type: ignore[attr-defined]
    cls.load_by_key_path = classmethod(load_by_key_path)


def save_output_code(folder: str) -> list[str]:
    """Copy the output-code modules (those with a ``call``: the graphs' wrappers, not kernel modules)
    into ``folder/output_code``; their names."""
    out = []
    target = os.path.join(folder, "output_code")
    for path in OUTPUT_CODE:
        try:
            if os.path.getsize(path) > MAX_CODE_BYTES:
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        if "def call(" not in text:
            continue
        os.makedirs(target, exist_ok=True)
        name = os.path.basename(path)
        _atomic(os.path.join(target, name), text.encode())
        out.append(name)
    return out


# --- captured graphs, device-agnostic -----------------------------------------------------------------

# Each graph Dynamo hands to the backend, in capture order: {"hash", "ops", "nodes"} (GRAPH_NODES
# node lines kept for `cache diff`), at most MAX_GRAPHS.
GRAPHS: list[dict[str, Any]] = []
MAX_GRAPHS = 64
GRAPH_NODES = 400


def _value(v: Any) -> str:
    """A node's example value without its device: dtype and shape for tensors."""
    shape, dtype = getattr(v, "shape", None), getattr(v, "dtype", None)
    if shape is not None and dtype is not None:
        return f"{str(dtype).removeprefix('torch.')}[{','.join(str(s) for s in shape)}]"
    if isinstance(v, (tuple, list)):
        return "(" + ",".join(_value(x) for x in v[:8]) + ")"
    return type(v).__name__ if v is not None else "-"


def _target(gm: Any, node: Any) -> str:
    t = node.target
    if node.op == "call_module":
        return "module " + type(gm.get_submodule(t)).__name__
    if node.op == "call_method":
        return f"method {t}"
    name = getattr(t, "__name__", None) or str(t)
    return f"{getattr(t, '__module__', None) or ''}.{name}".lstrip(".")


def user_line(stack_trace: str | None) -> str | None:
    """The innermost frame of a node's stack trace outside torch itself, as "file:line" (the stack
    traces Dynamo records are of the traced code: the probe's own frames are never in them)."""
    if not stack_trace:
        return None
    found = None
    for m in _FRAME.finditer(stack_trace):
        path = m.group(1)
        if f"{os.sep}torch{os.sep}" not in path:
            found = f"{path}:{m.group(2)}"
    return found


def graph_signature(gm: Any) -> dict[str, Any]:
    """A captured FX graph as device-agnostic lines (inputs, then each op with its output's dtype and
    shape; devices, file paths and node names left out) and their hash: equal graphs hash equal on
    any machine (reference section 4: graph identity apart from environment identity)."""
    lines, where, ops = [], {}, {}
    for node in gm.graph.nodes:
        meta = node.meta.get("example_value", node.meta.get("val"))
        line = user_line(node.meta.get("stack_trace"))
        if line and len(where) < GRAPH_NODES:
            where[node.name] = line  # Inductor's output code names its source nodes by these names
            if (op := _op_name(node)) is not None:
                ops[node.name] = op  # what a C++ kernel's name is matched against (compile/fusion.py)
        if node.op == "placeholder":
            lines.append(f"input {_value(meta)}")
        elif node.op in ("call_function", "call_method", "call_module"):
            lines.append(f"{_target(gm, node)} -> {_value(meta)}")
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]
    return {"hash": digest, "ops": sum(not s.startswith("input ") for s in lines), "nodes": lines[:GRAPH_NODES],
            "lines": where, "node_ops": ops}


def _op_name(node: Any) -> str | None:
    """The op a captured node calls, short: ``layer_norm`` for torch.nn.functional.layer_norm, ``add``
    for operator.add, ``view`` for a method; None for inputs, outputs and module calls. Node names are
    the user's variable names (``x_1 = x + y``), so they cannot tell which op a node is."""
    if node.op == "call_method":
        return str(node.target)
    if node.op != "call_function":
        return None
    name = getattr(node.target, "__name__", None)
    return name if isinstance(name, str) else None


def watch_graphs(output_graph: Any, failed: Any) -> None:
    """Record every graph Dynamo hands its backend (OutputGraph.call_user_compiler, feature-detected):
    read only, the graph and the compile are unchanged. Not a probe shim: those stand aside while
    torch.compiler.is_compiling(), which is True here (Dynamo's own code, not the user's, is running)."""
    import functools

    cls = getattr(output_graph, "OutputGraph", None)
    fn = getattr(cls, "call_user_compiler", None)
    if fn is None or getattr(fn, "_torchdoctor_graphs", False):
        return

    @functools.wraps(fn)
    def call_user_compiler(self: Any, gm: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            if len(GRAPHS) < MAX_GRAPHS:
                GRAPHS.append(graph_signature(gm))
        except Exception as exc:
            failed(exc)
        return fn(self, gm, *args, **kwargs)

    call_user_compiler._torchdoctor_graphs = True  # type: ignore[attr-defined]
    cls.call_user_compiler = call_user_compiler
