"""Cross-rank metrics: step-time skew and straggler blame."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import msgspec
import numpy as np

from .model import RankResult

# Below this spread of collective wait between ranks (share of the step) there is no straggler.
STRAGGLER_MIN_SPREAD = 0.05


class RankWait(msgspec.Struct):
    rank: int
    step_ms: float
    # Time per step spent inside collectives (device comm kernels, or host collective calls).
    comm_wait_ms: float
    # Extra wait this rank suffers compared with the rank that waits least.
    excess_wait_ms: float


class CollectiveWait(msgspec.Struct):
    """One collective call (process group, sequence number) seen on every rank, ms inside it per rank.

    The rank that arrived last spends the least time inside (everyone leaves together), so
    `last_rank` is the rank with `min_ms`; `excess_ms` sums over ranks the time each spent inside
    beyond `min_ms`: what the call cost the job in waiting for its last arrival."""

    group: str
    seq: int
    last_rank: int
    min_ms: float
    median_ms: float
    max_ms: float
    excess_ms: float


class LateRank(msgspec.Struct):
    rank: int
    calls: int  # matched calls in which this rank arrived last
    excess_ms: float  # the waiting those calls cost the other ranks


class CrossRank(msgspec.Struct):
    ranks: int
    step_ms_median: float | None = None
    step_ms_min: float | None = None
    step_ms_max: float | None = None
    # (max − min) / median of the ranks' median step times.
    step_skew_pct: float | None = None
    # The rank that waits least inside collectives: everyone else waits for it.
    straggler: int | None = None
    straggler_lead_ms: float | None = None
    victims: list[int] = []
    per_rank: list[RankWait] = []
    # "seq": waits measured on the same collective calls on every rank, matched by (process group,
    # sequence number); "aggregate": each rank's total collective time per step.
    matched_by: str = "aggregate"
    matched_calls: int = 0
    # Matched by sequence number only: the calls that cost the most waiting (at most TOP_CALLS), and
    # the ranks that arrived last most often (at most TOP_LATE), from the ranks x calls wait matrix.
    collective_waits: list[CollectiveWait] = []
    late_ranks: list[LateRank] = []


TOP_CALLS = 16
TOP_LATE = 8


def comm_wait_ms(r: RankResult) -> float | None:
    """Mean per-step time this rank spent inside collectives."""
    rows = [s.comm_ms for s in r.steps if s.comm_ms is not None]
    if rows:
        return float(np.mean(rows))
    if r.metrics.comm_pct is not None and r.metrics.step_ms_median:
        return r.metrics.comm_pct / 100.0 * r.metrics.step_ms_median
    return None


class RankLine(NamedTuple):
    """What the cross-rank analysis reads of one rank (taken from its result as the ranks stream by)."""

    rank: int
    step_ms: float  # median step
    steps: int  # steps in the window (at least 1)
    wait_ms: float | None  # comm_wait_ms
    calls: dict[tuple[str, int], int] | None  # (group, seq) -> ns inside; None without sequence numbers


def rank_line(r: RankResult) -> RankLine:
    c = r.collectives
    calls = ({(c.groups[g], s): d for g, s, d in zip(c.call_group, c.call_seq, c.call_dur_ns, strict=True)}
             if c is not None and c.call_seq else None)
    return RankLine(int(r.rank or 0), float(r.metrics.step_ms_median or 0.0), max(1, len(r.window.steps)),
                    comm_wait_ms(r), calls)


def wait_matrix(ranked: list[RankLine]) -> tuple[list[tuple[str, int]], np.ndarray] | None:
    """The collective calls every rank recorded, matched by (process group, sequence number), and a
    ranks x calls matrix of ns inside each; None when any rank lacks sequence numbers or no call is
    common to all. Matching compares the same calls everywhere, so a rank that also ran other
    collectives (or lost some rows) is not blamed for them. O(ranks x calls) time and memory."""
    tables = [line.calls for line in ranked]
    if any(t is None for t in tables):
        return None
    common = sorted(set(tables[0]).intersection(*tables[1:]), key=lambda k: (k[1], k[0]))  # type: ignore[arg-type]
    if not common:
        return None
    return common, np.array([[t[k] for k in common] for t in tables], dtype=np.float64)  # type: ignore[index]


def collective_waits(ranked: list[RankLine], calls: list[tuple[str, int]], m: np.ndarray
                     ) -> tuple[list[CollectiveWait], list[LateRank]]:
    """Per matched call: who arrived last and the waiting it cost (top TOP_CALLS by cost); per rank:
    how often it arrived last (top TOP_LATE by the waiting it caused)."""
    low = m.min(axis=0)
    last = m.argmin(axis=0)
    excess = (m - low).sum(axis=0)
    out = []
    for k in np.argsort(-excess, kind="stable")[:TOP_CALLS]:
        col = m[:, k]
        out.append(CollectiveWait(calls[k][0], int(calls[k][1]), int(ranked[last[k]].rank), round(low[k] / 1e6, 4),
                                  round(float(np.median(col)) / 1e6, 4), round(float(col.max()) / 1e6, 4),
                                  round(float(excess[k]) / 1e6, 4)))
    counts = np.bincount(last, minlength=len(ranked))
    cost = np.bincount(last, weights=excess, minlength=len(ranked))
    late = [LateRank(int(ranked[i].rank), int(counts[i]), round(float(cost[i]) / 1e6, 4))
            for i in np.argsort(-cost, kind="stable")[:TOP_LATE] if counts[i]]
    return out, late


def cross_rank(results: Iterable[RankResult]) -> CrossRank | None:
    """Skew and straggler blame across ranks of one job.

    Blame follows the asymmetry of waiting: in a collective every rank waits until the last one
    arrives, so the late rank spends the *least* time inside the collective and the others wait
    for it. The straggler is the rank with the smallest collective time per step, when the spread
    exceeds STRAGGLER_MIN_SPREAD of the median step; its victims are the ranks that wait longer.
    (Blaming the rank whose step took longest blames a victim: its step includes the waiting.)
    `results` is read once, one rank at a time (a generator over stored ranks holds none of them).
    """
    ranked = [rank_line(r) for r in results if r.rank is not None and r.metrics.step_ms_median]
    if len(ranked) < 2:
        return None
    steps = np.array([r.step_ms for r in ranked], dtype=float)
    med = float(np.median(steps))
    out = CrossRank(
        ranks=len(ranked), step_ms_median=round(med, 4), step_ms_min=round(float(steps.min()), 4),
        step_ms_max=round(float(steps.max()), 4),
        step_skew_pct=round(100.0 * float(steps.max() - steps.min()) / med, 3) if med else None,
    )
    matrix = wait_matrix(ranked)
    if matrix is not None:
        calls, m = matrix
        steps = np.array([r.steps for r in ranked], dtype=np.float64)
        out.matched_by, out.matched_calls = "seq", len(calls)
        out.collective_waits, out.late_ranks = collective_waits(ranked, calls, m)
        waits = list(zip(ranked, (m.sum(axis=1) / steps / 1e6).tolist(), strict=True))
    else:
        waits = [(r, r.wait_ms) for r in ranked if r.wait_ms is not None]
    if len(waits) < 2:
        return out
    least = min(w for _, w in waits)
    out.per_rank = [
        RankWait(r.rank, r.step_ms, round(w, 4), round(w - least, 4))
        for r, w in waits
    ]
    spread = max(w for _, w in waits) - least
    if med and spread > STRAGGLER_MIN_SPREAD * med:
        culprit = min(waits, key=lambda rw: rw[1])[0]
        out.straggler = int(culprit.rank)
        out.straggler_lead_ms = round(spread, 4)
        out.victims = sorted(int(r.rank) for r, w in waits if w - least > STRAGGLER_MIN_SPREAD * med)
    return out
