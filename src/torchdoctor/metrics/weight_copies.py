"""Matmuls that copy their weight: a non-contiguous activation against a weight that needs no gradient.

``torch.matmul`` (which ``F.linear`` calls for an input of more than two dimensions) folds a 3-D input
into one ``mm`` against a 2-D weight only when the fold costs no copy, or when the weight needs a
gradient. A non-contiguous input (a chunk along the sequence, a transposed view) against a frozen
weight is computed as a ``bmm`` instead, over the weight expanded to the batch and made contiguous:
a copy of batch x the weight at every call. Measured on torch 2.14 (CPU): ``F.linear`` of one of 8
sequence chunks of a [4, 120, 512] bf16 activation against a frozen 151,936 x 512 embedding took
1,614 ms, 95% of it in ``aten::copy_``; the same chunk made contiguous first, 27 ms; with the weight
requiring grad, 24 ms. torchtune's LoRA recipes run into it: CEWithChunkedOutputLoss has the model
split its last hidden state along the sequence, and the tied output projection is frozen.

Per outermost ``aten::matmul`` on the host in the window that holds an ``aten::bmm``: the host time
of the outermost ``aten::copy_`` ranges inside it and, with device activity, the device time of
what they launched. A matmul counts when its copies take at least COPY_SHARE of its time: a
batched matmul of two 3-D operands that copies a small one on the way is not this.
"""

from __future__ import annotations

import numpy as np

from ..trace.model import Cat
from .context import Context
from .device import launched_device_ns
from .model import WeightCopies
from .recompute import span_of
from .steps import outermost

# The share of a matmul's host time in copies from which it is a weight copy, not a matmul that copied.
COPY_SHARE = 0.5
MAX_SHAPES = 3


def weight_copies(ctx: Context) -> WeightCopies | None:
    """Matmuls of the window that copied their operands for a bmm (module docstring); None when none did."""
    tr = ctx.tr
    if "aten::bmm" not in tr.names or "aten::copy_" not in tr.names:
        return None
    cpu = ctx.host & tr.mask(Cat.CPU_OP) & ctx.in_window
    matmuls = outermost(tr, np.flatnonzero(cpu & tr.name_mask("aten::matmul".__eq__)))
    if not matmuls.size:
        return None
    copies = outermost(tr, np.flatnonzero(cpu & tr.name_mask("aten::copy_".__eq__)))
    bmms = np.flatnonzero(cpu & tr.name_mask("aten::bmm".__eq__))
    in_copy = span_of(tr, matmuls, copies)
    in_bmm = span_of(tr, matmuls, bmms)
    copy_ns = np.zeros(matmuls.size, np.int64)
    held = in_copy >= 0
    np.add.at(copy_ns, in_copy[held], (tr.end - tr.ts)[copies[held]])
    has_bmm = np.zeros(matmuls.size, bool)
    has_bmm[in_bmm[in_bmm >= 0]] = True
    own_ns = tr.end[matmuls] - tr.ts[matmuls]
    hit = has_bmm & (copy_ns >= COPY_SHARE * np.maximum(own_ns, 1))
    if not hit.any():
        return None
    device_ns = None
    if ctx.has_device:
        launches = np.flatnonzero(tr.mask(Cat.RUNTIME, Cat.DRIVER) & (tr.correlation >= 0) & ctx.in_window)
        at = span_of(tr, copies[held][hit[in_copy[held]]], launches)
        device_ns = int(launched_device_ns(ctx, launches[at >= 0]).sum())
    shapes: dict[str, int] = {}
    for i in matmuls[hit]:
        dims = _dims(tr, int(i))
        if dims:
            shapes[dims] = shapes.get(dims, 0) + 1
    return WeightCopies(
        calls=int(hit.sum()), copy_ns=int(copy_ns[hit].sum()), matmul_ns=int(own_ns[hit].sum()),
        device_ns=device_ns, steps=len(ctx.win.steps),
        shapes=dict(sorted(shapes.items(), key=lambda kv: -kv[1])[:MAX_SHAPES]))


def _dims(tr, i: int) -> str | None:
    """The matmul's recorded Input Dims as text ("[[4, 15, 512], [512, 151936]]"), or None."""
    try:
        sid = tr.shape_of(np.array([i]))[0]
    except Exception:
        return None
    if sid < 0:
        return None
    raw = tr.shapes[int(sid)][0]
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
