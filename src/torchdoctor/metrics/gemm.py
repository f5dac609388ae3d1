"""GEMM shapes from `record_shapes=True`: half-precision matmuls that tensor cores cannot tile well (HW-2).

Tensor-core GEMM kernels read and write their matrices in 16-byte vectors: 8 fp16/bf16 values.
A dimension that is not a multiple of 8 makes cuBLAS fall back to narrower loads or, on older
versions (cuBLAS < 11), to non-tensor-core kernels (NVIDIA: "set sizes to multiples of 8";
torch.profiler's MatMulDimInFP16Pattern flags exactly these ops).
"""

from __future__ import annotations

import math

import msgspec
import numpy as np

from ..trace.model import Cat
from .context import Context
from .device import lookup
from .model import GemmSite, MisalignedGemms

ALIGN = 8
# Kineto's `Input type` spellings of fp16 / bf16 tensors.
HALF_TYPES = frozenset({"c10::Half", "c10::BFloat16", "Half", "BFloat16", "half", "bfloat16"})
# The two matrix inputs of each GEMM op (the others are bias/self and the alpha/beta scalars).
MATRIX_INPUTS: dict[str, tuple[int, int]] = {
    "aten::mm": (0, 1), "aten::bmm": (0, 1), "aten::matmul": (0, 1), "aten::linear": (0, 1),
    "aten::addmm": (1, 2), "aten::baddbmm": (1, 2), "aten::addbmm": (1, 2),
}
_lists = msgspec.json.Decoder(list)


def gemm_dims(op: str, dims: list, types: list) -> tuple[str, dict[str, int]] | None:
    """(dtype of the matrices, {"M", "K", "N"}) of one GEMM op call, None when the shapes are not a GEMM.

    mm/addmm/bmm/baddbmm/addbmm/matmul: A[..., M, K] @ B[..., K, N] (the last two dims of the two
    matrix inputs). linear(x[..., K], W[N, K]): M is the product of x's leading dims (the rows
    of the GEMM it runs). A 1-D operand (a matrix-vector product) is not a tensor-core GEMM.
    """
    a_i, b_i = MATRIX_INPUTS[op]
    if len(dims) <= b_i or len(types) <= a_i:
        return None
    a, b = dims[a_i], dims[b_i]
    if not (isinstance(a, list) and isinstance(b, list)) or len(a) < 2 or len(b) < 2:
        return None
    if not all(isinstance(x, int) for x in a + b):
        return None
    if op == "aten::linear":
        m, k, n = math.prod(a[:-1]), a[-1], b[0]
    else:
        m, k, n = a[-2], a[-1], b[-1]
    return str(types[a_i]), {"M": int(m), "K": int(k), "N": int(n)}


def leaf_gemm_ops(ctx: Context) -> np.ndarray:
    """GEMM ops (MATRIX_INPUTS names) in the window that call no other GEMM op, on their thread.

    aten::linear runs aten::addmm (or aten::matmul -> aten::mm) nested inside it on the same
    thread: counting only the innermost op counts every GEMM once.
    """
    tr = ctx.tr
    return innermost(ctx, np.flatnonzero(tr.mask(Cat.CPU_OP) & ctx.in_window & tr.name_mask(MATRIX_INPUTS.__contains__)))


def innermost(ctx: Context, ops: np.ndarray) -> np.ndarray:
    """The ops of `ops` that hold no other op of `ops` on their thread (sorted indices)."""
    tr = ctx.tr
    if ops.size < 2:
        return ops
    # By thread, start, and longest first: a parent comes right before the first op it calls.
    o = ops[np.lexsort((-tr.end[ops], tr.ts[ops], tr.tid[ops]))]
    parent = np.zeros(o.size, bool)
    nxt, cur = o[1:], o[:-1]
    parent[:-1] = (tr.tid[nxt] == tr.tid[cur]) & (tr.ts[nxt] < tr.end[cur]) & (tr.end[nxt] <= tr.end[cur])
    return np.sort(o[~parent])


def launch_calls(ctx: Context) -> np.ndarray:
    """The trace's launch calls (runtime/driver events with a correlation id), sorted by thread, then start."""
    tr = ctx.tr
    calls = np.flatnonzero(tr.mask(Cat.RUNTIME, Cat.DRIVER) & (tr.correlation >= 0))
    return calls[np.lexsort((tr.ts[calls], tr.tid[calls]))]


def call_ranges(ctx: Context, ops: np.ndarray, calls: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each op, the run [lo, hi) of `calls` (`launch_calls`) on its thread inside its span."""
    tr = ctx.tr
    lo = np.zeros(ops.size, np.int64)
    hi = np.zeros(ops.size, np.int64)
    for tid in np.unique(tr.tid[ops]).tolist():
        a, b = np.searchsorted(tr.tid[calls], [tid, tid + 1])
        sel = tr.tid[ops] == tid
        lo[sel] = a + np.searchsorted(tr.ts[calls[a:b]], tr.ts[ops[sel]], side="left")
        hi[sel] = a + np.searchsorted(tr.ts[calls[a:b]], tr.end[ops[sel]], side="right")
    return lo, hi


def launched_kernel_ns(ctx: Context, ops: np.ndarray) -> np.ndarray:
    """Device time of the kernels each op launched: launch calls on the op's thread inside its span,
    joined to their kernels by correlation id (all kernels of a correlation id, summed)."""
    tr = ctx.tr
    out = np.zeros(ops.size, np.int64)
    k = np.flatnonzero(tr.mask(Cat.KERNEL) & (tr.correlation >= 0))
    calls = launch_calls(ctx)
    if k.size == 0 or calls.size == 0 or ops.size == 0:
        return out
    corr, inv = np.unique(tr.correlation[k], return_inverse=True)
    per_corr = np.bincount(inv, weights=(tr.end[k] - tr.ts[k]).astype(np.float64))
    csum = np.concatenate([[0.0], np.cumsum(lookup(corr, per_corr, tr.correlation[calls], missing=0))])
    lo, hi = call_ranges(ctx, ops, calls)
    return np.rint(csum[hi] - csum[lo]).astype(np.int64)


def misaligned_gemms(ctx: Context, top_n: int = 8) -> MisalignedGemms | None:
    """fp16/bf16 GEMM ops whose M, K or N is not a multiple of ALIGN (8).

    Population: leaf GEMM ops (`leaf_gemm_ops`) in the window with recorded shapes whose matrix
    inputs are fp16 or bf16 (`Input type`); fp32 GEMMs are HW-1's. count = such ops with any of
    M, K, N not a multiple of 8; device_ns = the device time of the kernels they launched
    (`launched_kernel_ns`); host_ns = the ops' own duration. When none of them can be joined to a
    kernel (no correlation in the trace), time_source is "host". Sites group the ops by (op,
    shapes), largest time first. None when no GEMM op in the window has recorded shapes.
    """
    tr = ctx.tr
    leaves = leaf_gemm_ops(ctx)
    shape = tr.shape_of(leaves)
    leaves, shape = leaves[shape >= 0], shape[shape >= 0]
    if leaves.size == 0:
        return None
    info: dict[tuple[int, int], tuple[str, dict[str, int], list[str]] | None] = {}
    half = np.zeros(leaves.size, bool)
    bad = np.zeros(leaves.size, bool)
    for j, (i, sid) in enumerate(zip(leaves.tolist(), shape.tolist(), strict=True)):
        key = (int(tr.name[i]), sid)
        if key not in info:
            info[key] = _classify(tr.names[key[0]], *tr.shapes[key[1]][:2])
        got = info[key]
        if got is not None:
            half[j] = True
            bad[j] = bool(got[2])
    out = MisalignedGemms(half_gemms=int(half.sum()))
    ops, op_shape = leaves[bad], shape[bad]
    if ops.size == 0:
        return out
    dev = launched_kernel_ns(ctx, ops)
    host = tr.end[ops] - tr.ts[ops]
    out.count, out.device_ns, out.host_ns = int(ops.size), int(dev.sum()), int(host.sum())
    if out.device_ns == 0:
        out.time_source = "host"
    weight = dev if out.device_ns else host
    groups: dict[tuple[int, int], list[int]] = {}
    for j, (i, sid) in enumerate(zip(ops.tolist(), op_shape.tolist(), strict=True)):
        groups.setdefault((int(tr.name[i]), sid), []).append(j)
    sites = []
    for (nid, sid), members in groups.items():
        m = np.array(members)
        dtype, dims, misaligned = info[(nid, sid)]  # type: ignore[misc]
        longest = int(ops[m][np.argmax(weight[m])])
        sites.append(GemmSite(
            op=tr.names[nid], dtype=dtype, shapes=tr.shapes[sid][0].decode(errors="replace"), dims=dims,
            misaligned=misaligned, count=int(m.size), device_ns=int(dev[m].sum()), host_ns=int(host[m].sum()),
            first_ts_ns=int(tr.ts[longest]),
        ))
    sites.sort(key=lambda s: -(s.device_ns if out.device_ns else s.host_ns))
    out.sites = sites[:top_n]
    return out


def _classify(op: str, dims_json: bytes, types_json: bytes) -> tuple[str, dict[str, int], list[str]] | None:
    """(dtype, dims, misaligned dim names) of an fp16/bf16 GEMM call; None for other dtypes or non-GEMMs."""
    try:
        dims, types = _lists.decode(dims_json), _lists.decode(types_json) if types_json else []
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    got = gemm_dims(op, dims, types)
    if got is None or got[0] not in HALF_TYPES:
        return None
    dtype, d = got
    return dtype, d, [k for k, v in d.items() if v % ALIGN]
