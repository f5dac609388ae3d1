"""Independent check of `torchdoctor fix --apply safe` on the bundled demo (issue 5).

1. The tool: ``torchdoctor demo --fix --apply safe`` (diagnosis run, then K alternating A/B rounds
   measured from the probe's step timings) gives its speed-up and the remedies it kept.
   ``--remedies LIST`` skips this step and benchmarks LIST instead.
2. This script, on its own clock: R rounds of three jobs in one process tree, the order rotated
   every round so machine drift hits all three alike:
     baseline  the pathological demo (all pathologies on, or ``--pathologies LIST``), as it is;
     treated   the same command with the kept remedies (TORCHDOCTOR_REMEDIES, applied at start-up
               by the bootstrap: no code change);
     healthy   the hand-tuned demo (``--healthy``);
     ceiling   the demo with only the pathologies no start-up remedy can reach on a CPU (a custom
               collate_fn doing per-sample host work, ``loss.item()`` every step: code edits), i.e.
               the best any set of remedies could do (``--no-ceiling`` leaves it out).
   All three run under ``python -m torchdoctor.runner --profile-steps off`` (the remedies need the
   bootstrap, so the other two get the same probe for a fair comparison) and are timed by the demo
   itself: rank 0's steps/s after ``--warmup`` steps (``--result-file``), plus the wall clock of
   the whole job.
3. Ratios per round, then median / min / max: treated/baseline (target >= 2), treated/healthy
   (target >= 0.9), and ceiling/healthy, treated/ceiling (how much of what remedies can reach they do).

    .venv/bin/python benchmarks/fix_demo.py                  # ~10 min on 2 cores
    .venv/bin/python benchmarks/fix_demo.py --rounds 3 --steps 48 --tool-repeats 2
    .venv/bin/python benchmarks/fix_demo.py --remedies dataloader.workers=2,ddp.bucket_cap
    .venv/bin/python benchmarks/fix_demo.py --out /tmp/fix_loader_only.json \
        --pathologies main_process_loader,find_unused_parameters,small_buckets
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from torchdoctor.workloads.cli import demo_command
from torchdoctor.workloads.pathologies import PATHOLOGIES

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
ARMS = ("baseline", "treated", "healthy", "ceiling")
# Pathologies of the demo that only a code change fixes (pathologies.py): the converting collate
# still runs (in workers, once they exist), and loss.item() is still called every step.
CODE_ONLY = ("syncing_collate", "loss_item_every_step")


def env_for(remedies: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR_")}
    env.setdefault("OMP_NUM_THREADS", "1")  # what `torchdoctor demo` sets (torchrun would too)
    if remedies:
        env["TORCHDOCTOR_REMEDIES"] = remedies
    return env


def sick_flags(pathologies: str | None) -> list[str]:
    return ["--pathologies", pathologies] if pathologies else []


def tool(steps: int, repeats: int, workdir: str, pathologies: str | None) -> dict[str, Any]:
    """`torchdoctor demo --fix --apply safe`: the tool's own measurement and the remedies it kept."""
    report = os.path.join(workdir, "fix.json")
    cmd = [sys.executable, "-m", "torchdoctor.cli", "demo", "--fix", "--apply", "safe", "--steps", str(steps),
           "--repeats", str(repeats), "--out", os.path.join(workdir, "fix"), "--json", report,
           *sick_flags(pathologies)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env_for(None), capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"torchdoctor demo --fix failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    print(proc.stdout, flush=True)
    with open(report, encoding="utf-8") as f:
        ab = json.load(f)["ab"]
    kept = [r["id"] for r in ab["remedies"] if r["kept"]]
    return {"speedup_median": ab["speedup_median"], "speedup_min": ab["speedup_min"],
            "speedup_max": ab["speedup_max"], "baseline_steps_per_s": ab["baseline_steps_per_s"],
            "treated_steps_per_s": ab["treated_steps_per_s"], "kept": kept,
            "verdicts": [{"id": r["id"], "kept": r["kept"], "speedup": r["speedup"], "reason": r["reason"]}
                         for r in ab["remedies"]],
            "loss_check": ab["details"].get("loss_check"), "wall_s": round(time.perf_counter() - t0, 1)}


def run_once(arm: str, remedies: str, args: argparse.Namespace, workdir: str, tag: str) -> dict[str, float]:
    result = os.path.join(workdir, f"{tag}.json")
    flags = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--result-file", result]
    sick = args.pathologies.split(",") if args.pathologies else list(PATHOLOGIES)
    if arm == "healthy":
        flags.append("--healthy")
    elif arm == "ceiling":
        left = [p for p in sick if p in CODE_ONLY]
        flags += ["--pathologies", ",".join(left)] if left else ["--healthy"]
    else:
        flags += sick_flags(args.pathologies)
    cmd = [sys.executable, "-m", "torchdoctor.runner", "--quiet", "--profile-steps", "off",
           "--out", os.path.join(workdir, f"{tag}-run"), "--", *demo_command(flags)]
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env_for(remedies if arm == "treated" else None), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    with open(result, encoding="utf-8") as f:
        return {"steps_per_s": float(json.load(f)["steps_per_s"]), "wall_s": round(wall, 2)}


def ratios(rounds: list[dict[str, dict[str, float]]], num: str, den: str) -> dict[str, float]:
    xs = [r[num]["steps_per_s"] / r[den]["steps_per_s"] for r in rounds]
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3),
            "per_round": [round(x, 3) for x in xs]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="benchmark rounds of the three jobs (default %(default)s)")
    p.add_argument("--steps", type=int, default=48, help="demo steps per run (default %(default)s)")
    p.add_argument("--warmup", type=int, default=4, help="steps left out of steps/s (default %(default)s)")
    p.add_argument("--tool-repeats", type=int, default=2, help="A/B rounds of `fix` (default %(default)s)")
    p.add_argument("--remedies", help="benchmark these remedies instead of asking `torchdoctor fix`")
    p.add_argument("--pathologies", metavar="LIST", help="pathologies of the baseline demo (default: all)")
    p.add_argument("--no-ceiling", action="store_true", help="leave out the ceiling arm")
    p.add_argument("--out", default=str(RESULTS / "fix_demo.json"), help="results JSON (default %(default)s)")
    args = p.parse_args()
    summary: dict[str, Any] = {"workload": "torchdoctor demo (2 ranks, torchrun, gloo, CPU)",
                               "pathologies": args.pathologies or "all",
                               "date": _dt.datetime.now().isoformat(timespec="seconds"),
                               "cpus": len(os.sched_getaffinity(0)), "steps": args.steps, "warmup": args.warmup}
    with tempfile.TemporaryDirectory(prefix="td-fix-demo-") as workdir:
        if args.remedies:
            remedies = args.remedies
        else:
            summary["tool"] = tool(args.steps, args.tool_repeats, workdir, args.pathologies)
            remedies = ",".join(summary["tool"]["kept"])
            print(f"tool: x{summary['tool']['speedup_median']:.2f} (x{summary['tool']['speedup_min']:.2f}.."
                  f"x{summary['tool']['speedup_max']:.2f}); kept: {remedies}", flush=True)
        summary["remedies"] = remedies
        rounds: list[dict[str, dict[str, float]]] = []
        arms = ARMS[:3] if args.no_ceiling else ARMS
        for i in range(args.rounds):
            order = arms[i % len(arms):] + arms[:i % len(arms)]  # rotate: each arm leads in turn
            got = {}
            for arm in order:
                got[arm] = run_once(arm, remedies, args, workdir, f"{i}-{arm}")
                print(f"round {i}: {arm:<8} {got[arm]['steps_per_s']:7.2f} steps/s  ({got[arm]['wall_s']:.1f} s)",
                      flush=True)
            rounds.append(got)
    summary["rounds"] = rounds
    for arm in arms:
        summary[f"median_{arm}_steps_per_s"] = round(statistics.median(r[arm]["steps_per_s"] for r in rounds), 3)
    summary["treated_over_baseline"] = ratios(rounds, "treated", "baseline")
    summary["healthy_over_baseline"] = ratios(rounds, "healthy", "baseline")
    summary["treated_over_healthy"] = ratios(rounds, "treated", "healthy")
    if "ceiling" in arms:
        summary["ceiling_over_healthy"] = ratios(rounds, "ceiling", "healthy")
        summary["treated_over_ceiling"] = ratios(rounds, "treated", "ceiling")
    tb, th = summary["treated_over_baseline"], summary["treated_over_healthy"]
    summary["targets"] = {"treated_over_baseline_ge_2": tb["median"] >= 2.0,
                          "treated_over_healthy_ge_0.9": th["median"] >= 0.9}
    print(f"\ntreated/baseline x{tb['median']:.2f} (x{tb['min']:.2f}..x{tb['max']:.2f}); "
          f"healthy/baseline x{summary['healthy_over_baseline']['median']:.2f}; "
          f"treated/healthy {th['median']:.0%} ({th['min']:.0%}..{th['max']:.0%})")
    if "ceiling" in arms:
        ch, tc = summary["ceiling_over_healthy"], summary["treated_over_ceiling"]
        print(f"ceiling (code-only pathologies left)/healthy {ch['median']:.0%}; treated/ceiling "
              f"{tc['median']:.0%} ({tc['min']:.0%}..{tc['max']:.0%})")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
