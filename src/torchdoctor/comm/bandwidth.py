"""Bandwidth arithmetic of the collective benchmark (nccl-tests' doc/PERFORMANCE.md); no torch."""

from __future__ import annotations

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


def bus_factor(op: str, n: int) -> float:
    """busbw / algbw for ``n`` ranks: all-reduce 2(n-1)/n; all-gather, reduce-scatter, all-to-all
    (n-1)/n; broadcast 1. With it, busbw compares with the link's peak whatever the op."""
    if n <= 1:
        return 1.0
    return {"all_reduce": 2 * (n - 1) / n, "broadcast": 1.0}.get(op, (n - 1) / n)


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Message sizes: doubling up to 1 KiB, then x4 (8 B, 16 B, ..., 1 KiB, 4 KiB, 16 KiB, ...)."""
    out, s = [], max(1, min_bytes)
    while s <= max_bytes:
        out.append(s)
        s *= 2 if s < 1024 else 4
    return out
