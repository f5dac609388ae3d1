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

from typing import Any

from torchdoctor.compile.records import CompileRecord, from_metrics

# What the probe has read so far, by (compile id, forward): the metrics deque forgets, this does not.
_SEEN: dict[tuple[str, bool], CompileRecord] = {}


def read(utils: Any) -> list[CompileRecord]:
    """Every compile Dynamo recorded so far (new metrics entries added to what was read before);
    raises where this torch has no compilation metrics."""
    for m in list(utils.get_compilation_metrics()):
        rec = from_metrics(lambda name, m=m: getattr(m, name, None), getattr(m, "is_forward", True) is not False)
        if rec is not None:
            _SEEN.setdefault((rec.compile_id, rec.forward), rec)
    return list(_SEEN.values())


def guards(utils: Any) -> dict[tuple[str | None, str | None], list[str]]:
    """Every failing guard seen, by (code name, "file:first line") (``guard_failures``)."""
    failures = getattr(utils, "guard_failures", None) or {}
    return {(getattr(code, "co_name", None), f"{getattr(code, 'co_filename', '')}:{getattr(code, 'co_firstlineno', '')}"):
            [str(r) for r in rs] for code, rs in list(failures.items())}


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
