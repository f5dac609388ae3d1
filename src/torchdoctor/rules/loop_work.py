"""Host layer, the training loop's own work in every step of a CPU-only job (HO-17).

On an accelerator, host work outside the model shows as device idle and HO-5 prices it from the
trace. On a CPU-only job there is no idle device to see: the model's compute and the loop's own
Python (an RL environment step and replay sampling in every update, a loss or metrics computed
outside the model, per-step logging) take turns on the same CPUs, and the report read "no
verdict" for a job that spent half of its time in that Python (CleanRL's dqn.py: 4.1 ms of an
8.5 ms step).

Measured by the probe on the steady steps (``View.timed``: warm-up, HO-16's long steps and the one
or two stray long steps of a run without a pattern of them left out): the median of ``other_ms`` (the step's wall time outside the DataLoader, the forward, the
backward, the optimizer step and collectives) less checkpoint saves (DI-15's) and loader restarts
(DL-6's). What that time is made of the probe does not see: the finding says where it is, not
what. The probe's own per-step cost (about 0.2 ms on a tiny loop, benchmarks/probe_overhead.py)
lands partly in it: MIN_MS keeps such loops out.

Priced against the job like HO-16: the steady steps' own work summed over the run, ``job_s`` and
``job_pct`` of the job's training wall time; no claim on the step's budget (how much of it a
change gives back depends on what it is). Shown from INFO_PCT of the median steady step; severity
by the job's share (a loop whose updates are a small part of the job, between long rollouts that
HO-16 prices, is no emergency however much of each update is Python).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..advice.command import cprofile, py_spy
from ..advice.environments import parallel_envs
from ..facts import forward_unseen
from ..metrics.between import rest_ms
from ._common import View, finding, fmt_ms, per_rank, severity
from .engine import RuleInputs, rule
from .model import Evidence, Finding, Fix

# Below this the loop's own work is noise, or the probe's own hooks (tiny loops).
MIN_MS = 1.0
# Shown from INFO_PCT of the median steady step; severity by the job's share on the ladder.
INFO_PCT, WARN_PCT, CRIT_PCT = 10.0, 20.0, 40.0
# Steady steps needed for a median.
MIN_STEPS = 8


def _fix(envs: Sequence[str], run: Mapping, processes: int = 1) -> Fix:
    """Profile, then take the work off the per-step path; environment steps and replay sampling only
    where the job imported an RL environment library (a fastai vision job was told to use
    AsyncVectorEnv)."""
    profile = ("Find what it is with a Python profiler over a few hundred steps (py-spy record, or cProfile sorted by "
               "cumulative time) and take it off the per-step path: ")
    prof = cprofile(run, processes)
    snippet = py_spy(run, "loop.svg", processes) + (f"   # or: {prof}" if prof else "")
    tail = "; a loss computed outside the model lands here too, and is compute, not overhead."
    if envs:
        how, code = parallel_envs(envs)
        return Fix(f"{profile}{how}, sample replay batches as whole tensors instead of Python lists, compute metrics "
                   f"on tensors and log every N steps{tail}", f"{snippet}\n{code}")
    return Fix(f"{profile}compute metrics on tensors and log every N steps, run per-step callbacks less often, and move "
               f"per-batch Python (host-side transforms of a batch) into the DataLoader's workers{tail}", snippet)


def _blind_split(v: View, total: np.ndarray) -> tuple[np.ndarray, float] | None:
    """(the loop's own ms of each steady step, the model's median ms) where the probe timed no forward
    (``facts.forward_unseen``: GPyTorch's modules run their forward from a __call__ of their own, so
    module hooks never fire, and the forward sits in ``other_ms``; SVGP's example read "20.3 ms of a
    55.5 ms step outside the model's forward" for its model's own forward). From the profiled
    steps' host split instead: the share of the step outside every traced op and the DataLoader, of
    each probe step; the model's, that of the forward, backward and optimizer. None without a trace."""
    phases = v.r.host.phases_ms if v.r is not None else {}
    window = sum(phases.values())
    if window <= 0:
        return None
    model = sum(phases.get(p, 0.0) for p in ("forward", "backward", "optimizer")) / window
    return total * phases.get("other", 0.0) / window, model * float(np.median(total))


@rule("HO-17")
def loop_work_in_every_step(inputs: RuleInputs) -> list[Finding]:
    """Every step of a CPU-only job spends a large share outside the model: the loop's own work.

    Live only (the probe's phases of every step); not on an accelerator, where HO-5 prices host
    work by the device idle it causes. Claims nothing per step: the cost is the job's.
    """
    def one(v: View) -> Finding | None:
        if v.f is None or v.accel:
            return None
        steps = v.timed
        if len(steps) < MIN_STEPS:
            return None
        total = np.array([s.total_ms for s in steps])
        blind = forward_unseen(v.f.steps)
        if blind:
            split = _blind_split(v, total)
            if split is None:
                return None
            own, model = split
        else:
            own = np.array([rest_ms(s) for s in steps])
            model = float(np.median([s.forward_ms + s.backward_ms + s.optimizer_ms for s in steps]))
        mid, step = float(np.median(own)), float(np.median(total))
        pct = 100.0 * mid / step if step > 0 else 0.0
        if mid < MIN_MS or pct < INFO_PCT:
            return None
        wall = v.f.train_wall_s or float(total.sum()) / 1e3
        job_s = float(own.sum()) / 1e3
        job_pct = 100.0 * job_s / wall if wall > 0 else 0.0
        inference = float(np.median([s.inference_ms for s in steps]))
        acting = (f" The model's forwards without autograd (acting, or an evaluation) take {fmt_ms(inference)} more "
                  "of each step, inside the forward." if inference >= 0.05 * step else "")
        sev = severity(job_pct, WARN_PCT, CRIT_PCT)
        title = (f"Each step spends {fmt_ms(mid)} ({pct:.0f}% of a {fmt_ms(step)} step) outside the model's forward, "
                 f"backward and optimizer step and the DataLoader: the training loop's own work, on the same CPUs "
                 f"as the model's {fmt_ms(model)}.")
        how = ("the probe's phases; saves, loader restarts and the long steps of work between steps left out"
               if not blind else
               "the probe timed no forward, so the share outside the model is the profiled steps' untraced time, "
               "outside every traced op")
        f = finding(
            v, "HO-17", "host", title, 0.0, sev=sev,
            evidence=[Evidence(
                f"Median over {len(steps)} steady steps ({how}): {fmt_ms(mid)} of {fmt_ms(step)} in the loop outside "
                f"the model; {job_s:.1f} s over the run, {job_pct:.0f}% of its training time.{acting}",
                {"loop_ms": round(mid, 3), "step_ms": round(step, 3), "model_ms": round(model, 3),
                 "loop_pct": round(pct, 1), "inference_ms": round(inference, 3), "steps": len(steps),
                 "job_s": round(job_s, 3), "job_pct": round(job_pct, 1)})],
            fix=_fix(v.f.env_libraries, inputs.run, len(inputs.ranks)),
            confidence="medium",
            confirm="py-spy or cProfile over the same run names the functions that take this time",
            source=("probe: every step's phases (other = wall time outside the loader, forward, backward, optimizer, "
                    "collectives)" if not blind else
                    "probe: every step's wall time; the profiled steps' host split for the share outside every traced "
                    "op (the probe timed no forward)")
                   + "; shown from 10% of the steady step, severity by the job's share (20% warning, 40% critical)")
        f.job_s, f.job_pct, f.per = round(job_s, 3), round(job_pct, 1), "job"
        return f
    return per_rank(inputs, one)
