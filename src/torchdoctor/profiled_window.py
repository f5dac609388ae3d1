"""A live run's profiled window against the rest of the job: whether its steps speak for the job.

The probe profiles a few steps (5-7 by default) and times every step. Two ways the window can
mislead: it ran slower than the steady steps (warm-up, the profiler's own cost: ``slow_window``),
or one of its steps held work between training steps, an evaluation or a checkpoint save at an
epoch's end (``held_work``): then the trace is analysed over the window's other steps, the same
for every rank, and the report says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from .facts import RankFacts, StepTiming
from .metrics.between import between_work, clean_profiled_range, profiled_strays
from .metrics.steps import parse_step_range
from .report.labels import steps_label
from .report.model import ErrorEntry
from .rules import RankInputs
from .rules._common import ProbeSteps, probe_steps

# The profiled steps' median this many times the probe's steady step or more: the window caught a
# slower stretch of the job. mmengine's ResNet-50 example on 2 CPUs: steps 5-7 at 412 ms against
# 245.9 ms over 124 steady steps (1.68x, its warm-up); profiled at steps 40-42, 273 ms against their
# neighbours' 275-330 ms. Run-to-run noise on this machine is 10-20%.
SLOW_WINDOW_FACTOR = 1.25
# Steady steps outside the window the probe must have timed for the comparison to mean anything.
SLOW_WINDOW_MIN_STEPS = 8


class SlowWindow(NamedTuple):
    """A live rank's profiled steps against the probe's steady ones (``slow_window``)."""

    window_ms: float  # median ProfilerStep of the analysed window (the per-rank table's "step ms")
    steady_ms: float  # median of the probe's steady steps, timed outside the window
    steady_steps: int
    before_ms: float | None  # median of the probe's (up to 3) steps just before the window, step 0 left out
    later_start: int | None  # a step from the middle of the steady steps after the window
    profiled: tuple[int, int]  # the steps the probe profiled, [first, end)
    analysed: tuple[int, ...]  # the window's steps: fewer than those where one held work between steps


def slow_window(ri: RankInputs, probe: ProbeSteps | None = None) -> SlowWindow | None:
    """The window of a live rank whose profiled steps ran SLOW_WINDOW_FACTOR x the probe's steady
    step or more; else None.

    Steady steps: ``rules._common.probe_steps`` (no leading warm-up, no regular long steps of work
    between steps). The steps just before the window tell a job still warming up (they are slow
    too) from the profiler's own cost (they are not).
    """
    res, f = ri.view, ri.facts
    if res is None or f is None or not res.window.steps or not res.metrics.step_ms_median:
        return None
    timed = (probe or probe_steps(res, f)).timed
    if len(timed) < SLOW_WINDOW_MIN_STEPS:
        return None
    if {s.step for s in profiled_strays(f.profiled_steps, timed)} & set(res.window.steps):
        return None  # slow for the work between steps in it, which ``held_work_remark`` names
    steady_ms = float(np.median([s.total_ms for s in timed]))
    window_ms = float(res.metrics.step_ms_median)
    if steady_ms <= 0 or window_ms < SLOW_WINDOW_FACTOR * steady_ms:
        return None
    # The probe's own numbers: the analysed window may have left the trace's first steps out as warm-up.
    first, end = _profiled_range(f, res.window.steps)
    before = [s.total_ms for s in f.steps if first - 3 <= s.step < first and s.step > 0]
    return SlowWindow(window_ms, steady_ms, len(timed), float(np.median(before)) if before else None,
                      later_start(timed, first, end), (first, end),
                      tuple(res.window.steps))


def _profiled_range(f: RankFacts, steps: Sequence[int]) -> tuple[int, int]:
    """The steps the probe profiled, [first, end): its record, else the span of ``steps``."""
    if len(f.profile_steps) == 2:
        return f.profile_steps[0], f.profile_steps[1]
    return min(steps), max(steps) + 1


def _profile_later(start: int | None, first: int, end: int) -> str | None:
    """The command that profiles as many steps from ``start`` (``later_start``), or None without one."""
    if start is None:
        return None
    return f"`torchdoctor run --profile-steps {start}:{start + end - first}` profiles steps from the middle of the run"


def later_start(timed: list[StepTiming], first: int, end: int) -> int | None:
    """A step from the middle of the steady steps after the window [first, end), where a window as
    long fits before the last of them; None without SLOW_WINDOW_MIN_STEPS such steps."""
    later = [s.step for s in timed if s.step >= end]
    start = later[len(later) // 2] if len(later) >= SLOW_WINDOW_MIN_STEPS else None
    if start is not None and start + (end - first) > later[-1] + 1:
        return None
    return start


class HeldWork(NamedTuple):
    """Profiled steps that held work between training steps, over the ranks of a run (``held_work``)."""

    steps: str | None  # the steps "A:B" to analyse instead of the whole window; None: keep it
    said: str  # what the steps held, in words, for the report's warning
    ranks: list[int | None]  # the ranks whose profiled steps held it
    later: int | None  # a later window's first step (``later_start``) where none of the window is clean
    window: tuple[int, int]  # the profiled steps [first, end)
    strays: tuple[int, ...]  # the steps that held it, on any rank


def held_work(facts: list[RankFacts]) -> HeldWork | None:
    """The profiled steps of a run that held work between training steps (``profiled_strays``: an
    evaluation's forwards, saves, loader restarts), left out on every rank alike: a save on rank 0
    only makes that step a stray there, and the others' windows would otherwise describe other
    steps (cross-rank comparisons read them side by side). The range is the longest run of the
    other profiled steps of the first such rank (``clean_profiled_range``); None without strays."""
    found = []
    for f in facts:
        if not f.profiled_steps:
            continue
        timed = probe_steps(None, f).timed
        strays = profiled_strays(f.profiled_steps, timed)
        if strays:
            found.append((f, timed, strays))
    if not found:
        return None
    stray_steps = {s.step for _, _, strays in found for s in strays}
    f, timed, strays = found[0]
    steady_ms = float(np.median([s.total_ms for s in timed]))
    profiled = f.profiled_steps
    rng = clean_profiled_range(profiled, [s for s in profiled if s.step in stray_steps], steady_ms)
    first, end = _profiled_range(f, [s.step for s in profiled])
    held = "; ".join(f"step {s.step} took {s.total_ms:,.0f} ms: {_held(s)}" for s in strays[:3])
    said = (f"of the profiled {steps_label(list(range(first, end)))}, {held}, against a steady step of "
            f"{steady_ms:,.1f} ms (the probe's median over {len(timed)} steps)")
    return HeldWork(f"{rng[0]}:{rng[1]}" if rng else None, said, [x.rank for x, _, _ in found],
                    later_start(timed, first, end) if rng is None else None, (first, end), tuple(sorted(stray_steps)))


def _held(s: StepTiming) -> str:
    """What the probe saw a stray profiled step do besides training, in words."""
    parts = zip(between_work(s), ("an evaluation's forwards", "checkpoint saves", "DataLoader restarts"), strict=True)
    return ", ".join(f"{what} {ms:,.0f} ms" for ms, what in parts if ms >= 1.0) or "work between steps"


def held_work_remark(h: HeldWork, run_dir: str, asked: str | None, analysed: bool, ranks: int) -> ErrorEntry:
    """The report's warning for ``held_work``: what the steps held and which steps the trace's
    shares describe. ``asked``: the window the user asked for (``--steps``); ``analysed``: whether
    the trace was analysed again over ``h.steps``; ``ranks``: how many ranks the run has."""
    names = ", ".join(str(r) for r in h.ranks[:8]) + (" …" if len(h.ranks) > 8 else "")
    who = f"ranks {names} (rank {h.ranks[0]}'s numbers)" if len(h.ranks) > 1 else f"rank {names}"
    first, end = h.window
    if asked is not None:
        lo, hi = parse_step_range(asked)
        stray = [s for s in h.strays if (lo is None or s >= lo) and (hi is None or s < hi)]
        tail = (" The window asked for holds it, so the trace's shares describe that work with the training steps."
                if stray else "")
    elif analysed and h.steps is not None:
        a, b = (int(x) for x in h.steps.split(":"))
        every = ", on every rank," if ranks > 1 else ""
        tail = (f" The trace is analysed over {steps_label(list(range(a, b)))} only{every} so that its shares "
                f"describe the training step (`torchdoctor analyze {run_dir} --steps {first}:{end}` analyses them all).")
    elif h.steps is None:
        again = (_profile_later(h.later, first, end)
                 or "profile other steps (`torchdoctor run --profile-steps A:B`)")
        tail = f" Every profiled step did, so the trace's shares describe that work, not the training step: {again}."
    else:
        tail = " The trace could not be analysed again without them, so its shares describe that work too."
    return ErrorEntry("torchdoctor", f"{who}: {h.said}.{tail}")


def _analysed(w: SlowWindow) -> str:
    """The window's steps in words: "profiled steps 5–7", or "analysed step 7" of a window that left
    out a step that held work between steps (``held_work``)."""
    first, end = w.profiled
    if list(w.analysed) == list(range(first, end)) or not w.analysed:
        return f"profiled {steps_label(list(range(first, end)))}"
    return f"analysed {steps_label(list(w.analysed))}"


def slow_window_remark(ranks: list[RankInputs], probes: list[ProbeSteps] | None,
                       warnings: list[ErrorEntry]) -> None:
    """Ranks whose profiled steps ran much slower than the job's steady steps (``slow_window``):
    the trace's shares, and the ms per step read from them, describe that stretch, not the job's
    usual step, so say so with the numbers, and where the job was still warming up, a later window."""
    if probes is None or len(probes) != len(ranks):
        probes = [None] * len(ranks)
    slow = [(ri, s) for ri, p in zip(ranks, probes, strict=True) if (s := slow_window(ri, p))]
    if not slow:
        return
    ri, w = max(slow, key=lambda x: x[1].window_ms / x[1].steady_ms)

    def label(r: RankInputs) -> str:
        return str(r.rank if r.rank is not None else r.facts.rank if r.facts is not None else "?")

    names = ", ".join(label(r) for r, _ in slow[:8]) + (" …" if len(slow) > 8 else "")
    which = f"ranks {names}" if len(slow) > 1 else f"rank {label(ri)}"
    first, end = w.profiled
    command = _profile_later(w.later_start, first, end)
    later = (f" {command}." if command else " Profiling later steps (`torchdoctor run --profile-steps A:B`) shows "
             "steadier ones.")
    if w.before_ms is None:  # nothing timed just before the window: warm-up or the profiler, unknown
        why, again = "the job's warm-up, or the profiler's own cost (no step just before it was timed)", later
    elif w.before_ms >= SLOW_WINDOW_FACTOR * w.steady_ms:
        why = (f"the job was still warming up (the steps just before it took {w.before_ms:.1f} ms)"
               + (", and the profiler adds its own cost" if w.window_ms > SLOW_WINDOW_FACTOR * w.before_ms else ""))
        again = later
    else:
        why = (f"that is the profiler's own cost on this job's steps (the steps just before it took "
               f"{w.before_ms:.1f} ms), which a later window would pay too")
        again = ""
    warnings.append(ErrorEntry("torchdoctor", (
        f"{which}: the {_analysed(w)} took {w.window_ms:.1f} ms a step (median"
        f"{' of rank ' + label(ri) if len(slow) > 1 else ''}), {w.window_ms / w.steady_ms:.2f}x the job's steady "
        f"{w.steady_ms:.1f} ms (the probe's median over {w.steady_steps} steps outside the window): {why}. The "
        "trace's shares, and the ms per step read from them, describe those steps; the shares the probe measures "
        "over every step do not." + again)))
