"""A straggler over a whole live run (2 ranks, gloo, CPU) under a default `torchdoctor run`: its
3-step profiler window alone could not warn; the probe's timings of every step can
(metrics/stragglers.py, DI-5)."""

from __future__ import annotations

import json

from probe.livejob import PY, run, script, wrapper_cmd

JOB = """
import sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

late_rank, lag_s, every = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
ddp = DistributedDataParallel(net)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
for step in range(40):
    loss = torch.nn.functional.cross_entropy(ddp(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if rank == late_rank and step % every == every - 1:
        time.sleep(lag_s)  # this rank's own work in the loop: logging, say, or a save
del ddp, opt
dist.barrier()
dist.destroy_process_group()
"""


def di5(tmp_path, *args: str) -> dict:
    job = script(tmp_path, JOB)
    torchrun = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(job), *args]
    result = run(wrapper_cmd(tmp_path / "run", torchrun, "--json", str(tmp_path / "r.json")))
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["findings"][0]["id"] == "DI-5", [f["id"] for f in report["findings"]]
    return report["findings"][0]


def test_a_rank_late_every_step_is_a_persistent_straggler_named_with_its_cause(tmp_path):
    got = di5(tmp_path, "1", "0.03", "1")
    data = got["evidence"][0]["values"]
    # 40 steps less the 3 in the profiler window, the first and the one after the window: 34,
    # more than TML's 20 for critical; rank 1 sleeps 30 ms in every one, rank 0 waits for it.
    assert data["straggler"] == 1 and data["persistent"] and data["steps"] == 34 and data["late_steps"] >= 32
    assert got["severity"] == "critical" and got["ranks"] == [0]
    assert 27.0 <= data["lead_by_phase"]["other"] <= 40.0 and 27.0 <= data["gain_ms"] <= 40.0
    assert "rank 1 spends" in got["title"] and "longer in the loop outside loading" in got["title"]
    # The claim is the run's gain as a share of its mean step, applied to the window's step and
    # granted from rank 0's exposed communication in the 3-step profiler window less the window's
    # inflation over the probe's own steps (a lower bound, rules/_comm.py): about 30 ms alone, 13.9 ms
    # once in a full suite run on 2 CPUs (2026-12-06), when the window ran slower. In ms it can pass
    # the run's gain when the window's step is the longer (30.56 against 30.456 once); as a share it
    # never passes the run's.
    assert got["recoverable_ms"] >= 10.0 and "every N steps" in got["fix"]["text"]
    assert got["recoverable_pct"] <= 100 * data["gain_ms"] / data["step_ms_mean"] + 0.01


def test_a_rank_late_every_tenth_step_is_a_transient_straggler_with_its_period(tmp_path):
    got = di5(tmp_path, "0", "0.2", "10")
    data = got["evidence"][0]["values"]
    # Rank 0 sleeps 200 ms after steps 9, 19, 29 (in steps 10, 20, 30; step 39's lands after the
    # last step): late in those three, by about 200 ms.
    assert data["straggler"] == 0 and not data["persistent"] and data["period"] == 10
    assert data["late_steps"] == 3 and 190.0 <= data["lead_ms_median"] <= 260.0  # jitter's late steps left out
    assert 3 * 190.0 / 34 <= data["gain_ms"] <= 3 * 260.0 / 34
    assert "transient straggler" in got["title"] and "every 10 steps" in got["title"]
    assert got["ranks"] == [1] and got["confidence"] == "low" and got["severity"] in ("warning", "critical")
