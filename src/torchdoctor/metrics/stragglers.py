"""Stragglers over a whole live run, from the probe's per-step timings of every rank.

A profiler window is a few steps; a straggler shows over hundreds. The probe times every step of
every rank (facts.StepTiming), so the whole run says who keeps the others waiting, and how often.

Why this works without timing the collectives: a synchronous collective (DDP's gradient
all-reduce inside backward; FSDP's all-gathers and reduce-scatters inside forward and backward)
ends at about the same moment on every rank, so the ranks' steps have the same length and differ
in where the time goes. The rank that reaches the collective last spent more of its step on its
own work (loading, the optimizer, logging, checkpoint saves, evaluation: everything outside the
phases that hold the collectives); every other rank spends that difference waiting inside the
collective. A rank whose *compute* is slow (a throttled device) is not told apart from the waiting
here: the traces' cross-rank analysis (metrics/ranks.py) sees that case.

Definitions, per step s recorded on every rank (steps aligned by number; each rank's first step,
which pays for start-up, left out):
- own_ms[r, s]: the step's wall time on rank r less its collective phases (DDP: backward and
  exposed communication; FSDP: forward, backward and communication).
- lead_ms[r, s] = max(0, own_ms[r, s] - max over the other ranks q of own_ms[q, s]): how much later
  than every other rank r reached the collectives; the step would have been that much shorter had
  r arrived with the next-latest rank.
- r is late in s when lead_ms[r, s] > LATE_SHARE x the median step and > LATE_MIN_MS.
- The straggler is the rank with the largest total lead, when it is late in at least one step.
  Persistent: its median lead over all steps is itself late-sized (it is late most of the time);
  transient otherwise (a periodic save, evaluation or logging on one rank), counting only the late
  steps that stand out of the run: step time above the median by more than OUTLIER_SIGMAS robust
  standard deviations (1.4826 x the median absolute deviation), with a lead of at least
  EVENT_SHARE of its largest. Scheduler jitter makes some rank late now and then in any job; a
  save or an evaluation makes its steps outliers. One such step is an event, not a straggler: a
  transient one is late in at least TRANSIENT_MIN_STEPS. `period`: the spacing of a transient
  straggler's late steps when they recur evenly.
- gain_ms: the straggler's total lead / steps: what the job gives back per step, amortised, when
  that rank arrives with the others.
- lead_by_phase: over the straggler's late steps, the mean of its own time in each phase of its own
  work less the median of the other ranks' (dataloader, forward under DDP, optimizer, checkpoint
  saves, and "other": the rest of the loop, e.g. logging or evaluation): where its lead comes from.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import msgspec
import numpy as np

from ..facts import StepTiming, forward_unseen

# A rank is late in a step when it arrives this share of the median step after every other rank
# (metrics/ranks.py uses the same 5% for the spread of waiting in a trace).
LATE_SHARE = 0.05
# ... and by more than this: below it, on a CPU host, the order in which ranks leave a collective and
# scheduler jitter make a rank "late" by a fraction of a millisecond every step (measured here: 0.6 ms
# of a 3 ms gloo step, on a job whose ranks do the same work).
LATE_MIN_MS = 1.0
# A transient straggler's late steps must be outliers of the run's step time by this many robust
# standard deviations (a 3-sigma rule on the median absolute deviation).
OUTLIER_SIGMAS = 3.0
# ... and lead by at least this share of its largest lead (a save of 200 ms, not the 5 ms of jitter
# that made it late in another outlier step).
EVENT_SHARE = 0.25
TRANSIENT_MIN_STEPS = 2
# Late steps listed in the result (the first ones).
LIST_STEPS = 16


class RankSeries(msgspec.Struct):
    rank: int
    own_ms_median: float  # median own (non-collective) time per step
    late_steps: int  # steps in which this rank arrived last by a late-sized lead
    lead_ms_total: float  # sum of its leads over the aligned steps


class StragglerSeries(msgspec.Struct):
    steps: int  # aligned steps (recorded on every rank)
    step_ms_median: float
    step_ms_mean: float  # mean over the aligned steps of the ranks' median step time
    ranks: list[RankSeries]
    straggler: int | None = None
    persistent: bool = False
    late_steps: list[int] = []  # step numbers in which the straggler was late (the first LIST_STEPS)
    late_count: int = 0
    period: int | None = None
    lead_ms_median: float = 0.0  # its median lead over the steps in which it was late
    lead_ms_mean: float = 0.0  # ... and its mean (what lead_by_phase splits)
    gain_ms: float = 0.0  # its total lead / steps
    lead_by_phase: dict[str, float] = {}
    # The probe timed no forward on some rank (facts.forward_unseen): "other" holds its forward.
    forward_unseen: bool = False


# The straggler's own work, by phase: StepTiming fields ("other" is other_ms less the checkpoint
# saves it contains).
OWN_PHASES = ("dataloader_ms", "forward_ms", "optimizer_ms", "checkpoint_ms", "other_ms")


def collective_phases(sharded: bool) -> tuple[str, ...]:
    """The StepTiming phases that hold the job's collectives (see the module docstring)."""
    return ("forward_ms", "backward_ms", "comm_ms") if sharded else ("backward_ms", "comm_ms")


def own_ms(s: StepTiming, phases: Sequence[str]) -> float:
    return max(0.0, s.total_ms - sum(getattr(s, p) for p in phases))


def straggler_series(steps_by_rank: Mapping[int, Sequence[StepTiming]], sharded: bool = False,
                     skip: Collection[int] = ()) -> StragglerSeries | None:
    """The straggler over the steps every rank recorded, less steps `skip` (the first steps after
    a profiler window, say, whose export lands on one rank); None with fewer than two ranks or no
    common step after the first."""
    if len(steps_by_rank) < 2:
        return None
    phases = collective_phases(sharded)
    tables = {r: {s.step: s for s in rows if s.step > 0 and s.step not in skip} for r, rows in steps_by_rank.items()}
    ranks = sorted(tables)
    common = sorted(set.intersection(*(set(t) for t in tables.values())))
    if not common:
        return None
    own = np.array([[own_ms(tables[r][k], phases) for k in common] for r in ranks], dtype=np.float64)
    total = np.array([[tables[r][k].total_ms for k in common] for r in ranks], dtype=np.float64)
    step_ms = float(np.median(total))
    # Per step, each rank's lead over the latest of the others.
    top2 = np.sort(own, axis=0)[-2:]
    others_max = np.where(own == top2[-1], top2[0], top2[-1])
    lead = np.maximum(0.0, own - others_max)
    threshold = max(LATE_SHARE * step_ms, LATE_MIN_MS)
    late = lead > threshold
    out = StragglerSeries(
        steps=len(common), step_ms_median=round(step_ms, 3),
        step_ms_mean=round(float(np.median(total, axis=0).mean()), 3),
        ranks=[RankSeries(r, round(float(np.median(own[i])), 3), int(late[i].sum()), round(float(lead[i].sum()), 3))
               for i, r in enumerate(ranks)],
        forward_unseen=any(forward_unseen(rows) for rows in steps_by_rank.values()))
    i = int(np.argmax(lead.sum(axis=1)))
    persistent = bool(np.median(lead[i]) > threshold)
    mine = late[i] if persistent else late[i] & outliers(np.median(total, axis=0), threshold)
    if not persistent and mine.any():
        # Its events, not the jitter around them: leads of the same order as its largest.
        mine &= lead[i] >= EVENT_SHARE * float(lead[i][mine].max())
    if not mine.any() or (not persistent and mine.sum() < TRANSIENT_MIN_STEPS):
        return out
    late_at = [common[k] for k in np.flatnonzero(mine)]
    leads = lead[i][mine]
    out.straggler, out.persistent = ranks[i], persistent
    out.late_steps, out.late_count = late_at[:LIST_STEPS], len(late_at)
    out.lead_ms_median = round(float(np.median(leads)), 3)
    out.lead_ms_mean = round(float(leads.mean()), 3)
    gaps = set(np.diff(late_at).tolist())
    out.period = int(gaps.pop()) if len(late_at) >= 3 and len(gaps) == 1 and not persistent else None
    out.gain_ms = round(float((lead[i] if persistent else leads).sum()) / len(common), 3)
    out.lead_by_phase = phase_excess(tables, ranks[i], late_at, phases)
    return out


def outliers(step_ms: np.ndarray, floor: float) -> np.ndarray:
    """Steps longer than the median by OUTLIER_SIGMAS robust standard deviations (and by `floor`)."""
    med = float(np.median(step_ms))
    sigma = 1.4826 * float(np.median(np.abs(step_ms - med)))
    return step_ms > med + max(OUTLIER_SIGMAS * sigma, floor)


def phase_excess(tables: Mapping[int, Mapping[int, StepTiming]], who: int, at: Sequence[int],
                 phases: Sequence[str]) -> dict[str, float]:
    """Mean over steps `at` of `who`'s time in each phase of its own work less the other ranks'
    median (the module docstring's lead_by_phase); phases that hold collectives left out."""
    def part(s: StepTiming, p: str) -> float:
        return s.other_ms - s.checkpoint_ms if p == "other_ms" else getattr(s, p)

    out = {}
    for p in OWN_PHASES:
        if p in phases:
            continue
        diffs = [part(tables[who][k], p) - float(np.median([part(t[k], p) for r, t in tables.items() if r != who]))
                 for k in at]
        out[p.removesuffix("_ms")] = round(float(np.mean(diffs)), 3)
    return out
