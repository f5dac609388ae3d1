"""Kernel breakdown: time per kind, top kernels with per-invocation statistics, memcpy by kind."""

from __future__ import annotations

import numpy as np

from ..hardware.devices import Identification, from_trace_properties
from ..trace.model import Cat
from . import intervals as iv
from .classify import KERNEL_KIND_LABELS, KernelKind, memcpy_kind
from .context import Context
from .device import pct
from .model import KernelBreakdown, KernelStat, KindTime, MemcpyRow
from .roofline import kernel_flops, roofline


def kernel_breakdown(ctx: Context, top_n: int = 15) -> KernelBreakdown:
    """Device work in the window, by kind and by kernel.

    by_kind: per KernelKind, the union of its intervals (overlap within a kind is not double
    counted) and its share of device busy time; kinds may overlap each other (comm under compute).
    top: kernels ranked by total time, with count and mean/min/max/std computed over single
    invocations — unlike HTA, whose stats collapse to per-kernel totals past `num_kernels` names.
    memcpy: copies by direction and host memory kind (pageable copies cannot be asynchronous).
    Top kernels also carry roofline numbers (metrics/roofline.py) against the device that the
    trace's deviceProperties match in the device table (hardware/devices.py), if any.
    """
    tr = ctx.tr
    m = ctx.device_work & ctx.in_window
    idx = np.flatnonzero(m)
    if idx.size == 0:
        return KernelBreakdown()
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
    dev = from_trace_properties(tr.device_properties)
    flops, dtypes = kernel_flops(ctx) if kern.size else (None, {})
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
            _add_roofline(top[-1], ctx, members, flops, dtypes, dev)

    cp = idx[tr.cat[idx] == Cat.MEMCPY]
    rows: dict[tuple[str, str], list[int]] = {}
    for nid in np.unique(tr.name[cp]):
        key = memcpy_kind(tr.names[nid])
        sel = cp[tr.name[cp] == nid]
        acc = rows.setdefault(key, [0, 0, 0])
        acc[0] += int(sel.size)
        acc[1] += int((tr.end[sel] - tr.ts[sel]).sum())
        acc[2] += int(np.clip(tr.nbytes[sel], 0, None).sum())
    memcpy = [MemcpyRow(d, h, c, ns, b) for (d, h), (c, ns, b) in sorted(rows.items(), key=lambda r: -r[1][1])]
    return KernelBreakdown(by_kind=by_kind, top=top, memcpy=memcpy, distinct_kernels=distinct,
                           device_key=dev.device.key if dev.device else None, device_note=dev.reason)


def _add_roofline(stat: KernelStat, ctx: Context, members: np.ndarray, flops: np.ndarray | None,
                  dtypes: dict[int, str], dev: Identification) -> None:
    """FLOPs, achieved TFLOP/s and % of peak over the invocations whose FLOPs are known."""
    if stat.kind != "gemm":
        stat.roofline = "FLOPs counted for GEMM kernels only"
        return
    known = members[~np.isnan(flops[members])] if flops is not None else members[:0]
    if known.size == 0:
        stat.roofline = "no GEMM op with recorded shapes launched it (record_shapes off, or a Triton/compiled GEMM)"
        return
    tr = ctx.tr
    stat.flops = int(flops[known].sum())
    ns = int((tr.end[known] - tr.ts[known]).sum())
    achieved, pct, stat.roofline = roofline(stat.flops, ns, dtypes[int(known[0])], stat.name, dev.device,
                                            dev.reason)
    stat.achieved_tflops = None if achieved is None else round(achieved, 3)
    stat.pct_of_peak = None if pct is None else round(pct, 2)
    if known.size < members.size:
        stat.roofline += f"; {known.size} of {members.size} invocations with known FLOPs"
