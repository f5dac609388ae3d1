"""Training steps and the analysis window.

A *step* is one `ProfilerStep#N` host annotation (torch.profiler's `prof.step()`), an interval
[start, end) on the host clock. The *window* is the time span every percentage is measured over:
by default the steady-state steps, so one-off warm-up costs (allocator growth, cuDNN autotuning,
lazy init, compilation) do not pollute the headline numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace.model import DEVICE_WORK, Cat, RankTrace
from .classify import step_number

# A leading step slower than this multiple of the median of the later steps is warm-up.
WARMUP_FACTOR = 1.5


@dataclass(frozen=True)
class Step:
    number: int
    start: int
    end: int

    @property
    def dur(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Window:
    """The analysed span: [start, end) in ns, the steps inside it and how it was chosen."""

    start: int
    end: int
    steps: tuple[Step, ...]
    mode: str  # "steady-state", "steps A:B", "all steps", "trace", "whole trace (no ProfilerStep)"
    skipped_warmup: tuple[int, ...] = ()

    @property
    def dur(self) -> int:
        return max(self.end - self.start, 0)


class WindowError(ValueError):
    """A --steps request this trace cannot satisfy (the message says why)."""


def find_steps(tr: RankTrace) -> list[Step]:
    """ProfilerStep#N host annotations, sorted by start; a step number seen twice keeps its first."""
    host = tr.mask(Cat.CPU_OP, Cat.USER_ANNOTATION)
    idx = np.flatnonzero(host & tr.name_mask(lambda n: n.startswith("ProfilerStep#")))
    steps: dict[int, Step] = {}
    for i in idx:
        n = step_number(tr.names[tr.name[i]])
        if n is not None and n not in steps:
            steps[n] = Step(n, int(tr.ts[i]), int(tr.end[i]))
    return sorted(steps.values(), key=lambda s: s.start)


def steady_state(steps: list[Step]) -> tuple[list[Step], list[Step]]:
    """Split off leading warm-up steps: those slower than WARMUP_FACTOR x the median of the rest.

    At least one step always remains. Returns (kept, skipped).
    """
    skipped: list[Step] = []
    rest = list(steps)
    while len(rest) >= 2:
        med = float(np.median([s.dur for s in rest[1:]]))
        if rest[0].dur > WARMUP_FACTOR * med:
            skipped.append(rest.pop(0))
        else:
            break
    return rest, skipped


def device_span(tr: RankTrace) -> tuple[int, int] | None:
    dev = tr.mask(*DEVICE_WORK)
    if not dev.any():
        return None
    return int(tr.ts[dev].min()), int(tr.end[dev].max())


def whole_span(tr: RankTrace) -> tuple[int, int]:
    span = device_span(tr)
    if span is not None:
        return span
    real = tr.pid >= 0  # named pseudo-processes such as "Spans" are profiler bookkeeping
    if not real.any():
        return (int(tr.ts.min()), int(tr.end.max())) if len(tr) else (0, 0)
    return int(tr.ts[real].min()), int(tr.end[real].max())


def choose_window(tr: RankTrace, request: str | None = None) -> Window:
    """Pick the analysis window.

    `request`: None (automatic steady state), "all" (every ProfilerStep), "trace" (HTA's window:
    first to last device event, or the whole host trace without device events), or "A:B"
    (ProfilerStep numbers A <= N < B; either side may be omitted).
    """
    steps = find_steps(tr)
    if request == "trace" or (not steps and request in (None, "all")):
        lo, hi = whole_span(tr)
        mode = "trace" if request == "trace" else "whole trace (no ProfilerStep)"
        inside = tuple(s for s in steps if s.start >= lo and s.end <= hi)
        return Window(lo, hi, inside, mode)
    if request in (None, ""):
        kept, skipped = steady_state(steps)
        return Window(kept[0].start, kept[-1].end, tuple(kept), "steady-state",
                      tuple(s.number for s in skipped))
    if request == "all":
        return Window(steps[0].start, steps[-1].end, tuple(steps), "all steps")
    lo_n, hi_n = parse_step_range(request)
    chosen = [s for s in steps if (lo_n is None or s.number >= lo_n) and (hi_n is None or s.number < hi_n)]
    if not chosen:
        have = f"{steps[0].number}..{steps[-1].number}" if steps else "none"
        raise WindowError(f"--steps {request} selects no ProfilerStep (trace has steps {have})")
    return Window(chosen[0].start, chosen[-1].end, tuple(chosen), f"steps {request}")


def parse_step_range(text: str) -> tuple[int | None, int | None]:
    if ":" not in text:
        raise WindowError(f"--steps expects A:B, 'all' or 'trace', got {text!r}")
    a, b = text.split(":", 1)
    try:
        lo = int(a) if a.strip() else None
        hi = int(b) if b.strip() else None
    except ValueError:
        raise WindowError(f"--steps expects integers in A:B, got {text!r}") from None
    if lo is not None and hi is not None and hi <= lo:
        raise WindowError(f"--steps {text}: B must be greater than A")
    return lo, hi
