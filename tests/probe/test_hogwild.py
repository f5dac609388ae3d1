"""Hogwild training (pytorch/examples' mnist_hogwild shape) under `torchdoctor run`: two
torch.multiprocessing children train one shared model, then their parent evaluates it. None of them
has a process group, so each reads rank 0: each keeps its own trace and analysis, the parent that only
evaluated is left out of the diagnosis, and the children's threads are counted together (HO-13)."""

from __future__ import annotations

import json
import os
import re

from probe.livejob import PY, run, script, wrapper_cmd

JOB = """
import os, sys
import torch
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, TensorDataset


def data():
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(512, 32, generator=g), torch.randint(0, 4, (512,), generator=g))


def train(rank, model):
    torch.set_num_threads(len(os.sched_getaffinity(0)))  # each child takes every CPU, as by default
    torch.manual_seed(rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step, (x, y) in enumerate(DataLoader(data(), batch_size=16, shuffle=True)):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if step == 13:
            break


if __name__ == "__main__":
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    model.share_memory()
    mp.set_start_method("spawn", force=True)
    children = [mp.Process(target=train, args=(r, model)) for r in range(2)]
    for p in children:
        p.start()
    for p in children:
        p.join()
    model.eval()
    with torch.no_grad():
        correct = sum(int((model(x).argmax(1) == y).sum()) for x, y in DataLoader(data(), batch_size=32))
    print(f"accuracy {correct / 512:.3f}")
    sys.exit(0 if all(p.exitcode == 0 for p in children) else 1)
"""


def test_hogwild_children_keep_their_own_windows_and_the_evaluating_parent_is_left_out(tmp_path):
    job = script(tmp_path, JOB)
    run_dir = tmp_path / "run"
    result = run(wrapper_cmd(run_dir, [PY, str(job)], "--profile-steps", "3:5", "--json", str(tmp_path / "r.json")))
    assert result.returncode == 0, result.stderr
    assert "accuracy" in result.stdout  # the job's own output passes through
    # Three processes profiled a window under rank 0: one trace each.
    traces = sorted(os.listdir(run_dir / "traces"))
    pids = [n.removeprefix("rank0.pid").removesuffix(".json.gz") for n in traces if n.startswith("rank0.pid")]
    assert "rank0.json.gz" in traces and len(pids) == 2 and all(p.isdigit() for p in pids), traces
    report = json.loads((tmp_path / "r.json").read_text())
    # The parent only evaluated: left out, and said; the children are ranks of their own.
    ranks = report["ranks"]
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    assert all(r["facts"]["step_source"] == "optimizer" and r["window"]["steps"] == [3, 4] for r in ranks)
    assert len({r["file"] for r in ranks}) == 2  # each child's own trace, not one shared
    messages = [w["message"] for w in report["warnings"]]
    # 16 batches: the last one closes no step, nor does the first before a step clock runs
    assert any(re.search(r"only evaluated: 1[0-6] steps \(DataLoader batches\)", m) for m in messages), messages
    assert any("reported as ranks of their own" in m for m in messages), messages
    # Two children with a thread per CPU each: twice the CPUs in threads, one per CPU advised.
    cpus = len(os.sched_getaffinity(0))
    (ho13,) = [f for f in report["findings"] if f["id"] == "HO-13"]
    values = ho13["evidence"][0]["values"]
    assert values["local_world_size"] == 2 and values["advised_threads"] == max(1, cpus // 2)
    assert f"{cpus} intra-op threads x 2 local rank(s)" in ho13["title"]
    # The parent's children are probed processes with reports of their own: not its child processes.
    children = {r["facts"]["pid"] for r in ranks}
    parent = [e["facts"] for e in json.loads((run_dir / "run.json").read_text())["ranks"]
              if e["facts"]["pid"] not in children]
    assert parent and all("child_processes_cpu_pct" not in f["cpu"] for f in parent), parent
