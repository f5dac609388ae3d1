"""A rank's summary for jobs with many ranks: its `RankResult` with the parts kept only for plots
bounded, so that thousands of ranks travel back from their workers and sit in one report in a few
KB each.

What is bounded (everything else, which the rules and the cross-rank analysis read, is kept whole):
- the timeline sketch (`timeline_busy`, `timeline_gaps`): at most SKETCH_INTERVALS busy intervals,
  merged across the smallest gaps (a coarser drawing of the same timeline), and the SKETCH_INTERVALS
  longest idle gaps;
- the top kernels (`kernels.top`): the TOP_KERNELS with most device time (the kinds, memcpy rows and
  roofline rows are kept);
- kernel names in those lists (`kernels.top`, `signals.sm_fill.top`): their first NAME_CHARS characters
  and an ellipsis (templated CUDA names run to 2,000 characters; the reports show 140).

Measured on the real traces in tests/data/hta (tests/metrics/test_summary.py; benchmarks/scale.py reports
it per run): the GPU ranks shrink from 46-97 KB of msgpack to 8-14 KB, the CPU-only ones stay at 2-4 KB.
What is left grows with the window's steps and collective calls, not with the trace's length.
"""

from __future__ import annotations

import msgspec
import numpy as np

from .intervals import merge_busy
from .model import RankResult

# Above this many ranks every rank's result is reduced to its summary (session.analyze_files).
SUMMARY_RANKS = 64
SKETCH_INTERVALS = 32
TOP_KERNELS = 5
NAME_CHARS = 160


def compact(r: RankResult, intervals: int = SKETCH_INTERVALS, kernels: int = TOP_KERNELS) -> RankResult:
    """`r` with its timeline sketch and top-kernel list bounded (a copy; `r` is left as it was)."""
    out = msgspec.structs.replace(r)
    if len(r.timeline_busy) > intervals:
        b = np.asarray(r.timeline_busy, dtype=np.int64)
        s, e = merge_busy(b[:, 0], b[:, 1], intervals)
        out.timeline_busy = [(int(x), int(y)) for x, y in zip(s, e, strict=True)]
    if len(r.timeline_gaps) > intervals:
        longest = sorted(range(len(r.timeline_gaps)), key=lambda i: r.timeline_gaps[i][0] - r.timeline_gaps[i][1])
        out.timeline_gaps = [r.timeline_gaps[i] for i in sorted(longest[:intervals])]
    out.kernels = msgspec.structs.replace(r.kernels, top=[_short(k) for k in r.kernels.top[:kernels]])
    if r.signals is not None and r.signals.sm_fill is not None:
        fill = msgspec.structs.replace(r.signals.sm_fill, top=[_short(k) for k in r.signals.sm_fill.top])
        out.signals = msgspec.structs.replace(r.signals, sm_fill=fill)
    return out


def _short(item):
    """A kernel entry with its name cut to NAME_CHARS characters."""
    if len(item.name) <= NAME_CHARS:
        return item
    return msgspec.structs.replace(item, name=item.name[: NAME_CHARS - 1] + "…")


def summary_bytes(r: RankResult) -> int:
    """Size of a rank's result as it travels from a worker (msgpack)."""
    return len(msgspec.msgpack.encode(r))
