"""Stragglers over a whole run from per-step timings (metrics/stragglers.py)."""

from __future__ import annotations

import numpy as np

from torchdoctor.facts import StepTiming
from torchdoctor.metrics.stragglers import straggler_series


def ddp_steps(n: int, own: list[float], step_ms: float = 100.0, *, phase: str = "other_ms",
              jitter: float = 0.0, seed: int = 0, longer: list[float] = (0.0,)) -> list[StepTiming]:
    """A DDP rank's steps: `own[s]` ms of its own work (in `phase`); backward holds the rest of the
    synchronous step (compute plus the wait for the latest rank); step s lasts `step_ms` plus
    `longer[s]` on every rank (the latest rank's extra work)."""
    rng = np.random.default_rng(seed)
    out = []
    for s in range(n):
        mine = own[s % len(own)] + float(rng.uniform(0, jitter))
        rest = {"dataloader_ms": 5.0, "forward_ms": 20.0, "optimizer_ms": 5.0, "other_ms": 0.0}
        rest[phase] = rest.get(phase, 0.0) + mine
        if phase == "checkpoint_ms":
            rest["other_ms"] += mine  # checkpoint time is part of "other"
        busy = rest["dataloader_ms"] + rest["forward_ms"] + rest["optimizer_ms"] + rest["other_ms"]
        total = step_ms + longer[s % len(longer)]
        out.append(StepTiming(step=s, total_ms=total, backward_ms=total - busy, **rest))
    return out


def test_a_persistent_straggler_is_named_with_its_lead_and_its_cause():
    ranks = {0: ddp_steps(40, [0.0], jitter=2.0, seed=1), 1: ddp_steps(40, [30.0], jitter=2.0, seed=2),
             2: ddp_steps(40, [0.0], jitter=2.0, seed=3)}
    s = straggler_series(ranks)
    assert s is not None and s.steps == 39  # each rank's first step is left out
    assert s.straggler == 1 and s.persistent and s.late_count == 39 and s.period is None
    assert 26.0 <= s.gain_ms <= 30.0 and 26.0 <= s.lead_ms_median <= 30.0
    assert s.lead_by_phase["other"] >= 0.8 * s.lead_ms_median and abs(s.lead_by_phase["dataloader"]) < 1e-9
    assert [r.late_steps for r in s.ranks] == [0, 39, 0]


def test_a_periodic_save_on_one_rank_is_a_transient_straggler_with_its_period():
    saving = [0.0] * 9 + [200.0]  # steps 9, 19, 29, ...: rank 0 saves a checkpoint
    ranks = {0: ddp_steps(50, saving, phase="checkpoint_ms", longer=saving), 1: ddp_steps(50, [0.0], longer=saving)}
    s = straggler_series(ranks)
    assert s.straggler == 0 and not s.persistent and s.period == 10
    assert s.late_steps == [9, 19, 29, 39, 49] and s.late_count == 5
    assert abs(s.gain_ms - 5 * 200.0 / 49) < 1e-3
    assert s.lead_by_phase["checkpoint"] == 200.0 and s.lead_by_phase["other"] == 0.0


def test_ranks_with_the_same_work_and_noise_have_no_persistent_straggler():
    ranks = {r: ddp_steps(60, [10.0], jitter=3.0, seed=r) for r in range(4)}
    s = straggler_series(ranks)
    # Jitter below the late threshold (5% of the step): nobody is late.
    assert s.straggler is None and s.gain_ms == 0.0 and not s.persistent


def test_jitter_that_makes_a_rank_late_in_ordinary_steps_is_not_a_transient_straggler():
    # Rank 1 is 8 ms late in a few steps, but those steps are no longer than the run's others
    # (step times vary by +-10 ms): scheduler noise, not a save or an evaluation.
    rng = np.random.default_rng(7)
    longer = [float(x) for x in rng.uniform(0, 20, 40)]
    late = [8.0 if s in (5, 17, 30) else 0.0 for s in range(40)]
    s = straggler_series({0: ddp_steps(40, [0.0], longer=longer), 1: ddp_steps(40, late, longer=longer)})
    assert s.straggler is None and s.ranks[1].late_steps == 3


def test_under_fsdp_the_forward_holds_collectives_and_is_not_own_work():
    # FSDP: the forward's all-gathers wait for the latest rank too; a long forward is waiting.
    a = ddp_steps(10, [40.0], phase="forward_ms")
    b = ddp_steps(10, [0.0])
    assert straggler_series({0: a, 1: b}, sharded=False).straggler == 0
    assert straggler_series({0: a, 1: b}, sharded=True).straggler is None


def test_steps_are_aligned_by_number_and_one_rank_is_not_enough():
    a, b = ddp_steps(10, [30.0]), ddp_steps(10, [0.0])[5:]
    s = straggler_series({0: a, 1: b})
    assert s.steps == 5 and s.late_steps == [5, 6, 7, 8, 9]
    assert straggler_series({0: a}) is None


def test_one_long_step_on_one_rank_is_an_event_not_a_straggler():
    once = [0.0] * 20
    once[12] = 300.0
    s = straggler_series({0: ddp_steps(20, once, longer=once), 1: ddp_steps(20, [0.0], longer=once)})
    assert s.straggler is None and s.ranks[0].late_steps == 1


def test_a_transient_straggler_s_events_are_its_late_steps_not_the_jitter_between_them():
    # Rank 0 saves (150 ms) every 8 steps; one ordinary step it is also a little late in (6 ms) is
    # an outlier of a very regular run: counted as jitter, not as one of its events.
    own = [0.0] * 40
    longer = [0.0] * 40
    for s in (7, 15, 23, 31, 39):
        own[s] = longer[s] = 150.0
    own[12] = longer[12] = 6.0
    s = straggler_series({0: ddp_steps(40, own, longer=longer), 1: ddp_steps(40, [0.0], longer=longer)})
    assert s.straggler == 0 and s.late_steps == [7, 15, 23, 31, 39] and s.period == 8
    assert abs(s.gain_ms - 5 * 150.0 / 39) < 1e-3


def test_a_straggler_whose_forward_the_probe_could_not_time_says_other_holds_it():
    """A model called as model.forward(x): its forward is in other_ms on every rank, and the cause
    must not read as logging or evaluation only."""
    from torchdoctor.rules.distributed import series_cause

    def blind(steps: list[StepTiming]) -> list[StepTiming]:
        for s in steps:
            s.other_ms, s.forward_ms = s.other_ms + s.forward_ms, 0.0
        return steps

    seen = {0: ddp_steps(40, [0.0]), 1: ddp_steps(40, [30.0], phase="forward_ms")}
    s = straggler_series(seen)
    assert not s.forward_unseen and series_cause(s)[0] == "forward"
    s = straggler_series({r: blind(steps) for r, steps in seen.items()})
    assert s.forward_unseen and s.straggler == 1 and s.lead_by_phase["other"] == 30.0
    phase, words = series_cause(s)
    assert phase == "other" and "its forward included" in words
