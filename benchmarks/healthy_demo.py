"""`torchdoctor demo --healthy`, N times quiet and M times beside a CPU load: warnings per run (issue 12).

A healthy job must get no warning-level finding, every time, also when another process takes a
core. Each run is exactly what a user types (``python -m torchdoctor.cli demo --healthy --json
REPORT --quiet``); the load is accuracy.py's: one pure-Python busy loop pinned to the last CPU of
the affinity mask for the run's duration. Runs alternate quiet / loaded while both kinds remain.

    .venv/bin/python benchmarks/healthy_demo.py --runs 10 --load-runs 5
    (results: benchmarks/results/healthy_demo.md and .json next to it)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accuracy import contention, machine  # noqa: E402 - a sibling script, not a package

RESULTS = Path(__file__).resolve().parent / "results" / "healthy_demo.md"
WARN = ("warning", "critical")


def one_run(out: Path, i: int, load: bool) -> dict:
    report = out / f"run{i}.json"
    report.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "torchdoctor.cli", "demo", "--healthy", "--quiet", "--out", str(out / f"run{i}"),
           "--json", str(report)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR_")}
    start = time.monotonic()
    with contention(load), open(out / f"run{i}.log", "w", encoding="utf-8") as log:
        code = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=900).returncode
    rec = {"run": i, "load": load, "exit_code": code, "wall_s": round(time.monotonic() - start, 1), "findings": []}
    try:
        data = json.loads(report.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        rec["error"] = f"no report: {exc}"
        return rec
    rec["findings"] = [{"id": f["id"], "severity": f["severity"], "pct": round(f.get("recoverable_pct", 0.0), 1)}
                       for f in data.get("findings", [])]
    rec["warnings"] = sum(f["severity"] in WARN for f in rec["findings"])
    return rec


def render(runs: list[dict], meta: dict) -> str:
    lines = ["# `torchdoctor demo --healthy`: warnings per run (benchmarks/healthy_demo.py)", "",
             f"Command: `{meta['command']}`  ", f"Date: {meta['date']}; machine: {meta['machine']}  ",
             "Load: one `python -c 'while True: pass'` pinned to the last CPU of the mask during the run.", "",
             "| run | load | exit | wall s | warnings | findings (id:severity:% of step) |", "|---|---|---|---|---|---|"]
    for r in runs:
        finds = " ".join(f"{f['id']}:{f['severity']}:{f['pct']:g}" for f in r["findings"]) or r.get("error", "none")
        lines.append(f"| {r['run']} | {'yes' if r['load'] else 'no'} | {r['exit_code']} | {r['wall_s']} | "
                     f"{r.get('warnings', '-')} | {finds} |")
    for load in (False, True):
        sel = [r for r in runs if r["load"] is load]
        if sel:
            warned = sum(1 for r in sel if r.get("warnings", 1))
            lines.append(f"\n{'Loaded' if load else 'Quiet'}: {len(sel)} runs, {warned} with a warning or a "
                         "missing report.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10, help="quiet runs (default %(default)s)")
    p.add_argument("--load-runs", type=int, default=5, help="runs beside the busy loop (default %(default)s)")
    p.add_argument("--out", default="td-runs/healthy-demo", help="run directories (default %(default)s)")
    p.add_argument("--results", default=str(RESULTS), help="markdown results (default %(default)s)")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plan, quiet, loaded = [], args.runs, args.load_runs
    while quiet or loaded:
        if quiet:
            plan.append(False)
            quiet -= 1
        if loaded:
            plan.append(True)
            loaded -= 1
    meta = {"command": " ".join(["benchmarks/healthy_demo.py", *(sys.argv[1:] if argv is None else argv)]),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": machine()}
    runs = []
    for i, load in enumerate(plan):
        rec = one_run(out, i, load)
        runs.append(rec)
        print(f"[{i + 1}/{len(plan)}] load={load} exit={rec['exit_code']} warnings={rec.get('warnings')} "
              + " ".join(f"{f['id']}:{f['severity'][:4]}:{f['pct']:g}" for f in rec["findings"]), flush=True)
    text = render(runs, meta)
    results = Path(args.results)
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(text, encoding="utf-8")
    results.with_suffix(".json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=1) + "\n", encoding="utf-8")
    print(text)
    return 0 if all(r.get("warnings") == 0 and r["exit_code"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
