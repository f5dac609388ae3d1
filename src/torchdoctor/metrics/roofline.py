"""Roofline numbers of the top kernels: achieved FLOP/s and bytes/s, intensity, % of peak, the bound.

Work per invocation comes from metrics/work.py (FLOPs and bytes of the op that launched it,
metrics/opwork.py defines them). Over the invocations of one kernel name whose work is known:

- achieved_tflops = Σ FLOPs / Σ their durations; pct_of_peak = 100 × that / the device table's
  dense peak for the precision run: bf16/fp16/fp8/fp64 by the op's `Input type`; fp32 ops on a
  tensor-core kernel (classify.math_path) ran in TF32, else FP32.
- achieved_gbps = Σ bytes / Σ their durations (1e9 bytes/s); pct_of_bandwidth = 100 × that /
  the device's DRAM/HBM bandwidth. Bytes are the op's minimum traffic (each operand once), so
  this is a lower bound on the DRAM traffic and can exceed 100% only by cache reuse.
- intensity = Σ FLOPs / Σ bytes over invocations with both known (FLOP per byte).
- bound: "compute" when the intensity is at or above the device's ridge point (peak FLOP/s /
  peak bytes/s for that precision), else "memory"; elementwise and reduction kernels with known
  bytes are "memory": they do O(1) FLOPs per element moved (≤ ~1 FLOP/byte), under every ridge
  in the table (the lowest, V100 FP32, is 17 FLOP/byte). None when neither applies.
"""

from __future__ import annotations

import numpy as np

from ..hardware.devices import DeviceSpec, Identification
from .classify import MathPath, math_path, name_precision
from .context import Context
from .model import KernelStat
from .occupancy import blocks_per_sm, sm_count
from .work import KernelWork

# Kineto's `Input type` spellings -> the device table's precision keys.
PRECISION = {
    "float": "fp32", "c10::Half": "fp16", "Half": "fp16", "half": "fp16", "c10::BFloat16": "bf16",
    "BFloat16": "bf16", "bfloat16": "bf16", "double": "fp64", "c10::Float8_e4m3fn": "fp8",
    "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8", "c10::Float8_e5m2fnuz": "fp8",
}
MEMORY_KINDS = ("elementwise", "reduction")
# Below this fill a kernel's grid leaves SMs empty for its whole run (Kineto's `blocks per SM`).
TINY_GRID = 1.0


def precision(dtype: str, kernel_name: str) -> str | None:
    """The device table's precision key for a GEMM/conv of this dtype run by this kernel; without
    the op's dtype (record_shapes off, a custom op), what the kernel's name spells, if it does."""
    p = PRECISION.get(dtype)
    if p is None:
        return name_precision(kernel_name)
    if p == "fp32" and math_path(kernel_name) == MathPath.TENSOR_CORE:
        return "tf32"
    return p


def kernel_precisions(names: list[str], name_ids: np.ndarray, work: KernelWork, k: np.ndarray) -> np.ndarray:
    """`precision` of each kernel event `k` ("" where unknown), as an object array: evaluated once per
    distinct (dtype, kernel name), a handful, not once per kernel."""
    width = len(names) + 1
    pair = work.dtype_id[k].astype(np.int64) * width + name_ids[k]
    pairs, inv = np.unique(pair, return_inverse=True)
    return np.array([precision(work.strings[int(x) // width] if x >= 0 else "", names[int(x) % width]) or ""
                     for x in pairs.tolist()], object)[inv]


def roofline(flops: float, ns: int, dtype: str, kernel_name: str,
             device: DeviceSpec | None, unknown_device: str) -> tuple[float | None, float | None, str]:
    """(achieved TFLOP/s, % of the device's dense peak, note) for `flops` done in `ns` of kernel time."""
    if ns <= 0:
        return None, None, "no kernel time"
    achieved = flops / ns / 1e3  # FLOP per ns = GFLOP/s
    prec = precision(dtype, kernel_name)
    if device is None:
        return achieved, None, unknown_device
    peak = device.peak_tflops(prec) if prec else None
    if peak is None:
        return achieved, None, f"no {prec or dtype} peak for {device.label} in the device table"
    return achieved, 100.0 * achieved / peak, f"{prec} dense peak of {device.label}{_scope(device)}: {peak:g} TFLOP/s"


def bandwidth_note(device: DeviceSpec) -> str:
    return f"memory bandwidth of {device.label}{_scope(device)}: {device.mem_bw_gbs:g} GB/s"


def fill_stat(stat: KernelStat, ctx: Context, members: np.ndarray, work: KernelWork, dev: Identification) -> None:
    """The roofline fields of one top kernel over its invocations `members` (module docstring)."""
    tr = ctx.tr
    dur = (tr.end[members] - tr.ts[members]).astype(np.int64)
    f, b = work.flops[members], work.nbytes[members]
    fk, bk = np.isfinite(f), np.isfinite(b)
    notes: list[str] = []
    if not (fk.any() or bk.any()):
        why = next((work.why(k) for k in members.tolist() if work.why_id[k] >= 0), "")
        stat.roofline = why or _unknown_reason(stat.kind)
        _grid_note(stat, ctx, members, [])
        return
    dtype = next((work.dtype(k) for k in members[fk | bk].tolist() if work.dtype_id[k] >= 0), "")
    device = dev.device
    if fk.any():
        stat.flops = int(f[fk].sum())
        achieved, pct, note = roofline(stat.flops, int(dur[fk].sum()), dtype, stat.name, device, dev.reason)
        stat.achieved_tflops = _r(achieved, 3)
        stat.pct_of_peak = _r(pct, 2)
        notes.append(note)
        if fk.sum() < members.size:
            notes.append(f"{int(fk.sum())} of {members.size} invocations with known FLOPs")
    else:
        notes.append("FLOPs not counted for this kind" if stat.kind not in ("gemm", "conv") else "FLOPs unknown")
    if bk.any():
        stat.bytes = int(b[bk].sum())
        ns = int(dur[bk].sum())
        stat.achieved_gbps = _r(stat.bytes / ns if ns > 0 else None, 2)
        if device is not None and device.mem_bw_gbs and stat.achieved_gbps is not None:
            stat.pct_of_bandwidth = _r(100.0 * stat.achieved_gbps / device.mem_bw_gbs, 2)
            notes.append(bandwidth_note(device))
        elif device is None and not fk.any():
            notes.append(dev.reason)
    both = fk & bk
    if both.any() and b[both].sum() > 0:
        stat.intensity = _r(float(f[both].sum() / b[both].sum()), 2)
    stat.bound = bound(stat, dtype, device)
    _grid_note(stat, ctx, members, notes)
    stat.roofline = "; ".join(n for n in notes if n)


def bound(stat: KernelStat, dtype: str, device: DeviceSpec | None) -> str | None:
    """"compute" / "memory" / None (module docstring)."""
    if stat.intensity is not None and device is not None:
        prec = precision(dtype, stat.name)
        ridge = device.ridge_flop_per_byte(prec) if prec else None
        if ridge is not None:
            return "compute" if stat.intensity >= ridge else "memory"
    if stat.kind in MEMORY_KINDS and stat.bytes is not None:
        return "memory"
    return None


def _grid_note(stat: KernelStat, ctx: Context, members: np.ndarray, notes: list[str]) -> None:
    """Say when the grid is smaller than the device (blocks per SM < 1): SMs sit empty, so the
    kernel cannot reach its roof whatever its efficiency per SM."""
    blocks = blocks_per_sm(ctx, members, sm_count(ctx.tr.device_properties)[0])
    dur = (ctx.tr.end[members] - ctx.tr.ts[members]).astype(np.float64)
    ok = np.isfinite(blocks) & (dur > 0)
    if not ok.any():
        return
    b = float((blocks[ok] * dur[ok]).sum() / dur[ok].sum())
    if b < TINY_GRID:
        low = any(p is not None and p < 50 for p in (stat.pct_of_peak, stat.pct_of_bandwidth))
        text = (f"tiny grid: {b:.2f} blocks per SM leaves {100 * (1 - b):.0f}% of the SMs empty"
                + (", which caps it at a low % of peak" if low else ""))
        if notes:
            notes.append(text)
        else:
            stat.roofline = f"{stat.roofline}; {text}" if stat.roofline else text


def _unknown_reason(kind: str) -> str:
    if kind == "comm":
        return "communication kernel: its traffic is the collective's (see collectives), no roofline"
    if kind in ("gemm", "conv"):
        return "no GEMM/convolution op with recorded shapes launched it (record_shapes off, or a Triton/compiled kernel)"
    return "no op with recorded shapes launched it alone (record_shapes off, compiled code, or a library call)"


def _scope(device: DeviceSpec) -> str:
    return f" ({device.scope})" if device.scope else ""


def _r(x: float | None, nd: int) -> float | None:
    return None if x is None else round(x, nd)
