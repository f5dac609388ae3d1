"""`--annotated-trace`: a copy of an analysed trace with torchdoctor's findings as an extra track.

The copy is streamed: the original bytes are copied block by block and the new events are spliced
in right after the `"traceEvents": [` token, so a 600 MB trace is never held in memory (nor parsed
a second time). The added events live on their own process (`TD_PID`, named "torchdoctor" by "M"
metadata events) so Perfetto / chrome://tracing show them as a separate track group:

  tid 1 "findings"          one range per finding over the analysis window
  tid 2 "device idle"       one range per idle gap, named by its attribution
                            ("idle: waiting for DataLoader, 23 ms")
  tid 3 "analysis window"   the window and one range per step with its numbers

Timestamps are absolute, in the trace's own clock: µs = (window start_ns + offset_ns) / 1000,
written as exact decimals so ns-precision epoch timestamps survive.
"""

from __future__ import annotations

import gzip
import os
import re
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

import msgspec

from ..metrics.model import RankResult
from .labels import cause_label, fmt_ms, job_cost, steps_label
from .model import Finding, RankReport, Report

# Above Linux's largest pid (2^22), so the track cannot merge with a real process of the trace;
# below 2^31 because some viewers keep pids in 32-bit signed ints.
TD_PID = 1 << 30
TID_FINDINGS, TID_IDLE, TID_WINDOW = 1, 2, 3
TD_CAT = "torchdoctor"
# Same token the decoder looks for (trace/decode.py), so both agree on where the events start.
_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
BLOCK = 8 << 20
# How far into the file `"traceEvents": [` may sit (Kineto writes a few KB of header before it;
# deviceProperties of a 16-GPU node stays far below this).
MAX_HEAD = 256 << 20
# msgspec writes Decimal as a JSON number, digit for digit: no float rounding of epoch-ns times.
_encoder = msgspec.json.Encoder(decimal_format="number")


class AnnotateError(ValueError):
    """The report holds no trace that can be annotated; the message says why in one line."""


def write_annotated_trace(report: Report, path: str | os.PathLike[str], rank: int | None = None) -> Path:
    """Write a copy of one analysed trace with the findings added; gzip when `path` ends in .gz.

    `rank`: which rank's trace to copy (default: the first analysed one). Returns the path written.
    Raises AnnotateError when there is nothing to annotate, OSError when a file cannot be read/written.
    """
    rr = _pick_rank(report, rank)
    assert rr.analysis is not None
    events = annotation_events(rr.analysis, report.findings)
    payload = b",\n".join(_encoder.encode(e) for e in events)
    dst = Path(path)
    # Write next to the destination and rename at the end: a failed copy never leaves half a
    # trace behind, and annotating a trace onto its own path does not truncate what is being read.
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    try:
        with _open_src(rr.analysis.file) as src, _open_dst(tmp, gz=dst.name.endswith(".gz")) as out:
            _splice(src, out, payload)
        os.replace(tmp, dst)
    finally:
        if tmp.exists():
            tmp.unlink()
    return dst


def _pick_rank(report: Report, rank: int | None) -> RankReport:
    have: list[str] = []  # one rank at a time: a report of thousands of ranks is read from a store
    for r in report.ranks:
        if r.analysis is None:
            continue
        if rank is None or r.rank == rank:
            return r
        if len(have) < 20:
            have.append(str(r.rank))
    if not have:
        raise AnnotateError("no analysed trace in this report: nothing to annotate")
    raise AnnotateError(f"rank {rank} is not among the analysed ranks ({', '.join(have)})")


def _us(ns: int) -> Decimal:
    """ns → µs as an exact decimal (Kineto's unit)."""
    return Decimal(int(ns)).scaleb(-3)


def _meta(name: str, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": TD_PID, "tid": tid, "args": args}


def _range(tid: int, name: str, start_ns: int, end_ns: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "X", "cat": TD_CAT, "name": name, "pid": TD_PID, "tid": tid,
            "ts": _us(start_ns), "dur": _us(max(end_ns - start_ns, 0)), "args": args}


def finding_label(f: Finding) -> str:
    gain = f"≈{f.recoverable_pct:.0f}% of step"
    if f.recoverable_ms:
        gain += f", {fmt_ms(f.recoverable_ms)} ms/step"
    elif f.job_s:
        gain = job_cost(f.job_s, f.job_pct, f.per)
    return f"[{f.severity}] {f.id}: {f.title} ({gain})"


def annotation_events(r: RankResult, findings: list[Finding]) -> list[dict[str, Any]]:
    """The Chrome-trace events torchdoctor adds for one rank (metadata first, then ranges)."""
    lo, hi = r.window.start_ns, r.window.end_ns
    out: list[dict[str, Any]] = [
        _meta("process_name", 0, {"name": "torchdoctor"}),
        _meta("process_labels", 0, {"labels": "findings and idle attribution"}),
        # A negative sort index puts the track group above the trace's own processes.
        _meta("process_sort_index", 0, {"sort_index": -1}),
    ]
    for tid, name in ((TID_FINDINGS, "findings"), (TID_IDLE, "device idle (by cause)"),
                      (TID_WINDOW, "analysis window")):
        out.append(_meta("thread_name", tid, {"name": name}))
        out.append(_meta("thread_sort_index", tid, {"sort_index": tid}))

    mine = [f for f in findings if not f.ranks or r.rank in f.ranks]
    for f in mine:
        args: dict[str, Any] = {"id": f.id, "layer": f.layer, "severity": f.severity,
                                "recoverable_pct": f.recoverable_pct, "confidence": f.confidence,
                                "evidence": [e.text for e in f.evidence]}
        if f.recoverable_ms is not None:
            args["recoverable_ms_per_step"] = f.recoverable_ms
        if f.fix is not None:
            args["fix"] = f.fix.text
        if f.confirm:
            args["confirm"] = f.confirm
        if f.ranks:
            args["ranks"] = f.ranks[:64]
        out.append(_range(TID_FINDINGS, finding_label(f), lo, hi, args))

    for s, e, cause in r.timeline_gaps:
        ms = (e - s) / 1e6
        out.append(_range(TID_IDLE, f"idle: {cause_label(cause)}, {fmt_ms(ms)} ms", lo + s, lo + e,
                          {"cause": cause, "dur_ms": round(ms, 4)}))

    steps = r.window.steps
    label = steps_label(steps) if steps else "no ProfilerStep"
    out.append(_range(TID_WINDOW, f"torchdoctor window: {label} ({r.window.mode})", lo, hi,
                      {"mode": r.window.mode, "steps": steps[:1000],
                       "skipped_warmup": r.window.skipped_warmup}))
    for row in r.steps:
        name = f"step {row.step}: {fmt_ms(row.dur_ms)} ms"
        if row.idle_ms is not None:
            name += f", device idle {fmt_ms(row.idle_ms)} ms"
        args = {k: v for k, v in msgspec.structs.asdict(row).items() if v is not None and k != "start_ns"}
        # Clamped into the window: dur_ms is rounded, and a step poking out of the window range by
        # a few ns would be mis-nested on the track (Perfetto then drops or truncates it).
        start = max(row.start_ns, lo)
        end = min(row.start_ns + round(row.dur_ms * 1e6), hi)
        out.append(_range(TID_WINDOW, name, start, max(end, start), args))
    return out


def _is_gzip(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def _open_src(path: str) -> IO[bytes]:
    # By content, not by name: the decoder accepts a gzip trace whatever it is called.
    return gzip.open(path, "rb") if _is_gzip(path) else open(path, "rb")  # noqa: SIM115


def _open_dst(path: Path, gz: bool) -> IO[bytes]:
    # Level 6 (zlib's default): a 600 MB trace compresses at tens of MB/s; level 9 is 3x slower
    # for a few per cent.
    return gzip.open(path, "wb", compresslevel=6) if gz else open(path, "wb")  # noqa: SIM115


def _blocks(src: IO[bytes]) -> Iterator[bytes]:
    while block := src.read(BLOCK):
        yield block


def _splice(src: IO[bytes], out: IO[bytes], payload: bytes) -> None:
    """Copy `src` to `out` with `payload` (comma-joined events) inserted first in traceEvents."""
    blocks = _blocks(src)
    head = bytearray()
    at = -1
    for block in blocks:
        head += block
        stripped = head.lstrip()
        if stripped[:1] == b"[":
            # A bare list of events (also accepted by the loader): insert after its '['.
            at = len(head) - len(stripped) + 1
            break
        m = _KEY.search(head)
        if m:
            at = m.end()
            break
        if len(head) > MAX_HEAD:
            break
    if at < 0:
        raise AnnotateError('no "traceEvents": [ array found near the start of the trace')
    # An empty array takes the events without a trailing comma; find its next significant byte.
    rest = head[at:]
    while not rest.strip():
        nxt = next(blocks, None)
        if nxt is None:
            raise AnnotateError("trace ends inside traceEvents")
        rest += nxt
    empty = rest.lstrip()[:1] == b"]"
    out.write(head[:at])
    out.write(b"\n")
    out.write(payload)
    if payload and not empty:
        out.write(b",")
    out.write(b"\n")
    out.write(rest)
    del head, rest
    for block in blocks:
        out.write(block)


__all__ = ["AnnotateError", "TD_PID", "annotation_events", "write_annotated_trace"]
