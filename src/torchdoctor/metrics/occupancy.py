"""How well compute kernels fill the device's SMs, from Kineto's kernel launch args (HW-4).

Kineto writes, per kernel, `blocks per SM` = grid blocks / the device's SM count and `est.
achieved occupancy %` (CUDA occupancy calculator, capped by the blocks available). TensorBoard's
profiler plugin: "blocks per SM < 1 indicates the GPU multiprocessors are not fully utilized";
its "Est. SM Efficiency" is min(sum of concurrent kernels' blocks per SM, 1) integrated over
kernel time. We measure its complement on compute kernels: the SM-time they leave empty.

When the trace's deviceProperties lack `numSms`, Kineto writes -1 for `blocks per SM`; the
launch grid is then divided by the device table's SM count for the device the trace names
(`sm_count`). When deviceProperties' numSms disagrees with the table's figure for the named
device (a MIG slice, a partitioned or harvested part), the trace's count is the one the
process sees and is kept; SmFill.sms_source says which count was used and why.
"""

from __future__ import annotations

import numpy as np

from ..hardware.devices import identify
from ..trace.model import Cat
from .classify import KERNEL_KIND_LABELS, KernelKind
from .context import Context
from .model import KernelFill, SmFill


def sm_count(device_properties: list[dict]) -> tuple[int | None, str]:
    """(SM/CU count the fill is measured against, where it comes from) (module docstring)."""
    props = device_properties[0] if device_properties else {}
    trace_sms = props.get("numSms")
    trace_sms = trace_sms if isinstance(trace_sms, int) and not isinstance(trace_sms, bool) and trace_sms > 0 else None
    # The table entry the name (and the other properties) pick, numSms left out: what it should be.
    others = {k: v for k, v in props.items() if k != "numSms"}
    table = identify(str(props.get("name") or ""), others).device if props else None
    table_sms = table.sms if table is not None else None
    if trace_sms and table_sms and trace_sms != table_sms:
        return trace_sms, (f"deviceProperties numSms {trace_sms}, not the {table_sms} of the device table's "
                           f"{table.label} (a MIG slice or partitioned part?): the trace's count, which the "
                           "process sees, is used")
    if trace_sms:
        return trace_sms, "deviceProperties numSms" + (" (agrees with the device table)" if table_sms else "")
    if table_sms:
        return table_sms, f"the device table's {table.label} (deviceProperties lack numSms)"
    return None, "unknown: deviceProperties lack numSms and the device is not in the table"


def blocks_per_sm(ctx: Context, k: np.ndarray, sms: int | None) -> np.ndarray:
    """Kineto's `blocks per SM` of kernels `k`, else their grid blocks / `sms` (NaN when neither)."""
    blocks, _, _ = ctx.tr.launch_of(k)
    if sms:
        grid = ctx.tr.grid_of(k)
        blocks = np.where(np.isfinite(blocks), blocks, grid / np.float32(sms)).astype(np.float32)
    return blocks


def sm_fill(ctx: Context, simt: np.ndarray | None = None, top_n: int = 5) -> SmFill | None:
    """SM fill of the compute kernels in the window.

    Population: kernels (not communication: NCCL launches few blocks by design and waits for
    peers) with a known `blocks per SM`, clipped to the window. kernel_ns = their time;
    underfilled_ns = the time of those with blocks per SM < 1; sm_idle_ns = the integral over
    compute-kernel time of 1 - min(sum of blocks per SM of the kernels running, 1) (concurrent
    kernels on other streams fill each other's SMs, as TBP counts them); sm_efficiency_pct =
    100 x (1 - sm_idle / compute-kernel time); occupancy_pct = duration-weighted mean est. achieved
    occupancy. idle_by_kind / idle_fp32_simt_ns split sm_idle_ns in proportion to each kernel's own
    ns x (1 - min(blocks per SM, 1)); `simt` marks plain FP32 GEMM/conv kernels. Communication
    kernels are not in the population, but their blocks count in the sum while they run beside
    compute kernels (they hold those SMs). Blocks per SM:
    Kineto's, else grid blocks / `sm_count` (module docstring). None without any such kernel (no
    device, ROCm, or a trace without launch args).
    """
    tr, w = ctx.tr, ctx.win
    k = np.flatnonzero(tr.mask(Cat.KERNEL) & ctx.in_window & (ctx.kind != KernelKind.COMM))
    sms, source = sm_count(tr.device_properties)
    _, _, occupancy = tr.launch_of(k)
    blocks = blocks_per_sm(ctx, k, sms)
    s, e = np.maximum(tr.ts[k], w.start), np.minimum(tr.end[k], w.end)
    keep = (e > s) & np.isfinite(blocks)
    k, s, e = k[keep], s[keep], e[keep]
    if k.size == 0:
        return None
    dur = (e - s).astype(np.float64)
    b = blocks[keep].astype(np.float64)
    own_idle = dur * (1.0 - np.minimum(b, 1.0))

    # Communication kernels running beside compute hold SMs too (DeepEP's dispatch/combine keep
    # a set of SMs on purpose, and the GEMMs are sized for the rest): their blocks fill the level,
    # they are not counted as compute time.
    c = np.flatnonzero(tr.mask(Cat.KERNEL) & ctx.in_window & (ctx.kind == KernelKind.COMM))
    cb = blocks_per_sm(ctx, c, sms)
    cs, ce = np.maximum(tr.ts[c], w.start), np.minimum(tr.end[c], w.end)
    ckeep = (ce > cs) & np.isfinite(cb)
    cs, ce, cb = cs[ckeep], ce[ckeep], cb[ckeep].astype(np.float64)

    # Sweep: sum of blocks per SM (and of running compute kernels) between consecutive start/end points.
    t = np.concatenate([s, cs, e, ce])
    order = np.argsort(t, kind="stable")
    level = np.cumsum(np.concatenate([b, cb, -b, -cb])[order])
    ones, zeros = np.ones(k.size), np.zeros(cs.size)
    running = np.cumsum(np.concatenate([ones, zeros, -ones, zeros])[order])
    seg = np.diff(t[order]).astype(np.float64)
    on = running[:-1] > 0.5
    fill = np.clip(level[:-1], 0.0, 1.0)
    busy = float(seg[on].sum())
    idle = float((seg * (1.0 - fill))[on].sum())

    occ = occupancy[keep].astype(np.float64)
    known = np.isfinite(occ)
    out = SmFill(
        kernel_ns=int(dur.sum()), underfilled_ns=int(dur[b < 1.0].sum()), sm_idle_ns=int(round(idle)),
        sm_efficiency_pct=round(100.0 * (1.0 - idle / busy), 2) if busy else None,
        occupancy_pct=round(float((occ[known] * dur[known]).sum() / dur[known].sum()), 2)
        if known.any() and dur[known].sum() > 0 else None,
        sms=sms, sms_source=source,
    )
    total_own = float(own_idle.sum())
    scale = idle / total_own if total_own > 0 else 0.0
    kinds = ctx.kind[k]
    for kind in np.unique(kinds):
        part = float(own_idle[kinds == kind].sum()) * scale
        if part >= 1:
            out.idle_by_kind[KERNEL_KIND_LABELS[KernelKind(int(kind))]] = int(round(part))
    if simt is not None:
        out.idle_fp32_simt_ns = int(round(float(own_idle[simt[k]].sum()) * scale))
    out.top = _top(ctx, k, s, dur, b, occ, own_idle, top_n)
    return out


def _top(ctx: Context, k: np.ndarray, s: np.ndarray, dur: np.ndarray, b: np.ndarray, occ: np.ndarray,
         own_idle: np.ndarray, n: int) -> list[KernelFill]:
    """Kernel names ranked by the SM-time their launches left empty."""
    tr = ctx.tr
    names = tr.name[k]
    sums = np.bincount(names, weights=own_idle, minlength=len(tr.names))
    rows = []
    for nid in np.argsort(-sums)[:n]:
        if sums[nid] <= 0:
            break
        sel = names == nid
        d = dur[sel]
        o, known = occ[sel], np.isfinite(occ[sel])
        rows.append(KernelFill(
            name=tr.names[nid], kind=KERNEL_KIND_LABELS[KernelKind(int(ctx.kind[k[sel][0]]))],
            count=int(sel.sum()), ns=int(d.sum()),
            blocks_per_sm=round(float((b[sel] * d).sum() / d.sum()), 4),
            occupancy_pct=round(float((o[known] * d[known]).sum() / d[known].sum()), 1)
            if known.any() and d[known].sum() > 0 else None,
            idle_ns=int(round(float(sums[nid]))), first_ts_ns=int(tr.ts[k[sel]][np.argmax(d)]),
        ))
    return rows
