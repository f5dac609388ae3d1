"""Work of one host op call from its recorded shapes (`record_shapes=True`): FLOPs and bytes moved.

Definitions (one call; metrics/work.py gives it to the kernels the call launched):

- GEMM (`aten::mm/addmm/bmm/baddbmm/addbmm/matmul/linear`): FLOPs = 2·M·N·K·batch (a multiply
  and an add per product term; `gemm.gemm_dims` defines M, K, N; batch = the product of the first
  matrix's leading dims for bmm/baddbmm/addbmm/matmul, 1 for mm/addmm; linear folds its leading
  dims into M). Bias adds and alpha/beta scaling are left out (O(M·N), under 1% for K >= 100).
  Bytes = every tensor input read once (A, B, and the bias of addmm/linear) + the output
  (batch·M·N) written, at the inputs' element size: the minimum traffic, as if each operand
  crossed DRAM once (tiling re-reads hit L2).
- Convolution (`CONV_ARGS`): input [N, C, *spatial], weight [K, C/groups, *kernel]; output
  spatial size o = (i + 2·pad - dil·(k - 1) - 1) // stride + 1 per dim, stride/padding/dilation
  from the op's `Concrete Inputs` (torch >= 2.1 records them; older traces do not, and the
  FLOPs are then null with that reason). FLOPs = 2·N·K·Π(o)·(C/groups)·Π(kernel) (C/groups is the
  weight's dim 1, so groups need not be recorded; a recorded groups must agree with C).
  Bytes = input + weight read + output written. Transposed convolutions: null (not counted).
- Other aten ops (elementwise, reductions, copies): FLOPs not counted; bytes = the tensor inputs
  read + the output written. The output is the broadcast shape of the tensor inputs at the first
  input's element size; in-place ops (`*_`) write their first input; `copy_` reads its source and
  writes its destination; fills and random fills (`WRITE_ONLY`) only write; reductions
  (`REDUCING`) count no write (their output is a reduced dim, small against the input: a lower
  bound).

Unknown dtypes, tensor lists without per-tensor dtypes, missing or malformed shapes give no
number and the reason; shapes past MAX_ELEMS elements or MAX_FLOPS are corrupt, dropped with it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import msgspec

from ..trace.model import CONV_OPS, SHAPE_OPS
from .gemm import MATRIX_INPUTS, gemm_dims

# Element sizes of Kineto's `Input type` spellings.
DTYPE_BYTES = {
    "float": 4, "double": 8, "c10::Half": 2, "Half": 2, "half": 2, "c10::BFloat16": 2, "BFloat16": 2,
    "bfloat16": 2, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1, "int": 4, "long int": 8, "long": 8, "short int": 2, "short": 2,
    "signed char": 1, "unsigned char": 1, "bool": 1, "c10::complex<float>": 8, "c10::complex<double>": 16,
    "c10::complex<c10::Half>": 4,
}
BATCHED = frozenset({"aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::matmul"})
# A product past this is a corrupt shape, not a GEMM (1e21 FLOPs: hours on any device): dropped.
MAX_FLOPS = 10**21
# A tensor past 2^48 elements (256 Ti) exists on no device: a corrupt shape.
MAX_ELEMS = 2**48
# Positions of (input, weight, stride, padding, dilation, transposed or None, groups) per op.
CONV_ARGS: dict[str, tuple[int, int, int, int, int, int | None, int]] = {
    "aten::convolution": (0, 1, 3, 4, 5, 6, 8), "aten::_convolution": (0, 1, 3, 4, 5, 6, 8),
    "aten::conv1d": (0, 1, 3, 4, 5, None, 6), "aten::conv2d": (0, 1, 3, 4, 5, None, 6),
    "aten::conv3d": (0, 1, 3, 4, 5, None, 6), "aten::cudnn_convolution": (0, 1, 3, 2, 4, None, 5),
    "aten::miopen_convolution": (0, 1, 4, 3, 5, None, 6), "aten::cudnn_convolution_relu": (0, 1, 3, 4, 5, None, 6),
    "aten::cudnn_convolution_add_relu": (0, 1, 4, 5, 6, None, 7),
}
assert set(CONV_ARGS) == CONV_OPS
WRITE_ONLY = frozenset({"aten::fill_", "aten::zero_", "aten::normal_", "aten::uniform_", "aten::bernoulli_",
                        "aten::random_", "aten::exponential_"})
REDUCING = frozenset({
    "aten::sum", "aten::mean", "aten::prod", "aten::amax", "aten::amin", "aten::max", "aten::min", "aten::argmax",
    "aten::argmin", "aten::norm", "aten::linalg_vector_norm", "aten::var", "aten::std", "aten::var_mean",
    "aten::std_mean", "aten::all", "aten::any", "aten::count_nonzero", "aten::logsumexp", "aten::nll_loss_forward",
    "aten::mse_loss", "aten::_foreach_norm", "aten::sum_to_size",
})
_any = msgspec.json.Decoder()


@dataclass(frozen=True)
class OpWork:
    """FLOPs and bytes of one op call (None when unknown, `why` says why), and its inputs' dtype."""

    flops: int | None = None
    nbytes: int | None = None
    dtype: str = ""
    why: str = ""


def op_work(op: str, dims_json: bytes, types_json: bytes, concrete_json: bytes = b"") -> OpWork:
    """The work of one call of `op` from its compact JSON shapes (trace.model RankTrace.shapes)."""
    try:
        dims, types = _any.decode(dims_json), _any.decode(types_json) if types_json else []
        concrete = _any.decode(concrete_json) if concrete_json else None
    except msgspec.DecodeError:
        return OpWork(why=f"{op}: unreadable Input Dims / Input type")
    if not isinstance(dims, list) or not isinstance(types, list):
        return OpWork(why=f"{op}: malformed Input Dims / Input type")
    if op in SHAPE_OPS:
        return gemm_work(op, dims, types)
    if op in CONV_ARGS:
        return conv_work(op, dims, types, concrete if isinstance(concrete, list) else None)
    return tensor_bytes(op, dims, types)


def gemm_work(op: str, dims: list, types: list) -> OpWork:
    """FLOPs and bytes of one GEMM op call (module docstring)."""
    got = gemm_dims(op, dims, types)
    if got is None:
        return OpWork(why=f"{op}: shapes are not a GEMM (a 1-D operand or missing dims)")
    dtype, d = got
    size = DTYPE_BYTES.get(dtype)
    a = dims[MATRIX_INPUTS[op][0]]
    batch = math.prod(a[:-2]) if op in BATCHED else 1
    flops = 2 * d["M"] * d["N"] * d["K"] * batch
    if not 0 < flops <= MAX_FLOPS:
        return OpWork(dtype=dtype, why=f"{op}: absurd shape {dims} ({flops:.3g} FLOPs), dropped")
    if size is None:
        return OpWork(flops, None, dtype, f"unknown dtype {dtype!r}: bytes not counted")
    elems = [_numel(x) for x, t in zip(dims, types, strict=False) if t in DTYPE_BYTES and isinstance(x, list)]
    nbytes = (sum(e for e in elems if e is not None) + batch * d["M"] * d["N"]) * size
    return OpWork(flops, nbytes, dtype)


def conv_work(op: str, dims: list, types: list, concrete: list | None) -> OpWork:
    """FLOPs and bytes of one forward convolution call (module docstring)."""
    i_x, i_w, i_stride, i_pad, i_dil, i_tr, i_groups = CONV_ARGS[op]
    if len(dims) <= i_w or len(types) <= i_x:
        return OpWork(why=f"{op}: input or weight shape not recorded")
    x, w, dtype = dims[i_x], dims[i_w], str(types[i_x])
    if not (_ints(x) and _ints(w)) or len(x) < 3 or len(w) != len(x):
        return OpWork(dtype=dtype, why=f"{op}: input/weight shapes {x} / {w} are not a convolution's")
    spatial = len(x) - 2
    if concrete is None:
        return OpWork(dtype=dtype, why=f"{op}: stride/padding/dilation not recorded (no Concrete Inputs: "
                                       "torch < 2.1 or record_shapes off), FLOPs unknown")
    if i_tr is not None and _value(concrete, i_tr) in (True, "True", "true", 1):
        return OpWork(dtype=dtype, why=f"{op}: transposed convolution, FLOPs not counted")
    stride, pad, dil = (_per_dim(_value(concrete, i), spatial, default)
                        for i, default in ((i_stride, 1), (i_pad, 0), (i_dil, 1)))
    groups = _value(concrete, i_groups)
    if stride is None or pad is None or dil is None:
        return OpWork(dtype=dtype, why=f"{op}: stride/padding/dilation {concrete} not readable (e.g. padding='same')")
    if isinstance(groups, int) and groups > 0 and w[1] * groups != x[1]:
        return OpWork(dtype=dtype, why=f"{op}: weight {w} with groups={groups} does not fit input {x}")
    out = [(i + 2 * p - d * (k - 1) - 1) // s + 1 for i, k, s, p, d in zip(x[2:], w[2:], stride, pad, dil, strict=True)]
    if min(out) <= 0 or min(stride) <= 0:
        return OpWork(dtype=dtype, why=f"{op}: shapes {x} / {w} give no output")
    n, k = x[0], w[0]
    flops = 2 * n * k * math.prod(out) * w[1] * math.prod(w[2:])
    if not 0 < flops <= MAX_FLOPS or math.prod(x) > MAX_ELEMS:
        return OpWork(dtype=dtype, why=f"{op}: absurd shape {x} / {w}, dropped")
    size = DTYPE_BYTES.get(dtype)
    nbytes = (math.prod(x) + math.prod(w) + n * k * math.prod(out)) * size if size else None
    return OpWork(flops, nbytes, dtype, "" if size else f"unknown dtype {dtype!r}: bytes not counted")


def tensor_bytes(op: str, dims: list, types: list) -> OpWork:
    """Bytes read and written by one elementwise/reduction/copy op call (module docstring)."""
    tensors = [(x, str(t)) for x, t in zip(dims, types, strict=False) if t not in ("", "Scalar", "ScalarList")]
    if not tensors:
        return OpWork(why=f"{op}: no tensor input recorded")
    for x, t in tensors:
        if t not in DTYPE_BYTES:
            return OpWork(dtype=t, why=f"{op}: dtype {t!r} not sizeable (unknown dtype or a tensor list)")
        if not _ints(x):
            return OpWork(dtype=t, why=f"{op}: shape {json.dumps(x)[:60]} not readable")
    sizes = [(_numel(x), DTYPE_BYTES[t]) for x, t in tensors]
    if any(n is None or n > MAX_ELEMS for n, _ in sizes):
        return OpWork(dtype=tensors[0][1], why=f"{op}: absurd shape, dropped")
    read = [n * s for n, s in sizes]  # type: ignore[operator]
    first = read[0]
    if op in WRITE_ONLY:
        total = first
    elif op == "aten::copy_":
        total = sum(read[1:]) + first
    elif op in REDUCING:
        total = sum(read)
    elif op.endswith("_"):
        total = sum(read) + first
    else:
        try:
            out = math.prod(_broadcast([x for x, _ in tensors]))
        except ValueError:
            return OpWork(dtype=tensors[0][1], why=f"{op}: input shapes do not broadcast")
        total = sum(read) + out * sizes[0][1]
    return OpWork(None, total, tensors[0][1])


def _ints(x: object) -> bool:
    return isinstance(x, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in x)


def _numel(x: list) -> int | None:
    return math.prod(x) if _ints(x) else None


def _broadcast(shapes: list[list[int]]) -> list[int]:
    """numpy's broadcasting of shapes, ValueError when they do not broadcast."""
    n = max(len(s) for s in shapes)
    out = [1] * n
    for s in shapes:
        for i, v in enumerate(s, n - len(s)):
            if out[i] == 1:
                out[i] = v
            elif v not in (1, out[i]):
                raise ValueError(shapes)
    return out


def _value(concrete: list, i: int) -> object:
    """A concrete input by position, parsed from Kineto's text ('[2, 2]', '1', 'False'); None if absent."""
    if i >= len(concrete) or concrete[i] in ("", None):
        return None
    v = concrete[i]
    if isinstance(v, str):
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v


def _per_dim(v: object, n: int, default: int) -> list[int] | None:
    """A stride/padding/dilation value as one int per spatial dim (None: not readable)."""
    if v is None:
        return [default] * n
    if isinstance(v, int) and not isinstance(v, bool):
        return [v] * n
    if isinstance(v, list) and all(isinstance(e, int) for e in v):
        return v * n if len(v) == 1 else v if len(v) == n else None
    return None
