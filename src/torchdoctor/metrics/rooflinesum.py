"""Kernel kinds against the device's roofs over the window, and the step's MFU.

Rows (time-weighted over every invocation in the window whose work is known, metrics/work.py):

- GEMM and convolution kernels, one row per precision (roofline.precision): pct_of_peak =
  100 × Σ FLOPs / Σ durations / the dense peak of that precision. This equals the mean of the
  per-invocation % of peak weighted by each invocation's duration.
- Elementwise and reduction kernels: pct_of_bandwidth = 100 × Σ bytes / Σ durations / the
  device's memory bandwidth (bytes as metrics/opwork.py counts them: a lower bound on traffic).
- ns is the device time of all kernels of the row's kind (and precision: kernels whose precision is
  unknown count in the kind's row without one); known_ns the part with known work. A row is kept
  when any work is known.

MFU (model FLOPs utilisation) = 100 × the FLOPs of the GEMM and convolution kernels that ran in the
window / the window's duration / the dense peak of the precision that did most of those FLOPs.
Those are the FLOPs of the ops that ran (recomputation counts; attention, elementwise and unknown
kernels do not), so with work unknown for part of the GEMM/conv/attention time MFU is a lower
bound, and the note says which share was counted. flops_per_step and step_ns divide by the
window's steps. None without known FLOPs or a matched device (mfu_note says why).
"""

from __future__ import annotations

import numpy as np

from ..hardware.devices import Identification
from ..trace.model import Cat
from .classify import KERNEL_KIND_LABELS, KernelKind
from .context import Context
from .model import Roofline, RooflineRow
from .roofline import kernel_precisions
from .work import KernelWork

COMPUTE_KINDS = (KernelKind.GEMM, KernelKind.CONV)
MEMORY_KINDS = (KernelKind.ELEMENTWISE, KernelKind.REDUCTION)


def roofline_summary(ctx: Context, work: KernelWork, dev: Identification) -> Roofline | None:
    """Per-kind rows and MFU over the window (module docstring)."""
    tr = ctx.tr
    k = np.flatnonzero(tr.mask(Cat.KERNEL) & ctx.in_window)
    device = dev.device
    out = Roofline(device_key=device.key if device else None, device_note=dev.reason)
    if device is not None:
        out.peak_tflops, out.mem_bw_gbs = dict(device.dense_tflops), device.mem_bw_gbs
    if k.size == 0:
        out.mfu_note = "no kernels in the window: no roofline"
        return out
    dur = (tr.end[k] - tr.ts[k]).astype(np.float64)
    kinds = ctx.kind[k]
    prec = kernel_precisions(tr.names, tr.name, work, k)
    for kind in COMPUTE_KINDS:
        sel = kinds == kind
        for p in sorted(set(prec[sel].tolist())):
            row = _row(kind, p, sel & (prec == p), work.flops[k], dur)
            if row is not None:
                _judge_compute(row, dev)
                out.rows.append(row)
    for kind in MEMORY_KINDS:
        row = _row(kind, "", kinds == kind, work.nbytes[k], dur)
        if row is not None:
            if device is not None and device.mem_bw_gbs and row.achieved_gbps is not None:
                row.pct_of_bandwidth = round(100.0 * row.achieved_gbps / device.mem_bw_gbs, 2)
            out.rows.append(row)
    _mfu(out, ctx, work, k, kinds, prec, dur, dev)
    return out


def _row(kind: KernelKind, p: str, sel: np.ndarray, amount: np.ndarray, dur: np.ndarray) -> RooflineRow | None:
    known = sel & np.isfinite(amount)
    if not known.any():
        return None
    ns = float(dur[known].sum())
    total = int(amount[known].sum())
    row = RooflineRow(kind=KERNEL_KIND_LABELS[kind], precision=p or None, ns=int(dur[sel].sum()), known_ns=int(ns))
    if kind in COMPUTE_KINDS:
        row.flops, row.achieved_tflops = total, round(total / ns / 1e3, 3) if ns > 0 else None
    else:
        row.bytes, row.achieved_gbps = total, round(total / ns, 2) if ns > 0 else None
    return row


def _judge_compute(row: RooflineRow, dev: Identification) -> None:
    peak = dev.device.peak_tflops(row.precision) if dev.device and row.precision else None
    if peak and row.achieved_tflops is not None:
        row.pct_of_peak = round(100.0 * row.achieved_tflops / peak, 2)


def _mfu(out: Roofline, ctx: Context, work: KernelWork, k: np.ndarray, kinds: np.ndarray, prec: np.ndarray,
         dur: np.ndarray, dev: Identification) -> None:
    f = work.flops[k]
    counted = np.isfinite(f)
    if not counted.any():
        out.mfu_note = "no GEMM/convolution FLOPs known (record_shapes off, or compiled kernels): no MFU"
        return
    by_prec: dict[str, float] = {}
    for p, x in zip(prec[counted].tolist(), f[counted].tolist(), strict=True):
        by_prec[p] = by_prec.get(p, 0.0) + x
    main = max(by_prec, key=by_prec.__getitem__)
    out.model_flops = int(f[counted].sum())
    steps = len(ctx.win.steps)
    if steps:
        out.flops_per_step = float(out.model_flops / steps)
        out.step_ns = ctx.win.dur / steps
    out.mfu_precision = main or None
    peak = dev.device.peak_tflops(main) if dev.device and main else None
    if dev.device is None:
        out.mfu_note = dev.reason
        return
    if peak is None or ctx.win.dur <= 0:
        out.mfu_note = f"no {main or 'known'} peak for {dev.device.label} in the device table: no MFU"
        return
    out.mfu_pct = round(100.0 * out.model_flops / ctx.win.dur / 1e3 / peak, 3)
    heavy = np.isin(kinds, [*COMPUTE_KINDS, KernelKind.ATTENTION])
    share = 100.0 * float(dur[heavy & counted].sum()) / float(dur[heavy].sum()) if heavy.any() else 100.0
    mixed = "; other precisions' FLOPs also counted against it" if len(by_prec) > 1 else ""
    out.mfu_note = (f"against the {main} dense peak ({peak:g} TFLOP/s){mixed}; FLOPs known for {share:.0f}% of "
                    "GEMM/convolution/attention kernel time" + ("" if share >= 99.5 else ": a lower bound"))
