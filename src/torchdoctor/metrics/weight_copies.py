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

Per outermost ``aten::matmul`` on the host in the window: the host time of the outermost
``aten::copy_`` ranges inside the ``aten::bmm`` calls it holds (the expanded weight made contiguous
for the bmm; the copies matmul's own reshape makes before it, of attention's transposed heads, are
not these) and, with device activity, the device time of what they launched. A matmul counts when
those copies take at least COPY_SHARE of its time and, where its Input Dims were recorded, one of
its operands is 2-D (a weight). On a CUDA device the expanded weight needs no copy (a batch stride
of 0), so what is found there is a host tensor's matmul, priced by its host time.
"""

from __future__ import annotations

import json

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
    bmms = outermost(tr, np.flatnonzero(cpu & tr.name_mask("aten::bmm".__eq__)))
    bmms = bmms[span_of(tr, matmuls, bmms) >= 0]
    copies = outermost(tr, np.flatnonzero(cpu & tr.name_mask("aten::copy_".__eq__)))
    copies = copies[span_of(tr, bmms, copies) >= 0]  # made inside a bmm: its expanded operand
    in_matmul = span_of(tr, matmuls, copies)
    copy_ns = np.zeros(matmuls.size, np.int64)
    np.add.at(copy_ns, in_matmul, (tr.end - tr.ts)[copies])
    own_ns = tr.end[matmuls] - tr.ts[matmuls]
    hit = copy_ns >= COPY_SHARE * np.maximum(own_ns, 1)
    shapes: dict[str, int] = {}
    sids = tr.shape_of(matmuls)
    for k in np.flatnonzero(hit):
        dims = tr.shapes[int(sids[k])][0].decode(errors="replace") if sids[k] >= 0 else None
        if dims is not None and not _one_matrix(dims):
            hit[k] = False  # two batched operands: not a weight's copy
        elif dims:
            shapes[dims] = shapes.get(dims, 0) + 1
    if not hit.any():
        return None
    device_ns = None
    if ctx.has_device:
        launches = np.flatnonzero(tr.mask(Cat.RUNTIME, Cat.DRIVER) & (tr.correlation >= 0) & ctx.in_window)
        at = span_of(tr, copies[hit[in_matmul]], launches)
        # Copies of host tensors launch nothing: their host time is the cost, even on an accelerator job.
        device_ns = int(launched_device_ns(ctx, launches[at >= 0]).sum()) or None
    return WeightCopies(
        calls=int(hit.sum()), copy_ns=int(copy_ns[hit].sum()), matmul_ns=int(own_ns[hit].sum()),
        device_ns=device_ns, steps=len(ctx.win.steps),
        shapes=dict(sorted(shapes.items(), key=lambda kv: -kv[1])[:MAX_SHAPES]))


def _one_matrix(dims: str) -> bool:
    """Whether exactly one operand of recorded Input Dims ("[[4,16,128],[128,8192]]") is 2-D; True when the
    text does not read as two shapes (nothing to go on)."""
    try:
        ops = json.loads(dims)
        ranks = [len(o) for o in ops[:2] if isinstance(o, list)]
    except (ValueError, TypeError):
        return True
    return len(ranks) < 2 or ranks.count(2) == 1
