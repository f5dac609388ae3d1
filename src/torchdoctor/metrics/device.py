"""Device time: busy/idle, compute/communication/memory, overlap and idle attribution."""

from __future__ import annotations

import numpy as np

from ..trace.model import DEVICE_WORK, Cat
from . import intervals as iv
from .context import Context
from .model import GapClass, IdleCause, NamedTime, StreamIdle

# HTA's consecutive_kernel_delay: documented as 30 ns, applied as 30 µs (its data is in µs).
KERNEL_WAIT_NS = 30_000
IDLE_CAUSES = ("dataloader", "sync", "optimizer", "comm_host", "host_ops", "untraced")


def pct(part: int | float, whole: int | float) -> float | None:
    return None if whole <= 0 else round(100.0 * part / whole, 3)


def utilisation(ctx: Context) -> dict[str, float | None]:
    """Busy and idle shares of the window.

    busy = |union of kernel, memcpy and memset intervals| / window. `cuda_sync` events are not
    busy time: they record the device waiting (HTA counts them as busy in its temporal breakdown,
    which is why its idle % can be lower on traces that carry them).
    compute = |union of non-communication kernels|; comm = |union of communication kernels|;
    memcpy = |union of memcpy and memset|.
    comm_exposed = |comm − compute|: communication time not hidden under compute.
    overlap = 100 × |comm ∩ compute| / |comm| (HTA's comp_comm_overlap_pctg), None without comm.
    """
    w = ctx.win.dur
    busy, comm, compute = iv.total(ctx.busy), iv.total(ctx.comm), iv.total(ctx.compute)
    overlap = iv.total(iv.intersect(ctx.comm, ctx.compute))
    return {
        "busy_pct": pct(busy, w),
        "idle_pct": pct(w - busy, w),
        "compute_pct": pct(compute, w),
        "comm_pct": pct(comm, w),
        "comm_exposed_pct": pct(comm - overlap, w),
        "memcpy_pct": pct(iv.total(ctx.memory), w),
        "overlap_pct": pct(overlap, comm) if comm else None,
    }


def launch_times(ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    """(sorted correlation ids, their launch start ns) of host runtime/driver calls."""
    tr = ctx.tr
    m = tr.mask(Cat.RUNTIME, Cat.DRIVER) & (tr.correlation >= 0)
    corr, ts = tr.correlation[m], tr.ts[m]
    order = np.argsort(corr, kind="stable")
    return corr[order], ts[order]


def lookup(keys_sorted: np.ndarray, values: np.ndarray, query: np.ndarray, missing: int = -1) -> np.ndarray:
    if keys_sorted.size == 0:
        return np.full(query.size, missing, np.int64)
    pos = np.clip(np.searchsorted(keys_sorted, query), 0, keys_sorted.size - 1)
    hit = keys_sorted[pos] == query
    return np.where(hit, values[pos], missing)


def launched_device_ns(ctx: Context, launches: np.ndarray) -> np.ndarray:
    """Device ns (kernels, copies, memsets) of each launch call in ``launches``, joined by correlation id.
    Collective kernels count 0: launched inside a region (FSDP's all-gather before a checkpointed
    segment's backward) they are needed with or without the region's own work, and their time is
    mostly waiting for the other ranks."""
    corr, per = ctx.work_by_correlation  # computed once per rank: recompute and the optimizer both ask
    return lookup(corr, per, ctx.tr.correlation[launches], missing=0)


def stream_idle(ctx: Context) -> list[StreamIdle]:
    """Per-stream idle gaps classified as HTA does, at ns precision.

    On each stream, kernels/memcpys/memsets sorted by start; the gap before event i is
    [end(i−1), start(i)). It is *host_wait* when the host called the launch API after end(i−1)
    (the device ran dry waiting for the CPU), else *kernel_wait* when shorter than 30 µs (launch
    latency between back-to-back kernels), else *other* (launched early but still waited: a
    cross-stream event, a collective waiting for peers). Gaps are clipped to the window. Per-stream
    totals do not add up to device idle time: a stream is idle while others work.
    """
    tr = ctx.tr
    m = ctx.device_work & ctx.in_window
    if not m.any():
        return []
    idx = np.flatnonzero(m)
    order = np.lexsort((tr.ts[idx], tr.stream[idx]))
    idx = idx[order]
    stream, ts, end = tr.stream[idx], tr.ts[idx], tr.end[idx]
    corr_sorted, launch_ts_sorted = launch_times(ctx)
    launch = lookup(corr_sorted, launch_ts_sorted, tr.correlation[idx])
    same = np.zeros(idx.size, bool)
    same[1:] = stream[1:] == stream[:-1]
    # End of the latest work before each entry on its stream (running max guards overlapping
    # entries); it restarts at each stream's first entry, whose gap `same` masks out.
    prev_end = np.zeros(idx.size, np.int64)
    starts = np.flatnonzero(~same)
    for a, b in zip(starts, np.append(starts[1:], idx.size), strict=True):
        if b - a > 1:
            prev_end[a + 1:b] = np.maximum.accumulate(end[a:b - 1])
    gap_lo = np.maximum(prev_end, ctx.win.start)
    gap_hi = np.minimum(ts, ctx.win.end)
    gap = np.where(same, np.clip(gap_hi - gap_lo, 0, None), 0)
    raw_gap = np.where(same, ts - prev_end, 0)
    host_wait = same & (launch >= 0) & (launch > prev_end) & (gap > 0)
    kernel_wait = same & ~host_wait & (raw_gap < KERNEL_WAIT_NS) & (gap > 0)
    other = same & ~host_wait & ~kernel_wait & (gap > 0)
    out = []
    for s in np.unique(stream):
        sel = stream == s
        busy = iv.total(iv.clip(iv.union(ts[sel], end[sel]), ctx.win.start, ctx.win.end))
        out.append(StreamIdle(
            stream=int(s), busy_ns=busy,
            host_wait=GapClass(int(gap[sel & host_wait].sum()), int((sel & host_wait).sum())),
            kernel_wait=GapClass(int(gap[sel & kernel_wait].sum()), int((sel & kernel_wait).sum())),
            other=GapClass(int(gap[sel & other].sum()), int((sel & other).sum())),
        ))
    return out


def cause_masks(ctx: Context) -> dict[str, np.ndarray]:
    """Host events that stand for each idle cause (before priority is applied)."""
    tr = ctx.tr
    step_marks = tr.name_mask(lambda n: n.startswith("ProfilerStep#"))
    return {
        "dataloader": ctx.dataloader_mask,
        "sync": ctx.sync_mask,
        "optimizer": ctx.optimizer_mask,
        "comm_host": ctx.comm_host_mask,
        "host_ops": ctx.host & ~step_marks,
    }


def idle_causes(ctx: Context) -> tuple[list[IdleCause], dict[str, iv.Intervals]]:
    """Device idle time attributed to what the host was doing meanwhile — HTA cannot answer this.

    Each idle ns goes to the first matching cause in priority order: waiting in the DataLoader's
    `__next__`; inside a blocking sync call (cudaStreamSynchronize & co, synchronous memcpy); in
    the optimizer's step/zero_grad; in a host-side collective call; in any other traced host
    op (Python-level ops, launch overhead); else *untraced* (Python between ops, or a process the
    profiler did not see). Returns the causes and their attributed interval sets.
    """
    if not ctx.has_device:
        return [], {}
    remaining = ctx.idle
    tr = ctx.tr
    out: list[IdleCause] = []
    sets: dict[str, iv.Intervals] = {}
    for cause, mask in cause_masks(ctx).items():
        cov = ctx.clipped_union(mask)
        got = iv.intersect(remaining, cov)
        remaining = iv.subtract(remaining, cov)
        sets[cause] = got
        top: list[NamedTime] = []
        if iv.total(got):
            m = mask & ctx.in_window
            if cause == "host_ops":
                m &= tr.mask(Cat.CPU_OP, Cat.USER_ANNOTATION)
            top = top_by_name(ctx, np.flatnonzero(m), got)
        out.append(IdleCause(cause, iv.total(got), top))
    sets["untraced"] = remaining
    out.append(IdleCause("untraced", iv.total(remaining)))
    return out, sets


def top_by_name(ctx: Context, idx: np.ndarray, within: iv.Intervals, n: int = 5) -> list[NamedTime]:
    """Names of the events in `idx` ranked by how much of `within` they cover."""
    if idx.size == 0:
        return []
    tr = ctx.tr
    cov = iv.covered_by(tr.ts[idx], tr.end[idx], within)
    hit = cov > 0
    if not hit.any():
        return []
    idx, cov = idx[hit], cov[hit]
    names = tr.name[idx]
    sums = np.bincount(names, weights=cov, minlength=len(tr.names))
    counts = np.bincount(names, minlength=len(tr.names))
    best = np.argsort(-sums)[:n]
    out = []
    for name_id in best:
        if sums[name_id] <= 0:
            break
        sel = names == name_id
        first = int(tr.ts[idx[sel]][np.argmax(cov[sel])])
        region = bool((tr.cat[idx[sel]] == Cat.USER_ANNOTATION).all())
        out.append(NamedTime(tr.names[name_id], int(sums[name_id]), int(counts[name_id]), first, region))
    return out


def timeline_sketch(ctx: Context, sets: dict[str, iv.Intervals], cap: int = 2000):
    """Busy intervals and idle gaps (relative to the window start) for plots, with each gap's main cause."""
    lo = ctx.win.start
    busy_s, busy_e = ctx.busy
    # Merge the smallest gaps away so the plot keeps its shape with a bounded point count.
    busy_s, busy_e = iv.merge_busy(busy_s, busy_e, cap)
    busy = [(int(a - lo), int(b - lo)) for a, b in zip(busy_s, busy_e, strict=True)]
    gap_s, gap_e = ctx.idle
    if gap_s.size > cap:
        order = np.sort(np.argsort(gap_e - gap_s)[-cap:])
        gap_s, gap_e = gap_s[order], gap_e[order]
    labels = np.full(gap_s.size, "untraced", dtype=object)
    best = np.zeros(gap_s.size, np.int64)
    for cause, s in sets.items():
        cov = iv.covered_by(gap_s, gap_e, s)
        better = cov > best
        labels[better] = cause
        best = np.maximum(best, cov)
    gaps = [(int(a - lo), int(b - lo), str(c)) for a, b, c in zip(gap_s, gap_e, labels, strict=True)]
    return busy, gaps


def device_kind(ctx: Context) -> str:
    tr = ctx.tr
    if not ctx.has_device:
        return "cpu"
    name = (tr.device_name or "").lower()
    hip = tr.mask(Cat.RUNTIME) & tr.name_mask(lambda n: n.startswith("hip"))
    if "amd" in name or "radeon" in name or "instinct" in name or hip.any():
        return "rocm"
    return "cuda"


__all__ = ["DEVICE_WORK", "IDLE_CAUSES", "idle_causes", "stream_idle", "utilisation", "timeline_sketch"]
