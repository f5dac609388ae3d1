"""Activation checkpointing: the forward work the backward pass runs again.

A checkpointed segment (torch.utils.checkpoint.checkpoint, which Hugging Face's
``gradient_checkpointing``, FSDP's ``checkpoint_wrapper``, Lightning's and torchtitan's activation
checkpointing call) keeps only its inputs in the forward; the backward runs its forward again to
get the activations back. Nothing in the trace names that second forward; where it runs does:

- **non-reentrant** (``use_reentrant=False``: FSDP's checkpoint_wrapper, recent transformers,
  timm): the saved tensors are unpacked inside the first autograd node of the segment that needs
  one, so the segment's forward ops run inside that node's ``autograd::engine::evaluate_function:
  XBackward0``. A built-in node (``...Backward<digit>``) never calls a composite forward op
  (FORWARD_OPS: ``aten::linear``, ``aten::layer_norm``, ``aten::scaled_dot_product_attention``, ...):
  its formula calls ``mm`` and ``*_backward`` kernels. A built-in node holding one is a *recompute
  node*; what it ran again is its time less the median time of the nodes of the same name that hold
  none (0 when every node of that name recomputes: the node's own formula is then counted in). The
  derivatives of backward formulas are left out (a double backward's ``ConvolutionBackwardBackward0``
  calls ``aten::convolution`` as its formula: a gradient penalty is not a recompute).
- **reentrant** (``use_reentrant=True``, torch's default when it is not given, and older
  transformers'; DeepSpeed's and Megatron's own checkpointing): the segment is one custom autograd
  node, ``CheckpointFunctionBackward``, whose backward runs the forward again and then a nested
  backward over it; what it ran again is its time less every autograd node nested inside it.
- **a compiled segment** (torchtune's ``compile: True`` with activation checkpointing: each layer is
  compiled inside its checkpoint wrapper): the segment's forward is AOTAutograd's ``CompiledFunction``
  (the autograd Function a compiled graph runs as), and the segment's backward node is its
  ``CompiledFunctionBackward``, which runs the compiled forward again when it unpacks what the
  segment saved. A ``CompiledFunction`` inside any autograd node but AccumulateGrad (whose hooks run
  an optimizer, not a forward) is a recompute. Where the node is not priced as above, what it ran
  again is the time and launches of its compiled forwards and of the forward ops beside them (a
  segment whose compiled code breaks its graph runs both); the ops inside a compiled forward are
  its own work, never counted apart. A checkpoint *inside* a compiled region is rematerialised
  within the compiled backward graph and has no range of its own: not read.

Work is given to the innermost autograd node holding it, of any kind: what a custom Function's
node (flash-attention's, a 4-bit matmul's) or AccumulateGrad's hooks run inside a reentrant
segment's nested backward is theirs, not the recompute's. Per recompute node: ``host_ns`` (its
time on the host, as above) and, with device activity, ``device_ns``: the device time of the
kernels, copies and memsets launched inside the node (by correlation id from the launching
runtime call on the node's thread), less the same-name median or the nested nodes' launches alike;
collectives are left out (FSDP's all-gather before a segment's backward is needed with or without
the recompute, and its kernel mostly waits for the other ranks). ``Recompute`` sums them over the
window. Custom autograd nodes other than CheckpointFunctionBackward (library Functions, and a compiled
graph's CompiledFunctionBackward, which rematerialises inside its own graph by its own choice) are
read only for a compiled forward they hold, as above.
"""

from __future__ import annotations

import re

import numpy as np

from ..trace.model import Cat
from . import intervals as iv
from .context import Context
from .device import launched_device_ns
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
# AOTAutograd's autograd Function: a compiled graph's forward (torch/_functorch/_aot_autograd).
COMPILED_FORWARD = "CompiledFunction"
BATCH_NORM_OPS = frozenset({"aten::batch_norm", "aten::_batch_norm_impl_index"})  # one call: the outermost
_BUILTIN = re.compile(r"Backward\d+$")
# The kinds of events (per interned name): not an autograd node; a node that is not read (a custom
# Function's, AccumulateGrad, a double backward's) but holds what runs inside it; the two read.
_NOT_NODE, _OTHER, _BUILT_IN, _REENTRANT = -1, 0, 1, 2


def _innermost(starts: np.ndarray, ends: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
    """For each span [t0, t1): the index of the latest-starting node (sorted ``starts``) that holds it,
    -1 when that node does not. Every autograd node is a candidate, so work inside a node nested in
    a reentrant segment's backward (a custom Function's, AccumulateGrad's hooks) is that node's; nodes
    on one thread nest or follow each other, so a span between two nested nodes of a reentrant segment
    is given to none (its nested backward's own Python), which is what the reentrant sum wants."""
    k = np.searchsorted(starts, t0, side="right") - 1
    ok = (k >= 0) & (ends[np.maximum(k, 0)] >= t1)
    return np.where(ok, k, -1)


def recompute(ctx: Context) -> Recompute | None:
    """Recompute over the window (module docstring); None when no backward node ran forward work again."""
    tr = ctx.tr
    kinds = np.fromiter(
        (_node_kind(n) for n in tr.names), np.int8, len(tr.names)) if tr.names else np.zeros(0, np.int8)
    any_compiled = COMPILED_FORWARD in tr.names
    if not kinds.size or not ((kinds > _OTHER).any() or any_compiled):
        return None
    cpu = ctx.host & tr.mask(Cat.CPU_OP) & ctx.in_window
    nodes = np.flatnonzero(cpu & (kinds.take(tr.name) >= _OTHER))
    kind = kinds.take(tr.name[nodes])
    if not nodes.size or not ((kind > _OTHER).any() or any_compiled):
        return None
    compiled = _outermost(tr, np.flatnonzero(cpu & tr.name_mask(COMPILED_FORWARD.__eq__)))
    fwd = _outermost(tr, np.flatnonzero(cpu & tr.name_mask(FORWARD_OPS.__contains__)))
    # A compiled forward's own ops (Inductor's extern calls, every op under aot_eager) are its work, named once.
    fwd = fwd[span_of(tr, compiled, fwd) < 0]
    launches = np.flatnonzero(tr.mask(Cat.RUNTIME, Cat.DRIVER) & (tr.correlation >= 0) & ctx.in_window)
    launch_ns = launched_device_ns(ctx, launches)

    holds = np.zeros(nodes.size, np.int64)  # forward ops held directly (innermost node)
    device = np.zeros(nodes.size, np.int64)  # device ns launched directly inside
    nested = np.zeros(nodes.size, np.int64)  # host ns of the nodes nested inside (reentrant only)
    seen: list[tuple[np.ndarray, np.ndarray]] = []  # (node, forward op name) of every forward op in a node
    # The forward work a node holds, compiled forwards and forward ops outside them: host ns, device ns.
    span_host = np.zeros(nodes.size, np.int64)
    span_device = np.zeros(nodes.size, np.int64)
    compiled_runs = np.zeros(nodes.size, np.int64)  # compiled forwards held directly
    for tid in np.unique(tr.tid[nodes]):
        on = np.flatnonzero(tr.tid[nodes] == tid)
        order = on[np.argsort(tr.ts[nodes[on]], kind="stable")]
        starts, ends = tr.ts[nodes[order]], tr.end[nodes[order]]
        lc = launches[tr.tid[launches] == tid]
        at = _innermost(starts, ends, tr.ts[lc], tr.end[lc])
        np.add.at(device, order[at[at >= 0]], launch_ns[np.searchsorted(launches, lc[at >= 0])])
        for group in (fwd, compiled):
            g = group[tr.tid[group] == tid]
            at = _innermost(starts, ends, tr.ts[g], tr.end[g])
            g, node = g[at >= 0], order[at[at >= 0]]
            if group is fwd:
                np.add.at(holds, node, 1)
                seen.append((node, tr.name[g]))
            else:
                np.add.at(compiled_runs, node, 1)
            np.add.at(span_host, node, tr.end[g] - tr.ts[g])
            k = span_of(tr, g, lc)  # the launches inside each span (spans of one kind do not overlap)
            np.add.at(span_device, node[k[k >= 0]], launch_ns[np.searchsorted(launches, lc[k >= 0])])
        # The nodes a reentrant node's nested backward ran: its host time and launches are not recomputed.
        for j in np.flatnonzero(kind[order] == _REENTRANT):
            inner = (starts > starts[j]) & (ends <= ends[j])
            inner[j] = False
            if inner.any():
                nested[order[j]] = iv.total(iv.union(starts[inner], ends[inner]))
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
        clean = same & (holds == 0) & (compiled_runs == 0)  # nodes that ran no forward work again
        base_h = int(np.median(host[clean])) if clean.any() else 0
        base_d = int(np.median(device[clean])) if clean.any() else 0
        hit = same & (holds > 0)
        host_again[hit] = np.maximum(host[hit] - base_h, 0)
        device_again[hit] = np.maximum(device[hit] - base_d, 0)
    # A compiled forward in a node not priced above (a built-in node holding forward ops has it in its time
    # already; a reentrant one, in its whole time): that node's forward work is what it ran again, the compiled
    # forwards and the forward ops beside them (a segment whose compiled code breaks its graph runs both).
    # Not AccumulateGrad's: its hooks run an optimizer, not a forward.
    accumulate = np.isin(names, [i for i, n in enumerate(tr.names) if "AccumulateGrad" in n])
    by_range = (compiled_runs > 0) & ~re_nodes & ~((kind == _BUILT_IN) & (holds > 0)) & ~accumulate
    host_again[by_range] = span_host[by_range]
    device_again[by_range] = span_device[by_range]
    again = re_nodes | ((kind == _BUILT_IN) & (holds > 0)) | by_range
    if not again.any():
        return None
    counts: dict[str, int] = {}
    for node_idx, name_ids in seen:
        for name_id in name_ids[again[node_idx]]:
            counts[tr.names[name_id]] = counts.get(tr.names[name_id], 0) + 1
    if runs := int(compiled_runs[again].sum()):
        counts[COMPILED_FORWARD] = runs
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:6]
    return Recompute(
        nodes=int(again.sum()), reentrant=int(re_nodes.sum()), host_ns=int(host_again[again].sum()),
        device_ns=int(device_again[again].sum()) if ctx.has_device else None,
        steps=len(ctx.win.steps), forward_ops=dict(top),
        batch_norm=sum(n for name, n in counts.items() if name in BATCH_NORM_OPS),
        compiled=int(by_range.sum()))


def span_of(tr, spans: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """For each event of ``idx``: the position in ``spans`` of the span on its thread that holds it, or -1.
    The spans of one thread must not overlap (outermost ranges)."""
    out = np.full(idx.size, -1, np.int64)
    for tid in np.unique(tr.tid[idx]) if spans.size else ():
        mine = np.flatnonzero(tr.tid[idx] == tid)
        st = np.flatnonzero(tr.tid[spans] == tid)
        if not st.size:
            continue
        st = st[np.argsort(tr.ts[spans[st]], kind="stable")]
        k = _innermost(tr.ts[spans[st]], tr.end[spans[st]], tr.ts[idx[mine]], tr.end[idx[mine]])
        out[mine[k >= 0]] = st[k[k >= 0]]
    return out


def _outermost(tr, idx: np.ndarray) -> np.ndarray:
    """The ops of ``idx`` not inside another of them on their thread (aten::conv2d, not the
    aten::convolution it calls): each call of a forward op once."""
    if idx.size == 0:
        return idx
    order = idx[np.lexsort((-tr.end[idx], tr.ts[idx], tr.tid[idx]))]
    tid, end = tr.tid[order], tr.end[order]
    before = np.maximum.accumulate(end)  # the latest end so far; reset per thread below
    first = np.ones(order.size, bool)
    first[1:] = tid[1:] != tid[:-1]
    starts = np.flatnonzero(first)
    for a, b in zip(starts, np.append(starts[1:], order.size), strict=True):
        before[a:b] = np.maximum.accumulate(end[a:b])
    inside = np.zeros(order.size, bool)
    inside[1:] = ~first[1:] & (before[:-1] >= end[1:])
    return np.sort(order[~inside])


def _node_kind(name: str) -> int:
    if not name.startswith(NODE_PREFIX):
        return _NOT_NODE
    node = name[len(NODE_PREFIX):].strip()
    if node in REENTRANT_NODES:
        return _REENTRANT
    # A derivative of a backward formula (double backward: a gradient penalty's create_graph=True):
    # ConvolutionBackwardBackward0 calls aten::convolution as its own formula, not as a recompute.
    if node.count("Backward") > 1:
        return _OTHER
    return _BUILT_IN if _BUILTIN.search(node) else _OTHER
