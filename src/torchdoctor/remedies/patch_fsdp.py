"""FSDP remedies: keyword arguments of ``fully_shard`` (FSDP2) and ``FullyShardedDataParallel`` (FSDP1).

``fsdp.keep_unsharded``: ``fully_shard(module, reshard_after_forward=False)`` on every unit. A unit
then keeps its parameters unsharded from its forward to its backward, so backward does not
all-gather them again: one all-gather per unit and step instead of two, the same numbers. The
price is memory: every unit's unsharded parameters stay allocated through the step (what FSDP
saves on parameters is given back), so `torchdoctor fix` offers it only where the probe saw
headroom (rules/distributed.py, DI-16).

``fsdp.prefetch`` (FSDP1): ``FullyShardedDataParallel(backward_prefetch=BACKWARD_PRE,
forward_prefetch=True)``: each unit's next all-gather is issued before the current unit computes,
in backward (FSDP1's default, which a job can turn off with ``backward_prefetch=None``) and in
forward (off by default). The same collectives in another order, the same numbers; one more unit's
parameters are unsharded at a time. FSDP1 builds its nested units through the same constructor, so
every unit gets it. FSDP2 prefetches by itself and is left alone.

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

IDS = ("fsdp.keep_unsharded", "fsdp.prefetch")
# Where FSDP1's class lives (the job imports it from torch.distributed.fsdp).
FSDP1_MODULE = "torch.distributed.fsdp.fully_sharded_data_parallel"
# The modules that export fully_shard (torch 2.6+; _composable.fsdp is the pre-2.6 public path).
EXPORTERS = ("torch.distributed.fsdp", "torch.distributed.fsdp._fully_shard", "torch.distributed._composable.fsdp")
# (id(original fully_shard), id(runtime)) -> its wrapper: one for every exporter.
_WRAPPED: dict[tuple[int, int], Any] = {}


def install(torch: Any, rt: Runtime) -> None:
    from torchdoctor.probe.imphook import when_imported

    if rt.active("fsdp.prefetch") is not None:
        def patch1(module: Any) -> None:
            try:
                _patch_fsdp1(module, rt)
            except Exception as exc:
                rt.broken(("fsdp.prefetch",), exc)

        when_imported(FSDP1_MODULE, patch1)
    if rt.active("fsdp.keep_unsharded") is None:
        return

    def patch(module: Any) -> None:
        try:
            _patch(module, rt)
        except Exception as exc:
            rt.broken(("fsdp.keep_unsharded",), exc)

    for name in EXPORTERS:
        when_imported(name, patch)


def prefetch_plan(arguments: dict[str, Any], pre: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(what to set, what the job had) for fsdp.prefetch, from the constructor's bound arguments;
    `pre` is BackwardPrefetch.BACKWARD_PRE. Arguments the job left out have FSDP1's defaults
    (backward_prefetch=BACKWARD_PRE, forward_prefetch=False)."""
    new, was = {}, {}
    if "backward_prefetch" in arguments and arguments["backward_prefetch"] is None:
        new["backward_prefetch"], was["backward_prefetch"] = pre, None
    if not arguments.get("forward_prefetch", False):
        new["forward_prefetch"], was["forward_prefetch"] = True, arguments.get("forward_prefetch", False)
    return new, was


def _code(value: Any) -> Any:
    """A value as the run record keeps it: JSON literals as they are, enum members as their source
    text (remedies/suggest.as_code writes it back into the user's call)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return {"code": f"{type(value).__name__}.{getattr(value, 'name', value)}"}


def _patch_fsdp1(module: Any, rt: Runtime) -> None:
    cls = getattr(module, "FullyShardedDataParallel", None)
    if cls is None or getattr(cls.__init__, "__torchdoctor_remedy__", False):
        return
    orig = cls.__init__
    sig = inspect.signature(orig)
    if "forward_prefetch" not in sig.parameters or "backward_prefetch" not in sig.parameters:
        rt.refuse("fsdp.prefetch", "this torch's FullyShardedDataParallel has no forward/backward_prefetch")
        return
    pre = module.BackwardPrefetch.BACKWARD_PRE
    said: list[bool] = []

    def adjust(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if rt.active("fsdp.prefetch") is None:
            return None
        bound = sig.bind(*args, **kwargs)
        new, was = prefetch_plan(bound.arguments, pre)
        if not new:
            if not said:
                rt.skip("fsdp.prefetch", "FullyShardedDataParallel already prefetches forward and backward")
            return None
        if not said:  # nested units are built by the same call: recorded once, at the user's line
            said.append(True)
            rt.did("fsdp.prefetch", "FullyShardedDataParallel", runtime.user_site(),
                   {k: _code(v) for k, v in new.items()}, {k: _code(v) for k, v in was.items()})
        plain = (bound.args, bound.kwargs)
        bound.arguments.update(new)
        return (bound.args, bound.kwargs), plain

    shim = kwargs_shim(orig, adjust, None, lambda exc: rt.broken(("fsdp.prefetch",), exc))
    shim.__torchdoctor_remedy__ = True  # type: ignore[attr-defined]
    cls.__init__ = shim


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
            # torchtune's shard_model calls it for the recipe: its config, not a diff, is the change.
            site = runtime.creation_site()
            rt.did(IDS[0], "fully_shard", site.user, {"reshard_after_forward": False},
                   {"reshard_after_forward": old}, library=site.library, library_site=site.library_site)
            plain = (bound.args, bound.kwargs)
            bound.arguments["reshard_after_forward"] = False
            return (bound.args, bound.kwargs), plain

        # No retry with the user's arguments: fully_shard has changed the module when it raises.
        shim = kwargs_shim(orig, adjust, None, lambda exc: rt.broken(IDS[:1], exc))
        shim.__torchdoctor_remedy__ = True  # type: ignore[attr-defined]
        _WRAPPED[key] = shim
    module.fully_shard = _WRAPPED[key]
