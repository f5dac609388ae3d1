"""Cross-rank metrics: step-time skew and straggler blame."""

from __future__ import annotations

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


def comm_wait_ms(r: RankResult) -> float | None:
    """Mean per-step time this rank spent inside collectives."""
    rows = [s.comm_ms for s in r.steps if s.comm_ms is not None]
    if rows:
        return float(np.mean(rows))
    if r.metrics.comm_pct is not None and r.metrics.step_ms_median:
        return r.metrics.comm_pct / 100.0 * r.metrics.step_ms_median
    return None


def matched_waits_ms(ranked: list[RankResult]) -> tuple[list[float], int] | None:
    """Per rank, the time per step inside the collective calls every rank recorded, matched by
    (process group, sequence number); and how many calls matched. None when any rank lacks
    sequence numbers or no call is common to all. Matching compares the same calls everywhere, so
    a rank that also ran other collectives (or lost some rows) is not blamed for them. O(calls)."""
    tables = []
    for r in ranked:
        c = r.collectives
        if c is None or not c.call_seq:
            return None
        tables.append({(c.groups[g], s): d for g, s, d in zip(c.call_group, c.call_seq, c.call_dur_ns, strict=True)})
    common = set(tables[0]).intersection(*tables[1:])
    if not common:
        return None
    waits = []
    for r, table in zip(ranked, tables, strict=True):
        steps = max(1, len(r.window.steps))
        waits.append(sum(table[k] for k in common) / steps / 1e6)
    return waits, len(common)


def cross_rank(results: list[RankResult]) -> CrossRank | None:
    """Skew and straggler blame across ranks of one job.

    Blame follows the asymmetry of waiting: in a collective every rank waits until the last one
    arrives, so the late rank spends the *least* time inside the collective and the others wait
    for it. The straggler is the rank with the smallest collective time per step, when the spread
    exceeds STRAGGLER_MIN_SPREAD of the median step; its victims are the ranks that wait longer.
    (Blaming the rank whose step took longest blames a victim: its step includes the waiting.)
    """
    ranked = [r for r in results if r.rank is not None and r.metrics.step_ms_median]
    if len(ranked) < 2:
        return None
    steps = np.array([r.metrics.step_ms_median for r in ranked], dtype=float)
    med = float(np.median(steps))
    out = CrossRank(
        ranks=len(ranked), step_ms_median=round(med, 4), step_ms_min=round(float(steps.min()), 4),
        step_ms_max=round(float(steps.max()), 4),
        step_skew_pct=round(100.0 * float(steps.max() - steps.min()) / med, 3) if med else None,
    )
    matched = matched_waits_ms(ranked)
    if matched is not None:
        out.matched_by, out.matched_calls = "seq", matched[1]
        waits = list(zip(ranked, matched[0], strict=True))
    else:
        waits = [(r, comm_wait_ms(r)) for r in ranked]
        waits = [(r, w) for r, w in waits if w is not None]
    if len(waits) < 2:
        return out
    least = min(w for _, w in waits)
    out.per_rank = [
        RankWait(int(r.rank), float(r.metrics.step_ms_median), round(w, 4), round(w - least, 4))
        for r, w in waits
    ]
    spread = max(w for _, w in waits) - least
    if med and spread > STRAGGLER_MIN_SPREAD * med:
        culprit = min(waits, key=lambda rw: rw[1])[0]
        out.straggler = int(culprit.rank)
        out.straggler_lead_ms = round(spread, 4)
        out.victims = sorted(int(r.rank) for r, w in waits if w - least > STRAGGLER_MIN_SPREAD * med)
    return out
