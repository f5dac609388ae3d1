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
checkpoint operator, which calls the function again when it runs (torch._higher_order_ops.wrap):
that call, and any other from torch's private modules or while compiling, gets torch's own. Such a
region's backward is one CompiledFunctionBackward node, which HW-19 does not read either.

The same losses and gradients: the segment's forward runs once instead of twice, on the same inputs
and random state (a checkpoint restores the RNG for its second run so that dropout draws the same
mask), inside the job's forward context (``context_fn``'s first), and a reentrant segment without an
input that requires grad still gives its parameters no gradient. What changes besides time and
memory: a BatchNorm inside a segment updates its running statistics once per step instead of twice
(the second forward updates them again), as it would without checkpointing; the evaluation then
reads other statistics. The activations stay allocated until backward: `fix` shows each arm's peak.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from typing import Any

from torchdoctor.probe import unseen

from . import runtime
from .runtime import Runtime

ID = "memory.no_checkpoint"
IDS = (ID,)
# checkpoint()'s own keywords: consumed here, never passed to the segment.
_OWN = ("use_reentrant", "context_fn", "determinism_check", "debug", "early_stop", "preserve_rng_state")
# torch's own callers that keep the checkpoint: Dynamo's checkpoint operator imports the function when it
# runs (torch._higher_order_ops.wrap, tag_activation_checkpoint), and a compiled region is left as it is.
_KEEP_FOR = ("torch._",)
# torch's public callers, whose frames the call site skips: the permanent change names them.
_VIA = {"torch.utils.checkpoint": "checkpoint_sequential",
        "torch.distributed.algorithms._checkpoint.checkpoint_wrapper": "checkpoint_wrapper"}


def install(torch: Any, rt: Runtime) -> None:
    if rt.active(ID) is None:
        return
    try:
        module = importlib.import_module("torch.utils.checkpoint")
    except ImportError as exc:
        rt.refuse(ID, f"torch.utils.checkpoint does not import: {exc}")
        return
    orig = getattr(module, "checkpoint", None)
    if orig is None:
        rt.refuse(ID, "this torch has no torch.utils.checkpoint.checkpoint")
        return
    is_compiling = unseen.compiling()
    said: list[bool] = []

    def note(caller: str) -> None:
        said.append(True)
        try:
            site = runtime.creation_site()
            done = {"checkpoint": "the segment is called directly"}
            if caller in _VIA:
                done["via"] = _VIA[caller]
            rt.did(ID, "torch.utils.checkpoint", site.user, done, {"checkpoint": "recomputed in backward"},
                   library=site.library, library_site=site.library_site)
        except Exception as exc:
            rt.broken(IDS, exc)

    def checkpoint(function: Any, *args: Any, **kwargs: Any) -> Any:
        caller = str(sys._getframe(1).f_globals.get("__name__", ""))
        if is_compiling() or caller.startswith(_KEEP_FOR):
            return orig(function, *args, **kwargs)
        reentrant = kwargs.get("use_reentrant")
        reentrant = True if reentrant is None else bool(reentrant)  # torch's default when it is not given
        context_fn = kwargs.get("context_fn")
        for key in _OWN:
            kwargs.pop(key, None)
        if not said:
            note(caller)
        # The job's forward context (selective checkpointing's policy, a user's own) is entered as before.
        with context_fn()[0] if context_fn is not None else contextlib.nullcontext():
            if reentrant and torch.is_grad_enabled() and not any(
                    isinstance(a, torch.Tensor) and a.requires_grad for a in args):
                # A reentrant checkpoint's output needs an input that requires grad: without one nothing
                # inside it gets a gradient (torch warns). The plain call keeps that.
                with torch.no_grad():
                    return function(*args, **kwargs)
            return function(*args, **kwargs)

    checkpoint.__doc__ = orig.__doc__
    checkpoint.__wrapped__ = orig  # type: ignore[attr-defined]
    # Dynamo must not compile this frame when eager code calls it; the segment's frames stay its own.
    unseen.hide(checkpoint, recursive=False)
    for mod in list(sys.modules.values()):
        names = getattr(mod, "__dict__", None)
        name = str(getattr(mod, "__name__", ""))
        if not isinstance(names, dict) or not name.startswith("torch") or name.startswith(_KEEP_FOR):
            continue
        for key, value in list(names.items()):
            if value is orig:
                names[key] = checkpoint
    rt.skip(ID, "the job never called torch.utils.checkpoint.checkpoint outside a compiled region (a library "
                "checkpoint of its own, DeepSpeed's or Megatron's, is not replaced)")
