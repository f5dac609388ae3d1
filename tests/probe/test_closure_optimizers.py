"""An optimizer that runs forward and backward inside ``step(closure)`` (LBFGS): the step is the
optimizer's step, from the first one on, and the profiler window records it once."""

from __future__ import annotations

from probe.livejob import load_run, run_wrapped, script

JOB = """
import torch

torch.manual_seed(0)
x, y = torch.randn(2048, 64), torch.randn(2048, 1)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1))
opt = torch.optim.LBFGS(model.parameters(), max_iter=4, history_size=4)

def closure():
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()  # 4 backward calls per step: none of them ends a step
    return loss

for step in range(6):
    opt.step(closure)
print("ok")
"""


def test_lbfgs_steps_are_optimizer_steps_and_the_window_is_recorded_once(tmp_path):
    job = script(tmp_path, JOB)
    result = run_wrapped(tmp_path / "run", job, options=("--profile-steps", "2:3"))
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
    (entry,) = load_run(tmp_path / "run")["ranks"]
    facts, analysis = entry["facts"], entry["analysis"]
    assert facts["step_source"] == "optimizer" and facts["last_step"] == 5
    for row in facts["steps"]:
        # The closures' forward and backward are not optimizer time, in step 0 too (a backward
        # boundary inside the first step used to reset the clock: optimizer_ms == total_ms).
        inner = row["forward_ms"] + row["backward_ms"] + row["optimizer_ms"]
        assert inner <= row["total_ms"] * 1.001, row
        # From step 1 on (the forward hooks attach when step 0 ends): closures are not optimizer.
        assert row["step"] == 0 or row["optimizer_ms"] < row["total_ms"] / 2, row
    # One window, over the optimizer's step 2: the analysis is of that step, not of a closure
    # profiled under a numbering the first optimizer step then replaced.
    assert analysis["window"]["steps"] == [2]
    (traced,) = analysis["steps"]
    plain = [row["total_ms"] for row in facts["steps"] if row["step"] >= 1]  # window steps left out
    assert 0.5 * min(plain) < traced["dur_ms"] < 3 * max(plain) + 50
    # The trace's split finds the closures' backward passes inside Optimizer.step (it used to give
    # them all to the optimizer: 0 ms of backward). Their forwards stay optimizer time there: the
    # trace has no marker that tells a closure's forward ops from LBFGS's own.
    backward = traced["host_split_ms"]["backward"]
    probed = sorted(row["backward_ms"] for row in facts["steps"] if row["step"] >= 1)
    assert backward > 0.25 * traced["dur_ms"]
    assert 0.3 * probed[0] < backward < 3 * probed[-1] + 20
