"""How much memory an optimizer's update moves, fused or not: the basis of HO-18's claim.

An update is memory-bound: each pass over a parameter-sized tensor costs its reads and writes. The
per-parameter (for-loop) and foreach implementations of torch.optim run one pass per operation;
the fused implementation reads each tensor of the update once and writes the changed ones once.
Counted from torch 2.13's ``_single_tensor_*`` code (the foreach code runs the same operations
over lists), in parameter-sized element accesses per parameter element:

- Adam: ``exp_avg.lerp_(grad)`` 3, ``exp_avg_sq.mul_().addcmul_(grad, grad)`` 2 + 4,
  ``denom = (exp_avg_sq.sqrt() / bc2).add_(eps)`` 2 + 2 + 2, ``param.addcdiv_(exp_avg, denom)`` 4:
  19. Weight decay: AdamW's ``param.mul_`` 2, Adam's ``grad.add(param)`` 3. amsgrad:
  ``torch.maximum(max_sq, exp_avg_sq, out=max_sq)`` 3. Fused: read param, grad, exp_avg,
  exp_avg_sq, write three: 7 (9 with amsgrad).
- SGD: ``param.add_(grad)`` 3; momentum ``buf.mul_().add_(grad)`` 2 + 3; nesterov
  ``grad.add(buf)`` 3; weight decay ``grad.add(param)`` 3. Fused: read param and grad, write param:
  3, and the buffer read and written with momentum: 5.
- Adagrad: ``state_sum.addcmul_(grad, grad)`` 4, ``std = state_sum.sqrt().add_(eps)`` 2 + 2,
  ``param.addcdiv_(grad, std)`` 4: 12; weight decay 3. Fused: read param, grad and state_sum,
  write two: 5.

The foreach code runs the same operations over lists, except Adagrad's, which first scales the
gradients by -clr into a new list (14); ``maximize`` negates the gradient (2) and Adam's
``capturable`` foreach update computes its step sizes as lists (2). Measured on this machine's 2 CPUs (torch 2.13, AdamW(weight_decay=0.1), default implementation
against fused=True): 94 M parameters in 140 tensors 120 -> 32 ms (saving 0.73, the model says
0.67), 0.8 M in 200 tensors 7.3 -> 1.4 ms (0.81): the per-parameter loop's Python adds to what the
model counts. SGD with momentum: 0.18 and 0.67 against the model's 0.375; plain SGD: no saving, as
the model says. An estimate of what `torchdoctor fix --apply optim.fused` measures.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# The classes with a fused implementation in torch.optim (Adam and AdamW on CUDA since torch 2.0,
# SGD and Adagrad later; all four on CPU since 2.4). Whether the job's torch has it for the job's
# parameters is the probe's to read (OptimizerFacts.fused_available).
FUSED_CLASSES = frozenset({"Adam", "AdamW", "SGD", "Adagrad"})


def update_traffic(cls: str, settings: Mapping[str, float | bool], impl: str) -> int | None:
    """Parameter-sized element accesses per parameter element of one update of ``cls`` with these
    group settings, by ``impl`` ("single_tensor", "foreach" or "fused"; the module docstring's
    counts); None for a class this does not model."""
    fused = impl == "fused"
    wd, maximize = bool(settings.get("weight_decay")), bool(settings.get("maximize"))
    negate = 2 if maximize and not fused else 0  # grad = -grad
    if cls in ("Adam", "AdamW"):
        amsgrad = bool(settings.get("amsgrad"))
        if fused:
            return 9 if amsgrad else 7
        decoupled = cls == "AdamW" or bool(settings.get("decoupled_weight_decay"))
        decay = (2 if decoupled else 3) if wd else 0
        capturable = 2 if impl == "foreach" and settings.get("capturable") else 0
        return 19 + decay + (3 if amsgrad else 0) + negate + capturable
    if cls == "SGD":
        momentum = bool(settings.get("momentum"))
        if fused:
            return 5 if momentum else 3
        return (3 + (5 if momentum else 0) + (3 if momentum and settings.get("nesterov") else 0) + (3 if wd else 0)
                + negate)
    if cls == "Adagrad":
        if fused:
            return 5
        # foreach scales the gradients by -clr into a new list first (_foreach_mul): 2 more.
        return 12 + (2 if impl == "foreach" else 0) + (3 if wd else 0) + negate
    return None


def fused_saving(cls: str, settings: Mapping[str, float | bool], impl: str = "single_tensor") -> float | None:
    """The share of the update's time fused=True would save, by the memory each moves: 1 - fused /
    unfused traffic (0 where both move the same: plain SGD); None for a class this does not model."""
    unfused, fused = update_traffic(cls, settings, impl), update_traffic(cls, settings, "fused")
    if not unfused or fused is None:
        return None
    return max(0.0, 1.0 - fused / unfused)


# Each class's fused operator. DTensor parameters (FSDP2, tensor parallel) have sharding rules for
# Adam's and AdamW's only (torch/distributed/tensor/_ops/_pointwise_ops.py, torch 2.13): SGD's and
# Adagrad's fail at the first step.
FUSED_OPS = {"Adam": "_fused_adam_", "AdamW": "_fused_adamw_", "SGD": "_fused_sgd_", "Adagrad": "_fused_adagrad_"}
DTENSOR_FUSED = frozenset({"Adam", "AdamW"})


def fused_problem(torch: Any, cls: str, tensors: Iterable[Any], sparse_ids: frozenset[int] = frozenset()) -> str | None:
    """Why ``fused=True`` cannot run for a ``cls`` over these parameters, or None when it can: a
    floating-point, dense-gradient parameter on a device where the running torch registers the
    class's fused kernel (the dispatcher's table, a private API: where it is missing, torch's own
    list of fused devices, one list for every class). ``sparse_ids``: ids of parameters known to get
    sparse gradients before any exists (an nn.Embedding(sparse=True)'s weight). Shared by the probe
    (OptimizerFacts.fused_available) and the remedy (remedies/patch_optim.py)."""
    op = FUSED_OPS.get(cls)
    if op is None:
        return f"{cls} has no fused implementation"
    has_kernel = getattr(torch._C, "_dispatch_has_kernel_for_dispatch_key", None)
    devices: dict[str, bool] = {}
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        if not t.is_floating_point():
            return f"fused kernels need floating-point parameters, not {t.dtype}"
        grad = t.grad
        if id(t) in sparse_ids or (grad is not None and grad.is_sparse):
            return "parameters with sparse gradients (nn.Embedding(sparse=True)): fused kernels take dense ones"
        if cls not in DTENSOR_FUSED and any(k.__name__ == "DTensor" for k in type(t).__mro__):
            return f"DTensor parameters (FSDP2, tensor parallel): torch has no sharding rule for {op}"
        kind = t.device.type
        if kind not in devices:
            devices[kind] = _has_fused(torch, has_kernel, op, kind)
        if not devices[kind]:
            return f"no fused {cls} kernel for parameters on {kind} in this torch"
    return None


def _has_fused(torch: Any, has_kernel: Any, op: str, kind: str) -> bool:
    if has_kernel is not None:
        try:
            return bool(has_kernel(f"aten::{op}", kind.upper()))
        except Exception:  # an unknown key or operator: the device list below
            pass
    from torch.optim import optimizer as optim

    supported = getattr(optim, "_get_fused_kernels_supported_devices", None)
    return supported is not None and kind in supported()


# Libraries that build the optimizer from settings of their own: library -> (the classes, what to
# say, the snippet with {command} for the job's command line, its language). transformers' Trainer
# maps optim="adamw_torch_fused" to AdamW(fused=True) (trainer_optimizer.py; the default from torch
# 2.8 in transformers 5); timm's train.py hands --opt-kwargs to create_optimizer_v2, which passes
# them to the torch.optim class (timm 1.0).
LIBRARY_SETTINGS: dict[str, tuple[frozenset[str], str, str, str]] = {
    "transformers": (frozenset({"AdamW"}), "Hugging Face's Trainer builds it: set its optim argument",
                     'TrainingArguments(..., optim="adamw_torch_fused")   # or --optim adamw_torch_fused', "python"),
    "timm": (FUSED_CLASSES, "timm's create_optimizer_v2 builds it: hand fused=True through its optimizer "
             "arguments (train.py's --opt-kwargs, or create_optimizer_v2(..., fused=True))",
             "{command} --opt-kwargs fused=True", "shell"),
}


def library_fix(library: str | None, cls: str | None, command: str) -> tuple[str, str, str] | None:
    """(what to say, snippet, language) when ``library`` built the ``cls`` optimizer and has a
    setting for fused=True; None otherwise. ``command``: the job's command line (advice/command.py)."""
    entry = LIBRARY_SETTINGS.get(library or "")
    if entry is None or cls not in entry[0]:
        return None
    return entry[1], entry[2].format(command=command), entry[3]
