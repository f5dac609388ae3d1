"""HO-17: the training loop's own work in every step of a CPU-only job (code-built facts)."""

from __future__ import annotations

import pytest

from torchdoctor.facts import StepTiming

from .conftest import cpu_facts, cpu_result, gpu_facts, only, run


def steps(n: int, other: float, model: float = 4.5, rollout_every: int | None = None,
          rollout_ms: float = 0.0) -> list[StepTiming]:
    """n steps: the model's phases `model` ms (forward 3/5, backward 1/5, optimizer 1/5), `other`
    ms outside them; every `rollout_every`-th step `rollout_ms` more outside them (HO-16's)."""
    out = []
    for i in range(n):
        extra = rollout_ms if rollout_every and i and i % rollout_every == 0 else 0.0
        out.append(StepTiming(step=i, total_ms=model + other + extra, forward_ms=0.6 * model, backward_ms=0.2 * model,
                              optimizer_ms=0.2 * model, other_ms=other + extra))
    return out


def facts(timings: list[StepTiming], gpu: bool = False):
    wall = sum(s.total_ms for s in timings) / 1e3
    return (gpu_facts if gpu else cpu_facts)(steps=timings, train_wall_s=wall)


def test_an_environment_step_in_every_update_is_priced_against_the_job():
    # CleanRL's dqn.py on 2 CPUs: 4.1 ms of an 8.5 ms step outside the model (measured).
    f = facts(steps(400, 4.1, model=4.4))
    f.env_libraries = ["gymnasium"]
    got = only(run("HO-17", (None, f)), "HO-17")
    assert got.title.startswith("Each step spends 4.1 ms (48% of a 8.5 ms step) outside the model's forward")
    values = got.evidence[0].values
    assert values["loop_ms"] == pytest.approx(4.1) and values["model_ms"] == pytest.approx(4.4)
    assert got.job_s == pytest.approx(400 * 4.1 / 1e3, rel=1e-3) and got.job_pct == pytest.approx(48.2, abs=0.1)
    assert got.severity == "critical" and got.per == "job" and got.recoverable_pct == 0
    assert "AsyncVectorEnv" in got.fix.snippet and "py-spy" in got.fix.snippet
    f.env_libraries = ["torchrl", "gymnasium"]
    got = only(run("HO-17", (None, f)), "HO-17")
    assert "ParallelEnv(n, make_env)" in got.fix.snippet and "AsyncVectorEnv" not in got.fix.text + got.fix.snippet
    # tianshou's discrete_dqn.py steps 10 CartPoles in a DummyVectorEnv: 3.2 ms of a 5.3 ms step outside
    # the model (measured); its own SubprocVectorEnv is what the job would change, as SB3's SubprocVecEnv.
    f.env_libraries = ["gymnasium", "tianshou"]
    got = only(run("HO-17", (None, f)), "HO-17")
    assert "tianshou's SubprocVectorEnv (or ShmemVectorEnv) in place of DummyVectorEnv" in got.fix.text
    assert got.fix.snippet.count("ts.env.SubprocVectorEnv(") == 1 and "AsyncVectorEnv" not in got.fix.snippet
    f.env_libraries = ["gymnasium", "stable_baselines3"]
    got = only(run("HO-17", (None, f)), "HO-17")
    assert "vec_env_cls=SubprocVecEnv" in got.fix.snippet and "AsyncVectorEnv" not in got.fix.text + got.fix.snippet
    # Without an environment library (fastai's vision quick start before its optimizer was seen): no
    # environments in the advice.
    f.env_libraries = []
    got = only(run("HO-17", (None, f)), "HO-17")
    assert "nvironment" not in got.fix.text + got.fix.snippet and "DataLoader's workers" in got.fix.text


def test_two_evaluations_are_no_part_of_the_loops_own_work_over_the_job():
    # pyro's VAE example over 4 epochs on 2 CPUs: 6.1 ms of pyro's ELBO in each 15.7 ms step, and two
    # epoch-end evaluations (1.4 s and 0.3 s) that read as "2.8 s of the loop's own work, 58% of the
    # job" when summed with the steps.
    timings = []
    for i in range(188):
        extra = {47: 1388.0, 141: 290.0}.get(i, 0.0)
        timings.append(StepTiming(step=i, total_ms=15.7 + extra, dataloader_ms=1.0, forward_ms=2.1,
                                  backward_ms=4.6, optimizer_ms=1.9, other_ms=6.1 + extra))
    got = only(run("HO-17", (None, facts(timings))), "HO-17")
    values = got.evidence[0].values
    assert values["steps"] == 186 and values["loop_ms"] == pytest.approx(6.1)
    assert got.job_s == pytest.approx(186 * 6.1 / 1e3, rel=1e-3)
    assert got.job_pct == pytest.approx(100 * 186 * 6.1 / (188 * 15.7 + 1678.0), abs=0.1)
    assert got.severity == "warning"


def test_updates_that_are_a_small_part_of_the_job_are_info():
    # CleanRL's ppo.py: 40% of each update step outside the model, but a 280 ms rollout every 16
    # steps (HO-16's, left out of the steady steps) is most of the job.
    f = facts(steps(320, 3.9, model=5.8, rollout_every=16, rollout_ms=280.0))
    got = only(run("HO-17", (None, f)), "HO-17")
    assert got.severity == "info" and got.evidence[0].values["loop_pct"] == pytest.approx(40.2, abs=0.1)
    assert got.job_pct < 20


def test_small_shares_tiny_loops_and_accelerators_are_left_to_others():
    assert run("HO-17", (None, facts(steps(200, 0.3, model=9.7)))) == []  # 3% of the step
    assert run("HO-17", (None, facts(steps(200, 0.6, model=0.6)))) == []  # below 1 ms: the probe's own cost
    assert run("HO-17", (None, facts(steps(200, 4.1, model=4.4), gpu=True))) == []  # HO-5's, from the trace
    assert run("HO-17", (None, facts(steps(6, 4.1, model=4.4)))) == []  # too few steps for a median


def test_a_forward_the_probe_could_not_time_is_the_models_not_the_loops():
    """GPyTorch's SVGP example: its modules run their forward from a __call__ of their own, so the
    probe timed none and its 'other' held the model's forward: "20.3 ms of a 55.5 ms step outside
    the model's forward", a warning. The profiled steps' untraced time is 6.1 of 78.9 ms (8%)."""
    timings = [StepTiming(step=i, total_ms=55.5, dataloader_ms=10.6, backward_ms=22.0, optimizer_ms=2.6, other_ms=20.3)
               for i in range(48)]
    f = facts(timings)
    assert run("HO-17", (None, f)) == []  # no trace: it cannot tell
    r = cpu_result()
    r.host.phases_ms = {"data": 10.5, "forward": 20.1, "backward": 37.9, "optimizer": 2.9, "comm": 0.0, "other": 6.1}
    assert run("HO-17", (r, f)) == []  # 8% of the step: below the 10% it is shown from
    # Twice that untraced time is shown, as that share of the probe's steps.
    r.host.phases_ms = {**r.host.phases_ms, "other": 15.0}
    got = only(run("HO-17", (r, f)), "HO-17")
    share = 15.0 / (10.5 + 20.1 + 37.9 + 2.9 + 15.0)
    assert got.evidence[0].values["loop_ms"] == pytest.approx(55.5 * share, abs=1e-3)
    assert got.evidence[0].values["model_ms"] == pytest.approx(55.5 * 60.9 / 86.4, abs=1e-3)
    assert "the probe timed no forward" in got.evidence[0].text
