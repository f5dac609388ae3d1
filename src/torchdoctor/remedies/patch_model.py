"""Model remedies: autocast around the forward, torch.compile, CUDA graphs.

The model is found the way the probe finds it: global module hooks watch the first training
forward, and the first outermost module with trainable parameters called with grad enabled in
the main thread is the model (transforms and loss modules have no parameters). The global hooks
are then removed, so later module calls cost nothing extra.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from torchdoctor.probe import unseen

from .runtime import Runtime

IDS = ("precision.autocast", "compile", "cudagraphs")


def _inner(module: Any) -> Any:
    """The user's model inside DDP / DataParallel wrappers."""
    child = getattr(module, "module", None)
    return _inner(child) if child is not None and hasattr(child, "parameters") else module


def _device_type(module: Any) -> str:
    p = next(iter(module.parameters()), None)
    return p.device.type if p is not None else "cpu"


def _autocast(torch: Any, rt: Runtime, root: Any) -> Callable[[Any, Any], None] | None:
    """Hooks entering autocast around ``root``'s forward; returns the entering hook once installed."""
    spec = rt.active("precision.autocast")
    if spec is None:
        return None
    if spec.value in ("fp16", "float16"):
        rt.refuse(spec.id, "float16 autocast needs a GradScaler in the training loop (a code change); use bf16")
        return None
    device = _device_type(root)
    if device == "cuda" and not torch.cuda.is_bf16_supported():
        rt.refuse(spec.id, "this GPU has no bfloat16 support")
        return None
    stack: list[Any] = []

    def enter(module: Any, args: Any) -> None:
        ctx = torch.autocast(device_type=device, dtype=torch.bfloat16)
        ctx.__enter__()
        stack.append(ctx)

    def leave(module: Any, args: Any, out: Any) -> None:
        if stack:
            stack.pop().__exit__(None, None, None)

    root.register_forward_pre_hook(enter)
    root.register_forward_hook(leave, always_call=True)
    rt.did(spec.id, "model", None, {"autocast": f"{device}/bfloat16"}, {"autocast": None})
    return enter


def _compile(torch: Any, rt: Runtime, root: Any) -> None:
    spec = rt.active("cudagraphs") or rt.active("compile")
    if spec is None:
        return
    target = _inner(root)
    mode = None
    if spec.id == "cudagraphs":
        if _device_type(target) != "cuda":
            rt.refuse(spec.id, "CUDA graphs need the model on an NVIDIA GPU")
            return
        mode = "reduce-overhead"
    import torch._dynamo

    # A frame that fails to compile runs eagerly instead of stopping the job.
    torch._dynamo.config.suppress_errors = True
    if spec.id == "compile" and spec.value == "dynamic":
        target.compile(dynamic=True)
        rt.did(spec.id, "model", None, {"compile": "dynamic=True"}, {"compile": None})
        return
    if spec.id == "compile" and spec.value and spec.value != "default":
        mode = spec.value
    target.compile(mode=mode)
    rt.did(spec.id, "model", None, {"compile": mode or "default"}, {"compile": None})


def install(torch: Any, rt: Runtime) -> None:
    if not any(rt.active(i) for i in IDS):
        return
    if rt.active("cudagraphs") and not torch.cuda.is_available():
        rt.refuse("cudagraphs", "no CUDA device: CUDA graphs exist only on NVIDIA GPUs")
    if not any(rt.active(i) for i in IDS):
        return
    from torch.nn.modules import module as nn_module

    main = threading.get_ident()
    depth = [0]
    handles: list[Any] = []
    # Global hooks are traced inside every compiled module call: there they fold away (a compiled
    # call's outer module still runs them eagerly), and Dynamo never sees their eager frames.
    is_compiling = unseen.compiling()

    def is_model(module: Any) -> bool:
        return torch.is_grad_enabled() and any(p.requires_grad for p in module.parameters())

    def pre(module: Any, args: Any) -> None:
        if is_compiling() or threading.get_ident() != main:
            return
        depth[0] += 1
        if depth[0] != 1 or not is_model(module):
            return
        for h in handles:
            h.remove()
        depth[0] = 0
        try:
            enter = _autocast(torch, rt, module)
            if enter is not None:
                enter(module, args)  # this call's pre-hooks were collected before ours was added
            _compile(torch, rt, module)
        except Exception as exc:
            rt.broken(IDS, exc)

    def post(module: Any, args: Any, out: Any) -> None:
        if not is_compiling() and threading.get_ident() == main and depth[0] > 0:
            depth[0] -= 1

    unseen.hide(pre, recursive=False)  # it compiles the model: what that runs stays visible
    unseen.hide(post)
    handles.append(nn_module.register_module_forward_pre_hook(pre))
    handles.append(nn_module.register_module_forward_hook(post, always_call=True))
    for rid in IDS:
        if rt.active(rid):
            rt.skip(rid, "no training forward of a module with trainable parameters was seen")
