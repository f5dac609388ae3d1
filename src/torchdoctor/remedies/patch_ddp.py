"""DDP remedies: constructor arguments of ``DistributedDataParallel``.

The constructor runs collectives (parameter shape check, broadcast), so a call is never retried:
only values DDP accepts are set. Whether the job's graph allows them (no unused parameters for
``find_unused_parameters=False``, a static graph for ``static_graph=True``) cannot be known before
the first iteration: ``torchdoctor fix`` checks it on the facts of an earlier run before it asks.
"""

from __future__ import annotations

import inspect
from typing import Any

from ..callsite import editable_site
from . import runtime
from ._shim import kwargs_shim
from .catalogue import DDP_DEFAULT_BUCKET_MB
from .runtime import Runtime

IDS = ("ddp.find_unused_false", "ddp.static_graph", "ddp.grad_as_bucket_view", "ddp.bucket_cap")


def plan(rt: Runtime, a: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    new: dict[str, Any] = {}
    by: dict[str, str] = {}

    def want(rid: str, key: str, value: Any, already: bool) -> None:
        if rt.active(rid) is None:
            return
        if already:
            rt.skip(rid, f"DDP already has {key}={a.get(key)!r}")
        else:
            new[key], by[key] = value, rid

    want("ddp.find_unused_false", "find_unused_parameters", False, not a.get("find_unused_parameters"))
    want("ddp.static_graph", "static_graph", True, bool(a.get("static_graph")))
    want("ddp.grad_as_bucket_view", "gradient_as_bucket_view", True, bool(a.get("gradient_as_bucket_view")))
    spec = rt.active("ddp.bucket_cap")
    if spec is not None:
        cap = float(spec.value) if spec.value else DDP_DEFAULT_BUCKET_MB
        current = a.get("bucket_cap_mb")
        if a.get("bucket_cap_mb_list"):
            rt.skip(spec.id, "DDP was given bucket_cap_mb_list (per-bucket caps): left as written")
        else:
            want(spec.id, "bucket_cap_mb", cap, (current or DDP_DEFAULT_BUCKET_MB) == cap)
    return new, by


def install(torch: Any, rt: Runtime) -> None:
    if not any(rt.active(i) for i in IDS):
        return
    from torch.nn.parallel import distributed

    cls = distributed.DistributedDataParallel
    orig = cls.__init__
    sig = inspect.signature(orig)

    def adjust(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        bound = sig.bind(*args, **kwargs)
        new, by = plan(rt, bound.arguments)
        if not new:
            return None
        plain = (bound.args, bound.kwargs)
        where = runtime.creation_site(type(bound.arguments["self"]).__name__)
        target, site = editable_site(where, "DistributedDataParallel", new)
        for key, value in new.items():
            rt.did(by[key], target, site, {key: value}, {key: bound.arguments.get(key)}, library=where.library)
        bound.arguments.update(new)
        return (bound.args, bound.kwargs), plain

    cls.__init__ = kwargs_shim(orig, adjust, None, lambda exc: rt.broken(IDS, exc))
