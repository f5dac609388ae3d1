"""memory.no_checkpoint: activation checkpointing off, without editing the job (HW-19's remedy).

``torch.utils.checkpoint.checkpoint`` is replaced, the moment torch is imported, by a function that
calls the segment directly: its forward keeps its activations and the backward runs nothing again.
Everything that checkpoints through it is covered: the job's own calls, ``checkpoint_sequential``,
Hugging Face's ``gradient_checkpointing`` (a ``functools.partial`` of the function, made when the
model enables it, after torch is imported), FSDP's ``checkpoint_wrapper`` and Lightning's and
torchtitan's policies, which import the function after torch has. Modules that bound the name before
(only torch.utils.checkpoint itself, on torch 2.13) are rebound. Libraries with a checkpoint of
their own (DeepSpeed's, Megatron's CheckpointFunction) are not: the remedy then says it had nothing
to change. Inside a torch.compile'd region nothing changes: Dynamo knows the checkpoint by
identity (whatever ``torch.utils.checkpoint.checkpoint`` is) and turns the call into its own
checkpoint operator, so the replacement is never traced there; such a region's backward is one
CompiledFunctionBackward node, which HW-19 does not read either.

The same numbers: the segment's forward runs once instead of twice, on the same inputs and random
state (a checkpoint restores the RNG for its second run so that dropout draws the same mask), so
the activations and gradients are those of the checkpointed run. It costs memory: the activations
stay allocated until backward, which `fix` shows as each arm's peak.
"""

from __future__ import annotations

import sys
from typing import Any

from torchdoctor.probe import unseen

from . import runtime
from .runtime import Runtime

ID = "memory.no_checkpoint"
IDS = (ID,)
# checkpoint()'s own keywords: consumed here, never passed to the segment.
_OWN = ("use_reentrant", "context_fn", "determinism_check", "debug", "early_stop", "preserve_rng_state")


def install(torch: Any, rt: Runtime) -> None:
    if rt.active(ID) is None:
        return
    module = sys.modules.get("torch.utils.checkpoint")
    orig = getattr(module, "checkpoint", None)
    if orig is None:
        rt.refuse(ID, "this torch has no torch.utils.checkpoint.checkpoint")
        return
    is_compiling = unseen.compiling()
    said: list[bool] = []

    def checkpoint(function: Any, *args: Any, **kwargs: Any) -> Any:
        for key in _OWN:
            kwargs.pop(key, None)
        if not said and not is_compiling():  # folded to a constant when Dynamo traces this call
            said.append(True)
            try:
                site = runtime.creation_site()
                rt.did(ID, "torch.utils.checkpoint", site.user, {"checkpoint": "the segment is called directly"},
                       {"checkpoint": "recomputed in backward"}, library=site.library,
                       library_site=site.library_site)
            except Exception as exc:
                rt.broken(IDS, exc)
        return function(*args, **kwargs)

    checkpoint.__doc__ = orig.__doc__
    checkpoint.__wrapped__ = orig  # type: ignore[attr-defined]
    # Dynamo must not compile this frame when eager code calls it; the segment's frames stay its own.
    unseen.hide(checkpoint, recursive=False)
    for mod in list(sys.modules.values()):
        names = getattr(mod, "__dict__", None)
        if not isinstance(names, dict) or not str(getattr(mod, "__name__", "")).startswith("torch"):
            continue
        for name, value in list(names.items()):
            if value is orig:
                names[name] = checkpoint
    rt.skip(ID, "the job never called torch.utils.checkpoint.checkpoint (a library checkpoint of its own, "
                "DeepSpeed's or Megatron's, is not replaced)")
