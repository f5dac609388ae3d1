"""The probe reads the loss backward starts from when that is free (a CPU scalar) and says when
the job trains on NaN (pytorch/examples' FSDP2 example on CPU did, from its first step)."""

from __future__ import annotations

import json

import pytest

from probe.livejob import facts_of, run_wrapped, script

JOB = """
import sys
import torch

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(16, 8)
for step in range(12):
    loss = model(x).pow(2).mean()
    if sys.argv[1] == "nan" and step >= 2:
        loss = loss * float("nan")
    opt.zero_grad()
    loss.backward()
    opt.step()
print("ok")
"""


def run(tmp_path, mode):
    job = script(tmp_path, JOB)
    report = tmp_path / f"{mode}.json"
    result = run_wrapped(tmp_path / mode, job, mode, options=("--profile-steps", "off", "--json", str(report)))
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
    return facts_of(tmp_path / mode), json.loads(report.read_text()), result.stderr


def test_a_job_training_on_nan_is_told_and_a_finite_one_is_not(tmp_path):
    facts, report, stderr = run(tmp_path, "nan")
    assert (facts["losses_read"], facts["losses_nonfinite"], facts["first_nonfinite_step"]) == (12, 10, 2)
    assert facts["last_finite_step"] == 1
    assert [s for s, _ in facts["loss_samples"]] == [0, 1]  # the finite ones only
    said = [w["message"] for w in report["warnings"] if "learns nothing" in w["message"]]
    assert said and said[0].startswith("rank 0: the loss was NaN or inf at every step read from step 2 (10 of 12)")
    assert "Warning" not in stderr  # reading the loss adds nothing to the job's output
    facts, report, stderr = run(tmp_path, "finite")
    assert facts["losses_read"] == 12 and "losses_nonfinite" not in facts and "Warning" not in stderr
    assert not facts.get("host_syncs_per_step")  # the probe's own read is no host sync of the job's
    assert not any("learns nothing" in w["message"] for w in report["warnings"])
    # The first 8 losses, as the job computed them (DI-17 compares them between ranks).
    assert [s for s, _ in facts["loss_samples"]] == list(range(8))
    assert [x for _, x in facts["loss_samples"]] == pytest.approx(_losses(8), rel=1e-6)


def _losses(n: int) -> list[float]:
    """JOB's losses, computed here."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 8)
    out = []
    for _ in range(n):
        loss = model(x).pow(2).mean()
        out.append(float(loss.detach()))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return out
