"""What marks a step when optimizers are unusual: one that runs forward and backward inside
``step(closure)`` (LBFGS), and several optimizers, alternating (a GAN) or one after the other
(layer-wise training)."""

from __future__ import annotations

from probe.livejob import load_run, run_wrapped, script

JOB = """
import torch

torch.manual_seed(0)
x, y = torch.randn(4096, 128), torch.randn(4096, 1)
model = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.Tanh(), torch.nn.Linear(512, 1))
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


SEVERAL = """
import torch

torch.manual_seed(0)
x = torch.randn(256, 32)
a, b = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)
opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=0.01), torch.optim.SGD(b.parameters(), lr=0.01)
for _ in range(6):  # alternating, as a GAN's two optimizers: one step each per iteration
    for model, opt in ((a, opt_a), (b, opt_b)):
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
for _ in range(8):  # then b alone, as layer-wise training moves on to the next layer
    b(x).pow(2).mean().backward()
    opt_b.step()
    opt_b.zero_grad()
print("ok")
"""


def test_the_optimizer_that_keeps_stepping_marks_the_steps(tmp_path):
    """Alternating optimizers: the first marks the steps (0-5). Then only the second steps: at its
    second step in a row (the last alternating one counts) it takes over and marks steps 6-13, so
    its 8 steps are not one long last step (they were: the first optimizer never stepped again)."""
    result = run_wrapped(tmp_path / "run", script(tmp_path, SEVERAL), options=("--profile-steps", "off"))
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
    (entry,) = load_run(tmp_path / "run")["ranks"]
    facts = entry["facts"]
    assert facts["step_source"] == "optimizer"
    assert facts["last_step"] == 13 and len(facts["steps"]) == 14
