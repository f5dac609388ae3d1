"""HO-16: work between training steps, from the probe's timing of every step (code-built facts)."""

from __future__ import annotations

import pytest

from torchdoctor.facts import DataLoaderFacts, StepTiming

from .conftest import cpu_facts, only, run, run_all


def steps(n: int, every: int | None, extra: float, inference: float = 0.0, base: float = 10.0,
          save_ms: float = 0.0, jitter: tuple[int, ...] = ()) -> list[StepTiming]:
    """n steps of `base` ms; every `every`-th (from step `every`) `extra` ms longer, `inference` of
    it in forwards without autograd; steps in `jitter` 25 ms longer (the machine's, not the loop's)."""
    out = []
    for i in range(n):
        long = every is not None and i >= 1 and i % every == 0
        total = base + (extra if long else 0.0) + (25.0 if i in jitter else 0.0) + (save_ms if long else 0.0)
        out.append(StepTiming(step=i, total_ms=total, forward_ms=2.0 + (inference if long else 0.0),
                              backward_ms=3.0, optimizer_ms=2.0, other_ms=total - 7.0 - (inference if long else 0.0),
                              inference_ms=inference if long else 0.0, checkpoint_ms=save_ms if long else 0.0,
                              checkpoint_saves=1 if long and save_ms else 0))
    return out


def facts(timings: list[StepTiming], **kw):
    wall = sum(s.total_ms for s in timings) / 1e3
    return cpu_facts(steps=timings, train_wall_s=wall, **kw)


def test_a_rollout_every_16_steps_is_priced_against_the_job():
    # CleanRL's ppo.py: 400 ms every 16 steps of 10 ms, 90 ms of it in no_grad forwards.
    f = facts(steps(320, 16, 400.0, inference=90.0), inference_site="ppo.py:122 (Agent.get_action_and_value)",
              env_libraries=["gymnasium"])
    got = only(run("HO-16", (None, f)), "HO-16")
    n = 19  # steps 16, 32, ..., 304
    assert got.title.startswith("Every 16 steps the training loop stops for 400.0 ms of work between steps")
    assert f"({n} times, {n * 0.4:.1f} s" in got.title and "90.0 ms in the model's forwards without autograd" in got.title
    assert "310.0 ms outside the model (Python: environment steps, metrics, logging)" in got.title
    assert "without autograd (an evaluation or a rollout)" in got.title
    total = sum(s.total_ms for s in f.steps) / 1e3
    assert got.job_s == round(n * 0.4, 3) and abs(got.job_pct - 100 * n * 0.4 / total) < 0.1
    assert got.severity == "critical" and got.recoverable_pct == 0 and got.per == "job"
    assert "AsyncVectorEnv" in got.fix.snippet and "--profile-steps 16:17" in got.confirm
    assert "called at ppo.py:122 (Agent.get_action_and_value)" in got.evidence[0].text
    # A job without environments (fastai's vision quick start) is not told to step them.
    f.env_libraries = []
    got = only(run("HO-16", (None, f)), "HO-16")
    assert "nvironment" not in got.fix.text + got.fix.snippet and "py-spy" in got.fix.snippet
    assert "nvironment" not in got.title and "rollout" not in got.title
    assert "310.0 ms outside the model (Python: metrics, logging, saves other than torch.save's)" in got.title
    rollouts, f.steps = f.steps, steps(320, 16, 400.0, inference=350.0)  # mostly forwards: an evaluation's advice
    got = only(run("HO-16", (None, f)), "HO-16")
    assert "run that evaluation less often" in got.fix.text and "environment" not in got.fix.text
    f.env_libraries = ["gymnasium"]
    got = only(run("HO-16", (None, f)), "HO-16")
    assert "run that evaluation or rollout less often" in got.fix.text and "environment step" in got.fix.text
    f.env_libraries, f.steps = [], rollouts
    # torchrl's getting-started DQN (a Collector over GymEnv("CartPole-v1")): 67 ms every 10 steps, 38 ms
    # of it outside the model; gymnasium's AsyncVectorEnv is not what a torchrl job changes.
    f.env_libraries = ["gymnasium", "torchrl"]
    got = only(run("HO-16", (None, f)), "HO-16")
    assert "torchrl's ParallelEnv" in got.fix.text and "MultiSyncCollector" in got.fix.text
    assert got.fix.snippet.startswith("env = ParallelEnv(n, make_env)") and "AsyncVectorEnv" not in got.fix.snippet


def test_an_evaluation_made_of_forwards_gets_the_inference_fix():
    f = facts(steps(200, 50, 600.0, inference=500.0), inference_site="train.py:88")
    got = only(run("HO-16", (None, f)), "HO-16")
    assert got.title.startswith("Every 50 steps") and "inference_mode" in got.fix.text
    assert "(called at train.py:88)" in got.fix.text
    # torchvision's evaluate() already runs under torch.inference_mode(): not advised again.
    f.inference_mode = True
    got = only(run("HO-16", (None, f)), "HO-16")
    assert "on fewer samples and batch it" in got.fix.text and "under torch.inference_mode()" not in got.fix.text


def test_a_trainers_evaluation_gets_its_own_settings():
    # Hugging Face Trainer with eval_strategy="steps", eval_steps=20 (measured: 738 ms per
    # evaluation, the Trainer's own eval_runtime 0.68-0.79 s): the site names the Trainer.
    f = facts(steps(100, 20, 700.0, inference=680.0), inference_site="transformers's Trainer.train() at train.py:23")
    got = only(run("HO-16", (None, f)), "HO-16")
    assert "eval_steps" in got.fix.text and "eval_dataset=eval_ds.select" in got.fix.snippet
    f = facts(steps(100, 20, 700.0, inference=680.0), inference_site="train.py:35 (Net.validation_step), from lightning's Trainer.fit() at train.py:45")
    assert "limit_val_batches" in only(run("HO-16", (None, f)), "HO-16").fix.snippet


def test_a_stable_baselines3_rollout_gets_more_environments_per_forward():
    # The docs' CartPole PPO (n_envs=4): HO-16 said "run that evaluation or rollout less often", which for a
    # rollout changes the algorithm; n_envs=16 at n_steps=512 (the same 8,192 transitions) ran 1.2-1.5x faster.
    f = facts(steps(100, 20, 700.0, inference=680.0),
              inference_site="stable_baselines3's PPO.learn() at /job/ppo_cartpole.py:8")
    got = only(run("HO-16", (None, f)), "HO-16")
    assert got.fix.text.startswith("Most of it is the policy's forwards of the rollout")
    assert "less often" not in got.fix.text and "n_envs up, n_steps down" in got.fix.text
    assert "make_vec_env(env_id, n_envs=16)" in got.fix.snippet and "n_steps=2048 * 4 // 16" in got.fix.snippet
    # SAC has no n_steps (it collects train_freq steps between updates): the general advice stays.
    f.inference_site = "stable_baselines3's SAC.learn() at /job/sac.py:12"
    assert "n_steps" not in only(run("HO-16", (None, f)), "HO-16").fix.snippet


def test_saves_are_di15s_and_jitter_is_not_the_loops():
    # The long steps are checkpoint saves: DI-15 prices them, HO-16 stays silent.
    assert run("HO-16", (None, facts(steps(200, 10, 0.0, save_ms=200.0)))) == []
    # A few slow steps that are the machine's, next to a rollout: left out of the count and period.
    got = only(run("HO-16", (None, facts(steps(200, 20, 300.0, jitter=(3, 55, 101, 150))))), "HO-16")
    assert got.title.startswith("Every 20 steps") and "(9 times," in got.title


def test_irregular_slow_steps_are_info_and_small_costs_are_silent():
    irregular = steps(300, None, 0.0)
    for i in (7, 31, 90, 97, 180, 250):
        irregular[i].total_ms += 200.0
        irregular[i].other_ms += 200.0
    got = only(run("HO-16", (None, facts(irregular))), "HO-16")
    assert got.severity == "info" and got.title.startswith("At 6 irregular steps")
    # 12 ms more every 50 steps of 10 ms: 2% of the job, below the floor.
    assert run("HO-16", (None, facts(steps(500, 50, 12.0)))) == []
    assert run("HO-16", (None, facts(steps(6, 2, 400.0)))) == []  # too few steps to have a median


def test_a_steady_job_stays_healthy():
    found = run_all((None, facts(steps(300, None, 0.0))))
    assert not [f for f in found if f.id == "HO-16"]


def test_the_other_rules_read_the_training_steps_between_the_evaluations():
    # An evaluation after every other step (PyG's mutag_gin.py: two batches per epoch): half of
    # the steps hold it. the input finding prices the training loader's wait in the training steps (5 of 24 ms),
    # not the evaluation's batches, which HO-16 prices against the job.
    from tests.metrics.test_between import two_batch_epochs

    f = facts(two_batch_epochs(), dataloaders=[DataLoaderFacts(num_workers=0, batch_size=128)])
    found = run_all((None, f))
    dl2 = only(found, "DL-2")  # the input finding of a loader without workers
    assert dl2.evidence[0].values["data_wait_ms"] == 5.0 and dl2.evidence[0].values["step_ms"] == 24.0
    assert "waits 5.0 ms (21%)" in dl2.title
    ho16 = only(found, "HO-16")
    assert ho16.title.startswith("Every 2 steps the training loop stops for 54.0 ms")


def test_a_profiler_window_that_holds_an_evaluation_step_is_said_to():
    from tests.metrics.test_between import two_batch_epochs

    from .conftest import cpu_result

    timings = [s for s in two_batch_epochs() if s.step not in (5, 6, 7)]  # the probe leaves profiled steps untimed
    r = cpu_result()
    r.window.steps = [5, 6, 7]
    got = only(run("HO-16", (r, facts(timings))), "HO-16")
    note = got.evidence[-1]
    assert note.values == {"window_steps": [5, 6, 7], "long_steps_in_window": [6]}
    assert note.text.startswith("The profiler window (steps 5–7) holds step 6, where this work recurs")
    r.window.steps = [7]
    assert "window_steps" not in only(run("HO-16", (r, facts(timings))), "HO-16").evidence[-1].values


def test_an_evaluation_after_every_step_is_priced_though_no_step_stands_out():
    # PyG's gcn.py: each epoch is one full-graph update, then a full-graph forward under no_grad.
    timings = [StepTiming(step=i, total_ms=30.0, forward_ms=16.0, backward_ms=8.0, optimizer_ms=2.0, other_ms=4.0,
                          inference_ms=9.0) for i in range(200)]
    f = facts(timings, inference_site="gcn.py:90 (test), from gcn.py:106")
    got = only(run("HO-16", (None, f)), "HO-16")
    assert got.title.startswith("After every training step the loop runs the model's forwards without autograd for "
                                "9.0 ms (30% of a 30.0 ms step)")
    assert got.job_s == pytest.approx(200 * 9.0 / 1e3, rel=1e-3) and got.job_pct == pytest.approx(30.0, abs=0.1)
    assert got.severity == "critical" and got.evidence[0].values["every_steps"] == 1
    assert "(called at gcn.py:90 (test), from gcn.py:106)" in got.fix.text and "less often" in got.fix.text
    # An RL policy's action in each update (CleanRL's dqn.py: 0.4 ms of 8.5 ms) is not an evaluation.
    acting = [StepTiming(step=i, total_ms=8.5, forward_ms=2.6, backward_ms=0.9, optimizer_ms=1.0, other_ms=4.0,
                         inference_ms=0.4) for i in range(200)]
    assert run("HO-16", (None, facts(acting))) == []


def test_a_small_pattern_does_not_hide_an_evaluation_in_every_step():
    # gcn.py's evaluation after every step, and 20 ms of logging every 50 steps (1% of the job).
    timings = [StepTiming(step=i, total_ms=30.0 + (20.0 if i and i % 50 == 0 else 0.0), forward_ms=16.0,
                          backward_ms=8.0, optimizer_ms=2.0, other_ms=4.0 + (20.0 if i and i % 50 == 0 else 0.0),
                          inference_ms=9.0) for i in range(200)]
    got = only(run("HO-16", (None, facts(timings))), "HO-16")
    assert got.title.startswith("After every training step") and got.job_pct == pytest.approx(100 * 197 * 9.0 / 6060.0, abs=0.1)
