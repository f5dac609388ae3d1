"""The A/B recorder of `torchdoctor fix`: the loss of every step, and an optional step limit.

Armed only in the A/B arms (``TORCHDOCTOR_AB_RECORD``). ``torch.autograd.backward`` (which
``Tensor.backward`` calls) keeps a detached copy of each scalar it is given: no host sync per
step, the values are read once at the end. With ``TORCHDOCTOR_AB_STEPS=N`` the job ends cleanly
(``SystemExit(0)``) right after its N-th optimizer step, so both arms run exactly the same steps.
A job that builds no ``torch.optim`` optimizer (word_language_model's ``p.data.add_`` loop, a
hand-written SGD) counts a step per call of ``torch.autograd.backward``, as the probe counts its
steps there, and ends as its (N+1)-th call begins: step N is closed by then, and the two arms still
stop at the same place.
"""

from __future__ import annotations

import os
import sys
import weakref
from typing import Any

from torchdoctor.probe import unseen
from torchdoctor.probe.shims import before_only

from .runtime import ENV_STEPS, Runtime, say


def _rank() -> int | None:
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:
        pass
    text = os.environ.get("RANK", "")
    return int(text) if text.isdigit() else None


def install(torch: Any, rt: Runtime) -> None:
    text = os.environ.get(ENV_STEPS, "")
    limit = int(text) if text.isdigit() else 0
    rt.recording = True

    optimizers: list[bool] = []  # one entry once the job builds a torch.optim optimizer

    def note(args: tuple[Any, ...]) -> None:
        loss = args[0] if args else None
        if isinstance(loss, (list, tuple)) and len(loss) == 1:
            loss = loss[0]
        # A backward on the meta device computes nothing and is no training step: litgpt's pretrain measures
        # its FLOPs with one (litgpt.utils.measure_flops) before training, and its loss, which has no value,
        # spoiled the stack of every loss.
        if isinstance(loss, torch.Tensor) and loss.device.type == "meta":
            return
        if limit and not optimizers:
            if rt.backward_steps >= limit:
                rt.write()
                raise SystemExit(0)  # BaseException: the shim lets it through, the job ends cleanly
            rt.backward_steps += 1
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            if rt.rank is None:
                rt.rank = _rank()
            rt.losses.append(loss.detach().clone())

    said: list[bool] = []

    def failed(exc: BaseException) -> None:
        if not said:
            said.append(True)
            say(f"fix: loss recorder error (the job carries on): {type(exc).__name__}: {exc}")

    torch.autograd.backward = before_only(torch.autograd.backward, note, failed)

    from torch.optim import optimizer as optim

    def made(args: tuple[Any, ...]) -> None:
        if not optimizers:
            optimizers.append(True)

    optim.Optimizer.__init__ = before_only(optim.Optimizer.__init__, made, failed)

    primary: list[Any] = []
    post_handle: list[Any] = []
    # Inside a compiled optimizer step the hooks fold away (see probe/unseen.py): those steps are
    # not counted, the job's graphs stay its own.
    is_compiling = unseen.compiling()

    def post(opt: Any, args: Any, kwargs: Any) -> None:
        if is_compiling():
            return
        if not primary or primary[0]() is None:
            primary[:] = [weakref.ref(opt)]
        if primary[0]() is not opt:  # with several optimizers, the first one counts steps
            return
        rt.steps += 1
        if limit and rt.steps >= limit:
            rt.write()  # now: a rank started by fork never runs atexit
            raise SystemExit(0)

    def pre(opt: Any, args: Any, kwargs: Any) -> None:
        # Registered at the first step, i.e. after the probe's own hook: the probe closes step N
        # before we end the job.
        if not is_compiling() and not post_handle:
            post_handle.append(optim.register_optimizer_step_post_hook(post))

    unseen.hide_all(pre, post)
    optim.register_optimizer_step_pre_hook(pre)
