"""HO-17: the training loop's own work in every step of a CPU-only job (code-built facts)."""

from __future__ import annotations

import pytest

from torchdoctor.facts import StepTiming

from .conftest import cpu_facts, gpu_facts, only, run


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
    # Without an environment library (fastai's vision quick start before its optimizer was seen): no
    # environments in the advice.
    f.env_libraries = []
    got = only(run("HO-17", (None, f)), "HO-17")
    assert "nvironment" not in got.fix.text + got.fix.snippet and "DataLoader's workers" in got.fix.text


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
