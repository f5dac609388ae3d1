"""Each recompile of the job, explained, and what compiling cost: read from what Dynamo keeps.

Read at the probe's housekeeping points (summary writes), never on the training thread's hot
path. Sources, all private and feature-detected (verified on torch 2.13):

- ``torch._dynamo.utils.get_compilation_metrics()``: one ``CompilationMetrics`` per compile
  (``compile_id`` "frame/entry", ``co_name``/``co_filename``/``co_firstlineno``, the first failing
  guard in ``recompile_reason``, ``fail_reason``; backward compiles come as ``is_forward=False``).
  It is a bounded deque (64 by default), so entries are accumulated here across reads, keyed by
  compile id and direction.
- ``torch._dynamo.utils.guard_failures``: code object -> every failing guard seen (one line per
  cache entry checked), for the values a changing size or Python value took.
- ``torch._dynamo.utils.compilation_time_metrics``: seconds per ``dynamo_timed`` key, for the
  compile time split: ``_compile.compile_inner`` (a frame's whole compile),
  ``OutputGraph.call_user_compiler`` (the backend: AOTAutograd + Inductor), and
  ``compile_fx.<locals>.bw_compiler`` (the backward graph, compiled lazily at the first backward).

A frame that exceeds ``recompile_limit`` gets one more metrics entry whose ``fail_reason`` starts
with LIMIT_REASON: from then on Dynamo runs that frame in eager, silently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from torchdoctor.facts import RecompileFacts

LIMIT_REASON = "Dynamo recompile limit exceeded"
_MAX_FRAMES = 20
_MAX_VALUES = 12
# "0/7: tensor 'x' size mismatch at index 0. expected 11, actual 12"
_ENTRY = re.compile(r"^\s*\d+/\d+:\s*")
_TENSOR = re.compile(r"tensor '([^']+)' (\w[\w ]*?) mismatch")
_INDEX = re.compile(r"at index (\d+)")
_EXPECTED = re.compile(r"expected ([^,]+), actual ([^\s.,]+)")
_VALUE = re.compile(r"^(.+?)\s*==\s*(.+?)\s*(?:#.*)?$")


@dataclass
class _Compile:
    frame_id: str
    name: str | None
    location: str | None
    reason: str | None
    limit: bool
    seconds: float


@dataclass
class _Seen:
    """What the probe has read so far (the metrics deque forgets; this does not)."""

    compiles: dict[tuple[str, bool], _Compile] = field(default_factory=dict)


_SEEN = _Seen()


def guard_kind(guard: str) -> tuple[str, str | None, int | None]:
    """(kind, tensor name, dim) of a failing guard as Dynamo prints it.

    Kinds: "size", "stride", "rank", "dtype", "requires_grad", "device" (tensor guards from
    C++ ``TensorCheck``, "dispatch key set" and "device index" both mean device/layout/autocast),
    "global_state" (grad mode, autocast, num_threads...), "value" (a Python value compared with
    ``==``), "identity" (``___check_obj_id``/``___check_type_id``: a different object or type),
    "length" (``len(...) == n``), else "other".
    """
    text = _ENTRY.sub("", guard).strip()
    m = _TENSOR.search(text)
    if m:
        what = m.group(2).strip()
        kind = {"size": "size", "stride": "stride", "rank": "rank", "dtype": "dtype",
                "requires_grad": "requires_grad", "dispatch key set": "device",
                "device index": "device"}.get(what, "other")
        idx = _INDEX.search(text)
        return kind, m.group(1), int(idx.group(1)) if idx else None
    if text.startswith("GLOBAL_STATE"):
        return "global_state", None, None
    if "___check_obj_id" in text or "___check_type_id" in text:
        return "identity", None, None
    if text.startswith("len("):
        return "length", None, None
    if _VALUE.match(text.split("\n", 1)[0]):
        return "value", _VALUE.match(text.split("\n", 1)[0]).group(1).strip(), None  # type: ignore[union-attr]
    return "other", None, None


def first_line(guard: str) -> str:
    """The guard itself: its first line, without the "frame/entry: " prefix and the source comment."""
    line = _ENTRY.sub("", (guard or "").split("\n", 1)[0]).strip()
    return re.sub(r"\s{2,}#.*$", "", line)[:300]


def observed_values(guards: list[str], kind: str, tensor: str | None, dim: int | None) -> list[str]:
    """Distinct values the guarded size or Python value took, in the order first seen."""
    seen: dict[str, None] = {}
    for g in guards:
        line = first_line(g)
        if kind in ("size", "stride", "rank", "dtype") and tensor is not None:
            if f"tensor '{tensor}'" not in line or (dim is not None and f"index {dim}." not in line):
                continue
            m = _EXPECTED.search(line)
            if m:
                seen.setdefault(m.group(1).strip(), None)
                seen.setdefault(m.group(2).strip(), None)
        elif kind == "value" and tensor is not None:
            m = _VALUE.match(line)
            if m and m.group(1).strip() == tensor:
                seen.setdefault(m.group(2).strip(), None)
    return list(seen)[:_MAX_VALUES]


def _read_metrics(utils: Any) -> None:
    for m in list(utils.get_compilation_metrics()):
        cid = str(getattr(m, "compile_id", None) or "")
        if "/" not in cid:
            continue
        fwd = getattr(m, "is_forward", True) is not False
        key = (cid, fwd)
        if key in _SEEN.compiles:
            continue
        seconds = getattr(m, "entire_frame_compile_time_s", None) if fwd else None
        if not fwd:
            us = getattr(m, "backward_cumulative_compile_time_us", None) or getattr(m, "inductor_cumulative_compile_time_us", None)
            seconds = us / 1e6 if us else None
        fname, line = getattr(m, "co_filename", None), getattr(m, "co_firstlineno", None)
        _SEEN.compiles[key] = _Compile(
            frame_id=cid.split("/")[0].lstrip("[!*"),
            name=getattr(m, "co_name", None),
            location=f"{fname}:{line}" if fname and line else None,
            reason=getattr(m, "recompile_reason", None),
            limit=str(getattr(m, "fail_reason", "") or "").startswith(LIMIT_REASON),
            seconds=float(seconds or 0.0),
        )


def recompiles(utils: Any) -> list[RecompileFacts]:
    """One record per compiled frame that recompiled, most recompiles first; [] when unknown."""
    try:
        _read_metrics(utils)
    except Exception:  # no metrics on this torch: counters still count
        return []
    frames: dict[str, list[_Compile]] = {}
    for (_cid, fwd), c in _SEEN.compiles.items():
        if fwd:
            frames.setdefault(c.frame_id, []).append(c)
    failures = getattr(utils, "guard_failures", None) or {}
    by_code = {(getattr(code, "co_name", None), f"{getattr(code, 'co_filename', '')}:{getattr(code, 'co_firstlineno', '')}"):
               [str(r) for r in rs] for code, rs in list(failures.items())}
    out = []
    for compiles in frames.values():
        named = next((c for c in compiles if c.name), None)
        recompiled = [c for c in compiles if c.reason and not c.limit]
        limit = any(c.limit for c in compiles)
        if not recompiled and not limit:
            continue
        last = (recompiled or [c for c in compiles if c.reason] or compiles)[-1]
        guard = first_line(last.reason or "")
        kind, tensor, dim = guard_kind(guard)
        name = named.name if named else None
        location = named.location if named else None
        values = observed_values(by_code.get((name, location), []) or [c.reason or "" for c in compiles], kind, tensor, dim)
        out.append(RecompileFacts(
            frame=name or "?", location=location, count=len(recompiled), guard=guard, kind=kind,
            tensor=tensor, dim=dim, values=values, limit_hit=limit,
            compile_s=round(sum(c.seconds for c in recompiled), 3)))
    out.sort(key=lambda r: (-r.limit_hit, -r.count))
    return out[:_MAX_FRAMES]


def frame_names(utils: Any) -> dict[str, str]:
    """Compiled frame id -> its code's name ("1" -> "torch_dynamo_resume_in_forward_at_9": the
    resume function of the graph break at line 9 of forward), for the trace's regions."""
    try:
        _read_metrics(utils)
    except Exception:
        return {}
    out: dict[str, str] = {}
    for c in _SEEN.compiles.values():
        if c.name and len(out) < 200:
            out.setdefault(c.frame_id, c.name)
    return out


def compile_seconds(utils: Any) -> tuple[float | None, float | None, float | None]:
    """(total, Dynamo's tracing, the backend's) compile seconds so far; None where unknown.

    Total: every frame's compile (``_compile.compile_inner``) plus the backward graphs compiled
    at their first backward. The backend's part: ``OutputGraph.call_user_compiler`` (AOTAutograd
    and Inductor for the forward) plus the backward compiles; Dynamo's: the rest.
    """
    times = getattr(utils, "compilation_time_metrics", None) or {}
    frame = sum(times.get("_compile.compile_inner", []) or [])
    if not frame:
        return None, None, None
    backend = sum(times.get("OutputGraph.call_user_compiler", []) or [])
    backward = sum(times.get("compile_fx.<locals>.bw_compiler", []) or [])
    total = frame + backward
    return round(total, 3), round(max(0.0, frame - backend), 3), round(backend + backward, 3)
