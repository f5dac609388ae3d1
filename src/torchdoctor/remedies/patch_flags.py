"""Process-wide remedies: backend flags, debug switches, intra-op threads and CPU affinity.

Flags are set right after the job imports torch, before any of its own code runs; a job that sets
the flag itself later wins (its explicit choice). Nothing here initialises CUDA: a launcher that
forks its ranks after importing torch must still be able to.
"""

from __future__ import annotations

import os
from typing import Any

from . import runtime
from .runtime import Runtime

IDS = ("cudnn.benchmark", "precision.tf32", "debug.off", "threads.affinity", "memory.expandable_segments",
       "memory.host_allocator")
ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
# Environment switches that only debug: CUDA_LAUNCH_BLOCKING serialises every kernel launch;
# TORCH_DISTRIBUTED_DEBUG=DETAIL wraps process groups in checks (extra collectives per call).
DEBUG_ENV = {"CUDA_LAUNCH_BLOCKING": lambda v: v.strip() not in ("", "0"),
             "TORCH_DISTRIBUTED_DEBUG": lambda v: v.strip().upper() == "DETAIL"}


def debug_env_off(rt: Runtime) -> None:
    """The environment part of debug.off; runs at start-up, before torch reads these variables."""
    if rt.active("debug.off") is None:
        return
    for name, on in DEBUG_ENV.items():
        value = os.environ.get(name)
        if value is not None and on(value):
            del os.environ[name]  # inherited by the processes this one starts
            rt.did("debug.off", "environment", None, {name: None}, {name: value})
    rt.skip("debug.off", "no debug switch was on")


def alloc_env(rt: Runtime) -> None:
    """memory.expandable_segments: add expandable_segments:True to PYTORCH_CUDA_ALLOC_CONF at start-up
    (torch reads it when CUDA initialises; child processes inherit it). A job that already chose an
    expandable_segments setting keeps its choice."""
    if rt.active("memory.expandable_segments") is None:
        return
    conf = os.environ.get(ALLOC_CONF, "")
    if "expandable_segments" in conf:
        rt.skip("memory.expandable_segments", f"{ALLOC_CONF} already sets expandable_segments ({conf})")
        return
    if "cudaMallocAsync" in conf:  # the driver's allocator: segments are not the caching allocator's
        rt.refuse("memory.expandable_segments", f"{ALLOC_CONF} selects backend:cudaMallocAsync ({conf})")
        return
    new = f"{conf},expandable_segments:True" if conf.strip() else "expandable_segments:True"
    os.environ[ALLOC_CONF] = new
    rt.did("memory.expandable_segments", "environment", None, {ALLOC_CONF: new}, {ALLOC_CONF: conf or None})


def host_allocator(rt: Runtime) -> None:
    """memory.host_allocator: glibc malloc keeps freed memory (advice/host_allocator.py). At start-up:
    the variables for the processes this one starts (glibc reads them when a process starts), and
    mallopt for this process, whose malloc has already read its environment. A job that chose its
    thresholds or preloads another allocator keeps its choice; other C libraries are refused."""
    if rt.active("memory.host_allocator") is None:
        return
    from ..advice import host_allocator as ha

    chosen = [k for k in ha.ENV if k in os.environ]
    preload = os.environ.get("LD_PRELOAD", "")
    if chosen or any(a in preload for a in ha.OTHER_ALLOCATORS) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        rt.skip("memory.host_allocator", f"the job already sets its allocator ({', '.join(chosen) or preload or 'GLIBC_TUNABLES'})")
        return
    why_not = ha.keep_freed_memory()
    if why_not is not None:
        rt.refuse("memory.host_allocator", why_not)
        return
    os.environ.update(ha.ENV)
    rt.did("memory.host_allocator", "environment", None, dict(ha.ENV), dict.fromkeys(ha.ENV))


def _debug_torch(torch: Any, rt: Runtime) -> None:
    orig = torch.set_anomaly_enabled
    if torch.is_anomaly_enabled():
        orig(False)
        rt.did("debug.off", "torch.autograd", None, {"anomaly_detection": False}, {"anomaly_detection": True})

    def set_anomaly_enabled(enabled: bool, check_nan: bool = True) -> None:
        if enabled:
            rt.did("debug.off", "torch.autograd", runtime.user_site(), {"anomaly_detection": False},
                   {"anomaly_detection": True})
        orig(False, check_nan)

    # set_detect_anomaly and detect_anomaly call torch.set_anomaly_enabled by attribute.
    torch.set_anomaly_enabled = set_anomaly_enabled


def _cuda(torch: Any) -> bool:
    try:
        return bool(torch.cuda.is_available())
    except Exception:
        return False


def threads_for(rt: Runtime) -> int:
    spec = rt.active("threads.affinity")
    if spec is not None and spec.value:
        return int(spec.value)
    return max(1, runtime.cpus() // runtime.local_world_size())


def _threads(torch: Any, rt: Runtime) -> None:
    """Intra-op threads (and a CPU range when there are CPUs to spare) for this local rank."""
    n = threads_for(rt)
    before = torch.get_num_threads()
    if n != before:
        torch.set_num_threads(n)
        rt.did("threads.affinity", "torch", None, {"torch.set_num_threads": n}, {"torch.set_num_threads": before})
    else:
        rt.skip("threads.affinity", f"already {n} intra-op thread(s) per rank")
    # A disjoint CPU range per local rank keeps ranks off each other's caches, but DataLoader
    # workers inherit it: only pin when each rank has room for them (>= 4 CPUs).
    try:
        mask = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return
    lws, lr = runtime.local_world_size(), runtime.local_rank()
    per = len(mask) // lws
    if lws > 1 and per >= 4 and lr < lws:
        mine = mask[lr * per:(lr + 1) * per]
        os.sched_setaffinity(0, mine)
        rt.did("threads.affinity", "os", None, {"cpu_affinity": f"{mine[0]}-{mine[-1]}"},
               {"cpu_affinity": f"{mask[0]}-{mask[-1]}"})


def _threads_when_grouped(torch: Any, rt: Runtime) -> None:
    """Apply now when the local world size is known, else right after init_process_group."""
    if os.environ.get("LOCAL_WORLD_SIZE") or rt.active("threads.affinity").value:  # type: ignore[union-attr]
        _threads(torch, rt)
        return
    import torch.distributed as dist

    if not dist.is_available():
        _threads(torch, rt)
        return
    from torch.distributed import distributed_c10d

    orig = distributed_c10d.init_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        out = orig(*args, **kwargs)
        try:
            _threads(torch, rt)
        except Exception as exc:
            rt.broken(("threads.affinity",), exc)
        return out

    distributed_c10d.init_process_group = init_process_group
    dist.init_process_group = init_process_group
    rt.skip("threads.affinity", "the job never called init_process_group and LOCAL_WORLD_SIZE is unset")


def install(torch: Any, rt: Runtime) -> None:
    for rid, fn in (("cudnn.benchmark", _cudnn), ("precision.tf32", _tf32), ("debug.off", _debug_torch),
                    ("threads.affinity", _threads_when_grouped)):
        if rt.active(rid) is None:
            continue
        try:
            fn(torch, rt)
        except Exception as exc:
            rt.broken((rid,), exc)


def _cudnn(torch: Any, rt: Runtime) -> None:
    if not (_cuda(torch) and torch.backends.cudnn.is_available()):
        rt.refuse("cudnn.benchmark", "no NVIDIA GPU with cuDNN in this process")
        return
    if torch.backends.cudnn.benchmark:
        rt.skip("cudnn.benchmark", "cudnn.benchmark is already on")
        return
    torch.backends.cudnn.benchmark = True
    rt.did("cudnn.benchmark", "torch.backends.cudnn", None, {"benchmark": True}, {"benchmark": False})


def _tf32(torch: Any, rt: Runtime) -> None:
    if not _cuda(torch):
        rt.refuse("precision.tf32", "no CUDA device: TF32 exists only on NVIDIA GPUs (compute capability >= 8.0)")
        return
    before = torch.get_float32_matmul_precision()
    if before != "highest":
        rt.skip("precision.tf32", f"float32 matmul precision is already {before!r}")
        return
    torch.set_float32_matmul_precision("high")
    rt.did("precision.tf32", "torch", None, {"float32_matmul_precision": "high"},
           {"float32_matmul_precision": before})
