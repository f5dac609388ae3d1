"""Kernel breakdown: time per kind, top kernels with per-invocation statistics, memcpy by kind."""

from __future__ import annotations

import numpy as np

from ..hardware.devices import Identification, from_trace_properties
from ..trace.model import Cat
from . import intervals as iv
from .classify import KERNEL_KIND_LABELS, KernelKind, memcpy_kind
from .context import Context
from .device import lookup, pct
from .gemm import launch_calls
from .model import KernelBreakdown, KernelStat, KindTime, MemcpyRow
from .roofline import fill_stat
from .work import KernelWork, kernel_work


def kernel_breakdown(ctx: Context, top_n: int = 15, dev: Identification | None = None,
                     work: KernelWork | None = None) -> KernelBreakdown:
    """Device work in the window, by kind and by kernel.

    by_kind: per KernelKind, the union of its intervals (overlap within a kind is not double
    counted) and its share of device busy time; kinds may overlap each other (comm under compute).
    top: kernels ranked by total time, with count and mean/min/max/std computed over single
    invocations — unlike HTA, whose stats collapse to per-kernel totals past `num_kernels` names.
    memcpy: copies by direction and host memory kind (pageable copies cannot be asynchronous),
    with bytes / ns as achieved_gbps.
    Top kernels also carry roofline numbers (metrics/roofline.py) against the device that the
    trace's deviceProperties match in the device table (hardware/devices.py), if any; `dev` and
    `work` (metrics/work.py) are computed here when not given.
    """
    tr = ctx.tr
    m = ctx.device_work & ctx.in_window
    idx = np.flatnonzero(m)
    dev = dev or from_trace_properties(tr.device_properties)
    if idx.size == 0:
        # Still say which device the roofs would come from, and why there is no roofline.
        note = "; ".join(x for x in (dev.reason, "no kernels in the window: no roofline") if x)
        return KernelBreakdown(device_key=dev.device.key if dev.device else None, device_note=note)
    busy = iv.total(ctx.busy)
    kinds = ctx.kind[idx]
    by_kind = []
    for k in KernelKind:
        sel = idx[kinds == k]
        if sel.size == 0:
            continue
        t = iv.total(iv.clip(iv.union(tr.ts[sel], tr.end[sel]), ctx.win.start, ctx.win.end))
        by_kind.append(KindTime(KERNEL_KIND_LABELS[k], t, int(sel.size), pct(t, busy) or 0.0))
    by_kind.sort(key=lambda r: -r.ns)

    kern = idx[tr.cat[idx] == Cat.KERNEL]
    if work is None and kern.size:
        work = kernel_work(ctx)
    top: list[KernelStat] = []
    distinct = 0
    if kern.size:
        names = tr.name[kern]
        dur = (tr.end[kern] - tr.ts[kern]).astype(np.float64)
        order = np.argsort(names, kind="stable")
        names, dur = names[order], dur[order]
        bounds = np.flatnonzero(np.concatenate([[True], names[1:] != names[:-1]]))
        distinct = int(bounds.size)
        counts = np.diff(np.append(bounds, names.size))
        sums = np.add.reduceat(dur, bounds)
        sq = np.add.reduceat(dur * dur, bounds)
        mins = np.minimum.reduceat(dur, bounds)
        maxs = np.maximum.reduceat(dur, bounds)
        means = sums / counts
        stds = np.sqrt(np.maximum(sq / counts - means * means, 0.0))
        for j in np.argsort(-sums)[:top_n]:
            nid = int(names[bounds[j]])
            top.append(KernelStat(
                name=tr.names[nid], kind=KERNEL_KIND_LABELS[KernelKind(int(ctx.kind[kern[order][bounds[j]]]))],
                count=int(counts[j]), total_ns=int(sums[j]), mean_ns=round(float(means[j]), 1),
                min_ns=int(mins[j]), max_ns=int(maxs[j]), std_ns=round(float(stds[j]), 1),
            ))
            members = kern[order][bounds[j]:bounds[j] + counts[j]]
            if work is not None:
                fill_stat(top[-1], ctx, members, work, dev)

    cp = idx[tr.cat[idx] == Cat.MEMCPY]
    rows: dict[tuple[str, str], list[int]] = {}
    for nid in np.unique(tr.name[cp]):
        key = memcpy_kind(tr.names[nid])
        sel = cp[tr.name[cp] == nid]
        acc = rows.setdefault(key, [0, 0, 0])
        acc[0] += int(sel.size)
        acc[1] += int((tr.end[sel] - tr.ts[sel]).sum())
        acc[2] += int(np.clip(tr.nbytes[sel], 0, None).sum())
    memcpy = [MemcpyRow(d, h, c, ns, b, round(b / ns, 2) if ns > 0 else None)
              for (d, h), (c, ns, b) in sorted(rows.items(), key=lambda r: -r[1][1])]
    return KernelBreakdown(by_kind=by_kind, eager_fusable=eager_fusable(ctx, idx), top=top, memcpy=memcpy,
                           distinct_kernels=distinct, device_key=dev.device.key if dev.device else None,
                           device_note=dev.reason)


FUSABLE = (KernelKind.ELEMENTWISE, KernelKind.REDUCTION)
# How far back among a thread's earlier ops the search for a launch's enclosing op goes.
MAX_WALK = 64


def eager_fusable(ctx: Context, idx: np.ndarray) -> KindTime | None:
    """Pointwise/reduction kernels (of the window's device work `idx`) that ATen ops launched.

    A kernel counts when the innermost cpu_op holding its launch call (same thread, joined by
    correlation id) is an `aten::` op: Inductor lowers and fuses those. Kernels a custom
    extension launches from its own autograd Function or a user annotation (hand-fused casts,
    layer norms, rotary embeddings in DeepSeek's published H800 trace) are left out: compiling
    the model does not fuse them. `ns` is the union of their intervals in the window, `count`
    their number, `pct_of_busy` their share of device busy time. None when no kernel can be joined
    to its launch call (no correlation ids): callers then fall back to the kinds' totals.
    """
    tr = ctx.tr
    k = idx[(tr.cat[idx] == Cat.KERNEL) & np.isin(ctx.kind[idx], FUSABLE) & (tr.correlation[idx] >= 0)]
    calls = launch_calls(ctx)
    if calls.size == 0 or not (tr.correlation[idx[tr.cat[idx] == Cat.KERNEL]] >= 0).any():
        return None
    by_corr = calls[np.argsort(tr.correlation[calls], kind="stable")]
    call = lookup(tr.correlation[by_corr], by_corr, tr.correlation[k])
    joined = call >= 0
    k, call = k[joined], call[joined]
    aten = np.zeros(k.size, bool)
    ops = np.flatnonzero(tr.mask(Cat.CPU_OP) & ctx.host)
    for tid in np.unique(tr.tid[call]).tolist():
        sel = np.flatnonzero(tr.tid[call] == tid)
        own = ops[tr.tid[ops] == tid]
        if own.size == 0:
            continue
        own = own[np.lexsort((-tr.end[own], tr.ts[own]))]  # a parent before a child that starts with it
        ts, ends = tr.ts[own], tr.end[own]
        t0 = tr.ts[call[sel]]
        j = np.searchsorted(ts, t0, side="right") - 1
        found = np.full(sel.size, -1, np.int64)
        todo = np.arange(sel.size)
        # The latest-starting op that still holds the call's start is the innermost (ops nest);
        # walk back over earlier ops that ended before it, a bounded number of steps. The start,
        # not the whole call: CUPTI's runtime clock and the op's may differ by a few µs at the end.
        for _ in range(MAX_WALK):
            todo = todo[j[todo] >= 0]
            if todo.size == 0:
                break
            holds = ends[j[todo]] > t0[todo]
            found[todo[holds]] = j[todo[holds]]
            todo = todo[~holds]
            j[todo] -= 1
        ok = found >= 0
        names = tr.name[own[found[ok]]]
        aten[sel[ok]] = _aten_names(tr, names)
    k = k[aten]
    t = iv.total(iv.clip(iv.union(tr.ts[k], tr.end[k]), ctx.win.start, ctx.win.end)) if k.size else 0
    return KindTime("eager_fusable", int(t), int(k.size), pct(t, iv.total(ctx.busy)) or 0.0)


def _aten_names(tr, names: np.ndarray) -> np.ndarray:
    """Which interned op names are ATen's (`aten::...`)."""
    uniq, inv = np.unique(names, return_inverse=True)
    is_aten = np.array([tr.names[int(n)].startswith("aten::") for n in uniq], bool)
    return is_aten[inv] if uniq.size else np.zeros(0, bool)
