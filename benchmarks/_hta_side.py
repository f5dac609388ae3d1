"""HTA side of the torchdoctor benchmarks: runs Holistic Trace Analysis and prints JSON.

This script runs *inside an HTA virtualenv* (made by setup_hta.sh: HTA 0.5.0, PyPI
``holistictraceanalysis``, in benchmarks/.hta-venv; HTA 0.6.1, PyPI ``traceinsight``, in
benchmarks/out/hta-venv-0.6.1), never in torchdoctor's environment: HTA is a reference tool, not a
dependency. The driver scripts (hta_compare.py, speed_vs_hta.py) call it through subprocess and read
the JSON it writes. Both releases import as ``hta`` with the same TraceAnalysis API; where they
differ (0.6.1 reads its environment options once, into a singleton) the code detects the feature
rather than the version.

Two sub-commands:

``temporal TRACE... --out OUT.json``
    For each trace file, load it alone with ``TraceAnalysis(trace_dir=<temp dir holding a link to
    it>)`` and run ``get_temporal_breakdown(visualize=False)``. Records HTA's idle / compute /
    non-compute times (µs) and percentages, its window (first to last row with ``stream != -1``, in
    the trace's own µs clock) and any exception as ``"Type: message"``. With ``--variants`` it repeats
    the run (a) with ``include_last_profiler_step=True`` and (b) with ``HTA_DISABLE_NS_ROUNDING=1``, so
    the driver can show from HTA itself how much each of those two HTA behaviours moves idle %.

``bench TRACE_DIR --out OUT.json``
    The speed/memory workload: ``TraceAnalysis(trace_dir=TRACE_DIR)`` (load) followed by
    ``get_temporal_breakdown``, ``get_idle_time_breakdown`` (all loaded ranks; HTA's default is rank 0
    only), ``get_gpu_kernel_breakdown`` and ``get_comm_comp_overlap``, all with ``visualize=False``.
    Writes the wall time of each phase and HTA's idle % per rank. Wall clock and peak RSS of the
    whole process are measured by the caller.

Run by hand (after ``bash benchmarks/setup_hta.sh``)::

    benchmarks/.hta-venv/bin/python benchmarks/_hta_side.py temporal ../shared/traces/*.json.gz --out /tmp/t.json
    benchmarks/.hta-venv/bin/python benchmarks/_hta_side.py bench benchmarks/out/big --out /tmp/b.json
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import tempfile
import time
import traceback
from typing import Any

# HTA logs timing lines at WARNING level; keep stderr readable.
logging.getLogger("hta").setLevel(logging.ERROR)


def _quiet_hta() -> None:
    from hta.configs.config import logger  # type: ignore[import-not-found]

    logger.setLevel(logging.ERROR)


def _num(x: Any) -> float | int | None:
    """JSON-safe number (NaN -> None, numpy scalars -> Python)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    if math.isnan(v) or math.isinf(v):
        return None
    return int(v) if v.is_integer() else v


def _set_ns_rounding(disable: bool) -> None:
    """Turn HTA's µs rounding of ns timestamps off or on for the next load.

    HTA 0.5 reads ``HTA_DISABLE_NS_ROUNDING`` from the environment at each parse; 0.6 reads it once
    into ``HTAEnvOptions.instance()``, so there the singleton is set as well."""
    if disable:
        os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"
    else:
        os.environ.pop("HTA_DISABLE_NS_ROUNDING", None)
    try:
        from hta.configs.env_options import HTAEnvOptions  # type: ignore[import-not-found]
    except ImportError:  # HTA 0.5: the environment variable is all there is
        return
    HTAEnvOptions.instance().set_disable_ns_rounding(disable)


def _temporal_once(path: str, include_last_profiler_step: bool, disable_rounding: bool) -> dict[str, Any]:
    from hta.trace_analysis import TraceAnalysis  # type: ignore[import-not-found]

    _set_ns_rounding(disable_rounding)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="hta_one_") as tmp:
        # HTA reads every *.json / *.gz of a directory: give it a directory holding only this trace.
        os.symlink(os.path.abspath(path), os.path.join(tmp, os.path.basename(path)))
        t0 = time.perf_counter()
        try:
            ta = TraceAnalysis(trace_dir=tmp, include_last_profiler_step=include_last_profiler_step)
            df = ta.get_temporal_breakdown(visualize=False)
        except Exception as exc:  # HTA 0.5 crashes on CPU-only traces: record, don't die.
            out["error"] = f"{type(exc).__name__}: {exc}"
            out["traceback"] = traceback.format_exc(limit=3)
            return out
        out["seconds"] = round(time.perf_counter() - t0, 3)
        if df is None or len(df) == 0:  # HTA 0.6 skips a trace without analysable device events
            out["error"] = "no result: HTA returned an empty temporal breakdown"
            return out
        row = df.iloc[0]
        for col in ("rank", "idle_time(us)", "compute_time(us)", "non_compute_time(us)", "kernel_time(us)"):
            out[col] = _num(row[col])
        for col in ("idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg"):
            out[col] = _num(row[col])
        # Unrounded idle %, so the driver is not limited by HTA's round(., 2).
        out["idle_pct_exact"] = _num(100.0 * float(row["idle_time(us)"]) / float(row["kernel_time(us)"]))
        rank = int(row["rank"])
        tdf = ta.t.get_trace(rank)
        gpu = tdf[tdf["stream"].ne(-1)]
        min_ts = int(getattr(ta.t, "min_ts", 0))
        out["window_us"] = [_num(gpu["ts"].min() + min_ts), _num((gpu["ts"] + gpu["dur"]).max() + min_ts)]
        out["gpu_rows"] = int(len(gpu))
        steps = ta.t.get_iterations(rank)
        out["iterations"] = [int(s) for s in steps]
    return out


def cmd_temporal(args: argparse.Namespace) -> int:
    _quiet_hta()
    results: dict[str, Any] = {}
    for path in args.traces:
        entry: dict[str, Any] = {"default": _temporal_once(path, False, False)}
        if args.variants and "error" not in entry["default"]:
            entry["include_last_step"] = _temporal_once(path, True, False)
            entry["no_rounding"] = _temporal_once(path, False, True)
        results[os.path.basename(path)] = entry
        d = entry["default"]
        print(f"{os.path.basename(path)}: {d.get('idle_time_pctg', d.get('error'))}", file=sys.stderr)
    with open(args.out, "w") as f:
        json.dump({"hta_version": _hta_version(), "results": results}, f, indent=1)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    _quiet_hta()
    t_import = time.perf_counter()
    from hta.trace_analysis import TraceAnalysis  # type: ignore[import-not-found]

    phases: dict[str, float] = {"import": time.perf_counter() - t_import}
    t0 = time.perf_counter()
    ta = TraceAnalysis(trace_dir=os.path.abspath(args.trace_dir))
    phases["load"] = time.perf_counter() - t0
    ranks = ta.t.get_ranks()

    t0 = time.perf_counter()
    temporal = ta.get_temporal_breakdown(visualize=False)
    phases["temporal_breakdown"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    ta.get_idle_time_breakdown(ranks=ranks, visualize=False)
    phases["idle_time_breakdown"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    ta.get_gpu_kernel_breakdown(visualize=False)
    phases["gpu_kernel_breakdown"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    overlap = ta.get_comm_comp_overlap(visualize=False)
    phases["comm_comp_overlap"] = time.perf_counter() - t0

    rows = {int(r): int(len(ta.t.get_trace(r))) for r in ranks}
    out = {
        "hta_version": _hta_version(),
        "ranks": [int(r) for r in ranks],
        "rows_per_rank": rows,
        "phases_s": {k: round(v, 3) for k, v in phases.items()},
        "idle_pct": {int(r): _num(v) for r, v in zip(temporal["rank"], temporal["idle_time_pctg"], strict=True)},
        "comm_comp_overlap_pct": {
            int(r): _num(v) for r, v in zip(overlap["rank"], overlap["comp_comm_overlap_pctg"], strict=True)
        },
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    return 0


def _hta_version() -> str:
    """The installed HTA release (0.6 is published as ``traceinsight``, 0.5 as ``holistictraceanalysis``)."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("traceinsight", "holistictraceanalysis"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "?"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("temporal", help="temporal breakdown of each trace, one TraceAnalysis per trace")
    t.add_argument("traces", nargs="+")
    t.add_argument("--out", required=True)
    t.add_argument("--variants", action="store_true", help="also include_last_profiler_step / no rounding")
    t.set_defaults(func=cmd_temporal)
    b = sub.add_parser("bench", help="load + temporal/idle/kernel breakdowns + comm/comp overlap")
    b.add_argument("trace_dir")
    b.add_argument("--out", required=True)
    b.set_defaults(func=cmd_bench)
    args = ap.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
