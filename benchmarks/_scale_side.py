"""One measured analysis for benchmarks/scale.py, in its own process: what `torchdoctor analyze DIR
--executor E --json OUT -q` does, then one JSON line (driver peak RSS, summary sizes, straggler)."""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile

from torchdoctor.advice.host_allocator import keep_freed_memory
from torchdoctor.executors import parse_executor
from torchdoctor.metrics.summary import summary_bytes
from torchdoctor.report.json_out import write_json
from torchdoctor.report.model import LazyRanks
from torchdoctor.session import analyze_paths
from torchdoctor.trace import scanned


def peak_mb() -> float:
    """This process's peak RSS: VmHWM where Linux has it. (getrusage's ru_maxrss keeps the peak of
    the process that exec'd this one: a parent that held a 622 MB trace would count here.)"""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("--executor", default="local")
    ap.add_argument("--jobs", type=int)
    a = ap.parse_args()
    keep_freed_memory(big_blocks=False)  # as cmd_analyze does
    report = analyze_paths([a.folder], jobs=a.jobs, executor=parse_executor(a.executor), progress=False)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "report.json")
        write_json(report, out)
        json_mb = os.path.getsize(out) / 1e6
    sizes = [summary_bytes(r.analysis) for r in report.ranks if r.analysis is not None]
    # Past SUMMARY_RANKS the driver holds each summary compressed (metrics/store.py): what it keeps.
    held = report.ranks.held_bytes / max(len(sizes), 1) / 1024 if isinstance(report.ranks, LazyRanks) else None
    print(json.dumps({
        "peak_mb": peak_mb(),
        "summary_kb_mean": sum(sizes) / max(len(sizes), 1) / 1024,
        "summary_kb_max": max(sizes, default=0) / 1024,
        "held_kb_mean": held,
        "analysed": len(sizes), "errors": len(report.errors),
        "straggler": report.cross_rank.straggler if report.cross_rank else None,
        "json_mb": round(json_mb, 1), "findings": [f.id for f in report.findings],
        "scanner": scanned.available(),
    }))


if __name__ == "__main__":
    main()
