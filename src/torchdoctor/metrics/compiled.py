"""Compiled regions of torch.compile in the trace, and the eager time a graph break leaves.

Dynamo wraps each run of a compiled frame in a ``Torch-Compiled Region: F/N`` range (F: the
frame's id, N: which of its compiles). After a graph break, the frame's remaining code runs in
eager and then calls the *resume function* Dynamo compiled for the rest of the frame: a new frame
id whose region is nested inside the first one. The compiled graphs themselves run inside
``CompiledFunction`` (AOTAutograd, training), ``## Call CompiledFxGraph <key> ##`` (Inductor)
or ``AOTDispatcher Runtime Wrapper Prologue`` ranges.
"""

from __future__ import annotations

import re
from collections import defaultdict

import numpy as np

from ..compile.records import RESUME, base_function
from ..facts import CompileFacts, GraphBreakFacts
from ..trace.model import RankTrace
from .steps import Window

_REGION = re.compile(r"^Torch-Compiled Region: (\d+)/(\d+)")
_GRAPH_CALLS = ("CompiledFunction", "## Call CompiledFxGraph", "AOTDispatcher Runtime Wrapper")
# Compiling, as Dynamo records it while a profiler runs (dynamo_timed ranges): a resume function
# compiled on its first call (or recompiled) is compiled inside the gap, and is not eager code.
_COMPILING = ("entire_frame_compile", "entire_backward_compile", "_compile.compile_inner")


def compiled_regions(tr: RankTrace) -> dict[str, int]:
    """torch.compile frames seen: 'frame/recompile' -> count of `Torch-Compiled Region` events."""
    out: dict[str, int] = {}
    for nid, name in enumerate(tr.names):
        m = _REGION.match(name)
        if m:
            n = int((tr.name == nid).sum())
            if n:
                out[f"{m.group(1)}/{m.group(2)}"] = n
    return out


def break_gaps(tr: RankTrace, win: Window) -> dict[str, float]:
    """Eager time per step before each nested compiled region: what a graph break leaves, in ms.

    For every region R = ``Torch-Compiled Region: F/N`` in the window that is nested in another
    region P on the same thread (R is the resume function of the break in P's frame): the time
    from the end of the last graph call or region inside P that ended before R started, to R's
    start, less the time spent compiling in it (``_COMPILING`` ranges: the resume function is
    compiled on its first call), summed over the window and divided by its steps (by 1 without
    steps). Keyed by R's "F/N". A gap is only measured after a graph call or region in P, so
    guard evaluation at P's start is never counted; with the "eager" backend (no graph-call
    ranges) nothing is measured.
    """
    region_ids = {nid: f"{m.group(1)}/{m.group(2)}" for nid, name in enumerate(tr.names)
                  if (m := _REGION.match(name))}
    if not region_ids:
        return {}
    call_ids = [nid for nid, name in enumerate(tr.names) if name.startswith(_GRAPH_CALLS)]
    inside = (tr.ts >= win.start) & (tr.end <= win.end)
    is_region = np.isin(tr.name, list(region_ids))
    picked = np.flatnonzero(inside & (is_region | np.isin(tr.name, call_ids)))
    by_tid: dict[int, list[int]] = defaultdict(list)
    for i in picked:
        by_tid[int(tr.tid[i])].append(int(i))
    compiling: dict[int, list[tuple[int, int]]] = defaultdict(list)
    compile_ids = [nid for nid, name in enumerate(tr.names) if name.startswith(_COMPILING)]
    for i in np.flatnonzero(inside & np.isin(tr.name, compile_ids)):
        compiling[int(tr.tid[i])].append((int(tr.ts[i]), int(tr.end[i])))
    gaps: dict[str, int] = defaultdict(int)
    for idx in by_tid.values():
        idx.sort(key=lambda i: (int(tr.ts[i]), -int(tr.end[i])))
        open_regions: list[tuple[int, int | None]] = []  # (end, last child's end) of the enclosing regions
        for i in idx:
            ts, end = int(tr.ts[i]), int(tr.end[i])
            while open_regions and open_regions[-1][0] <= ts:
                open_regions.pop()
            if is_region[i]:
                last = open_regions[-1][1] if open_regions else None
                if last is not None and last <= ts:
                    busy = _covered(compiling.get(int(tr.tid[i]), []), last, ts)
                    gaps[region_ids[int(tr.name[i])]] += max(0, ts - last - busy)
                if open_regions:
                    open_regions[-1] = (open_regions[-1][0], end)
                open_regions.append((end, None))
            elif open_regions:
                open_regions[-1] = (open_regions[-1][0], max(end, open_regions[-1][1] or 0))
    steps = max(len(win.steps), 1)
    return {k: round(v / steps / 1e6, 4) for k, v in sorted(gaps.items())}


def _covered(spans: list[tuple[int, int]], a: int, b: int) -> int:
    """ns of [a, b) covered by the union of ``spans`` (nested compile ranges counted once)."""
    parts = sorted((max(s, a), min(e, b)) for s, e in spans if s < b and e > a)
    total, reach = 0, a
    for s, e in parts:
        if e > reach:
            total += e - max(s, reach)
            reach = e
    return total


def gaps_by_break(gaps_ms: dict[str, float], frame_names: dict[str, str],
                  breaks: list[GraphBreakFacts]) -> dict[int, float]:
    """Eager ms per step each break leaves, by index in ``breaks``.

    A gap sits before the region of a resume function, which Dynamo names after the break's
    function and line ("torch_dynamo_resume_in_forward_at_9"); ``frame_names`` maps the region's
    frame id to that name (``CompileFacts.frame_names``). Breaks without a matched gap are absent.
    """
    out: dict[int, float] = {}
    for key, ms in gaps_ms.items():
        m = RESUME.fullmatch(frame_names.get(key.split("/")[0], ""))
        if not m:
            continue
        for i, b in enumerate(breaks):
            line = (b.location or "").rsplit(":", 1)[-1]
            if base_function(b.function) == m.group(1) and line == m.group(2):
                out[i] = round(out.get(i, 0.0) + ms, 4)
                break
    return out


def compile_summary(facts: CompileFacts | None, gaps_ms: dict[str, float]) -> dict | None:
    """The report's per-rank ``compile`` section (docs/json-schema.md); None when nothing was compiled.

    ``compile_s``, ``dynamo_s``, ``backend_s``, ``graphs``, ``graph_breaks[]`` (``gb_id``, ``reason``,
    ``location``, ``function``, ``count``: times Dynamo met it while compiling, ``eager_ms_per_step``),
    ``recompiles[]`` (``frame``, ``location``, ``guard``, ``kind``, ``tensor``, ``dim``, ``values``,
    ``count``, ``limit_hit``, ``compile_s``), ``cache`` (``hits``, ``misses``: FX graph cache; ``counters``: hits,
    misses and bypasses of each cache, e.g. ``aot_autograd.hit``; ``dir``, ``default_dir``: Inductor's cache
    directory and whether it is the default under the temporary directory; ``pack``: the pack `run --cache`
    loaded, or why it was refused),
    ``eager_gaps_ms`` (the trace's gaps by compiled region).
    """
    if (facts is None or not facts.used) and not gaps_ms:
        return None
    f = facts or CompileFacts()
    by_break = gaps_by_break(gaps_ms, f.frame_names, f.breaks)
    return {
        "compile_s": f.compile_time_s, "dynamo_s": f.dynamo_s, "backend_s": f.backend_s, "graphs": f.unique_graphs,
        "graph_breaks": [{"gb_id": b.gb_id, "reason": b.reason, "location": b.location, "function": b.function,
                          "count": b.compiles, "eager_ms_per_step": by_break.get(i)} for i, b in enumerate(f.breaks)],
        "recompiles": [{"frame": r.frame, "location": r.location, "guard": r.guard, "kind": r.kind, "tensor": r.tensor,
                        "dim": r.dim, "values": r.values, "count": r.count, "limit_hit": r.limit_hit,
                        "compile_s": r.compile_s} for r in f.recompile_frames],
        "cache": {"hits": f.cache_hits, "misses": f.cache_misses, "counters": dict(f.cache_counts), "dir": f.cache_dir,
                  "default_dir": f.cache_dir_default, "pack": f.cache_pack},
        "eager_gaps_ms": dict(gaps_ms),
    }
