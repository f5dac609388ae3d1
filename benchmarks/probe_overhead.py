"""Probe overhead: steps/s of the healthy demo with and without ``torchdoctor run``.

Runs the healthy 2-rank demo (``torchdoctor.workloads.demo --healthy``) alternately without the
probe and under ``python -m torchdoctor.runner --profile-steps off`` (the profiler window is
excluded on purpose: it is a deliberate, bounded cost). Each run reports its own steady-state
steps/s (after ``--warmup`` steps, which also absorb the probe's one-time gather at step 8).
The order alternates pair by pair (plain first, then probe first) so drifting machine load hits
both sides alike. Prints and optionally writes (``--out``) medians, the per-pair ratios and the
overhead ``1 - probe/plain`` in percent.

    .venv/bin/python benchmarks/probe_overhead.py --pairs 5 --steps 240
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from torchdoctor.workloads.cli import demo_command


def run_once(with_probe: bool, steps: int, warmup: int, workdir: str, tag: str) -> float:
    result = os.path.join(workdir, f"{tag}.json")
    cmd = demo_command(["--healthy", "--steps", str(steps), "--warmup", str(warmup), "--result-file", result])
    if with_probe:
        run_dir = os.path.join(workdir, f"{tag}-run")
        cmd = [
            sys.executable,
            "-m",
            "torchdoctor.runner",
            "--quiet",
            "--profile-steps",
            "off",
            "--out",
            run_dir,
            "--",
            *cmd,
        ]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(result, encoding="utf-8") as f:
        return float(json.load(f)["steps_per_s"])


# A tiny single-process loop (DataLoader, forward, backward, optimizer, loss.item() every step):
# its steps are so short that the probe's fixed cost per step shows in microseconds.
MICRO = """
import json, sys, time
import torch
from torch.utils.data import DataLoader, TensorDataset
torch.set_num_threads(1)
loader = DataLoader(TensorDataset(torch.randn(64000, 8), torch.randn(64000, 1)), batch_size=8)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
times = []
t = time.perf_counter()
for i, (x, y) in enumerate(loader):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    loss.item()
    now = time.perf_counter()
    times.append(now - t)
    t = now
steady = sorted(times[100:])
print(json.dumps({"median_us": 1e6 * steady[len(steady) // 2]}))
"""


def micro_once(with_probe: bool, workdir: str, tag: str) -> float:
    path = os.path.join(workdir, "micro.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(MICRO)
    cmd = [sys.executable, path]
    if with_probe:
        cmd = [sys.executable, "-m", "torchdoctor.runner", "--quiet", "--profile-steps", "off",
               "--out", os.path.join(workdir, f"{tag}-run"), "--", *cmd]  # fmt: skip
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return float(json.loads(out.strip().splitlines()[0])["median_us"])


def micro(pairs: int) -> dict:
    """Median step time of the tiny loop with and without the probe: the probe's cost per step."""
    plain: list[float] = []
    probe: list[float] = []
    with tempfile.TemporaryDirectory(prefix="td-micro-") as workdir:
        for i in range(pairs):
            for with_probe in (False, True) if i % 2 == 0 else (True, False):
                (probe if with_probe else plain).append(micro_once(with_probe, workdir, f"m{i}"))
    return {
        "micro_plain_us": [round(v, 1) for v in plain],
        "micro_probe_us": [round(v, 1) for v in probe],
        "micro_cost_us_per_step": round(statistics.median(probe) - statistics.median(plain), 1),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=5, help="runs per side (default %(default)s)")
    p.add_argument("--steps", type=int, default=240, help="steps per run (default %(default)s)")
    p.add_argument("--warmup", type=int, default=10, help="steps left out of steps/s (default %(default)s)")
    p.add_argument("--out", metavar="FILE", help="write the results as JSON")
    p.add_argument("--micro-pairs", type=int, default=5, help="pairs of tiny-loop runs (0: skip)")
    args = p.parse_args()
    micro_summary = micro(args.micro_pairs) if args.micro_pairs else {}
    print(json.dumps(micro_summary), flush=True)
    plain: list[float] = []
    probe: list[float] = []
    with tempfile.TemporaryDirectory(prefix="td-overhead-") as workdir:
        for i in range(args.pairs):
            order = (False, True) if i % 2 == 0 else (True, False)
            for with_probe in order:
                value = run_once(with_probe, args.steps, args.warmup, workdir, f"{i}-{int(with_probe)}")
                (probe if with_probe else plain).append(value)
                print(f"pair {i}: {'probe' if with_probe else 'plain'} {value:.2f} steps/s", flush=True)
    pair_ratios = [b / a for a, b in zip(plain, probe, strict=True)]
    ratio = statistics.median(probe) / statistics.median(plain)
    summary = {
        "workload": "torchdoctor demo --healthy (2 ranks, gloo, CPU)",
        "steps": args.steps,
        "warmup": args.warmup,
        "plain_steps_per_s": plain,
        "probe_steps_per_s": probe,
        "median_plain": round(statistics.median(plain), 3),
        "median_probe": round(statistics.median(probe), 3),
        "ratio_of_medians": round(ratio, 4),
        "median_pair_ratio": round(statistics.median(pair_ratios), 4),
        "overhead_pct": round(100 * (1 - ratio), 2),
        **micro_summary,
    }
    print(json.dumps(summary, indent=1))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
