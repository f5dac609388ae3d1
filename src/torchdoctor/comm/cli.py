"""`torchdoctor comm`: launch the collective benchmark on every rank and print busbw per size.

``torchdoctor comm --nproc-per-node N`` launches ``torch.distributed.run --standalone`` itself;
``torchdoctor comm -- torchrun --nnodes 2 --nproc-per-node 8 ...`` uses the job's own launcher
(the benchmark module is appended to it). No torch import here: the ranks import it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from rich.console import Console
from rich.table import Table

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_bytes(text: str) -> int:
    """ "8", "64K", "16M", "1G" -> bytes."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = t[-1] if t and t[-1] in _UNITS else ""
    return int(float(t[: len(t) - len(unit)]) * _UNITS[unit])


def human(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n:g} B"


def command(args: argparse.Namespace, out: str) -> list[str]:
    bench = ["-m", "torchdoctor.comm.bench", "--out", out, "--min-bytes", str(parse_bytes(args.min_bytes)),
             "--max-bytes", str(parse_bytes(args.max_bytes)), "--ops", args.ops, "--timeout", str(args.timeout)]
    launcher = [a for a in args.launcher if a != "--"]
    if launcher:
        return [*launcher, *bench]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc_per_node}",
            *bench]


def render(result: dict, console: Console) -> None:
    peak = (result.get("peak") or {}).get("gbps")
    t = Table(title=f"Collectives: {result['backend']}, {result['world_size']} ranks, {result['device']} "
                    f"(busbw = algbw x nccl-tests' factor)", title_justify="left")
    for col in ("op", "size", "time (µs)", "algbw (GB/s)", "busbw (GB/s)") + (("% of peak",) if peak else ()):
        t.add_column(col, justify="left" if col == "op" else "right")
    for r in result["collectives"]:
        row = [r["op"], human(r["bytes"]), f"{r['time_us']:,.1f}", f"{r['algbw_gbps']:.3f}", f"{r['busbw_gbps']:.3f}"]
        if peak:
            row.append(f"{100 * r['busbw_gbps'] / peak:.1f}%")
        t.add_row(*row)
    console.print(t)
    if peak:
        console.print(f"peak: {peak:g} GB/s ({result['peak']['source']})")
    else:
        console.print("peak: unknown for this fabric (no link figures): compare busbw across sizes and runs")
    for op, why in (result.get("skipped") or {}).items():
        console.print(f"skipped {op}: {why}")


def cmd_comm(args: argparse.Namespace) -> int:
    try:
        parse_bytes(args.min_bytes), parse_bytes(args.max_bytes)
    except (ValueError, IndexError):
        print(f"torchdoctor: comm: bad size {args.min_bytes!r} or {args.max_bytes!r} (use 8, 64K, 16M, 1G)", file=sys.stderr)
        return EXIT_USAGE
    if args.from_json:
        try:
            with open(args.from_json, encoding="utf-8") as f:
                result = json.load(f)
            if not isinstance(result, dict) or not isinstance(result.get("collectives"), list):
                raise ValueError("no collectives[]")
        except (OSError, ValueError) as exc:
            print(f"torchdoctor: comm: {args.from_json}: not a comm result ({exc})", file=sys.stderr)
            return EXIT_USAGE
    else:
        code, result = _benchmark(args)
        if code:
            return code
    if args.json and not args.from_json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    if not args.quiet and not args.compare:
        render(result, Console())
    if args.compare:
        return _compare(args, result)
    return EXIT_OK


def _compare(args: argparse.Namespace, bench: dict) -> int:
    """Place the job's collectives (a trace or run directory) on the benchmark's curve."""
    import msgspec

    from torchdoctor.comm.compare import place, sentence
    from torchdoctor.session import analyze_paths

    report = msgspec.to_builtins(analyze_paths(args.compare))
    rows = place(report, bench)
    for e in report.get("errors", []):
        print(f"torchdoctor: comm: {e['file']}: {e['message']}", file=sys.stderr)
    if not rows:
        print("torchdoctor: comm: the job's trace records no collective sizes (gloo traces carry none without "
              "record_param_comms; NCCL traces do)", file=sys.stderr)
        return EXIT_FAILED
    if args.compare_json:
        with open(args.compare_json, "w", encoding="utf-8") as f:
            json.dump({"placed": rows}, f, indent=1)
    if not args.quiet:
        for row in rows:
            print(sentence(row, human))
    return EXIT_OK


def _benchmark(args: argparse.Namespace) -> tuple[int, dict]:
    with tempfile.TemporaryDirectory(prefix="td-comm-") as tmp:
        out = os.path.join(tmp, "comm.json")
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        proc = subprocess.run(command(args, out), env=env, capture_output=True, text=True)
        if proc.returncode != 0 or not os.path.exists(out):
            last = next((ln for ln in reversed(proc.stderr.splitlines()) if "Error" in ln or "error" in ln),
                        proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "no output")
            print(f"torchdoctor: comm: the benchmark failed (exit {proc.returncode}): {last.strip()[:300]}",
                  file=sys.stderr)
            return EXIT_FAILED, {}
        with open(out, encoding="utf-8") as f:
            return EXIT_OK, json.load(f)


def add_comm_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "comm", help="benchmark collectives (all_reduce, all_gather, ...) over sizes: algbw and busbw",
        description="Run all_reduce, all_gather, reduce_scatter, all_to_all and broadcast over sizes with the job's "
                    "backend (NCCL on GPUs, gloo on CPU): median time, algbw and busbw (nccl-tests' factors), and the "
                    "fraction of the fabric's peak where it is known. Standalone with --nproc-per-node, or after -- "
                    "with the job's own launcher.")
    p.add_argument("--nproc-per-node", type=int, default=2, help="ranks to start (standalone; default %(default)s)")
    p.add_argument("--min-bytes", default="8", help="smallest message (default %(default)s)")
    p.add_argument("--max-bytes", default="64M", help="largest message (default %(default)s; up to 1G)")
    p.add_argument("--ops", default="all_reduce,all_gather,reduce_scatter,all_to_all,broadcast")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds any collective may take before the run fails")
    p.add_argument("--json", metavar="FILE", help="write the result as JSON (collectives[]: op, bytes, time_us, ...)")
    p.add_argument("--quiet", action="store_true", help="print nothing (with --json)")
    p.add_argument("--compare", nargs="+", metavar="PATH",
                   help="the job's traces or run directory: place its collectives on the measured curve")
    p.add_argument("--from-json", metavar="FILE", help="use an earlier --json result instead of measuring again")
    p.add_argument("--compare-json", metavar="FILE", help="write the placed collectives as JSON")
    p.add_argument("launcher", nargs=argparse.REMAINDER, help="-- torchrun ... (the job's launcher), optional")
    p.set_defaults(func=cmd_comm)
    return p
