"""FLOPs and bytes of each kernel event, from the host op call that launched it (metrics/opwork.py).

The launching op of a kernel is the innermost host op with recorded shapes whose span holds the
kernel's launch call (same thread; launch and kernel joined by correlation id): `leaf_shape_ops`.
A GEMM or convolution call's FLOPs and bytes go to the longest GEMM/convolution kernel it
launched (split-K reductions, layout transforms and other helper kernels get none). Another
op's bytes go to its kernel only when it launched exactly one (an op that launched several
gives its bytes to none: splitting them would be a guess). A kernel no op with shapes launched
(no `record_shapes`, Triton/compiled code, a library call) has unknown work, never zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..trace.model import CONV_OPS, SHAPE_OPS, Cat
from .classify import KernelKind
from .context import Context
from .gemm import call_ranges, innermost, launch_calls
from .opwork import OpWork, op_work

MAIN_KINDS = (int(KernelKind.GEMM), int(KernelKind.CONV))


@dataclass
class KernelWork:
    """Per event of the trace: FLOPs and bytes (NaN where unknown), and ids into `strings` of the
    Kineto dtype of the launching op and of why the work is unknown (-1: none)."""

    flops: np.ndarray
    nbytes: np.ndarray
    dtype_id: np.ndarray
    why_id: np.ndarray
    strings: list[str] = field(default_factory=list)

    @staticmethod
    def empty(n: int) -> KernelWork:
        return KernelWork(np.full(n, np.nan), np.full(n, np.nan), np.full(n, -1, np.int32), np.full(n, -1, np.int32))

    def dtype(self, k: int) -> str:
        i = int(self.dtype_id[k])
        return self.strings[i] if i >= 0 else ""

    def why(self, k: int) -> str:
        i = int(self.why_id[k])
        return self.strings[i] if i >= 0 else ""

    def string_id(self, s: str) -> int:
        if not s:
            return -1
        try:
            return self.strings.index(s)
        except ValueError:
            self.strings.append(s)
            return len(self.strings) - 1


def leaf_shape_ops(ctx: Context) -> np.ndarray:
    """Host ops in the window with recorded shapes that hold no other such op (on their thread)."""
    tr = ctx.tr
    ops = tr.shape_idx
    return innermost(ctx, ops[ctx.in_window[ops] & tr.mask(Cat.CPU_OP)[ops]])


def kernel_work(ctx: Context) -> KernelWork:
    """FLOPs and bytes per kernel event (module docstring)."""
    tr = ctx.tr
    out = KernelWork.empty(len(tr))
    ops = leaf_shape_ops(ctx)
    kern = np.flatnonzero(tr.mask(Cat.KERNEL) & (tr.correlation >= 0))
    calls = launch_calls(ctx)
    if ops.size == 0 or kern.size == 0 or calls.size == 0:
        return out
    # Kernels by correlation id: sorted, with the first of each id and how many share it.
    kern = kern[np.argsort(tr.correlation[kern], kind="stable")]
    corr, first, n_per = np.unique(tr.correlation[kern], return_index=True, return_counts=True)
    # Each op's launch calls: a contiguous run of its thread's calls sorted by start.
    lo, hi = call_ranges(ctx, ops, calls)
    pos = np.searchsorted(corr, tr.correlation[calls])
    hit = (pos < corr.size) & (corr[np.minimum(pos, corr.size - 1)] == tr.correlation[calls])
    call_first = np.where(hit, first[np.minimum(pos, corr.size - 1)], -1)
    call_n = np.where(hit, n_per[np.minimum(pos, corr.size - 1)], 0)
    csum = np.concatenate([[0], np.cumsum(call_n)])
    n_kernels = csum[hi] - csum[lo]

    # One OpWork per distinct (op name, shapes).
    key = tr.name[ops].astype(np.int64) * (len(tr.shapes) + 1) + tr.shape_of(ops)
    keys, inv = np.unique(key, return_inverse=True)
    works = _Works.of(out, [op_work(tr.names[int(k) // (len(tr.shapes) + 1)], *tr.shapes[int(k) % (len(tr.shapes) + 1)])
                            for k in keys.tolist()])
    main_op = np.array([tr.names[int(k) // (len(tr.shapes) + 1)] in SHAPE_OPS | CONV_OPS for k in keys.tolist()])

    # The common case, vectorised: an op whose single launch call queued a single kernel.
    single = (n_kernels == 1) & (hi - lo == 1)
    k1 = kern[call_first[lo[single]]]
    ok = ~main_op[inv[single]] | np.isin(ctx.kind[k1], MAIN_KINDS)
    _assign(out, k1[ok], inv[single][ok], works)
    for j in np.flatnonzero(~single & (n_kernels > 0)).tolist():
        ks = [int(k) for c in range(lo[j], hi[j]) if call_n[c] for k in kern[call_first[c]:call_first[c] + call_n[c]]]
        _give(ctx, out, tr.names[tr.name[ops[j]]], int(inv[j]), ks, works)
    return out


@dataclass
class _Works:
    """The distinct op calls' work as arrays (index = op kind), strings interned into the output."""

    flops: np.ndarray
    nbytes: np.ndarray
    dtype_id: np.ndarray
    why_id: np.ndarray

    @staticmethod
    def of(out: KernelWork, works: list[OpWork]) -> _Works:
        return _Works(np.array([np.nan if x.flops is None else float(x.flops) for x in works]),
                      np.array([np.nan if x.nbytes is None else float(x.nbytes) for x in works]),
                      np.array([out.string_id(x.dtype) for x in works], np.int32),
                      np.array([out.string_id(x.why) for x in works], np.int32))


def _assign(out: KernelWork, k: np.ndarray, w: np.ndarray, works: _Works) -> None:
    """Kernels `k` get the work of op kinds `w` (indices into `works`), summed where repeated."""
    if k.size == 0:
        return
    for arr, val in ((out.flops, works.flops[w]), (out.nbytes, works.nbytes[w])):
        known = np.isfinite(val)
        kk = k[known]
        arr[kk[np.isnan(arr[kk])]] = 0.0
        np.add.at(arr, kk, val[known])
    out.dtype_id[k] = works.dtype_id[w]
    why = works.why_id[w]
    out.why_id[k[why >= 0]] = why[why >= 0]


def _give(ctx: Context, out: KernelWork, op: str, wi: int, kernels: list[int], works: _Works) -> None:
    """One op call outside the vectorised case: several launch calls or kernels (module docstring)."""
    tr = ctx.tr
    if op in SHAPE_OPS or op in CONV_OPS:
        main = [k for k in kernels if int(ctx.kind[k]) in MAIN_KINDS]
        if not main:
            return
        k = max(main, key=lambda j: int(tr.end[j] - tr.ts[j]))
        helper = out.string_id(f"helper kernel of {op}: the op's work is counted on its longest kernel")
        for j in main:
            if j != k and out.why_id[j] < 0:
                out.why_id[j] = helper
        _assign(out, np.array([k]), np.array([wi]), works)
        return
    if len(kernels) == 1:  # several launch calls (a memset, a copy...) but one kernel
        _assign(out, np.array(kernels), np.array([wi]), works)
        return
    why = out.string_id(f"{op} launched {len(kernels)} kernels: its bytes are not split between them")
    for j in kernels:
        if out.why_id[j] < 0:
            out.why_id[j] = why
