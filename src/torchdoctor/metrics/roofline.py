"""Roofline numbers for GEMM kernels: FLOPs from their ops' recorded shapes, achieved TFLOP/s, % of peak.

FLOPs of one GEMM op call = 2·M·N·K·batch (a multiply and an add per product term; `gemm_dims`
defines M, K, N; batch = product of the leading dims of the first matrix for bmm/baddbmm/
addbmm/matmul, 1 for mm/addmm; linear folds its leading dims into M). Bias adds and alpha/beta
scaling are left out (O(M·N), under 1% for K ≥ 100). The op's FLOPs go to the longest GEMM-kind
kernel it launched (launch calls on its thread inside its span, joined by correlation id): split-K
reductions and other helper kernels get none. A kernel launched by no GEMM op with shapes (no
`record_shapes`, a Triton/compiled GEMM, cuDNN) has unknown FLOPs, never zero.

Peak: the device table's dense peak (hardware/devices.toml) for the precision the kernel ran in:
bf16/fp16/fp8 by the op's `Input type`; fp32 ops on a tensor-core kernel (classify.math_path) ran
in TF32, else FP32.
"""

from __future__ import annotations

import math

import msgspec
import numpy as np

from ..hardware.devices import DeviceSpec
from ..trace.model import Cat
from .classify import KernelKind, MathPath, math_path
from .context import Context
from .gemm import MATRIX_INPUTS, gemm_dims, leaf_gemm_ops

# Kineto's `Input type` spellings -> the device table's precision keys.
PRECISION = {
    "float": "fp32", "c10::Half": "fp16", "Half": "fp16", "half": "fp16", "c10::BFloat16": "bf16",
    "BFloat16": "bf16", "bfloat16": "bf16", "double": "fp64", "c10::Float8_e4m3fn": "fp8",
    "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8", "c10::Float8_e5m2fnuz": "fp8",
}
BATCHED = frozenset({"aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::matmul"})
# A product past this is a corrupt shape, not a GEMM (1e21 FLOPs: hours on any device): dropped.
MAX_FLOPS = 10**21
_lists = msgspec.json.Decoder(list)


def gemm_flops(op: str, dims: list, types: list) -> tuple[int, str] | None:
    """(FLOPs, Kineto dtype) of one GEMM op call, None when its shapes are not a GEMM or absurd."""
    got = gemm_dims(op, dims, types)
    if got is None:
        return None
    dtype, d = got
    a = dims[MATRIX_INPUTS[op][0]]
    batch = math.prod(a[:-2]) if op in BATCHED else 1
    flops = 2 * d["M"] * d["N"] * d["K"] * batch
    return (flops, dtype) if 0 < flops <= MAX_FLOPS else None


def kernel_flops(ctx: Context) -> tuple[np.ndarray, dict[int, str]]:
    """(FLOPs per event, float64 with NaN where unknown; Kineto dtype by kernel event index)."""
    tr = ctx.tr
    flops = np.full(len(tr), np.nan)
    dtypes: dict[int, str] = {}
    ops = leaf_gemm_ops(ctx)
    sid = tr.shape_of(ops)
    ops, sid = ops[sid >= 0], sid[sid >= 0]
    if ops.size == 0:
        return flops, dtypes
    gemm_k = np.flatnonzero(tr.mask(Cat.KERNEL) & (ctx.kind == KernelKind.GEMM) & (tr.correlation >= 0))
    by_corr: dict[int, list[int]] = {}
    for k in gemm_k.tolist():
        by_corr.setdefault(int(tr.correlation[k]), []).append(k)
    calls = np.flatnonzero(tr.mask(Cat.RUNTIME, Cat.DRIVER) & (tr.correlation >= 0))
    cache: dict[tuple[int, int], tuple[int, str] | None] = {}
    for tid in np.unique(tr.tid[ops]):
        mine = calls[tr.tid[calls] == tid]
        mine = mine[np.argsort(tr.ts[mine], kind="stable")]
        for i, s in zip(ops[tr.tid[ops] == tid].tolist(), sid[tr.tid[ops] == tid].tolist(), strict=True):
            key = (int(tr.name[i]), s)
            if key not in cache:
                cache[key] = _decode(tr.names[key[0]], *tr.shapes[s])
            got = cache[key]
            if got is None:
                continue
            lo, hi = np.searchsorted(tr.ts[mine], [tr.ts[i], tr.end[i]], side="left")
            kern = [k for c in tr.correlation[mine[lo:hi]].tolist() for k in by_corr.get(int(c), ())]
            if kern:
                k = max(kern, key=lambda j: int(tr.end[j] - tr.ts[j]))
                flops[k] = got[0] if np.isnan(flops[k]) else flops[k] + got[0]
                dtypes[k] = got[1]
    return flops, dtypes


def precision(dtype: str, kernel_name: str) -> str | None:
    """The device table's precision key for a GEMM of this dtype run by this kernel."""
    p = PRECISION.get(dtype)
    if p == "fp32" and math_path(kernel_name) == MathPath.TENSOR_CORE:
        return "tf32"
    return p


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


def _scope(device: DeviceSpec) -> str:
    return f" ({device.scope})" if device.scope else ""


def _decode(op: str, dims_json: bytes, types_json: bytes) -> tuple[int, str] | None:
    try:
        dims, types = _lists.decode(dims_json), _lists.decode(types_json) if types_json else []
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return gemm_flops(op, dims, types)
