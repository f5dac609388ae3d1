"""What a report shows of a job with more ranks than rows: the ranks that lose most, the spread of
the rest, and heat-map rows that stand for groups of ranks. Shared by the console and the HTML."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..metrics.model import RankResult
from ..metrics.ranks import CrossRank


def badness(r: RankResult) -> tuple[float, float]:
    """Sort key, worst first: most device idle time, then the longest step."""
    m = r.metrics
    return (-(m.idle_pct if m.idle_pct is not None else -1.0), -(m.step_ms_median or 0.0))


def worst(results: Sequence[RankResult], cap: int, first: int | None = None) -> list[int]:
    """Indices of at most `cap` results: `first` (the straggler's index) if given, then the worst by
    `badness`; returned in the results' (rank) order."""
    if len(results) <= cap:
        return list(range(len(results)))
    head = [first] if first is not None else []
    rest = sorted((i for i in range(len(results)) if i != first), key=lambda i: badness(results[i]))
    return sorted(head + rest[: cap - len(head)])


def spread(values: Sequence[float | None]) -> tuple[float, float, float] | None:
    """(median, 90th percentile, max) of the known values; None when none is known."""
    known = np.array([v for v in values if v is not None], dtype=float)
    if known.size == 0:
        return None
    return float(np.median(known)), float(np.percentile(known, 90)), float(known.max())


def groups(n: int, rows: int) -> list[range]:
    """`n` items cut into at most `rows` consecutive groups of equal size (the last may be shorter)."""
    size = max(1, -(-n // rows))
    return [range(i, min(i + size, n)) for i in range(0, n, size)]


def late_line(c: CrossRank) -> str:
    """Who arrived last in the collectives matched across ranks by sequence number ("" without)."""
    if not c.late_ranks:
        return ""
    parts = [f"rank {r.rank} in {r.calls} (the others waited {r.excess_ms:.2f} ms for it in all)" for r in c.late_ranks[:4]]
    return f"Last to arrive, of {c.matched_calls} collective calls matched on every rank: " + "; ".join(parts) + "."
