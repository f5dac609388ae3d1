"""A 2-rank torchrun job (gloo, CPU) under `torchdoctor run`: every rank recorded and gathered."""

from __future__ import annotations

import json

from probe.livejob import PY, load_run, run, script, wrapper_cmd

DDP_JOB = """
import sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
data = TensorDataset(torch.randn(512, 32), torch.randint(0, 4, (512,)))
if sys.argv[1:] == ["same"]:  # the common mistake: every rank iterates the whole dataset, in the same order
    loader = DataLoader(data, batch_size=16)
else:
    loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data))
net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
ddp = DistributedDataParallel(net, bucket_cap_mb=1)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
for step, (x, y) in enumerate(loader):
    loss = torch.nn.functional.cross_entropy(ddp(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == 11:
        break
print(f"rank {rank} done", flush=True)
del ddp, opt
dist.barrier()
dist.destroy_process_group()
"""


def test_two_rank_torchrun(tmp_path):
    job = script(tmp_path, DDP_JOB)
    torchrun = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(job)]
    result = run(wrapper_cmd(tmp_path / "run", torchrun, "--json", str(tmp_path / "report.json")))
    assert result.returncode == 0, result.stderr
    # Both ranks share the job's stdout, so their prints may interleave ("rank 1 donerank 0 done\n\n"):
    # check each line arrived exactly once and nothing else did.
    out = result.stdout
    assert out.count("rank 0 done") == 1 and out.count("rank 1 done") == 1, out
    assert not out.replace("rank 0 done", "").replace("rank 1 done", "").strip(), out
    manifest = load_run(tmp_path / "run")
    ranks = [entry["facts"] for entry in manifest["ranks"]]
    assert [f.get("rank", 0) for f in ranks] == [0, 1]  # the torchrun launcher wrote nothing
    for facts, entry in zip(ranks, manifest["ranks"], strict=True):
        assert facts["world_size"] == 2 and facts["distributed_backend"] == "gloo"
        assert facts["local_rank"] == facts.get("rank", 0) and facts["cpu"]["local_world_size"] == 2
        (ddp,) = facts["ddp"]
        assert ddp["bucket_cap_mb"] == 1.0 and ddp["backend_name"] == "gloo"
        assert ddp.get("find_unused_parameters") is False and ddp["total_parameter_bytes"] == 2372 * 4
        assert len(facts["steps"]) == 9 and any(s.get("comm_ms", 0) > 0 for s in facts["steps"])
        # The steps DDP's logging data timed say so; comm_ms on the others means nothing.
        assert all(s.get("comm_sampled") for s in facts["steps"] if s.get("comm_ms", 0) > 0)
        assert entry["analysis"] is not None and "probe_errors" not in facts
    run_dir = tmp_path / "run"
    # Rank 0 received both summaries over the job's own process group.
    assert sorted(p.name for p in (run_dir / "ranks" / "gathered").iterdir()) == ["rank0.json", "rank1.json"]
    assert sorted(p.name for p in (run_dir / "traces").iterdir()) == ["rank0.json.gz", "rank1.json.gz"]
    # Each rank trains on its own share: different losses, and DI-17 says nothing.
    assert ranks[0]["loss_samples"] != ranks[1]["loss_samples"] and len(ranks[0]["loss_samples"]) == 8
    fingerprints = [dict(f["dataloaders"][0]["batch_samples"]) for f in ranks]
    assert len(fingerprints[0]) == 8 and all(fingerprints[0][i] != fingerprints[1][i] for i in fingerprints[0])
    findings = json.loads((tmp_path / "report.json").read_text())["findings"]
    assert "DI-17" not in [f["id"] for f in findings]


def test_ddp_without_a_distributed_sampler_repeats_the_first_rank(tmp_path):
    """DDP over a plain DataLoader: both ranks draw the same batches, so DDP averages two identical
    gradients; the probe's losses show it, and so does each loader's length."""
    job = script(tmp_path, DDP_JOB)
    torchrun = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(job), "same"]
    result = run(wrapper_cmd(tmp_path / "run", torchrun, "--profile-steps", "off", "--json",
                             str(tmp_path / "report.json")))
    assert result.returncode == 0, result.stderr
    ranks = [entry["facts"] for entry in load_run(tmp_path / "run")["ranks"]]
    assert ranks[0]["loss_samples"] == ranks[1]["loss_samples"]
    assert ranks[0]["dataloaders"][0]["batch_samples"] == ranks[1]["dataloaders"][0]["batch_samples"]
    findings = json.loads((tmp_path / "report.json").read_text())["findings"]
    (dup,) = [f for f in findings if f["id"] == "DI-17"]
    assert dup["severity"] == "critical" and dup["job_pct"] == 50.0
    # Ranked by its share of the job: only a finding that gives back more of the step can come first (a
    # straggler's wait, DI-5, on a busy machine).
    ahead = findings[:findings.index(dup)]
    assert all(f["severity"] != "info" and f["recoverable_pct"] >= 50.0 for f in ahead), ahead
    assert dup["title"].startswith("All 2 ranks drew the same batches (8 batches)")
    assert "32 batches of 16 per epoch from a 512-sample dataset" in dup["evidence"][1]["text"]
    assert "DistributedSampler" in dup["fix"]["snippet"]
