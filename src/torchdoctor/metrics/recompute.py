"""Activation checkpointing: the forward work the backward pass runs again.

A checkpointed segment (torch.utils.checkpoint.checkpoint, which Hugging Face's
``gradient_checkpointing``, FSDP's ``checkpoint_wrapper``, Lightning's and torchtitan's activation
checkpointing call) keeps only its inputs in the forward; the backward runs its forward again to
get the activations back. Nothing in the trace names that second forward; where it runs does:

- **non-reentrant** (``use_reentrant=False``, the default of Hugging Face and FSDP): the saved
  tensors are unpacked inside the first autograd node of the segment that needs one, so the
  segment's forward ops run inside that node's ``autograd::engine::evaluate_function: XBackward0``.
  A built-in node (``...Backward<digit>``) never calls a composite forward op (FORWARD_OPS:
  ``aten::linear``, ``aten::layer_norm``, ``aten::scaled_dot_product_attention``, ...): its
  formula calls ``mm``, ``*_backward`` kernels. A built-in node holding one is a *recompute node*;
  what it ran again is its time less the median time of the nodes of the same name that hold
  none (0 when every node of that name recomputes: the node's own formula is then counted in).
- **reentrant** (``use_reentrant=True``; DeepSpeed's and Megatron's own checkpointing): the
  segment is one custom autograd node, ``CheckpointFunctionBackward``, whose backward runs the
  forward again and then a nested backward over it; what it ran again is its time less the nested
  nodes inside it.

Per recompute node: ``host_ns`` (its time on the host, as above) and, with device activity,
``device_ns``: the device time of the kernels, copies and memsets launched inside the node (by
correlation id from the launching runtime call on the node's thread), less the same-name median or
the nested nodes' launches alike. ``Recompute`` sums them over the window. Custom autograd nodes
other than CheckpointFunctionBackward (a compiled graph's CompiledFunctionBackward, which
rematerialises by its own choice, and library Functions) are not read.
"""

from __future__ import annotations

import re

import numpy as np

from ..trace.model import Cat
from .context import Context
from .model import Recompute

NODE_PREFIX = "autograd::engine::evaluate_function: "
# The reentrant checkpoint's autograd Function (torch.utils.checkpoint.CheckpointFunction; DeepSpeed's
# and Megatron-LM's own CheckpointFunction classes keep the name).
REENTRANT_NODES = frozenset({"CheckpointFunctionBackward"})
# Forward ops no built-in backward formula calls (their gradients are other ops: mm, *_backward,
# threshold_backward, _softmax_backward_data, embedding_dense_backward, native_dropout_backward).
FORWARD_OPS = frozenset({
    "aten::linear", "aten::matmul", "aten::einsum", "aten::dropout", "aten::native_dropout",
    "aten::layer_norm", "aten::native_layer_norm", "aten::group_norm", "aten::native_group_norm",
    "aten::batch_norm", "aten::_batch_norm_impl_index", "aten::rms_norm", "aten::_fused_rms_norm",
    "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution", "aten::_convolution",
    "aten::embedding", "aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention", "aten::softmax", "aten::_softmax", "aten::log_softmax",
    "aten::_log_softmax", "aten::gelu", "aten::silu", "aten::relu", "aten::max_pool2d",
    "aten::max_pool2d_with_indices", "aten::adaptive_avg_pool2d",
})
_BUILTIN = re.compile(r"Backward\d+$")
# The node kinds (per interned name).
_OTHER, _BUILT_IN, _REENTRANT = 0, 1, 2


def _innermost(starts: np.ndarray, ends: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
    """For each span [t0, t1): the index of the latest-starting node (sorted ``starts``) that holds it,
    -1 when that node does not (nodes on one thread nest or follow each other: a span between two
    nested nodes of a reentrant segment is given to none, which is what the reentrant sum wants)."""
    k = np.searchsorted(starts, t0, side="right") - 1
    ok = (k >= 0) & (ends[np.maximum(k, 0)] >= t1)
    return np.where(ok, k, -1)


def recompute(ctx: Context) -> Recompute | None:
    """Recompute over the window (module docstring); None when no backward node ran forward work again."""
    tr = ctx.tr
    kinds = np.fromiter(
        (_node_kind(n) for n in tr.names), np.int8, len(tr.names)) if tr.names else np.zeros(0, np.int8)
    if not kinds.size or not (kinds > _OTHER).any():
        return None
    cpu = ctx.host & tr.mask(Cat.CPU_OP) & ctx.in_window
    nodes = np.flatnonzero(cpu & (kinds.take(tr.name) > _OTHER))
    if nodes.size == 0:
        return None
    kind = kinds.take(tr.name[nodes])
    fwd = np.flatnonzero(cpu & tr.name_mask(FORWARD_OPS.__contains__))
    launches = np.flatnonzero(tr.mask(Cat.RUNTIME, Cat.DRIVER) & (tr.correlation >= 0) & ctx.in_window)
    launch_ns = _launched_device_ns(ctx, launches)

    holds = np.zeros(nodes.size, np.int64)  # forward ops held directly (innermost node)
    device = np.zeros(nodes.size, np.int64)  # device ns launched directly inside
    nested = np.zeros(nodes.size, np.int64)  # host ns of the nodes nested inside (reentrant only)
    op_counts: dict[str, int] = {}
    for tid in np.unique(tr.tid[nodes]):
        on = np.flatnonzero(tr.tid[nodes] == tid)
        order = on[np.argsort(tr.ts[nodes[on]], kind="stable")]
        starts, ends = tr.ts[nodes[order]], tr.end[nodes[order]]
        f = fwd[tr.tid[fwd] == tid]
        at = _innermost(starts, ends, tr.ts[f], tr.end[f])
        np.add.at(holds, order[at[at >= 0]], 1)
        for name_id in tr.name[f[at >= 0]]:
            op_counts[tr.names[name_id]] = op_counts.get(tr.names[name_id], 0) + 1
        lc = launches[tr.tid[launches] == tid]
        at = _innermost(starts, ends, tr.ts[lc], tr.end[lc])
        np.add.at(device, order[at[at >= 0]], launch_ns[np.searchsorted(launches, lc[at >= 0])])
        # The nodes a reentrant node's nested backward ran: its host time and launches are not recomputed.
        for j in np.flatnonzero(kind[order] == _REENTRANT):
            inner = (starts > starts[j]) & (ends <= ends[j])
            inner[j] = False
            if inner.any():
                nested[order[j]] = _union_ns(starts[inner], ends[inner])
    host = tr.end[nodes] - tr.ts[nodes]
    host_again = np.zeros(nodes.size, np.int64)
    device_again = np.zeros(nodes.size, np.int64)
    re_nodes = kind == _REENTRANT
    host_again[re_nodes] = np.maximum(host[re_nodes] - nested[re_nodes], 0)
    device_again[re_nodes] = device[re_nodes]  # launches inside nested nodes went to those nodes
    built = np.flatnonzero((kind == _BUILT_IN) & (holds > 0))
    names = tr.name[nodes]
    for name_id in np.unique(names[built]):
        same = names == name_id
        clean = same & (kind == _BUILT_IN) & (holds == 0)
        base_h = int(np.median(host[clean])) if clean.any() else 0
        base_d = int(np.median(device[clean])) if clean.any() else 0
        hit = same & (holds > 0)
        host_again[hit] = np.maximum(host[hit] - base_h, 0)
        device_again[hit] = np.maximum(device[hit] - base_d, 0)
    again = re_nodes | ((kind == _BUILT_IN) & (holds > 0))
    if not again.any():
        return None
    top = sorted(op_counts.items(), key=lambda kv: -kv[1])[:6]
    return Recompute(
        nodes=int(again.sum()), reentrant=int(re_nodes.sum()), host_ns=int(host_again[again].sum()),
        device_ns=int(device_again[again].sum()) if ctx.has_device else None,
        steps=len(ctx.win.steps), forward_ops=dict(top))


def _node_kind(name: str) -> int:
    if not name.startswith(NODE_PREFIX):
        return _OTHER
    node = name[len(NODE_PREFIX):].strip()
    if node in REENTRANT_NODES:
        return _REENTRANT
    return _BUILT_IN if _BUILTIN.search(node) else _OTHER


def _launched_device_ns(ctx: Context, launches: np.ndarray) -> np.ndarray:
    """Device ns (kernels, copies, memsets) of each launch call in ``launches``, joined by correlation id."""
    tr = ctx.tr
    out = np.zeros(launches.size, np.int64)
    work = np.flatnonzero(ctx.device_work & (tr.correlation >= 0))
    if not launches.size or not work.size:
        return out
    corr, inv = np.unique(tr.correlation[work], return_inverse=True)
    per = np.zeros(corr.size, np.int64)
    np.add.at(per, inv, tr.end[work] - tr.ts[work])
    pos = np.clip(np.searchsorted(corr, tr.correlation[launches]), 0, corr.size - 1)
    return np.where(corr[pos] == tr.correlation[launches], per[pos], 0)


def _union_ns(starts: np.ndarray, ends: np.ndarray) -> int:
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], np.maximum.accumulate(ends[order])
    new = np.ones(s.size, bool)
    new[1:] = s[1:] > e[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:], s.size) - 1
    return int((e[last] - s[first]).sum())
