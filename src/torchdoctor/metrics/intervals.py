"""Interval-set algebra on numpy arrays (half-open [start, end) in ns).

An *interval set* is a pair of int64 arrays (starts, ends), sorted, disjoint and non-empty
intervals. Every metric that speaks of "time when X was happening" is a union of intervals,
so overlapping events are never double counted (HTA's definition, at ns precision).
"""

from __future__ import annotations

import numpy as np

Intervals = tuple[np.ndarray, np.ndarray]
EMPTY: Intervals = (np.zeros(0, np.int64), np.zeros(0, np.int64))


def union(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """Merge possibly overlapping intervals into a disjoint sorted set (zero-length ones vanish)."""
    keep = ends > starts
    if not keep.all():
        starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        return EMPTY
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    run_end = np.maximum.accumulate(e)
    # A new merged interval begins where the start lies past every end seen so far.
    new = np.ones(s.size, dtype=bool)
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    merged_end = np.maximum.reduceat(e, idx)
    return s[idx].astype(np.int64), merged_end.astype(np.int64)


def total(iv: Intervals) -> int:
    return int((iv[1] - iv[0]).sum())


def clip(iv: Intervals, lo: int, hi: int) -> Intervals:
    s, e = np.maximum(iv[0], lo), np.minimum(iv[1], hi)
    keep = e > s
    return s[keep], e[keep]


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """Time covered by both sets."""
    if a[0].size == 0 or b[0].size == 0:
        return EMPTY
    return _coverage(a, b, want=3)


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """Time covered by `a` but not by `b`."""
    if a[0].size == 0 or b[0].size == 0:
        return a
    return _coverage(a, b, want=1)


def complement(iv: Intervals, lo: int, hi: int) -> Intervals:
    """Gaps of `iv` inside [lo, hi)."""
    whole = (np.array([lo], np.int64), np.array([hi], np.int64))
    if hi <= lo:
        return EMPTY
    return subtract(whole, clip(iv, lo, hi))


def _coverage(a: Intervals, b: Intervals, want: int) -> Intervals:
    # Sweep: a contributes weight 1, b weight 2; keep the spans where the running sum == want.
    pts = np.concatenate([a[0], a[1], b[0], b[1]])
    w = np.concatenate([
        np.ones(a[0].size, np.int8), -np.ones(a[1].size, np.int8),
        np.full(b[0].size, 2, np.int8), np.full(b[1].size, -2, np.int8),
    ])
    order = np.lexsort((w, pts))  # at equal times apply ends (negative) before starts
    pts, w = pts[order], w[order]
    level = np.cumsum(w, dtype=np.int16)
    inside = level == want
    starts = pts[:-1][inside[:-1]]
    ends = pts[1:][inside[:-1]]
    keep = ends > starts
    s, e = starts[keep], ends[keep]
    if s.size == 0:
        return EMPTY
    # Adjacent pieces produced by coincident points are re-joined.
    return union(s, e)


def covered_by(points_start: np.ndarray, points_end: np.ndarray, iv: Intervals) -> np.ndarray:
    """For each [s, e) query interval, the ns of it covered by the interval set `iv`."""
    if iv[0].size == 0 or points_start.size == 0:
        return np.zeros(points_start.size, np.int64)
    # Prefix sums of covered length let each query be answered with two binary searches.
    lengths = iv[1] - iv[0]
    prefix = np.concatenate([[0], np.cumsum(lengths)])

    def covered_until(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(iv[0], t, side="right")  # intervals starting at or before t
        full = prefix[np.maximum(i - 1, 0)]
        last_start = iv[0][np.maximum(i - 1, 0)]
        last_end = iv[1][np.maximum(i - 1, 0)]
        partial = np.clip(np.minimum(t, last_end) - last_start, 0, None)
        return np.where(i > 0, full + partial, 0)

    return covered_until(points_end) - covered_until(points_start)


def merge_busy(starts: np.ndarray, ends: np.ndarray, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted, disjoint busy intervals merged across their smallest gaps until at most `cap` remain."""
    if starts.size <= cap:
        return starts, ends
    if cap <= 1:
        return starts[:1], ends[-1:]
    gaps = starts[1:] - ends[:-1]
    # The cap-1 largest gaps stay; ties are broken by position so exactly cap-1 are kept.
    keep = np.zeros(gaps.size, bool)
    keep[np.argsort(-gaps, kind="stable")[: cap - 1]] = True
    idx = np.flatnonzero(np.concatenate([[True], keep]))
    return starts[idx], np.maximum.reduceat(ends, idx)
