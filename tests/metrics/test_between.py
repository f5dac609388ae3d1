"""Work between training steps (metrics/between.py): which steps are the loop's long ones, and
what the steady steps left are."""

from __future__ import annotations

import pytest

from torchdoctor.facts import StepTiming
from torchdoctor.metrics.between import between_steps, inference_in_every_step, loop_steps, stray_steps


def two_batch_epochs(n: int = 41) -> list[StepTiming]:
    """PyG's mutag_gin.py on 188 graphs, batch 128: two training steps per epoch, then an
    evaluation over both loaders (measured: 5 ms waits and 24 ms steps; 78 ms with the evaluation:
    20 ms of no_grad forwards, 30 ms of its batches, 4 ms of Python). Every even step is long:
    half of the steps, so the median step is no steady step."""
    out = []
    for i in range(n):
        if i >= 2 and i % 2 == 0:  # the step after an epoch's evaluation
            out.append(StepTiming(step=i, total_ms=78.0, dataloader_ms=35.0, forward_ms=27.0, backward_ms=5.0,
                                  optimizer_ms=4.0, other_ms=7.0, inference_ms=20.0, epoch_starts=3))
        else:
            out.append(StepTiming(step=i, total_ms=24.0, dataloader_ms=5.0, forward_ms=7.0, backward_ms=5.0,
                                  optimizer_ms=4.0, other_ms=3.0))
    return out


def test_an_evaluation_after_every_other_step_is_measured_against_the_training_steps():
    b = between_steps(two_batch_epochs(), 2.0)
    assert b is not None and b.every == 2 and len(b.steps) == 20
    # Against the training steps (24 ms, no evaluation), not the median of all steps (51 ms).
    assert b.median_ms == 24.0
    n = len(b.steps)
    assert b.inference_ms / n == pytest.approx(20.0)
    # The evaluation's batches: the step's wait less the training batch's own 5 ms.
    assert b.data_ms / n == pytest.approx(30.0)
    assert b.rest_ms / n == pytest.approx(4.0)
    assert b.excess_ms / 1e3 == pytest.approx(20 * 54.0 / 1e3)
    # One long step more than the others (the probe leaves the profiled steps 5-7 untimed): the
    # median step is an evaluating one; the quickest steps still are training steps.
    b = between_steps([s for s in two_batch_epochs() if s.step not in (5, 6, 7)], 2.0)
    assert b is not None and b.every == 2 and len(b.steps) == 19 and b.median_ms == 24.0


def test_a_first_evaluation_that_compiles_is_a_one_off_not_the_pattern():
    # PyG's compiled GIN (examples/compile/gin.py, torch 2.14.1): the first evaluation recompiles the
    # model for no_grad, 10 s in step 2; every later one costs 54 ms. A mean over the long steps read
    # 145 ms of work each time, 14.2 s in all, the compile counted again beside CG-3's 10 s.
    steps = two_batch_epochs()
    steps[2] = StepTiming(step=2, total_ms=10_024.0, dataloader_ms=35.0, forward_ms=9_973.0, backward_ms=5.0,
                          optimizer_ms=4.0, other_ms=7.0, inference_ms=9_966.0, epoch_starts=3)
    b = between_steps(steps, 60.0)
    assert b is not None and b.every == 2 and len(b.steps) == 19
    assert [s.step for s in b.one_offs] == [2]
    assert b.excess_ms / len(b.steps) == pytest.approx(54.0) and b.excess_ms == pytest.approx(19 * 54.0)
    # The one-off is no steady step either.
    assert [s.step for s in loop_steps(steps)] == [0, *range(1, 41, 2)]
    # Three such steps are a pattern of their own (an evaluation every 1,000 steps beside logging
    # every 10): priced, not left out.
    for i in (12, 22):
        steps[i] = StepTiming(**{**{f: getattr(steps[2], f) for f in steps[2].__struct_fields__}, "step": i})
    b = between_steps(steps, 60.0)
    assert b is not None and not b.one_offs and len(b.steps) == 20
    assert b.excess_ms == pytest.approx(17 * 54.0 + 3 * (9_966.0 + 30.0 + 4.0 + 20.0 - 20.0))


def test_the_steady_steps_leave_a_regular_pattern_out_and_keep_irregular_slow_steps():
    steps = two_batch_epochs()
    kept = loop_steps(steps)
    assert [s.step for s in kept] == [0, *range(1, 41, 2)]
    # A few slow steps at no period: the machine's perhaps, not the loop's; a median does not see them.
    irregular = [StepTiming(step=i, total_ms=210.0 if i in (7, 31, 90, 97, 180, 250) else 10.0, other_ms=200.0
                            if i in (7, 31, 90, 97, 180, 250) else 0.0) for i in range(300)]
    assert between_steps(irregular, None) is not None and len(loop_steps(irregular)) == 300


def vae_with_two_evaluations() -> list[StepTiming]:
    """pyro's VAE example (examples/vae/vae.py, -n 4 -tf 2) as measured: 47 steps of 15.7 ms per
    epoch, 1.0 ms of it the batch and 6.1 ms pyro's ELBO outside the modules; the first steps of
    epochs 1 and 3 also hold the test set's ELBO and the loss plot, 1.4 s and 0.3 s."""
    out = []
    for i in range(188):
        extra = {47: 1388.0, 141: 290.0}.get(i, 0.0)
        out.append(StepTiming(step=i, total_ms=15.7 + extra, dataloader_ms=1.0, forward_ms=2.1, backward_ms=4.6,
                              optimizer_ms=1.9, other_ms=6.1 + extra, epoch_starts=2 if extra else 0))
    return out


def test_one_or_two_long_steps_are_no_pattern_and_no_steady_steps():
    steps = vae_with_two_evaluations()
    assert between_steps(steps, 4.9) is None  # two are no pattern for HO-16
    assert [s.step for s in stray_steps(steps)] == [47, 141]
    kept = loop_steps(steps)
    assert len(kept) == 186 and max(s.total_ms for s in kept) == pytest.approx(15.7)
    # Three are a pattern, priced by HO-16 and left out as before; none, nothing to leave out.
    steps[94] = StepTiming(step=94, total_ms=305.7, dataloader_ms=1.0, other_ms=296.1)
    assert stray_steps(steps) == [] and between_steps(steps, 4.9) is not None
    assert stray_steps([s for s in steps if s.step not in (47, 94, 141)]) == []


def test_strays_are_found_beside_the_machines_jitter_and_a_one_off():
    # A 9 ms pause in one more step is long too (beyond max(7.85, 5) ms), but the machine's jitter
    # next to the evaluations: it stays, and they still go.
    steps = vae_with_two_evaluations()
    steps[100] = StepTiming(step=100, total_ms=24.7, dataloader_ms=1.0, forward_ms=2.1, backward_ms=4.6,
                            optimizer_ms=1.9, other_ms=15.1)
    assert [s.step for s in stray_steps(steps)] == [47, 141]
    assert len(loop_steps(steps)) == 186
    # Beside a one-off far beyond them (a first evaluation that compiled), all three go.
    steps[10] = StepTiming(step=10, total_ms=30_015.7, dataloader_ms=1.0, other_ms=30_006.1)
    assert [s.step for s in stray_steps(steps)] == [10, 47, 141]
    # One evaluation alone is a stray as well.
    one = [s for s in vae_with_two_evaluations() if s.step != 141]
    assert [s.step for s in stray_steps(one)] == [47]


def test_a_slow_batch_beside_a_target_networks_forward_is_no_evaluation():
    # A DQN's target network in every step (frozen, the step's own) and a 40 ms batch once: no
    # evaluation, so not a long step either (it read as an evaluation's batch, then as a stray).
    steps = [StepTiming(step=i, total_ms=10.0 + (40.0 if i == 30 else 0.0), dataloader_ms=1.0 + (40.0 if i == 30 else 0.0),
                        forward_ms=4.0, inference_ms=2.0, frozen_inference_ms=2.0, backward_ms=3.0, optimizer_ms=1.0,
                        other_ms=1.0) for i in range(100)]
    assert stray_steps(steps) == [] and between_steps(steps, 1.0) is None
    assert len(loop_steps(steps)) == 100


def test_a_minority_of_long_steps_is_priced_as_before():
    # Every 16th step 400 ms longer (CleanRL's PPO rollout): the first pass's median already is a
    # training step; the second pass over the others gives the same.
    steps = [StepTiming(step=i, total_ms=410.0 if i and i % 16 == 0 else 10.0, forward_ms=2.0, backward_ms=3.0,
                        optimizer_ms=2.0, other_ms=403.0 if i and i % 16 == 0 else 3.0) for i in range(320)]
    b = between_steps(steps, None)
    assert b is not None and b.every == 16 and len(b.steps) == 19 and b.median_ms == 10.0
    assert b.excess_ms == pytest.approx(19 * 400.0)


def test_a_burst_of_slow_steps_is_no_period():
    # Steps 8-12 slow one after another (contention, a slow start): long, but not "every step".
    steps = [StepTiming(step=i, total_ms=30.0 if 8 <= i <= 12 else 10.0, other_ms=20.0 if 8 <= i <= 12 else 0.0)
             for i in range(40)]
    b = between_steps(steps, None)
    assert b is not None and b.every is None and len(loop_steps(steps)) == 40


def test_forwards_of_modules_that_never_train_are_the_steps_own():
    # A DQN target network's forward in every update: frozen, not an evaluation after each step.
    steady = [StepTiming(step=i, total_ms=30.0, forward_ms=16.0, inference_ms=9.0, frozen_inference_ms=9.0)
              for i in range(100)]
    assert inference_in_every_step(steady, 3.0) is None
    for s in steady:
        s.frozen_inference_ms = 0.0  # the trained model's own forward (PyG's gcn.py evaluating)
    b = inference_in_every_step(steady, 3.0)
    assert b is not None and b.every == 1 and b.inference_ms == pytest.approx(900.0) and b.job_pct == pytest.approx(30.0)


def test_steps_that_vary_by_themselves_are_no_work_between_steps():
    # pytorch/examples' actor_critic.py: one CartPole episode per update, episodes of 10 to 500
    # environment steps, longer as the agent learns: most updates are "long", at no period.
    lengths = [20.0 + (i * 7919 % 97) * (1 + i / 50) for i in range(400)]
    steps = [StepTiming(step=i, total_ms=ms, forward_ms=5.0, other_ms=ms - 5.0) for i, ms in enumerate(lengths)]
    assert between_steps(steps, None) is None
