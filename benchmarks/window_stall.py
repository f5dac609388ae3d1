"""How long the probe's profiler window stalls the training job when it closes.

Runs the bundled demo (2 ranks, gloo, healthy so steps are short and steady) under
``torchdoctor run`` with a profiler window of W steps, and reads rank 0's own per-step wall times
(``--step-times``: the job's clock, not the probe's, which leaves its housekeeping out). The stall
is the time the steps around the window's end take beyond the median step:

    stall_ms = sum(step_ms[s] - median for s in the steps [end-1, end+2)) clipped at 0

where ``end`` is the window's last step + 1 (the probe stops the profiler, writes the trace and
hands it on at the boundary that closes step end-1). A run without the probe's window
(``--profile-steps off``) in the same process tree gives the noise floor of the same sum.

Two code versions are compared in one run, alternating, with ``--sources``: each runs from its
own ``src`` tree (a `git worktree` of the old commit, with this demo's --step-times option):

    git worktree add /tmp/before <old commit>; cp src/torchdoctor/workloads/demo.py /tmp/before/src/...
    .venv/bin/python benchmarks/window_stall.py --windows 3 50 --repeats 3 \
        --sources before=/tmp/before/src after=src --out benchmarks/results/window_stall.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from torchdoctor.workloads.cli import demo_command

START = 10  # first profiled step (the demo's default window starts here)
AROUND = (-1, 2)  # steps [end-1, end+2) around the window's end


def run_once(window: int | None, steps: int, src: str | None = None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        times = Path(tmp) / "steps.json"
        profile = f"{START}:{START + window}" if window else "off"
        cmd = [sys.executable, "-m", "torchdoctor.cli", "run", "--out", f"{tmp}/run", "-q",
               "--profile-steps", profile, "--",
               *demo_command(["--healthy", "--steps", str(steps), "--step-times", str(times)])]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        if src:
            env["PYTHONPATH"] = os.path.abspath(src)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        wall = time.perf_counter() - t0
        if proc.returncode != 0 or not times.exists():
            raise SystemExit(f"window_stall: run failed ({proc.returncode}): {proc.stderr[-2000:]}")
        step_ms = json.loads(times.read_text())
        trace = Path(tmp) / "run" / "traces" / "rank0.json.gz"
        trace_mb = trace.stat().st_size / 1e6 if trace.exists() else 0.0
    end = START + (window or 3)
    lo, hi = end + AROUND[0], end + AROUND[1]
    steady = [ms for i, ms in enumerate(step_ms) if i >= 3 and not (START <= i < hi)]
    median = statistics.median(steady)
    stall = sum(max(0.0, step_ms[i] - median) for i in range(lo, hi))
    return {"window": window or 0, "median_step_ms": round(median, 2), "stall_ms": round(stall, 1),
            "around_end_ms": [round(step_ms[i], 1) for i in range(lo, hi)], "wall_s": round(wall, 1),
            "trace_gz_mb": round(trace_mb, 2)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--windows", type=int, nargs="+", default=[3, 50], help="window lengths in steps")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--sources", nargs="+", default=["current="], metavar="LABEL=SRC",
                   help="code versions to compare: a label and the src directory to run it from")
    p.add_argument("--out", help="JSON file to add this label's results to")
    args = p.parse_args()
    sources = [tuple(x.split("=", 1)) for x in args.sources]
    rows: dict[str, list[dict]] = {label: [] for label, _ in sources}
    for _ in range(args.repeats):
        for window in [None, *args.windows]:  # None: no window, the noise floor
            for label, src in sources:  # alternating, so load changes hit both versions
                row = run_once(window, START + (window or 3) + 12, src or None)
                rows[label].append(row)
                print(label, json.dumps(row), flush=True)
    doc = {}
    for label, mine in rows.items():
        summary = {}
        for window in [0, *args.windows]:
            w = [r for r in mine if r["window"] == window]
            summary[str(window)] = {"stall_ms_median": statistics.median(r["stall_ms"] for r in w),
                                    "median_step_ms": statistics.median(r["median_step_ms"] for r in w),
                                    "trace_gz_mb": max(r["trace_gz_mb"] for r in w)}
        doc[label] = {"summary": summary, "runs": mine}
    doc["machine"] = f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} at the end"
    print(json.dumps({k: v["summary"] for k, v in doc.items() if k != "machine"}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
