"""One record per compile Dynamo made, and the per-frame recompile summary built from them.

Sources fill ``CompileRecord``s: the live probe from ``torch._dynamo.utils.get_compilation_metrics()``
(probe/recompiles.py), the TORCH_TRACE reader from its ``compilation_metrics`` events
(compile/torch_trace.py). Everything below is the same for both.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torchdoctor.compile.guards import first_line, guard_kind, observed_values
from torchdoctor.facts import RecompileFacts

# A frame past recompile_limit gets one more compile record with this ``fail_reason``: Dynamo runs
# the frame in eager from then on.
LIMIT_REASON = "Dynamo recompile limit exceeded"
_MAX_FRAMES = 20
# After a graph break Dynamo runs the rest of a function as a resume function of its own, named
# after the function and the break's line ("torch_dynamo_resume_in_forward_at_101").
RESUME = re.compile(r"torch_dynamo_resume_in_(\w+?)_at_(\d+)")


def base_function(name: str | None) -> str | None:
    """The user's function a (possibly resume) code name belongs to."""
    m = RESUME.fullmatch(name or "")
    return m.group(1) if m else name


@dataclass
class CompileRecord:
    """One compile: its id "frame/entry", the code compiled, why it recompiled, what it cost."""

    compile_id: str
    forward: bool
    name: str | None
    location: str | None  # "file:first line" of the code object
    reason: str | None  # the first failing guard (None for a frame's first compile)
    limit: bool  # the compile that hit the recompile limit
    seconds: float
    backend_seconds: float = 0.0  # of which the backend's (AOTAutograd, Inductor): all of a backward compile
    started_at: float | None = None  # epoch seconds (CompilationMetrics.start_time_us)

    @property
    def frame_id(self) -> str:
        return self.compile_id.split("/")[0].lstrip("[!*")


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def from_metrics(field: Callable[[str], Any], forward: bool) -> CompileRecord | None:
    """A CompileRecord from CompilationMetrics' fields, read through ``field(name)`` (an attribute
    of the live object, or a key of a TORCH_TRACE event, which is untrusted: numbers are checked);
    None without a "frame/entry" compile id. A backward compile's seconds are its cumulative
    backward (else Inductor) microseconds, and all of them are the backend's."""
    cid = str(field("compile_id") or "")
    if "/" not in cid:
        return None
    if forward:
        seconds, backend = _number(field("entire_frame_compile_time_s")), _number(field("backend_compile_time_s"))
    else:
        us = _number(field("backward_cumulative_compile_time_us")) or _number(field("inductor_cumulative_compile_time_us"))
        seconds = us / 1e6 if us else None
        backend = seconds
    name, filename, line = field("co_name"), field("co_filename"), field("co_firstlineno")
    return CompileRecord(
        compile_id=cid, forward=forward, name=name if isinstance(name, str) else None,
        location=f"{filename}:{line}" if filename and line else None,
        reason=field("recompile_reason"), limit=str(field("fail_reason") or "").startswith(LIMIT_REASON),
        seconds=seconds or 0.0, backend_seconds=backend or 0.0,
        started_at=start_us / 1e6 if (start_us := _number(field("start_time_us"))) else None)


def recompile_frames(records: list[CompileRecord], guards: dict[tuple[str | None, str | None], list[str]]
                     ) -> list[RecompileFacts]:
    """One RecompileFacts per compiled frame and cause of its recompiles (the guard's kind, input and
    dimension), most recompiles first.

    A frame recompiles for causes of different kinds, each with its own fix: timm's train.py, with
    --torchcompile, recompiled its model once for the evaluation under no_grad (grad mode) and once
    for the validation set's last, smaller batch, and summed under the last guard both read as "input
    'x' changes size" twice. A frame that hit the recompile limit marks the cause of its last
    recompile. ``guards``: every failing guard seen per (code name, "file:line")
    (``guard_failures``), for the values the changing size or Python value took; without them,
    each compile's first reason.
    """
    frames: dict[str, list[CompileRecord]] = {}
    for c in records:
        if c.forward:
            frames.setdefault(c.frame_id, []).append(c)
    out = []
    for compiles in frames.values():
        named = next((c for c in compiles if c.name), None)
        recompiled = [c for c in compiles if c.reason and not c.limit]
        limit = any(c.limit for c in compiles)
        if not recompiled and not limit:
            continue
        name = named.name if named else None
        location = named.location if named else None
        seen = guards.get((name, location)) or [c.reason or "" for c in compiles]
        causes: dict[tuple[str, str | None, int | None], list[CompileRecord]] = {}
        for c in recompiled:
            causes.setdefault(guard_kind(first_line(c.reason or "")), []).append(c)
        last = (recompiled or [c for c in compiles if c.reason] or compiles)[-1]
        last_cause = guard_kind(first_line(last.reason or ""))
        causes.setdefault(last_cause, [])  # a limit hit with no recompile of its own still names its guard
        for cause, group in causes.items():
            kind, tensor, dim = cause
            latest = (group or [last])[-1]
            out.append(RecompileFacts(
                frame=name or "?", location=location, count=len(group), guard=first_line(latest.reason or ""),
                kind=kind, tensor=tensor, dim=dim, values=observed_values(seen, kind, tensor, dim),
                limit_hit=limit and cause == last_cause, compile_s=round(sum(c.seconds for c in group), 3)))
    out.sort(key=lambda r: (-r.limit_hit, -r.count))
    return out[:_MAX_FRAMES]


def frame_names(records: list[CompileRecord]) -> dict[str, str]:
    """Compiled frame id -> its code's name ("1" -> "torch_dynamo_resume_in_forward_at_9")."""
    out: dict[str, str] = {}
    for c in records:
        if c.name and len(out) < 200:
            out.setdefault(c.frame_id, c.name)
    return out
