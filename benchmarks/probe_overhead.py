"""Probe overhead: steps/s of the healthy demo with and without ``torchdoctor run``.

Runs the healthy 2-rank demo (``torchdoctor.workloads.demo --healthy``) alternately without the
probe and under ``python -m torchdoctor.runner --profile-steps off`` (the profiler window is
excluded on purpose: it is a deliberate, bounded cost). Each run reports its own steady-state
steps/s (after ``--warmup`` steps, which also absorb the probe's one-time gather at step 8).
The order alternates pair by pair (plain first, then probe first) so drifting machine load hits
both sides alike. Prints and optionally writes (``--out``) medians, the per-pair ratios, the
overhead ``1 - probe/plain`` in percent with a 95% bootstrap bound over the pairs, and the
overhead implied by the probe's cost per step measured on a tiny loop (``--micro-pairs``: the
fastest and the typical run of each side) and part by part inside one probed process (COMPONENTS:
each piece with the probe's hook in place and taken out, in alternation; the steadiest figure on
a noisy machine).

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
# its steps are so short that the probe's fixed cost per step shows in microseconds. The loop is
# timed in blocks of 250 steps and the fastest block counts (the least disturbed by other work on
# the machine), in wall time and in the process's CPU time.
MICRO = """
import json, sys, time
import torch
from torch.utils.data import DataLoader, TensorDataset
torch.set_num_threads(1)
loader = DataLoader(TensorDataset(torch.randn(64000, 8), torch.randn(64000, 1)), batch_size=8)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
BLOCK = 250
walls, cpus = [], []
w0, c0 = time.perf_counter(), time.process_time()
for i, (x, y) in enumerate(loader):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    loss.item()
    if (i + 1) % BLOCK == 0:
        w1, c1 = time.perf_counter(), time.process_time()
        if i >= 2 * BLOCK:  # the first blocks hold the probe's one-time work (step 0 hooks, gather)
            walls.append((w1 - w0) / BLOCK)
            cpus.append((c1 - c0) / BLOCK)
        w0, c0 = w1, c1
print(json.dumps({"min_block_us": 1e6 * min(walls), "min_block_cpu_us": 1e6 * min(cpus)}))
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
    return json.loads(out.strip().splitlines()[0])


def micro(pairs: int) -> dict:
    """The tiny loop's fastest-block step time with and without the probe: the probe's cost per step."""
    plain: list[dict] = []
    probe: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="td-micro-") as workdir:
        for i in range(pairs):
            for with_probe in (False, True) if i % 2 == 0 else (True, False):
                (probe if with_probe else plain).append(micro_once(with_probe, workdir, f"m{i}"))

    def best(runs: list[dict], key: str) -> float:
        return min(r[key] for r in runs)

    return {
        "micro_plain_us": [round(r["min_block_us"], 1) for r in plain],
        "micro_probe_us": [round(r["min_block_us"], 1) for r in probe],
        "micro_plain_cpu_us": [round(r["min_block_cpu_us"], 1) for r in plain],
        "micro_probe_cpu_us": [round(r["min_block_cpu_us"], 1) for r in probe],
        # Fastest block over all runs of each side: the probe's cost per step, wall and CPU. One
        # lucky probed run makes this small; the median of the runs' fastest blocks is the typical.
        "micro_cost_us_per_step": round(best(probe, "min_block_us") - best(plain, "min_block_us"), 1),
        "micro_cost_us_per_step_median": round(statistics.median(r["min_block_us"] for r in probe)
                                               - statistics.median(r["min_block_us"] for r in plain), 1),
        "micro_cost_cpu_us_per_step": round(best(probe, "min_block_cpu_us") - best(plain, "min_block_cpu_us"), 1),
    }


# The probe's cost per step taken apart inside one probed process, each part timed with the probe's
# piece in place and with it taken out (the original function, or the hooks' dicts emptied), in
# alternation, fastest of several repeats. Two processes differ by more than the probe on a noisy
# machine; one process against itself does not. Not counted: the DataLoader's collate timer (two
# clock reads) and the probe's work at its first steps (hooks attached once).
COMPONENTS = """
import json, timeit
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data import dataloader as dl
from torch.optim import optimizer as optim
torch.set_num_threads(1)
from torchdoctor.probe import core
probe = core.get()
loader = DataLoader(TensorDataset(torch.randn(800000, 8), torch.randn(800000, 1)), batch_size=8)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
it = iter(loader)
def step():
    x, y = next(it)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step(); loss.item()
    return x, y, loss
for _ in range(30):  # past step 0: the probe's hooks are attached and its clock runs
    x, y, loss = step()
assert probe is not None and probe.clock.index > 10, "the probe is not running"
N, REPEATS = 1000, 9  # 100,000 batches in the loader: enough for every timed call of next()
def per_call_us(fn):
    return timeit.timeit(fn, number=N) / N * 1e6
def paired(fn, remove, restore):
    with_probe, without = [], []
    for _ in range(REPEATS):
        with_probe.append(per_call_us(fn))
        remove()
        try:
            without.append(per_call_us(fn))
        finally:
            restore()
    return min(with_probe), min(without)
parts = {}
pre, post = dict(model._forward_pre_hooks), dict(model._forward_hooks)
always = dict(model._forward_hooks_always_called)
def no_fwd():
    model._forward_pre_hooks.clear(); model._forward_hooks.clear(); model._forward_hooks_always_called.clear()
def fwd_back():
    model._forward_pre_hooks.update(pre); model._forward_hooks.update(post)
    model._forward_hooks_always_called.update(always)
parts["forward hooks"] = paired(lambda: model(x), no_fwd, fwd_back)
shim_bwd = torch.autograd.backward
def fb():
    torch.nn.functional.mse_loss(model(x), y).backward()
def no_bwd(): torch.autograd.backward = shim_bwd.__wrapped__
def bwd_back(): torch.autograd.backward = shim_bwd
parts["backward shim"] = paired(fb, no_bwd, bwd_back)
opt_pre, opt_post = dict(optim._global_optimizer_pre_hooks), dict(optim._global_optimizer_post_hooks)
def no_opt():
    optim._global_optimizer_pre_hooks.clear(); optim._global_optimizer_post_hooks.clear()
def opt_back():
    optim._global_optimizer_pre_hooks.update(opt_pre); optim._global_optimizer_post_hooks.update(opt_post)
# Each probed optimizer step closes a step: this part holds the probe's step boundary.
parts["optimizer hooks + step boundary"] = paired(opt.step, no_opt, opt_back)
shim_item = torch.Tensor.item
def no_item(): torch.Tensor.item = shim_item.__wrapped__
def item_back(): torch.Tensor.item = shim_item
parts["loss.item() shim"] = paired(loss.item, no_item, item_back)
shim_next = dl._BaseDataLoaderIter.__next__
def no_next(): dl._BaseDataLoaderIter.__next__ = shim_next.__wrapped__
def next_back(): dl._BaseDataLoaderIter.__next__ = shim_next
parts["DataLoader next shim"] = paired(lambda: next(it), no_next, next_back)
steps = [per_call_us(step) for _ in range(REPEATS)]
out = {name: {"with_us": round(a, 2), "without_us": round(b, 2), "cost_us": round(a - b, 2)}
       for name, (a, b) in parts.items()}
print(json.dumps({"parts": out, "cost_us_per_step": round(sum(v["cost_us"] for v in out.values()), 1),
                  "probed_step_us": round(min(steps), 1)}))
"""


def components(workdir: str) -> dict:
    """The probe's per-step cost, part by part, measured inside one probed process (COMPONENTS)."""
    path = os.path.join(workdir, "components.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(COMPONENTS)
    cmd = [sys.executable, "-m", "torchdoctor.runner", "--quiet", "--profile-steps", "off",
           "--out", os.path.join(workdir, "components-run"), "--", sys.executable, path]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[0])


def bootstrap_median(values: list[float], draws: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the median of ``values``."""
    import random

    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return meds[int(0.025 * draws)], meds[int(0.975 * draws) - 1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=5, help="runs per side (default %(default)s)")
    p.add_argument("--steps", type=int, default=240, help="steps per run (default %(default)s)")
    p.add_argument("--warmup", type=int, default=10, help="steps left out of steps/s (default %(default)s)")
    p.add_argument("--out", metavar="FILE", help="write the results as JSON")
    p.add_argument("--micro-pairs", type=int, default=5, help="pairs of tiny-loop runs (0: skip)")
    p.add_argument("--no-components", dest="components", action="store_false",
                   help="skip the part-by-part cost inside one probed process")
    args = p.parse_args()
    micro_summary = micro(args.micro_pairs) if args.micro_pairs else {}
    if args.components:
        with tempfile.TemporaryDirectory(prefix="td-components-") as workdir:
            micro_summary["components"] = components(workdir)
    print(json.dumps(micro_summary), flush=True)
    if args.pairs < 1:  # the tiny loop only
        if args.out:
            with open(args.out, "w", encoding="utf-8") as f:
                json.dump({"workload": "tiny loop (probe_overhead.MICRO, COMPONENTS)", **micro_summary}, f, indent=1)
        return 0
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
    low, high = bootstrap_median(pair_ratios)
    # Independent of the noisy end-to-end ratio: the probe's measured cost per step times the steps
    # per second of the healthy demo is the share of each second the probe spends.
    # The part-by-part cost (one process against itself) when measured, else the typical tiny-loop one.
    cost_us = (micro_summary.get("components") or {}).get("cost_us_per_step",
                                                           micro_summary.get("micro_cost_us_per_step_median"))
    from_micro = None if cost_us is None else round(cost_us * statistics.median(plain) / 1e4, 3)
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
        # 95% bootstrap interval of the median pair ratio: its lower end bounds the overhead.
        "pair_ratio_ci95": [round(low, 4), round(high, 4)],
        "overhead_pct_upper_95": round(100 * (1 - low), 2),
        "overhead_pct_from_micro": from_micro,
        **micro_summary,
    }
    print(json.dumps(summary, indent=1))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
