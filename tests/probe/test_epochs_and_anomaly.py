"""What the probe times at epoch starts (DataLoader iterators) and in autograd's anomaly mode, live."""

from __future__ import annotations

import json

from probe.livejob import facts_of, job_stderr, load_run, run_plain, run_wrapped, script

JOB = """
import time
import torch
from torch.utils.data import DataLoader, TensorDataset

def slow_start(worker_id):
    time.sleep(0.15)  # a worker's start-up (opening an index): paid again at every epoch

torch.manual_seed(0)
data = TensorDataset(torch.randn(96, 16), torch.randint(0, 4, (96,)))
loader = DataLoader(data, batch_size=16, num_workers=1, persistent_workers=False, worker_init_fn=slow_start)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step = 0
for epoch in range(4):  # 6 steps per epoch
    for x, y in loader:
        torch.autograd.set_detect_anomaly(step >= 12)  # on from the third epoch
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
print("ok", step)
"""


def test_epoch_starts_and_anomaly_stacks_are_timed(tmp_path):
    job = script(tmp_path, JOB)
    run_dir = tmp_path / "run"
    result = run_wrapped(run_dir, job, options=("--profile-steps", "19:22", "--json", str(tmp_path / "r.json")))
    assert result.returncode == 0 and result.stdout == "ok 24\n", result.stderr
    facts = facts_of(run_dir)
    steps = {s["step"]: s for s in facts["steps"]}
    # Each epoch's first step created the iterator: marked, and its creation timed.
    assert [i for i, s in sorted(steps.items()) if s.get("epoch_starts")] == [0, 6, 12, 18]
    assert all(steps[i]["loader_iter_ms"] > 0 for i in (6, 12, 18))
    # ... and that step waited for the worker's 150 ms start-up (which began inside __iter__),
    # the others did not.
    assert all(steps[i]["dataloader_ms"] + steps[i]["loader_iter_ms"] >= 145 for i in (6, 12, 18))
    others = sorted(s["dataloader_ms"] for i, s in steps.items() if i % 6)
    assert others[len(others) // 2] < 0.5 * min(steps[i]["dataloader_ms"] for i in (6, 12, 18))
    # Anomaly mode's stack recording is timed only while it is on (from step 12).
    assert all(steps[i].get("anomaly_stack_ms", 0.0) == 0.0 for i in range(1, 12))
    assert all(steps[i]["anomaly_stack_ms"] > 0 for i in range(13, 24) if i in steps)
    (entry,) = load_run(run_dir)["ranks"]
    checks = entry["analysis"]["signals"]["anomaly_checks"]
    # 3 profiled steps x 3 backward nodes with outputs to check (addmm, relu, addmm; and the loss).
    assert checks[0] >= 3 * 3 and checks[1] > 0
    report = json.loads((tmp_path / "r.json").read_text())
    ho8 = next(f for f in report["findings"] if f["id"] == "HO-8")
    assert ho8["recoverable_ms"] > 0 and "anomaly mode alone costs" in ho8["title"]
    dl6 = next(f for f in report["findings"] if f["id"] == "DL-6")
    assert dl6["recoverable_pct"] > 0 and "restarting them (their start-up, the wait for its first batch" in dl6["title"]
    assert "every 6 steps; 3 such start(s) in this run" in dl6["title"]
    assert facts["dataloaders"][0]["batches_per_epoch"] == 6


def test_a_failing_anomaly_timer_changes_nothing(tmp_path):
    job = script(tmp_path, JOB)
    plain = run_plain(job)
    wrapped = run_wrapped(tmp_path / "run", job, TORCHDOCTOR_PROBE_FAULT="anomaly")
    assert plain.returncode == wrapped.returncode == 0
    assert wrapped.stdout == plain.stdout == "ok 24\n"
    assert job_stderr(wrapped.stderr) == plain.stderr
    facts = facts_of(tmp_path / "run")
    assert [e.split(":")[0] for e in facts["probe_errors"]] == ["anomaly"]  # recorded once, then skipped
    assert all(s.get("anomaly_stack_ms", 0.0) == 0.0 for s in facts["steps"])


NAN_JOB = """
import torch
torch.autograd.set_detect_anomaly(True)
x = torch.tensor([-1.0, 4.0], requires_grad=True)
for step in range(3):
    y = torch.sqrt(x * (1.0 if step < 2 else 1.0)).sum()  # sqrt(-1): its backward returns nan
    try:
        y.backward()
    except RuntimeError as exc:
        print("caught:", str(exc).splitlines()[0])
"""


def test_anomaly_tracebacks_show_no_probe_frame(tmp_path):
    # Anomaly mode prints the forward's stack when a backward returns nan: the timer around the
    # stack recording must not add a frame of its own to it.
    job = script(tmp_path, NAN_JOB)
    plain = run_plain(job)
    wrapped = run_wrapped(tmp_path / "run", job)
    assert plain.returncode == wrapped.returncode == 0
    assert "Traceback of forward call that caused the error" in plain.stderr
    assert wrapped.stdout == plain.stdout and job_stderr(wrapped.stderr) == plain.stderr
