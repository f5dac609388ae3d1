"""Read a TORCH_TRACE directory (the structured compile logs tlparse reads) into CompileFacts.

``TORCH_TRACE=/dir python train.py`` makes torch write ``/dir/dedicated_log_torch_trace_*.log``
(``..._rank_N_...`` per rank in distributed jobs). Each record is one line
``V1203 07:35:23.079000 <pid> <file:line>] {json metadata}`` followed by payload lines that start
with a TAB. What is read (verified on torch 2.13; other record kinds are skipped):

- ``compilation_metrics`` / ``bwd_compilation_metrics``: one per compile, the same fields as the
  live ``CompilationMetrics`` (compile id, code name and file, recompile reason, fail reason,
  seconds): recompiles per frame, the recompile limit, compile seconds.
- ``artifact`` ``dynamo_graph_break_reason``: each graph break, with "Graph break in user code at
  FILE:LINE", Dynamo's message (type, explanation, hints, registry link) and the user traceback.
- ``artifact`` ``recompile_reasons``: every failing guard of a recompile (values seen).
- ``artifact`` ``fx_graph_cache_hit`` / ``fx_graph_cache_miss``; ``dynamo_output_graph``: graphs.

Content is untrusted: it is parsed as JSON and text, never evaluated. A file that is not such a
log, or is cut short, gives one ``InputError``-style message and no facts.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field

from torchdoctor.compile.records import (
    CompileRecord,
    base_function,
    frame_names,
    from_metrics,
    recompile_frames,
)
from torchdoctor.facts import CompileFacts, GraphBreakFacts

LOG_NAME = re.compile(r"^dedicated_log_torch_trace_(?:rank_(\d+)_)?.*\.log$")
_HEAD = re.compile(r"^[VIWEC]\d{4} [\d:.]+\s+\d+ [^\]]*\] (\{.*\})\s*$")
_AT = re.compile(r"^Graph break in user code at (.+):(\d+)\s*$")
_FRAME = re.compile(r'^\s*File "(.+)", line (\d+), in (.+)$')
_GB_LINK = re.compile(r"/gb/gb(\d+)\.html")
_MAX_BREAKS = 30
_MAX_LINE = 1 << 24  # a record line longer than this is not a compile log


@dataclass
class TorchTrace:
    """What one log holds: its rank and the compile facts read from it."""

    path: str
    rank: int | None
    facts: CompileFacts
    records: int = 0
    skipped: list[str] = field(default_factory=list)


def is_log(path: str) -> bool:
    """A TORCH_TRACE log by its file name."""
    return bool(LOG_NAME.match(os.path.basename(path)))


def split_paths(paths: list[str]) -> tuple[list[str], list[str]]:
    """(TORCH_TRACE logs, the other paths): logs given directly or found in directories that hold
    no Kineto trace (a directory with both is searched for both)."""
    logs, rest = [], []
    for p in paths:
        if os.path.isfile(p) and is_log(p):
            logs.append(p)
            continue
        if os.path.isdir(p):
            names = [(root, f) for root, _d, files in os.walk(p) for f in files]
            found = sorted(os.path.join(root, f) for root, f in names if is_log(f))
            logs.extend(found)
            if found and not any(f.endswith((".json", ".json.gz")) for _r, f in names):
                continue
        rest.append(p)
    return logs, rest


def _records(path: str):
    """(metadata dict, payload text) per record; raises ValueError on a file that is not a log."""
    meta, payload, seen = None, [], 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if len(line) > _MAX_LINE:
                raise ValueError(f"line {n} is longer than {_MAX_LINE} characters")
            if line.startswith("\t"):
                if meta is not None:
                    payload.append(line[1:].rstrip("\n"))
                continue
            m = _HEAD.match(line)
            if not m:
                if line.strip() and seen == 0 and n > 3:
                    raise ValueError("not a TORCH_TRACE log (no structured record in its first lines)")
                continue
            if meta is not None:
                yield meta, "\n".join(payload)
            try:
                meta = json.loads(m.group(1))
            except json.JSONDecodeError:
                meta = None  # a record cut short (the job was killed mid-write): skipped
            payload, seen = [], seen + 1
        if meta is not None:
            yield meta, "\n".join(payload)
    if seen == 0:
        raise ValueError("not a TORCH_TRACE log (no structured record)")


def parse_break(text: str) -> GraphBreakFacts | None:
    """One ``dynamo_graph_break_reason`` payload as GraphBreakFacts (no registry lookup)."""
    lines = text.splitlines()
    at = next((m for m in map(_AT.match, lines[:3]) if m), None)
    try:
        tb = lines.index("User code traceback:")
    except ValueError:
        tb = len(lines)
    body = [ln for ln in lines[:tb] if not _AT.match(ln) and not ln.startswith("Graph Break Reason:")]
    message = [ln.strip() for ln in body]
    while message and not message[0]:
        message.pop(0)
    reason_line = next((ln for ln in lines[:tb] if ln.startswith("Graph Break Reason:")), "")
    reason = message[0] if message else reason_line.removeprefix("Graph Break Reason:").strip()
    if not reason:
        return None
    if reason.startswith("generic_jump") or "data-dependent branching" in reason.lower():
        reason = "Data-dependent branching"
    explanation = next((ln.removeprefix("Explanation:").strip() for ln in message if ln.startswith("Explanation:")), None)
    hints = [ln.removeprefix("Hint:").strip() for ln in message if ln.startswith("Hint:")]
    link = _GB_LINK.search(text)
    frames = [(m.group(1), int(m.group(2)), m.group(3), lines[i + 1].strip() if i + 1 < len(lines) else "")
              for i, m in ((i, _FRAME.match(ln)) for i, ln in enumerate(lines[tb:], tb)) if m]
    location = f"{at.group(1)}:{at.group(2)}" if at else None
    here = next((fr for fr in reversed(frames) if location and f"{fr[0]}:{fr[1]}" == location), None)
    in_torch = location is None or "/torch/" in location.replace(os.sep, "/")
    return GraphBreakFacts(
        reason=reason[:200], gb_id=f"GB{link.group(1)}" if link else None,
        explanation=(explanation or "")[:400] or None, hints=[h[:300] for h in hints[:4]],
        location=None if in_torch else location,
        source=(here[3][:200] or None) if here and not in_torch else None,
        function=base_function(here[2]) if here and not in_torch else None, in_torch=in_torch)


def read(path: str) -> TorchTrace:
    """The compile facts of one TORCH_TRACE log; ValueError (one line) when it is not one."""
    m = LOG_NAME.match(os.path.basename(path))
    rank = int(m.group(1)) if m and m.group(1) else None
    compiles: list[CompileRecord] = []
    guards: dict[str, list[str]] = {}
    breaks: dict[tuple[str, str | None], GraphBreakFacts] = {}
    graphs, cache, n = 0, Counter(), 0
    for meta, payload in _records(path):
        n += 1
        if rank is None and isinstance(meta.get("rank"), int):
            rank = meta["rank"]
        for kind in ("compilation_metrics", "bwd_compilation_metrics"):
            cm = meta.get(kind)
            if isinstance(cm, dict):
                rec = from_metrics(cm.get, kind == "compilation_metrics")
                if rec is not None:
                    compiles.append(rec)
        if "dynamo_output_graph" in meta:
            graphs += 1
        art = meta.get("artifact")
        if not isinstance(art, dict):
            continue
        name = art.get("name")
        if name in ("fx_graph_cache_hit", "fx_graph_cache_miss"):
            cache[name] += 1
        elif name == "recompile_reasons":
            try:
                got = json.loads(payload) if art.get("encoding") == "json" else payload
            except json.JSONDecodeError:
                got = payload
            for reason in ([got] if isinstance(got, str) else got if isinstance(got, list) else []):
                guards.setdefault(str(meta.get("frame_id")), []).append(str(reason))
        elif name == "dynamo_graph_break_reason":
            b = parse_break(payload)
            if b is None:
                continue
            key = (b.reason, b.location)
            if key in breaks:
                breaks[key].compiles += 1
            elif len(breaks) < _MAX_BREAKS:
                breaks[key] = b
    by_code: dict[tuple[str | None, str | None], list[str]] = {}
    for c in compiles:
        if c.forward and c.frame_id in guards:
            by_code.setdefault((c.name, c.location), guards[c.frame_id])
    frames = recompile_frames(compiles, by_code)
    total = sum(c.seconds for c in compiles)
    backend = sum(c.backend_seconds for c in compiles)
    facts = CompileFacts(
        used=bool(compiles or graphs), graph_breaks=sum(b.compiles for b in breaks.values()),
        graph_break_reasons=[b.reason for b in breaks.values()][:10], breaks=list(breaks.values()),
        recompiles=sum(r.count for r in frames), recompile_reasons=[r.guard for r in frames][:10],
        recompile_frames=frames, frame_names=frame_names(compiles), unique_graphs=graphs or None,
        cache_hits=cache["fx_graph_cache_hit"] if cache else None,
        cache_misses=cache["fx_graph_cache_miss"] if cache else None,
        compile_time_s=round(total, 3) if total else None,
        dynamo_s=round(max(0.0, total - backend), 3) if total else None,
        backend_s=round(backend, 3) if total else None)
    return TorchTrace(path, rank, facts, n)

