"""Distributed layer, checkpoints: saves that block the training loop (DI-15).

A checkpoint written synchronously from the training loop stops the step for as long as the
write takes (``torch.save`` of a state dict, DCP ``save``); on a multi-rank job every other rank
then waits at its next collective. The probe times each save on the training thread
(``StepTiming.checkpoint_ms``/``checkpoint_saves``); the step's share is the save time
amortised over the steps the probe recorded (a save every K steps costs 1/K of it per step).
"""

from __future__ import annotations

from ._common import View, checkpoint_saves, every_step, finding, fmt_ms, per_rank
from .engine import RuleInputs, rule
from .model import Evidence, Finding, Fix


@rule("DI-15")
def blocking_checkpoints(inputs: RuleInputs) -> list[Finding]:
    """Checkpoint saves that block the step (live: the probe times torch.save and DCP save).

    Claim: the save time amortised per step (total blocked / steps recorded), an upper bound of
    what an asynchronous save gives back: ``dcp.async_save`` still blocks while it copies the
    state to host memory (staging), a background thread still competes for the CPU. Severity by
    that share of the step (the default ladder). The steps of the profiler's window count too (their
    saves are the job's). Saves outside the recorded steps (after the last one) are not counted:
    they block nothing the job waits for.

    Confidence is low on a CPU-only job: there the write is CPU work that competes with training.
    Measured on 2 cores (a 50 MB model saved every 5 steps with DCP): async_save cut the blocking
    from 110 to 24 ms per save, yet the steps with a save stayed about 100 ms longer than the rest.
    """
    def one(v: View) -> Finding | None:
        n, blocked, steps = checkpoint_saves(v)
        if not n or not steps or not v.step_ms:
            return None
        per_step = blocked / steps
        if v.pct(per_step) < 0.5:
            return None
        saving = [s for s in every_step(v.f) if s.checkpoint_saves]
        at = [s.step for s in saving]
        gaps = sorted(b - a for a, b in zip(at, at[1:], strict=False))
        every = gaps[len(gaps) // 2] if gaps else steps / n  # the median interval between saving steps
        # Saves per saving step, when all such steps save alike: torchvision's reference writes
        # model_{epoch}.pth and checkpoint.pth at each epoch's end, two saves in one step.
        counts = {s.checkpoint_saves for s in saving}
        per = counts.pop() if len(counts) == 1 else None
        how_often = (f"one every {every:.0f} steps" if per == 1 or not at else
                     f"{per} every {every:.0f} steps" if per else f"{n / len(at):.1f} saves at a time, every {every:.0f} steps")
        distributed = v.f is not None and v.f.world_size > 1
        site = v.f.checkpoint_site if v.f is not None else None
        text = (f"Save asynchronously{f' (the save at {site})' if site else ''}: DCP async_save returns once the state is staged in host memory and writes "
                "in the background" + ("; other ranks otherwise wait for this one at the next collective." if distributed
                                       else "; or hand torch.save to a background thread with a copy of the state."))
        snippet = ("import torch.distributed.checkpoint as dcp\n"
                   "pending = dcp.async_save(state_dict, checkpoint_id=path)   # wait on pending.result() before the next save"
                   if distributed else
                   "state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}\n"
                   "threading.Thread(target=torch.save, args=(state, path)).start()")
        return finding(
            v, "DI-15", "distributed",
            f"Checkpoint saves block the training loop: {n} save(s) of {fmt_ms(blocked / n)} each in {steps} steps "
            f"({how_often}), {fmt_ms(per_step)} per step on average.",
            per_step,
            evidence=[Evidence(f"{n} save(s) on the training thread took {fmt_ms(blocked)} in all over {steps} recorded "
                               f"steps; the median step is {fmt_ms(v.step_ms)}.",
                               {"saves": n, "blocked_ms": round(blocked, 3), "steps": steps,
                                "ms_per_step": round(per_step, 3), "every_steps": round(every, 1)})],
            fix=Fix(text, snippet), confidence="medium" if v.accel else "low",
            confirm="time a run with the save made asynchronous: the staging copy still blocks"
            + ("" if v.accel else "; on a CPU-only job the background write competes with training for the cores"),
            source="probe: torch.save / DCP save timed on the training thread; proposed: the step ladder")
    return per_rank(inputs, one)
