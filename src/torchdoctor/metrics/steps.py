"""Training steps and the analysis window.

A *step* is one training iteration, an interval [start, end) on the host clock. It is one
`ProfilerStep#N` host annotation (torch.profiler's `prof.step()`) when the trace has any. Without
them (the legacy `torch.autograd.profiler.profile`, hand-rolled loops) steps are inferred from the
first of these *boundary sources* that gives >= 2 steps with a consistent period (`consistent`):

1. `Optimizer.step`: host events `Optimizer.step#<Cls>.step`. Step i runs from the end of
   optimizer step i-1 (for the first: the trace's first host event) to the end of step i.
2. `DataLoader`: host events `enumerate(DataLoader)#<Iter>.__next__`. Step i runs from the start
   of fetch i to the start of fetch i+1; the last step ends at the trace's last host event.
3. `backward`: backward passes, the `## backward ##` annotation (the convention of torch's
   profiler tutorials, HTA and torchrec) when the trace has >= 2 of them, else runs of
   `autograd::engine::evaluate_function` roots (`backward_passes`). Steps are delimited by pass
   ends, as for optimizer steps.

Within a source an event nested inside another of the same source on its thread (the same step
seen on two levels, a wrapper optimizer around the one it wraps) counts once, as the outer one.
Inferred steps are numbered 0..n-1. The *window* is the time span every percentage is measured
over: by default the steady-state steps, so one-off warm-up costs (allocator growth, cuDNN
autotuning, lazy init, compilation) do not pollute the headline numbers.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ..trace.model import DEVICE_WORK, HOST_CATS, Cat, RankTrace
from .classify import step_number

# A leading step slower than this multiple of the median of the later steps is warm-up.
WARMUP_FACTOR = 1.5
# A boundary source is consistent when at least CONSISTENT_SHARE of its steady-state steps last
# within a factor PERIOD_TOLERANCE of their median: one backward per micro-batch of a gradient
# accumulation loop, or one optimizer stepping only now and then, are not.
PERIOD_TOLERANCE = 2.0
CONSISTENT_SHARE = 0.75

# `WindowInfo.boundaries` values: where the steps came from.
PROFILER_STEP = "ProfilerStep"
OPTIMIZER = "Optimizer.step"
DATALOADER = "DataLoader"
BACKWARD = "backward"
NO_BOUNDARY = "none"
NO_STEPS_MODE = "whole trace (no ProfilerStep, nor any Optimizer.step, DataLoader or backward boundary)"

BACKWARD_ANNOTATION = "## backward ##"
_ROOT_PREFIX = "autograd::engine::evaluate_function"
# Host categories step boundaries are read from (ops and record_function annotations).
_MARKS = (Cat.CPU_OP, Cat.USER_ANNOTATION)


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
    # "steady-state", "steps A:B", "all steps" (each + " (steps inferred from SOURCE)" / " (inferred
    # from SOURCE)" on inferred steps), "trace", NO_STEPS_MODE
    mode: str
    skipped_warmup: tuple[int, ...] = ()
    boundaries: str = PROFILER_STEP  # PROFILER_STEP, OPTIMIZER, DATALOADER, BACKWARD or NO_BOUNDARY

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


def step_boundaries(tr: RankTrace) -> tuple[str, list[Step]]:
    """(source, steps): the ProfilerSteps, else the steps of the first consistent boundary source.

    `source` is PROFILER_STEP, OPTIMIZER, DATALOADER, BACKWARD, or NO_BOUNDARY with no steps.
    """
    source, steps, _ = _boundaries(tr)
    return source, steps


def _boundaries(tr: RankTrace) -> tuple[str, list[Step], list[str]]:
    """`step_boundaries`, plus the inferred sources tried before and rejected as too irregular
    (`consistent`): what the window's mode says when no source is kept."""
    steps = find_steps(tr)
    if steps:
        return PROFILER_STEP, steps, []
    host = tr.mask(*HOST_CATS) & (tr.pid >= 0)
    if not host.any():
        return NO_BOUNDARY, [], []
    irregular: list[str] = []
    for source, steps in _inferred(tr, host):
        if len(steps) >= 2:
            if consistent(steps):
                return source, steps, irregular
            irregular.append(source)
    return NO_BOUNDARY, [], irregular


def _inferred(tr: RankTrace, host: np.ndarray) -> Iterator[tuple[str, list[Step]]]:
    """Each inferred boundary source's steps, in order of trust (computed as asked for)."""
    first, last = int(tr.ts[host].min()), int(tr.end[host].max())
    yield OPTIMIZER, optimizer_steps(tr, first)
    yield DATALOADER, dataloader_steps(tr, last)
    yield BACKWARD, backward_steps(tr, first)


def no_steps_mode(irregular: list[str]) -> str:
    """The window mode of a trace without steps: why there are none (no boundary at all, or
    the `irregular` sources whose periods are too irregular to be steps: `consistent`)."""
    if not irregular:
        return NO_STEPS_MODE
    return (f"whole trace (no ProfilerStep; {', '.join(irregular)} boundaries found, but too irregular "
            "to be steps)")


def consistent(steps: list[Step]) -> bool:
    """At least CONSISTENT_SHARE of the steady-state steps last within PERIOD_TOLERANCE x their median."""
    kept, _ = steady_state(steps)
    durs = np.array([s.dur for s in kept], dtype=np.float64)
    med = float(np.median(durs))
    if med <= 0:
        return False
    near = (durs >= med / PERIOD_TOLERANCE) & (durs <= med * PERIOD_TOLERANCE)
    return float(near.mean()) >= CONSISTENT_SHARE


def optimizer_steps(tr: RankTrace, first: int) -> list[Step]:
    """Steps ending where `Optimizer.step#<Cls>.step` events end; the first starts at `first`."""
    idx = outermost(tr, _marks(tr, lambda n: n.startswith("Optimizer.step#") and n.endswith(".step")))
    return _end_anchored(np.sort(tr.end[_one_optimizer(tr, idx)]), first)


def _one_optimizer(tr: RankTrace, idx: np.ndarray) -> np.ndarray:
    """The events of one optimizer class when several step one after another each iteration
    (dense + sparse optimizers): the most frequent name, on a tie the one ending last.
    """
    names = tr.name[idx]
    uniq = np.unique(names)
    if uniq.size <= 1:
        return idx
    best = max(uniq, key=lambda n: (int((names == n).sum()), int(tr.end[idx[names == n]].max())))
    return idx[names == best]


def dataloader_steps(tr: RankTrace, last: int) -> list[Step]:
    """Steps starting where `enumerate(DataLoader)#<Iter>.__next__` events start; the last ends at `last`.

    A last step shorter than 1/PERIOD_TOLERANCE of the (steady-state) median of the others is
    partial and dropped: the fetch that found the loader exhausted, or a trace cut mid-iteration.
    """
    idx = outermost(tr, _marks(tr, lambda n: n.startswith("enumerate(DataLoader)#") and n.endswith(".__next__")))
    if idx.size == 0:
        return []
    starts = np.sort(tr.ts[idx])
    steps = _numbered(starts, np.append(starts[1:], max(last, int(starts[-1]))))
    if len(steps) >= 2:
        kept, _ = steady_state(steps[:-1])
        if steps[-1].dur < float(np.median([s.dur for s in kept])) / PERIOD_TOLERANCE:
            steps.pop()
    return steps


def backward_steps(tr: RankTrace, first: int) -> list[Step]:
    """Steps ending where backward passes end (`backward_passes`); the first starts at `first`."""
    _, ends = backward_passes(tr)
    return _end_anchored(ends, first)


def backward_passes(tr: RankTrace) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the backward passes, sorted by start.

    With >= 2 `## backward ##` annotations, those. Else the roots (outermost on their thread) of
    `autograd::engine::evaluate_function` events, one per autograd node run, cut into passes: a
    new pass starts at a root when a host op that is no root began after the previous roots
    ended, on a thread that runs roots or on the driver thread (`driver_thread`). On CPU the
    forward ops between passes run on the roots' own thread; on CUDA the engine's device thread
    runs the roots while the driver thread runs the forward. Other threads (pin_memory) may run
    ops during a pass, so they cannot cut one.
    """
    ann = outermost(tr, _marks(tr, lambda n: n == BACKWARD_ANNOTATION))
    if ann.size >= 2:
        order = np.argsort(tr.ts[ann], kind="stable")
        return tr.ts[ann][order], tr.end[ann][order]
    is_root = tr.name_mask(lambda n: n.startswith(_ROOT_PREFIX))
    roots = outermost(tr, np.flatnonzero(tr.mask(*_MARKS) & is_root))
    if roots.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    roots = roots[np.argsort(tr.ts[roots], kind="stable")]
    marks = np.flatnonzero(tr.mask(*_MARKS))
    top = outermost(tr, marks)
    thread = np.full(len(tr), -1, np.int64)
    thread[marks] = _thread_ids(tr.pid[marks], tr.tid[marks])
    runs_roots = np.unique(thread[roots])
    cutters = np.isin(thread[top], np.append(runs_roots, driver_thread(tr, top, is_root, thread)))
    cut_ts = np.sort(tr.ts[top[cutters & ~is_root[top]]])
    done = np.maximum.accumulate(tr.end[roots])  # end of all roots so far
    nxt = tr.ts[roots[1:]]
    cut = np.searchsorted(cut_ts, nxt, "left") > np.searchsorted(cut_ts, done[:-1], "left")
    first = np.concatenate(([0], np.flatnonzero(cut) + 1))
    last = np.append(first[1:] - 1, roots.size - 1)
    return tr.ts[roots[first]], done[last]


def driver_thread(tr: RankTrace, top: np.ndarray, is_root: np.ndarray, thread: np.ndarray) -> int:
    """The thread (id in `thread`, per event) with the most time in outermost host events `top`
    that are no autograd roots: the one running forward and optimizer.
    """
    keep = top[~is_root[top]]
    if keep.size == 0:
        return -1
    keys, inv = np.unique(thread[keep], return_inverse=True)
    busy = np.bincount(inv, weights=(tr.end[keep] - tr.ts[keep]).astype(np.float64))
    return int(keys[int(np.argmax(busy))])


def outermost(tr: RankTrace, idx: np.ndarray) -> np.ndarray:
    """Those of events `idx` not nested inside another of `idx` on the same (pid, tid), sorted.

    Nested means starting at or after it and ending at or before it; of two identical events the
    first in trace order is kept.
    """
    if idx.size == 0:
        return idx
    key = _thread_ids(tr.pid[idx], tr.tid[idx])
    order = np.lexsort((-tr.end[idx], tr.ts[idx], key))
    idx, key = idx[order], key[order]
    ends = tr.end[idx]
    keep = np.ones(idx.size, dtype=bool)
    for lo, hi in _runs(key):
        reach = np.maximum.accumulate(ends[lo:hi])  # the furthest end of the earlier events
        keep[lo + 1:hi] = ends[lo + 1:hi] > reach[:-1]
    return np.sort(idx[keep])


def _runs(key: np.ndarray) -> list[tuple[int, int]]:
    """[lo, hi) ranges of equal values in sorted `key`."""
    cuts = np.flatnonzero(np.diff(key)) + 1
    bounds = np.concatenate(([0], cuts, [key.size]))
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True))


def _thread_ids(pids: np.ndarray, tids: np.ndarray) -> np.ndarray:
    """One int64 per (pid, tid) pair, equal for equal pairs (pid and tid ids are dense)."""
    _, pid = np.unique(pids, return_inverse=True)
    uniq_tids, tid = np.unique(tids, return_inverse=True)
    return pid.reshape(-1).astype(np.int64) * max(uniq_tids.size, 1) + tid.reshape(-1)


def _marks(tr: RankTrace, predicate) -> np.ndarray:
    """Indices of host ops/annotations (real processes) whose name satisfies `predicate`."""
    return np.flatnonzero(tr.mask(*_MARKS) & (tr.pid >= 0) & tr.name_mask(predicate))


def _end_anchored(ends: np.ndarray, first: int) -> list[Step]:
    """Steps delimited by `ends` (sorted): [first, ends[0]), [ends[0], ends[1]), ..."""
    starts = np.concatenate(([min(first, int(ends[0]))], ends[:-1])) if ends.size else ends
    return _numbered(starts, ends)


def _numbered(starts: np.ndarray, ends: np.ndarray) -> list[Step]:
    return [Step(i, int(a), int(b)) for i, (a, b) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True))]


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

    `request`: None (automatic steady state), "all" (every step), "trace" (HTA's window: first to
    last device event, or the whole host trace without device events), or "A:B" (step numbers
    A <= N < B; either side may be omitted). Steps are ProfilerSteps, else inferred ones
    (`step_boundaries`).
    """
    source, steps, irregular = _boundaries(tr)
    if request == "trace" or (not steps and request in (None, "all")):
        lo, hi = whole_span(tr)
        mode = "trace" if request == "trace" else no_steps_mode(irregular)
        inside = tuple(s for s in steps if s.start >= lo and s.end <= hi)
        return Window(lo, hi, inside, mode, boundaries=source)
    inferred = "" if source == PROFILER_STEP else f" (inferred from {source})"
    if request in (None, ""):
        kept, skipped = steady_state(steps)
        mode = "steady-state" if source == PROFILER_STEP else f"steady-state (steps inferred from {source})"
        return Window(kept[0].start, kept[-1].end, tuple(kept), mode,
                      tuple(s.number for s in skipped), source)
    if request == "all":
        return Window(steps[0].start, steps[-1].end, tuple(steps), "all steps" + inferred, boundaries=source)
    lo_n, hi_n = parse_step_range(request)
    chosen = [s for s in steps if (lo_n is None or s.number >= lo_n) and (hi_n is None or s.number < hi_n)]
    if not chosen:
        raise WindowError(f"--steps {request} selects no step: {_have(source, steps)}")
    return Window(chosen[0].start, chosen[-1].end, tuple(chosen), f"steps {request}{inferred}",
                  boundaries=source)


def _have(source: str, steps: list[Step]) -> str:
    """What steps the trace has, for a --steps error."""
    if not steps:
        return "the trace has no steps: no ProfilerStep, and no Optimizer.step, DataLoader or backward boundary " \
               "regular enough to be one"
    have = f"the trace has steps {steps[0].number}..{steps[-1].number}"
    return have + (" (ProfilerStep)" if source == PROFILER_STEP else f" (inferred from {source})")


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
