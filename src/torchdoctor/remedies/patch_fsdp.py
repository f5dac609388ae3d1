"""FSDP2 remedies: keyword arguments of ``fully_shard``.

``fsdp.keep_unsharded``: ``fully_shard(module, reshard_after_forward=False)`` on every unit. A unit
then keeps its parameters unsharded from its forward to its backward, so backward does not
all-gather them again: one all-gather per unit and step instead of two, the same numbers. The
price is memory: every unit's unsharded parameters stay allocated through the step (what FSDP
saves on parameters is given back), so `torchdoctor fix` offers it only where the probe saw
headroom (rules/distributed.py, DI-16).

``fully_shard`` is a function, imported by name (``from torch.distributed.fsdp import
fully_shard``): it is replaced in the modules that export it the moment each is imported, before
the job's own import reads it. A job that imported it earlier keeps the original (the remedy is then
reported as not applied).
"""

from __future__ import annotations

import inspect
from typing import Any

from . import runtime
from ._shim import kwargs_shim
from .runtime import Runtime

IDS = ("fsdp.keep_unsharded",)
# The modules that export fully_shard (torch 2.6+; _composable.fsdp is the pre-2.6 public path).
EXPORTERS = ("torch.distributed.fsdp", "torch.distributed.fsdp._fully_shard", "torch.distributed._composable.fsdp")
# (id(original fully_shard), id(runtime)) -> its wrapper: one for every exporter.
_WRAPPED: dict[tuple[int, int], Any] = {}


def install(torch: Any, rt: Runtime) -> None:
    if rt.active("fsdp.keep_unsharded") is None:
        return
    from torchdoctor.probe.imphook import when_imported

    def patch(module: Any) -> None:
        try:
            _patch(module, rt)
        except Exception as exc:
            rt.broken(IDS, exc)

    for name in EXPORTERS:
        when_imported(name, patch)


def _patch(module: Any, rt: Runtime) -> None:
    orig = getattr(module, "fully_shard", None)
    if orig is None or getattr(orig, "__torchdoctor_remedy__", False):
        return
    key = (id(orig), id(rt))
    if key not in _WRAPPED:
        sig = inspect.signature(orig)
        if "reshard_after_forward" not in sig.parameters:
            rt.refuse(IDS[0], "this torch's fully_shard has no reshard_after_forward")
            return

        def adjust(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if rt.active(IDS[0]) is None:
                return None
            bound = sig.bind(*args, **kwargs)
            old = bound.arguments.get("reshard_after_forward")
            if old is False:
                rt.skip(IDS[0], "fully_shard already has reshard_after_forward=False")
                return None
            rt.did(IDS[0], "fully_shard", runtime.user_site(), {"reshard_after_forward": False},
                   {"reshard_after_forward": old})
            plain = (bound.args, bound.kwargs)
            bound.arguments["reshard_after_forward"] = False
            return (bound.args, bound.kwargs), plain

        # No retry with the user's arguments: fully_shard has changed the module when it raises.
        shim = kwargs_shim(orig, adjust, None, lambda exc: rt.broken(IDS, exc))
        shim.__torchdoctor_remedy__ = True  # type: ignore[attr-defined]
        _WRAPPED[key] = shim
    module.fully_shard = _WRAPPED[key]
