"""Host-side metrics: syncs, kernel launches, the input pipeline and the host step split."""

from __future__ import annotations

import numpy as np

from ..trace.model import Cat
from . import intervals as iv
from .classify import BLOCKING_COPY_APIS, LAUNCH_APIS, SYNC_OPS_EXPLAINED
from .context import Context
from .device import lookup, pct, top_by_name
from .model import HostBreakdown, LaunchStats, NamedTime, SyncSite, SyncStats

HOST_PHASES = ("data", "forward", "backward", "optimizer", "comm", "other")


def enclosing_ops(ctx: Context, idx: np.ndarray) -> tuple[list[str], list[str]]:
    """For each event in `idx`: (innermost, outermost) enclosing cpu_op on its thread, "" if none
    (an event never encloses itself: for a cpu_op in `idx`, its parent and its root)."""
    tr = ctx.tr
    ops = np.flatnonzero(tr.mask(Cat.CPU_OP) & ctx.host)
    inner: list[str] = []
    outer: list[str] = []
    by_tid: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
    for i in idx:
        tid = int(tr.tid[i])
        if tid not in by_tid:
            sel = ops[tr.tid[ops] == tid]
            ends = tr.end[sel]
            by_tid[tid] = (sel, tr.ts[sel], ends, np.maximum.accumulate(ends) if ends.size else ends)
        sel, ts, ends, prefix_max = by_tid[tid]
        t0, t1 = tr.ts[i], tr.end[i]
        k = int(np.searchsorted(ts, t0, side="right"))
        name_in = name_out = ""
        # Innermost: the latest-starting op that still encloses the call (nesting is shallow).
        for j in range(k - 1, max(k - 64, 0) - 1, -1):
            if ends[j] >= t1 and sel[j] != i:
                name_in = tr.names[tr.name[sel[j]]]
                break
        # Outermost: the first op whose end reaches past the call (prefix max of ends is sorted).
        j0 = int(np.searchsorted(prefix_max, t1, side="left")) if prefix_max.size else 0
        if j0 < k and ends[j0] >= t1 and sel[j0] != i:
            name_out = tr.names[tr.name[sel[j0]]]
        inner.append(name_in)
        outer.append(name_out or name_in)
    return inner, outer


def explain_sync(inner: str, outer: str, api: str) -> str:
    for op in (inner, outer):
        if op in SYNC_OPS_EXPLAINED:
            return SYNC_OPS_EXPLAINED[op]
    if api in BLOCKING_COPY_APIS:
        return "synchronous copy (pageable host memory or a blocking .to()/.cpu())"
    if "Synchronize" in api and not inner:
        return "explicit torch.cuda.synchronize() or event.synchronize() outside any aten op"
    return "host waits for the device"


def syncs(ctx: Context) -> SyncStats:
    """Host-device synchronisations in the window.

    A sync is a blocking runtime call (cudaStreamSynchronize, cudaDeviceSynchronize,
    cudaEventSynchronize, their cu*/hip* twins) or a synchronous copy (cudaMemcpy). Each is tied to
    the aten op that caused it — the innermost enclosing cpu_op on its thread (e.g.
    `aten::_local_scalar_dense` is `.item()`) — and grouped by (API, op, outermost op).
    `cuda_sync` events are the device-side record of waits and are counted by name.
    """
    tr = ctx.tr
    idx = np.flatnonzero(ctx.sync_mask & ctx.in_window)
    dev_sync = tr.mask(Cat.SYNC) & ctx.in_window
    names, counts = np.unique(tr.name[dev_sync], return_counts=True)
    device_events = {tr.names[n]: int(c) for n, c in zip(names, counts, strict=True)}
    steps = max(len(ctx.win.steps), 1)
    if idx.size == 0:
        return SyncStats(device_sync_events=device_events)
    inner, outer = enclosing_ops(ctx, idx)
    groups: dict[tuple[str, str, str], list[int]] = {}
    for i, a, b in zip(idx, inner, outer, strict=True):
        groups.setdefault((tr.names[tr.name[i]], a, b), []).append(int(i))
    sites = []
    for (api, a, b), members in groups.items():
        m = np.array(members)
        sites.append(SyncSite(
            api=api, op=a, top_op=b, explanation=explain_sync(a, b, api), count=m.size,
            ns=int((tr.end[m] - tr.ts[m]).sum()), first_ts_ns=int(tr.ts[m].min()),
        ))
    sites.sort(key=lambda s: -s.ns)
    return SyncStats(
        count=int(idx.size), ns=iv.total(ctx.sync), per_step=round(idx.size / steps, 3),
        sites=sites[:10], device_sync_events=device_events,
    )


# A kernel that starts within this long after another stream's op ends is taken to have waited
# for it (cudaStreamWaitEvent on the event recorded after that op): the device's event latency.
DEPENDENCY_SLACK_NS = 5_000


def unexplained_waits(ctx: Context, kp: np.ndarray, launch_end: np.ndarray) -> np.ndarray:
    """For kernels ``kp`` launched by calls ending at ``launch_end``: the ns between the launch
    and the kernel's start that earlier device work does not explain.

    Explained: the wait for the previous op (kernel, copy, memset) on the kernel's own stream to
    end, and for an op on another stream of the same device that ended at most
    DEPENDENCY_SLACK_NS before the kernel started (a cross-stream dependency). What is left is
    the device being slow to pick the kernel up: launch latency proper.
    """
    tr = ctx.tr
    work = np.flatnonzero(ctx.device_work)
    ready = launch_end.astype(np.int64).copy()
    starts = tr.ts[kp]
    for dev in np.unique(tr.pid[kp]):
        on_dev = work[tr.pid[work] == dev]
        mine = np.flatnonzero(tr.pid[kp] == dev)
        ends_sorted = np.sort(tr.end[on_dev])
        # The latest end on the device at or before the start, if close: a dependency (or the
        # same stream's predecessor, which the loop below finds exactly).
        j = np.searchsorted(ends_sorted, starts[mine], side="right") - 1
        near = (j >= 0) & (starts[mine] - ends_sorted[np.maximum(j, 0)] <= DEPENDENCY_SLACK_NS)
        ready[mine] = np.where(near, np.maximum(ready[mine], ends_sorted[np.maximum(j, 0)]), ready[mine])
        for stream in np.unique(tr.stream[kp[mine]]):
            same = on_dev[tr.stream[on_dev] == stream]
            order = np.argsort(tr.ts[same], kind="stable")
            s_ts, s_end = tr.ts[same][order], np.maximum.accumulate(tr.end[same][order])
            sel = mine[tr.stream[kp[mine]] == stream]
            i = np.searchsorted(s_ts, starts[sel], side="left") - 1  # ops that started before it
            prev = np.where(i >= 0, s_end[np.maximum(i, 0)], np.iinfo(np.int64).min)
            ready[sel] = np.maximum(ready[sel], prev)
    return np.clip(starts - ready, 0, None)


def launches(ctx: Context) -> LaunchStats:
    """Kernel launch costs.

    Launch = a host call in LAUNCH_APIS (cudaLaunchKernel, cudaLaunchKernelExC, cuLaunchKernel(Ex)
    from Triton, hip*LaunchKernel, cudaGraphLaunch) starting in the window; joined to its kernel by
    correlation id. launch_ns = the call's duration; launch delay = max(0, kernel start − call end)
    (HTA's definition), and the part of it earlier device work does not explain
    (``unexplained_waits``: launch_wait_ns); a *short kernel* runs shorter on the device than its launch took on the
    host; queue depth at a launch = kernels launched before it that have not finished yet (≤ 1
    means the device is starved by the host).
    """
    tr = ctx.tr
    w = ctx.win
    is_launch = tr.mask(Cat.RUNTIME, Cat.DRIVER) & tr.name_mask(LAUNCH_APIS.__contains__)
    idx = np.flatnonzero(is_launch & (tr.ts >= w.start) & (tr.ts < w.end))
    if idx.size == 0:
        return LaunchStats()
    api_names, api_counts = np.unique(tr.name[idx], return_counts=True)
    by_api = {tr.names[n]: int(c) for n, c in zip(api_names, api_counts, strict=True)}
    graph = sum(c for a, c in by_api.items() if "Graph" in a)
    cost = (tr.end[idx] - tr.ts[idx]).astype(np.float64)
    k = np.flatnonzero(tr.mask(Cat.KERNEL) & (tr.correlation >= 0))
    order = np.argsort(tr.correlation[k], kind="stable")
    k_corr = tr.correlation[k][order]
    k_pos = k[order]
    pos = lookup(k_corr, k_pos, tr.correlation[idx])
    found = pos >= 0
    out = LaunchStats(
        launches=int(idx.size), by_api=by_api, graph_launches=int(graph),
        launch_ns_median=float(np.median(cost)), launch_ns_p95=float(np.percentile(cost, 95)),
    )
    if found.any():
        kp = pos[found]
        k_dur = (tr.end[kp] - tr.ts[kp]).astype(np.float64)
        short = int((k_dur < cost[found]).sum())
        delay = np.clip(tr.ts[kp] - tr.end[idx[found]], 0, None).astype(np.float64)
        launch_ts = tr.ts[idx[found]]
        ends_sorted = np.sort(tr.end[kp])
        queued = np.arange(launch_ts.size) - np.searchsorted(ends_sorted, launch_ts, side="right")
        queued = np.clip(queued, 0, None)
        out.short_kernels = short
        out.short_kernels_pct = pct(short, int(found.sum()))
        out.launch_delay_ns_median = float(np.median(delay))
        out.launch_delay_ns_p95 = float(np.percentile(delay, 95))
        wait = unexplained_waits(ctx, kp, tr.end[idx[found]]).astype(np.float64)
        out.launch_wait_ns_median = float(np.median(wait))
        out.launch_wait_ns_p95 = float(np.percentile(wait, 95))
        out.queue_depth_median = float(np.median(queued))
        out.queue_le1_pct = pct(int((queued <= 1).sum()), queued.size)
    n_kernels = int((tr.mask(Cat.KERNEL) & (tr.ts >= w.start) & (tr.ts < w.end)).sum())
    out.kernels_per_step = round(n_kernels / max(len(w.steps), 1), 2)
    return out


def backward_passes(ctx: Context, main: np.ndarray) -> iv.Intervals:
    """The window's backward passes: each from its first to its last autograd engine node.

    Nodes (``autograd::engine::evaluate_function: ...``, any thread) belong to one pass until an
    op of the training thread (``main``) starts outside every node: the forward of the
    next micro-batch under gradient accumulation, or of an LBFGS closure. Those forwards are not
    backward time, so a step holds as many passes as it called ``backward()``; the engine's own
    gaps between the nodes of one pass stay inside it.
    """
    tr = ctx.tr
    m = ctx.backward_mask & ctx.in_window
    nodes = iv.clip(iv.union(tr.ts[m], tr.end[m]), ctx.win.start, ctx.win.end)
    if nodes[0].size <= 1:
        return nodes
    others = main & ~ctx.backward_mask & ctx.in_window
    # Any nesting level: an annotation around the whole step (or LBFGS's step around its
    # closures) starts before the gaps it spans, and so splits nothing.
    starts = np.sort(tr.ts[others])
    outside = starts[iv.covered_by(starts, starts + 1, nodes) == 0]
    # A gap [end of node k, start of node k+1) ends the pass when such an op starts inside it.
    in_gap = np.searchsorted(outside, nodes[0][1:]) - np.searchsorted(outside, nodes[1][:-1])
    first = np.concatenate([[0], np.flatnonzero(in_gap > 0) + 1])
    return nodes[0][first], np.maximum.reduceat(nodes[1], first)


# Lightning's closure runs backward right after zero_grad: the part after it holds almost no ops.
LIGHTNING_AFTER_SHARE = 0.05


def closure_forwards(ctx: Context, passes: iv.Intervals, ops: iv.Intervals) -> iv.Intervals:
    """Forward time of the closures an optimizer's step runs (LBFGS; Lightning's automatic
    optimization hands Optimizer.step a closure that runs training_step, zero_grad and backward).

    Inside an ``Optimizer.step#`` range that holds backward passes, each pass's closure spans from
    the range's start, or the previous pass's end, to the pass, less its ``Optimizer.zero_grad#``
    calls. A zero_grad in that span splits it: the forward is the part after it (torch's docs'
    closure: zero_grad, forward, loss, backward; what precedes it is the optimizer's own work
    between closures, LBFGS's two-loop recursion, which can hold many more ops than a small
    model's forward), unless that part holds almost no traced op time (`ops`: the thread's
    cpu_ops, not its annotations): under LIGHTNING_AFTER_SHARE of the part before it (Lightning's
    closure: forward, zero_grad, backward, nothing between the last two). A span
    without zero_grad is the closure's forward whole.
    """
    tr = ctx.tr
    opt = ctx.optimizer_mask & ctx.in_window
    zero = opt & tr.name_mask(lambda n: n.startswith("Optimizer.zero_grad#"))
    step_ranges = iv.union(tr.ts[opt & ~zero], tr.end[opt & ~zero])
    if passes[0].size == 0 or step_ranges[0].size == 0:
        return iv.EMPTY
    zs, ze = iv.union(tr.ts[zero], tr.end[zero])
    rs, re_ = step_ranges
    out_s: list[int] = []
    out_e: list[int] = []
    prev_end = None
    for ps, pe in zip(passes[0].tolist(), passes[1].tolist(), strict=True):
        k = int(np.searchsorted(rs, ps, side="right")) - 1
        if k < 0 or re_[k] < ps:
            prev_end = pe
            continue
        lo = int(rs[k]) if prev_end is None or prev_end < rs[k] else max(int(rs[k]), prev_end)
        prev_end = pe
        if lo >= ps:
            continue
        j = int(np.searchsorted(ze, ps, side="right")) - 1
        if j >= 0 and ze[j] > lo:  # the last zero_grad between lo and the pass
            before = (np.array([lo], np.int64), np.array([max(lo, int(zs[j]))], np.int64))
            after = (np.array([int(ze[j])], np.int64), np.array([ps], np.int64))
            held = iv.total(iv.intersect(after, ops)), iv.total(iv.intersect(before, ops))
            a, b = (after if held[0] >= held[1] * LIGHTNING_AFTER_SHARE else before)
            out_s.append(int(a[0]))
            out_e.append(int(b[0]))
        else:
            out_s.append(lo)
            out_e.append(ps)
    if not out_s:
        return iv.EMPTY
    return iv.union(np.array(out_s, np.int64), np.array(out_e, np.int64))


def host_split(ctx: Context) -> tuple[HostBreakdown, list[dict[str, float]]]:
    """Host time of each step split into exclusive phases: data, forward, backward, optimizer, comm, other.

    Priority (first match wins): comm (host collective calls: nccl:*, gloo:*, c10d::*), data
    (DataLoader `__next__`), backward (the step's backward passes, each from its first to its last
    autograd engine node, any thread: `backward_passes`), the forwards of closures an optimizer's
    step runs (`closure_forwards`), optimizer (Optimizer.step/zero_grad, less those closures'
    passes and forwards), forward (other traced ops on the step's thread), other (untraced
    Python, gaps). The phases of a step sum to its duration.
    Returns the median ms per phase over the window's steps, shares of the window, and per-step ms.
    """
    tr = ctx.tr
    steps = ctx.win.steps or ()
    if not steps:
        return HostBreakdown(), []
    comm = ctx.clipped_union(ctx.comm_host_mask)
    data = ctx.dataloader
    opt = ctx.clipped_union(ctx.optimizer_mask)
    main = ctx.host & (tr.tid == ctx.main_tid) & tr.mask(Cat.CPU_OP, Cat.USER_ANNOTATION)
    main &= ~tr.name_mask(lambda n: n.startswith("ProfilerStep#"))
    bwd = backward_passes(ctx, main)
    fwd_all = ctx.clipped_union(main)
    closures = closure_forwards(ctx, bwd, ctx.clipped_union(main & tr.mask(Cat.CPU_OP)))
    rows: list[dict[str, float]] = []
    for s in steps:
        remaining = (np.array([s.start], np.int64), np.array([s.end], np.int64))
        row: dict[str, float] = {}
        for phase, cover in (("comm", comm), ("data", data), ("backward", bwd), ("forward", closures),
                             ("optimizer", opt), ("forward", fwd_all)):
            got = iv.total(iv.intersect(remaining, cover))
            remaining = iv.subtract(remaining, cover)
            row[phase] = row.get(phase, 0.0) + got / 1e6
        row["other"] = iv.total(remaining) / 1e6
        rows.append({p: round(row[p], 4) for p in HOST_PHASES})
    med = {p: round(float(np.median([r[p] for r in rows])), 4) for p in HOST_PHASES}
    wdur = ctx.win.dur
    share = {p: pct(sum(r[p] for r in rows) * 1e6, wdur) or 0.0 for p in HOST_PHASES}
    top = top_by_name(ctx, np.flatnonzero(main & ctx.in_window), (np.array([ctx.win.start]),
                      np.array([ctx.win.end])), n=8)
    return HostBreakdown(phases_ms=med, phases_pct=share, top_ops=top), rows


def comm_ops(ctx: Context) -> list[NamedTime]:
    """Host-side collective calls (nccl:*, gloo:*, c10d::*) in the window, by name and total time."""
    idx = np.flatnonzero(ctx.comm_host_mask & ctx.in_window)
    whole = (np.array([ctx.win.start]), np.array([ctx.win.end]))
    return top_by_name(ctx, idx, whole, n=8)
