"""The analysed ranks as the HTML report shows them, and which of them it draws.

Every plot and table is bounded whatever the job size (thousands of ranks): the page picks the
ranks worth drawing (the straggler, then the most idle) and says how many it left out.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..metrics.model import RankResult
from ..metrics.ranks import CrossRank, comm_wait_ms
from .html_text import short
from .model import RankReport, Report
from .offenders import worst

# Bounds that keep the page light whatever the job size (thousands of ranks, long windows).
MAX_TIMELINE_RANKS = 12  # rows in the timeline (each carries up to ~4000 intervals)
MAX_DETAIL_RANKS = 16  # ranks offered in the per-rank detail selector
MAX_HEATMAP_RANKS = 4096  # ranks in the heat map
MAX_TABLE_RANKS = 64  # rows in the rank table; past it the page adds histograms of all ranks


@dataclass
class RankView:
    """One analysed rank as the page shows it: a stable key, a unique label, its numbers."""

    key: str
    label: str
    rank: int | None
    result: RankResult
    report: RankReport


def rank_views(report: Report) -> list[RankView]:
    rows = [rr for rr in report.ranks if rr.analysis is not None]
    counts: dict[int | None, int] = {}
    for rr in rows:
        counts[rr.rank] = counts.get(rr.rank, 0) + 1
    views = []
    for i, rr in enumerate(rows):
        assert rr.analysis is not None
        label = f"rank {rr.rank}" if rr.rank is not None else f"trace {i}"
        if counts[rr.rank] > 1:
            # Two traces claiming one rank are reported separately (session.assign_ranks): name both.
            label += f" · {short(os.path.basename(rr.file), 40)}"
        views.append(RankView(f"r{i}", label, rr.rank, rr.analysis, rr))
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
