"""The compile environment's fingerprint: what goes into torch.compile's cache keys, and which
caches a difference invalidates (reference: torch/_inductor/codecache.py FxGraphHashDetails;
../shared/reference/compile_layer.md sections 3.2-3.3, verified on torch 2.13).

`collect(torch)` runs inside a job that compiled (the probe, at exit) or in `torchdoctor cache load`;
`diff` and `explain` need no torch. A fingerprint is a flat {field: value} of strings.

Fields and the caches they key (CACHES names them):
- torch, torch_sources: the version and Inductor's hash of every torch source file (torch_key):
  every cache. python: Dynamo's bytecode and every pickled entry.
- device, cuda, hip, triton: the FX graph cache's system_info, the kernels and autotuning.
- threads: `torch.get_num_threads()`, part of the FX key for CPU graphs (cpp_runtime_thread_count)
  unless cpp.dynamic_threads; Dynamo also guards on it (a recompile).
- cpu_isa: the vector ISA the C++ kernels were built for. Not in any key: a kernel built for
  AVX-512 loads on an AVX2 machine and fails there, so a pack refuses a different ISA.
- inductor.*, functorch.*, compiler.*: config values in the keys (the ones a user sets).
- env.*: the environment variables that change them (TORCHINDUCTOR_*, TORCH_COMPILE_*).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import sys
from typing import Any

ALL = ("fx_graph", "aot_autograd", "kernels", "autotune", "dynamo")
CACHES: dict[str, tuple[str, ...]] = {
    "torch": ALL, "torch_sources": ALL, "python": ALL,
    "device": ("fx_graph", "aot_autograd", "kernels", "autotune"),
    "cuda": ("fx_graph", "aot_autograd", "kernels", "autotune"),
    "hip": ("fx_graph", "aot_autograd", "kernels", "autotune"),
    "triton": ("fx_graph", "aot_autograd", "kernels", "autotune"),
    "threads": ("fx_graph", "aot_autograd", "dynamo"),
    "cpu_isa": ("kernels",),
}
# Prefixes: every field under them keys the FX graph cache (and AOTAutograd's, which wraps it).
PREFIXED = {"inductor.": ("fx_graph", "aot_autograd"), "functorch.": ("aot_autograd",),
            "compiler.": ALL, "env.": ("fx_graph", "aot_autograd")}
# A pack made where these differ cannot be used here at all (its kernels or entries would not load,
# or load wrong): `cache load` refuses it. Other differences only cost misses.
INCOMPATIBLE = ("torch", "torch_sources", "python", "device", "cuda", "hip", "triton", "cpu_isa")
# Config values in the keys that users set (torch._inductor.config and friends).
INDUCTOR_KEYS = ("fx_graph_cache", "fx_graph_remote_cache", "autotune_local_cache", "autotune_remote_cache",
                 "bundle_triton_into_fx_graph_cache", "max_autotune", "max_autotune_gemm",
                 "coordinate_descent_tuning", "freezing", "cpp.threads", "cpp.dynamic_threads", "cpp.simdlen",
                 "triton.cudagraphs", "size_asserts")
ENV_PREFIXES = ("TORCHINDUCTOR_", "TORCH_COMPILE_", "INDUCTOR_")
# Where the caches are, not what they hold: left out of the comparison.
WHERE = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def invalidates(field: str) -> tuple[str, ...]:
    """The caches a difference in `field` invalidates."""
    if field in CACHES:
        return CACHES[field]
    return next((caches for prefix, caches in PREFIXED.items() if field.startswith(prefix)), ())


def diff(a: dict[str, str], b: dict[str, str]) -> list[tuple[str, str | None, str | None]]:
    """(field, value in a, value in b) for every field that differs, in field order."""
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def incompatible(pack: dict[str, str], here: dict[str, str]) -> list[tuple[str, str | None, str | None]]:
    """The differences that make a pack from `pack` unusable `here` (INCOMPATIBLE fields)."""
    return [d for d in diff(pack, here) if d[0] in INCOMPATIBLE]


def explain(d: tuple[str, str | None, str | None]) -> str:
    field, a, b = d
    caches = invalidates(field)
    return f"{field}: {a if a is not None else '(unset)'} -> {b if b is not None else '(unset)'}" + (
        f" (invalidates {', '.join(caches)})" if caches else " (not in any cache key)")


def collect(torch: Any) -> dict[str, str]:
    """This process's fingerprint. Private torch APIs are feature-detected: a field that cannot be
    read is left out (never guessed)."""
    out: dict[str, str] = {"torch": str(torch.__version__), "python": platform.python_version(),
                           "threads": str(torch.get_num_threads())}
    codecache = sys.modules.get("torch._inductor.codecache")
    key = getattr(codecache, "torch_key", None)
    if key is not None:  # only when Inductor ran: hashing torch's sources takes a second otherwise
        _try(out, "torch_sources", lambda: key().hex()[:16])
    _try(out, "cpu_isa", lambda: str(torch.backends.cpu.get_cpu_capability()))
    for name, value in (("cuda", torch.version.cuda), ("hip", getattr(torch.version, "hip", None))):
        if value:
            out[name] = str(value)
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and _safe(lambda: cuda.is_initialized()):
        _try(out, "device", lambda: f"{cuda.get_device_name()} (sm {'.'.join(map(str, cuda.get_device_capability()))})")
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        out["triton"] = importlib.metadata.version("triton")
    config = sys.modules.get("torch._inductor.config")
    for name in INDUCTOR_KEYS if config is not None else ():
        _try(out, f"inductor.{name}", lambda n=name: repr(_attr(config, n)))
    functorch = sys.modules.get("torch._functorch.config")
    if functorch is not None:
        _try(out, "functorch.enable_autograd_cache", lambda: repr(functorch.enable_autograd_cache))
    compiler = getattr(getattr(torch, "compiler", None), "config", None)
    for name in ("cache_key_tag", "force_disable_caches"):
        if compiler is not None and hasattr(compiler, name):
            out[f"compiler.{name}"] = repr(getattr(compiler, name))
    for k, v in os.environ.items():
        if k.startswith(ENV_PREFIXES) and k not in WHERE:
            out[f"env.{k}"] = v
    return out


def cache_dir(torch: Any) -> str | None:
    """Inductor's cache directory for this process (where its entries and kernels are written)."""
    utils = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    fn = getattr(utils, "cache_dir", None)
    if fn is not None:
        return _safe(fn)
    return os.environ.get("TORCHINDUCTOR_CACHE_DIR")


def _attr(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _safe(fn: Any) -> Any:
    try:
        return fn()
    except Exception:
        return None


def _try(out: dict[str, str], field: str, fn: Any) -> None:
    value = _safe(fn)
    if value is not None:
        out[field] = str(value)
