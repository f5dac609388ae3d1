"""Helpers over the probe's facts (facts.py)."""

from __future__ import annotations

from torchdoctor.facts import StepTiming, forward_unseen, sampled_comm_median


def test_the_comm_median_is_over_the_steps_ddp_sampled():
    # DDP times iterations 1-10, then 2 in every 100: the others read 0 and are no measurement.
    steps = [StepTiming(step=i, total_ms=10.0, comm_ms=c, comm_sampled=True) for i, c in enumerate([4.0, 0.0, 2.0])]
    steps += [StepTiming(step=i, total_ms=10.0) for i in range(3, 40)]
    assert sampled_comm_median(steps) == 2.0  # a sampled step with its collective hidden counts
    # Run directories from before the mark: the steps with a positive comm_ms.
    old = [StepTiming(step=i, total_ms=10.0, comm_ms=c) for i, c in enumerate([4.0, 0.0, 2.0, 0.0])]
    assert sampled_comm_median(old) == 3.0
    assert sampled_comm_median([StepTiming(step=1, total_ms=10.0)]) == 0.0


def test_a_forward_is_unseen_only_when_backward_ran_without_one():
    blind = [StepTiming(step=0, total_ms=9.0, forward_ms=3.0), StepTiming(step=1, total_ms=9.0, backward_ms=4.0)]
    assert forward_unseen(blind)
    assert not forward_unseen([*blind, StepTiming(step=2, total_ms=9.0, forward_ms=2.0, backward_ms=4.0)])
    assert not forward_unseen([StepTiming(step=1, total_ms=9.0)])  # no backward: nothing to say
    assert not forward_unseen(blind[:1])  # step 0 alone: the hooks go on at its end
