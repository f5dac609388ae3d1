"""The analysed ranks as the HTML report shows them, and which of them it draws.

Every plot and table is bounded whatever the job size (thousands of ranks): the page picks the
ranks worth drawing (the straggler, then the most idle) and says how many it left out.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial

from ..metrics.model import RankResult
from ..metrics.ranks import CrossRank, comm_wait_ms
from .html_text import short
from .model import LazyRanks, Report
from .offenders import worst

# Bounds that keep the page light whatever the job size (thousands of ranks, long windows).
MAX_TIMELINE_RANKS = 12  # rows in the timeline (each carries up to ~4000 intervals)
MAX_DETAIL_RANKS = 16  # ranks offered in the per-rank detail selector
MAX_HEATMAP_RANKS = 4096  # ranks in the heat map
MAX_TABLE_RANKS = 64  # rows in the rank table; past it the page adds histograms of all ranks


class RankView:
    """One analysed rank as the page shows it: a stable key, a unique label, its numbers.

    In a report read from stored summaries (`LazyRanks`, thousands of ranks) `result` is decoded
    on each read (the store keeps the last few), so the page's views never hold every rank's."""

    __slots__ = ("key", "label", "rank", "file", "_result", "_load")

    def __init__(self, key: str, label: str, rank: int | None, file: str, result: RankResult | None = None,
                 load: Callable[[], RankResult | None] | None = None) -> None:
        self.key, self.label, self.rank, self.file = key, label, rank, file
        self._result, self._load = result, load

    @property
    def result(self) -> RankResult:
        r = self._load() if self._load is not None else self._result
        assert r is not None  # a view is made only for a rank with a result
        return r


def rank_views(report: Report) -> list[RankView]:
    ranks = report.ranks
    lazy = ranks if isinstance(ranks, LazyRanks) else None
    # Stored ranks: read from their handles, no result decoded or kept (each view loads its own).
    rows = ([(i, rank, file, None) for i, rank, file in lazy.heads()] if lazy is not None else
            [(i, rr.rank, rr.file, rr.analysis) for i, rr in enumerate(ranks) if rr.analysis is not None])
    counts: dict[int | None, int] = {}
    for _, rank, _, _ in rows:
        counts[rank] = counts.get(rank, 0) + 1
    views = []
    for n, (i, rank, file, res) in enumerate(rows):
        label = f"rank {rank}" if rank is not None else f"trace {n}"
        if counts[rank] > 1:
            # Two traces claiming one rank are reported separately (session.assign_ranks): name both.
            label += f" · {short(os.path.basename(file), 40)}"
        if lazy is not None:
            views.append(RankView(f"r{n}", label, rank, file, load=partial(lazy.result, i)))
        else:
            views.append(RankView(f"r{n}", label, rank, file, res))
    return views


def straggler_key(views: list[RankView], cross: CrossRank | None) -> str | None:
    """The view of the straggler rank. CrossRank names it by rank number; when two traces claim that
    number (reported separately), the one that waits least in collectives is the one it meant."""
    if cross is None or cross.straggler is None:
        return None
    cands = [v for v in views if v.rank == cross.straggler]
    if not cands:
        return None

    def wait(v: RankView) -> float:
        w = comm_wait_ms(v.result)
        return float("inf") if w is None else w

    return min(cands, key=wait).key


def device_name(r: RankResult) -> str:
    if r.device:
        return r.device
    # Device activity without deviceProperties (older Kineto): say what kind, not "CPU only".
    return "CPU only" if r.device_kind == "cpu" else f"{r.device_kind.upper()} device (unnamed)"


def pick_ranks(views: list[RankView], straggler: str | None, cap: int) -> list[RankView]:
    """At most `cap` ranks worth drawing: the straggler, then the ranks with most device idle time
    (then longest step), shown in rank order. With thousands of ranks a row each would be unreadable
    and heavy; these are the rows a reader looks for."""
    first = next((i for i, v in enumerate(views) if v.key == straggler), None)
    return [views[i] for i in worst([v.result for v in views], cap, first)]
