"""Work between training steps, from the probe's timing of every step (facts.StepTiming).

A loop that stops every N steps for work of its own (an RL rollout between policy updates, an
evaluation every epoch, logging) spends that time in a few long steps. HO-16 prices it against the
job; every other rule reads the steady step, which must leave those long steps out.

Definitions, over the steps after step 0 (warm-up included: an evaluation early in the run is a
long step, not warm-up):
- own(s) = (inference, data, rest) ms of step s outside its training phases: the model's forwards
  without autograd (``inference_ms``); in a step that ran such forwards, its batch waits beyond the
  training loader's typical wait (the median wait of the steps without them: an evaluation's
  loader); and the rest of ``other_ms`` less checkpoint saves (DI-15's) and DataLoader restarts
  (DL-6's). The forward, backward and optimizer with autograd are the training step's own.
- The reference steps stand for the steady step. First the quickest REFERENCE_QUANTILE of the steps
  (wall time at most that quantile's); then, when that found at least MIN_LONG_STEPS long steps and
  as many others, the steps it did not find long. The median of every step is no reference when the
  long steps are half of them or more (an evaluation after every other step: a two-batch epoch);
  the quickest steps are training steps whenever any are, and the second pass measures against all
  the steps that are the loop's own, so that the jitter of a steady job is judged as before.
- excess(s) = sum over the three parts of max(0, own(s) - the reference steps' median of that part);
  s is long when excess(s) >= max(LONG_SHARE x the reference steps' median step, LONG_MIN_MS), and
  long steps with less than JITTER_SHARE of the median long excess are left out as the machine's
  jitter, and fewer than MIN_LONG_STEPS with more than ONE_OFF_FACTOR times it as one-offs
  (``one_offs``: the first evaluation compiling its graph, priced by the compile findings; PyG's
  compiled GIN: 10.0 s once, 56 ms at every later evaluation, which a mean over the long steps read
  as 145 ms each).
- strays: one or two long steps (fewer than MIN_LONG_STEPS) are no pattern and no finding, but the
  steady steps leave them out too (``stray_steps``): sums over the steps would count them.
- every: the steps between long steps when at least REGULAR_SHARE of the gaps equal the median gap
  (+-1) and that gap is 2 or more; None (irregular) otherwise. Irregular long steps that are more
  than MAX_IRREGULAR_SHARE of the steps are no finding: the steps themselves vary (pytorch/examples'
  actor_critic.py, one episode per update: 549 of 803 updates longer than the quickest ones).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..facts import StepTiming

LONG_SHARE = 0.5
LONG_MIN_MS = 5.0
# Fewer long steps than this are one-offs (a first evaluation's compile, a stray pause): not a
# pattern of the loop.
MIN_LONG_STEPS = 3
# Steps the probe must have recorded after step 0 for a median to stand for the steady step.
MIN_STEPS = 8
REGULAR_SHARE = 0.6
REFERENCE_QUANTILE = 25.0  # percent
# Irregular long steps beyond this share of the steps are the steps' own spread (RL episodes of
# every length, steps that grow as the agent learns), not work between steps.
MAX_IRREGULAR_SHARE = 0.25
# Forwards without autograd in every step count from this share of the median step and this time.
EVERY_STEP_SHARE = 0.05
EVERY_STEP_MIN_MS = 1.0
JITTER_SHARE = 0.25
ONE_OFF_FACTOR = 10.0


@dataclass
class Between:
    """The work between steps of one rank, from the probe's step timings (ms unless said)."""

    steps: list[StepTiming]  # the long steps
    median_ms: float  # the median step of the reference (steady) steps
    excess_ms: float  # the long steps' work outside the training phases beyond the reference's
    inference_ms: float  # of it, in the model's forwards without autograd
    data_ms: float  # of it, waiting for batches
    every: int | None  # steps between long steps, when regular
    train_wall_s: float  # the job's training wall time (s) it is a share of
    recorded: int  # the steps it was found in
    one_offs: tuple[StepTiming, ...] = ()  # long steps far beyond the pattern's, left out of it

    @property
    def rest_ms(self) -> float:
        return max(0.0, self.excess_ms - self.inference_ms - self.data_ms)

    @property
    def job_pct(self) -> float:
        return 100.0 * self.excess_ms / 1e3 / self.train_wall_s if self.train_wall_s > 0 else 0.0


def rest_ms(s: StepTiming) -> float:
    """The step's time outside the loader, the model's phases and collectives, less checkpoint saves
    (DI-15's) and DataLoader restarts (DL-6's), ms: the loop's own work."""
    return max(0.0, s.other_ms - s.checkpoint_ms - s.loader_iter_ms)


def evaluating_ms(s: StepTiming) -> float:
    """The step's forwards without autograd that are not its own (an evaluation, a rollout): its
    ``inference_ms`` less the frozen part (a target network's, gradient caching's feature pass)."""
    return max(0.0, s.inference_ms - s.frozen_inference_ms)


def own_parts(s: StepTiming, train_wait_ms: float) -> tuple[float, float, float]:
    """(forwards without autograd, an evaluation's batch waits, the rest outside the training
    phases) of step ``s``, ms (the module's own(s); ``train_wait_ms``: the training loader's
    typical wait, which a step that also evaluated paid for its own batch). A DQN's target network
    in every step is the step's own: with it counted, no step was without an evaluation, and every
    batch wait read as an evaluation's."""
    inference = evaluating_ms(s)
    data = max(0.0, s.dataloader_ms - train_wait_ms) if inference > 0 else 0.0
    return inference, data, rest_ms(s)


def _long(total: np.ndarray, own: np.ndarray, ref: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """(reference median step, parts beyond the reference's, long-step mask) against ``ref``'s steps."""
    median = float(np.median(total[ref]))
    beyond = np.maximum(own - np.median(own[ref], axis=0), 0.0)
    return median, beyond, beyond.sum(axis=1) >= max(LONG_SHARE * median, LONG_MIN_MS)


def _long_steps(steps: list[StepTiming]) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
    """(reference median step, parts beyond the reference's, the long steps' indices, the one-offs'
    indices) of ``steps``: long by ``_long``, less the machine's jitter; one-offs apart."""
    waits = [s.dataloader_ms for s in steps if evaluating_ms(s) <= 0]
    train_wait = float(np.median(waits)) if waits else 0.0
    own = np.array([own_parts(s, train_wait) for s in steps])  # steps x (inference, data, rest)
    total = np.array([s.total_ms for s in steps])
    median, beyond, long = _long(total, own, total <= np.percentile(total, REFERENCE_QUANTILE))
    if long.sum() >= MIN_LONG_STEPS and (~long).sum() >= MIN_LONG_STEPS:
        median, beyond, long = _long(total, own, ~long)
    excess = beyond.sum(axis=1)
    idx = np.flatnonzero(long)
    if idx.size == 0:
        return median, beyond, idx, idx
    # Long steps far shorter than the typical long one are the machine's jitter (a slow step now
    # and then), not the loop's work: left out, they do not blur its period.
    typical = float(np.median(excess[idx]))
    idx = idx[excess[idx] >= JITTER_SHARE * typical]
    # A few long steps far beyond the typical one are one-offs; as many as a pattern (an evaluation
    # every 1,000 steps beside logging every 10) are the loop's work and stay.
    far = excess[idx] > ONE_OFF_FACTOR * typical
    if 0 < far.sum() < MIN_LONG_STEPS:
        return median, beyond, idx[~far], idx[far]
    return median, beyond, idx, idx[:0]


def long_steps(timings: list[StepTiming], train_wall_s: float | None) -> tuple[Between | None, list[StepTiming]]:
    """One pass over a rank's steps: (the pattern of work between steps, ``between_steps``; the
    stray long steps, ``stray_steps``). At most one of the two is non-empty."""
    steps = [s for s in timings if s.step >= 1]
    if len(steps) < MIN_STEPS:
        return None, []
    median, beyond, idx, far = _long_steps(steps)
    if idx.size < MIN_LONG_STEPS:
        return None, [steps[i] for i in sorted([*idx.tolist(), *far.tolist()])]
    inference, data, rest = beyond[idx].sum(axis=0).tolist()
    picked = [steps[i] for i in idx.tolist()]
    gaps = [b.step - a.step for a, b in zip(picked, picked[1:], strict=False)]
    mid = int(np.median(gaps))
    # Long steps one after another are a burst (contention, a slow start), not a period.
    every = mid if mid > 1 and sum(abs(g - mid) <= 1 for g in gaps) >= REGULAR_SHARE * len(gaps) else None
    if every is None and len(picked) > MAX_IRREGULAR_SHARE * len(steps):
        return None, []
    wall = train_wall_s or sum(s.total_ms for s in timings) / 1e3
    one_offs = tuple(steps[i] for i in far.tolist())
    return Between(picked, median, inference + data + rest, inference, data, every, wall, len(steps), one_offs), []


def stray_steps(timings: list[StepTiming]) -> list[StepTiming]:
    """The long steps of a run that has too few of them for a pattern (fewer than MIN_LONG_STEPS
    once the machine's jitter is left out), with any one-offs beside them: an evaluation at the end
    of each of two epochs, a plot drawn once. No finding prices them, but a sum over the steps
    does: pyro's VAE example over 4 epochs, evaluating after epochs 0 and 2, spent 1.4 s and 0.3 s
    in two of its 185 recorded steps of 15.7 ms, and HO-17 read "2.8 s of the loop's own work, 58%
    of the job" (1.2 s, 24%, without them) while the data wait's share fell from 7.0% to 4.9%.
    Empty where there are none, or enough for ``between_steps`` to judge."""
    return long_steps(timings, None)[1]


def between_steps(timings: list[StepTiming], train_wall_s: float | None) -> Between | None:
    """The long steps of a rank's run and what they hold (None without a pattern of them)."""
    return long_steps(timings, train_wall_s)[0]


def inference_in_every_step(steady: list[StepTiming], train_wall_s: float | None) -> Between | None:
    """An evaluation or a rollout after every training step (PyG's gcn.py: a full-graph forward
    without autograd after each update), which no step stands out for: the steady steps' forwards
    without autograd of modules that train (a DQN target network's or a distillation teacher's
    are the step's own), as a Between with ``every`` 1 whose ``steps`` are the steady steps that
    ran them. None unless they run in most steady steps for at least EVERY_STEP_SHARE of the median
    step and EVERY_STEP_MIN_MS (an RL policy's action in each update is less)."""
    if len(steady) < MIN_STEPS:
        return None
    inference = np.array([evaluating_ms(s) for s in steady])
    median_step = float(np.median([s.total_ms for s in steady]))
    mid = float(np.median(inference))
    if mid < max(EVERY_STEP_MIN_MS, EVERY_STEP_SHARE * median_step):
        return None
    picked = [s for s, ms in zip(steady, inference.tolist(), strict=True) if ms > 0]
    total = float(inference.sum())
    wall = train_wall_s or sum(s.total_ms for s in steady) / 1e3
    return Between(picked, median_step, total, total, 0.0, 1, wall, len(steady))


def loop_steps(timings: list[StepTiming],
               found: tuple[Between | None, list[StepTiming]] | None = None) -> list[StepTiming]:
    """``timings`` less the long steps of a regular pattern of work between steps (``found``, else
    ``long_steps(timings)``: the pattern, with a period, and the strays) and its one-offs, or,
    without a pattern, the one or two stray long steps (``stray_steps``): what the steady step is
    made of. Irregular long steps of a pattern stay (they may be the machine's, and a median does
    not see a few)."""
    b, strays = found if found is not None else long_steps(timings, None)
    if b is not None and b.every is None:
        return list(timings)
    out = {id(s) for s in ((*b.steps, *b.one_offs) if b is not None else strays)}
    return [s for s in timings if id(s) not in out]


def between_work(s: StepTiming) -> tuple[float, float, float]:
    """Work in step ``s`` that is not the training step's, as the probe times it, ms: (an evaluation's
    forwards, ``evaluating_ms``; checkpoint saves; DataLoader restarts)."""
    return evaluating_ms(s), s.checkpoint_ms, s.loader_iter_ms


def between_work_ms(s: StepTiming) -> float:
    """``between_work`` in all, ms."""
    return sum(between_work(s))


def profiled_strays(profiled: list[StepTiming], timed: list[StepTiming]) -> list[StepTiming]:
    """The profiler's steps that held work between training steps: more ``between_work_ms`` than the
    steady steps' (``timed``) usual by LONG_SHARE of their median step (and LONG_MIN_MS). timm's
    train.py with 6 steps an epoch: step 6 of the default window 5-7 evaluated (1.6 s), recompiled
    for it and saved (0.25 s), 2.6 s against a steady 145 ms, and the window's shares and its mean
    step were that evaluation's. Their own times are the profiler's too, so only the work the probe
    names counts. Empty without MIN_STEPS steady steps to compare with."""
    if not profiled or len(timed) < MIN_STEPS:
        return []
    steady_ms = float(np.median([s.total_ms for s in timed]))
    usual = float(np.median([between_work_ms(s) for s in timed]))
    floor = max(LONG_SHARE * steady_ms, LONG_MIN_MS)
    return [s for s in profiled if between_work_ms(s) - usual >= floor]


def clean_profiled_range(profiled: list[StepTiming], strays: list[StepTiming],
                         steady_ms: float) -> tuple[int, int] | None:
    """The longest run of consecutive profiled steps without a stray, as steps [first, end); of runs
    as long, the one whose median step is nearest ``steady_ms``. None when every step is a stray."""
    bad = {s.step for s in strays}
    runs: list[list[StepTiming]] = []
    for s in sorted(profiled, key=lambda s: s.step):
        if s.step in bad:
            continue
        if runs and runs[-1][-1].step == s.step - 1:
            runs[-1].append(s)
        else:
            runs.append([s])
    if not runs:
        return None
    best = min(runs, key=lambda run: (-len(run), abs(float(np.median([s.total_ms for s in run])) - steady_ms)))
    return best[0].step, best[-1].step + 1
