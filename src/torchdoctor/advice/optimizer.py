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

Measured on this machine's 2 CPUs (torch 2.13, AdamW(weight_decay=0.1), default implementation
against fused=True): 94 M parameters in 140 tensors 120 -> 32 ms (saving 0.73, the model says
0.67), 0.8 M in 200 tensors 7.3 -> 1.4 ms (0.81): the per-parameter loop's Python adds to what the
model counts. SGD with momentum: 0.18 and 0.67 against the model's 0.375; plain SGD: no saving, as
the model says. An estimate of what `torchdoctor fix --apply optim.fused` measures.
"""

from __future__ import annotations

from collections.abc import Mapping

# The classes with a fused implementation in torch.optim (Adam and AdamW on CUDA since torch 2.0,
# SGD and Adagrad later; all four on CPU since 2.4). Whether the job's torch has it for the job's
# parameters is the probe's to read (OptimizerFacts.fused_available).
FUSED_CLASSES = frozenset({"Adam", "AdamW", "SGD", "Adagrad"})


def update_traffic(cls: str, settings: Mapping[str, float | bool], fused: bool) -> int | None:
    """Parameter-sized element accesses per parameter element of one update of ``cls`` with these
    group settings (the module docstring's counts); None for a class this does not model."""
    wd = bool(settings.get("weight_decay"))
    if cls in ("Adam", "AdamW"):
        amsgrad = bool(settings.get("amsgrad"))
        if fused:
            return 9 if amsgrad else 7
        decay = (2 if cls == "AdamW" else 3) if wd else 0
        return 19 + decay + (3 if amsgrad else 0)
    if cls == "SGD":
        momentum = bool(settings.get("momentum"))
        if fused:
            return 5 if momentum else 3
        return 3 + (5 if momentum else 0) + (3 if momentum and settings.get("nesterov") else 0) + (3 if wd else 0)
    if cls == "Adagrad":
        return 5 if fused else 12 + (3 if wd else 0)
    return None


def fused_saving(cls: str, settings: Mapping[str, float | bool]) -> float | None:
    """The share of the update's time fused=True would save, by the memory each moves: 1 - fused /
    unfused traffic (0 where both move the same: plain SGD); None for a class this does not model."""
    unfused, fused = update_traffic(cls, settings, False), update_traffic(cls, settings, True)
    if not unfused or fused is None:
        return None
    return max(0.0, 1.0 - fused / unfused)


# Libraries that build the optimizer from settings of their own: (library, classes) -> (what to
# say, the setting). transformers' Trainer maps optim="adamw_torch_fused" to AdamW(fused=True)
# (trainer_optimizer.py; the default from torch 2.8 in transformers 5); timm's train.py hands
# --opt-kwargs to create_optimizer_v2, which passes them to the torch.optim class (timm 1.0).
LIBRARY_SETTINGS: dict[str, tuple[frozenset[str], str, str]] = {
    "transformers": (frozenset({"AdamW"}), "Hugging Face's Trainer builds it: set its optim argument",
                     'TrainingArguments(..., optim="adamw_torch_fused")   # or --optim adamw_torch_fused'),
    "timm": (frozenset(FUSED_CLASSES), "timm's create_optimizer_v2 builds it: hand fused=True through its "
             "optimizer arguments", "python train.py ... --opt-kwargs fused=True   # or create_optimizer_v2(..., fused=True)"),
}
