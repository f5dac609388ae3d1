"""The fixed cost of reaching a running Dask or Ray engine from a fresh driver process.

What `torchdoctor analyze --executor dask://ADDR` (or `ray://auto`) pays before its first rank is
analysed, whatever the traces: the engine's import, the connection, one round trip of two trivial
tasks, and closing. The engine is started once, before the timed children (as a user's cluster runs
before the command), so its own start-up is not counted. scale.py's 64-rank ratios are read against
this floor: a 1.5 s local analysis cannot be within 1.5x on an engine whose floor is 0.75 s or more.

    .venv/bin/python benchmarks/engine_floor.py [--repeats 3] [--engines dask,ray]

Prints a markdown table and writes benchmarks/results/engine_floor.md (unless --no-write).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

from scale import attached  # the engine held open before the timed drivers, as scale.py's attached runs

RESULTS = Path(__file__).resolve().parent / "results" / "engine_floor.md"
PHASES = ("import_s", "connect_s", "first_tasks_s", "close_s")

_DASK_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
from distributed import Client
t1 = time.perf_counter()
c = Client(sys.argv[1], timeout="20s")
t2 = time.perf_counter()
c.gather(c.map(abs, [-1, -2], pure=False))
t3 = time.perf_counter()
c.close()
t4 = time.perf_counter()
print(json.dumps(dict(import_s=t1 - t0, connect_s=t2 - t1, first_tasks_s=t3 - t2, close_s=t4 - t3)))
"""

_RAY_CHILD = r"""
import json, time
t0 = time.perf_counter()
import ray
t1 = time.perf_counter()
ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
t2 = time.perf_counter()
f = ray.remote(num_cpus=1)(lambda x: abs(x))
ray.get([f.remote(-1), f.remote(-2)])
t3 = time.perf_counter()
ray.shutdown()
t4 = time.perf_counter()
print(json.dumps(dict(import_s=t1 - t0, connect_s=t2 - t1, first_tasks_s=t3 - t2, close_s=t4 - t3)))
"""

def _child(cmd: list[str]) -> dict[str, float]:
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - t
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise SystemExit(f"engine_floor: {cmd[2][:20]!r}... failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return {**json.loads(lines[-1]), "wall_s": wall}


def runs(engine: str, repeats: int, workers: int) -> list[dict[str, float]]:
    """`repeats` fresh drivers against one engine held by scale.attached (as its attached runs)."""
    with attached(engine, workers) as spec:
        if engine == "dask":
            return [_child([sys.executable, "-c", _DASK_CHILD, spec.removeprefix("dask://")])
                    for _ in range(repeats)]
        return [_child([sys.executable, "-c", _RAY_CHILD]) for _ in range(repeats)]


def render(rows: dict[str, list[dict[str, float]]], argv: list[str]) -> str:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    out = [f"# The fixed cost of a running engine, from a fresh driver (benchmarks/engine_floor.py)\n\n"
           f"Generated {_dt.datetime.now():%Y-%m-%d %H:%M} by `benchmarks/engine_floor.py {' '.join(argv)}` on "
           f"{cpus} CPUs, Python {sys.version.split()[0]}. Each run is a fresh process against an engine "
           "started before it; seconds, median [min..max] over the runs.\n",
           "| engine | runs | import | connect | 2 trivial tasks | close | process wall |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for engine, runs in rows.items():
        cells = []
        for key in (*PHASES, "wall_s"):
            vals = [r[key] for r in runs]
            cells.append(f"{median(vals):.2f} [{min(vals):.2f}..{max(vals):.2f}]")
        out.append(f"| {engine} | {len(runs)} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--engines", default="dask,ray")
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    rows = {e: runs(e, a.repeats, a.workers) for e in a.engines.split(",") if e}
    text = render(rows, sys.argv[1:])
    print(text)
    if not a.no_write:
        RESULTS.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
