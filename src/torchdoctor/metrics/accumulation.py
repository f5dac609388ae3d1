"""Gradient accumulation that reduces gradients on every micro-batch of an optimizer step.

With gradient accumulation an optimizer step takes k forward and backward passes (micro-batches)
and only the gradients of the last one need to cross the ranks: DDP's ``no_sync()`` and FSDP2's
``set_requires_gradient_sync(False)`` skip the reduction of the others. A job that does not call
them all-reduces (DDP) or reduce-scatters (FSDP) every micro-batch: k times the gradient traffic.
torchtune's distributed recipes do this (they accumulate without either call).

Read from a window step that holds one optimizer step (``Optimizer.step#``). *Backward* is the
union of the autograd engine's node ranges and FSDP's post-backward ranges, on every thread.
*Root forwards* are the data-parallel wrapper's outermost forward ranges outside backward (FSDP2's
``FSDP::root_pre_forward``, DDP's ``DistributedDataParallel.forward``, FSDP1's outermost
``FullyShardedDataParallel.forward``; a checkpoint's recompute runs inside backward). A micro-batch
starts at the step's first root forward and at every root forward that follows some backward
since the previous one: two forwards before one backward (DPO's chosen and rejected, an evaluation,
a model with two sharded roots) are one micro-batch. A step with two or more is read. A *gradient
reduction* is a host collective call that reduces (``c10d::allreduce_``, ``c10d::_reduce_scatter_base_``,
``c10d::reduce_scatter_*`` ...) made inside the AccumulateGrad node's range (DDP's reducer and FSDP1
reduce from hooks there) or FSDP's post-backward ranges (FSDP2), on the same thread: a loss or
metric all-reduce in the loop, or a SyncBatchNorm's in its own backward node, is not one. The step
reduces on every micro-batch when each micro-batch holds at least SYNCED_SHARE of the reduction
calls of the last one (HSDP that skips only the all-reduce of the replicas, with
``set_requires_all_reduce(False)``, still reduce-scatters every micro-batch by design, and holds half).

``early_ns``: the communication time of those reductions in all micro-batches but each step's
last, summed over the steps: on a trace with device activity the device rows launched by those
calls (by correlation), less the time any other device work (compute, copies, other collectives)
ran beside them: the exposed part; on a host-only trace the union of the gradients' reduction ranges
(the calls and FSDP's ``post_backward_reduce`` and its waits inside the gradient nodes and FSDP's
post-backward ranges; the backends' ``gloo:all_reduce``/``nccl:reduce_scatter`` ranges on their
worker threads, which nothing ties to a call) from the step's first micro-batch to its last while
some thread was in backward, all of it exposed, as every other host collective time is. That is the time skipping those reductions gives
back, less what the skipped micro-batches then do instead (FSDP2 accumulates their unsharded
gradients), which is not priced: on torchtune's FSDP2 recipe the reductions took 12.8% of the
profiled step (11.8% of the unprofiled one, rules/_comm.accumulation_within_ms) and skipping them
gave back 10.8%.
"""

from __future__ import annotations

import re

import numpy as np

from ..trace.model import Cat, RankTrace
from . import intervals as iv
from .context import Context
from .model import Accumulation
from .steps import outermost

# The wrapper's outermost forward, by the range it records, and the name the report uses.
ROOT_FORWARDS = (("FSDP::root_pre_forward", "FSDP2"), ("DistributedDataParallel.forward", "DDP"),
                 ("FullyShardedDataParallel.forward", "FSDP"))
# Host collective calls that reduce (the dispatcher's c10d ops, one per call; allreduce_ covers _coalesced_).
_REDUCE_CALL = re.compile(r"^c10d::(allreduce_|_reduce_scatter_base_|reduce_scatter_)")
# Where gradients are reduced: DDP's reducer and FSDP1 from hooks on the AccumulateGrad node, FSDP2 in
# its post-backward ranges. A SyncBatchNorm's all-reduce runs in its own backward node: not a gradient's.
GRADIENT_NODE = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
# Host ranges of reductions in progress: the calls, the backends' ranges, FSDP's reduce and waits.
_REDUCE_RANGE = re.compile(
    r"^c10d::(allreduce|_reduce_scatter_base|reduce_scatter)|^(nccl|gloo|mpi|ucc|xccl|hccl):(all_?reduce|reduce_?scatter)"
    r"|^FSDP::post_backward_(reduce|rs_wait)")
# FSDP's post-backward ranges (the reduce runs there, and in the root's final callback).
_FSDP_BACKWARD = re.compile(r"^FSDP::(post_backward|root_post_backward)")
# A micro-batch reduces when it holds at least this share of the last micro-batch's reduction calls.
SYNCED_SHARE = 0.75


def accumulation(ctx: Context) -> Accumulation | None:
    """Accumulation over the window's steps (module docstring); None when no step holds one
    optimizer step and two or more micro-batches."""
    tr = ctx.tr
    host = ctx.host & ctx.in_window
    found = _root_forwards(ctx, host)
    if found is None:
        return None
    wrapper, root = found
    bwd = ctx.clipped_union(host & (ctx.backward_mask | tr.name_mask(_FSDP_BACKWARD.match)))
    opt = np.sort(tr.ts[host & tr.name_mask(lambda n: n.startswith("Optimizer.step#"))])
    calls = _gradient_calls(ctx, host)
    call_ts = tr.ts[calls]
    read = synced = micro = 0
    per_sync: list[int] = []
    early_calls: list[np.ndarray] = []
    spans: list[tuple[int, int]] = []
    for s in ctx.win.steps:
        starts = _micro_batches(root[(root >= s.start) & (root < s.end)], bwd)
        if starts.size < 2 or int(((opt >= s.start) & (opt < s.end)).sum()) != 1:
            continue
        edges = np.searchsorted(call_ts, np.append(starts, s.end))
        counts = np.diff(edges)
        read += 1
        micro += starts.size
        if counts[-1] == 0 or (counts[:-1] < SYNCED_SHARE * counts[-1]).any():
            continue
        synced += 1
        per_sync.append(int(round(float(np.median(counts)))))
        early_calls.append(calls[edges[0]:edges[-2]])
        spans.append((int(starts[0]), int(starts[-1])))
    if not read:
        return None
    picked = np.concatenate(early_calls) if early_calls else np.zeros(0, np.int64)
    kinds = sorted({"reduce-scatter" if "reduce_scatter" in n else "all-reduce" for n in tr.names_of(picked)})
    return Accumulation(
        wrapper=wrapper, steps=read, synced_steps=synced, micro_batches=round(micro / read, 2),
        reductions_per_micro_batch=int(round(float(np.median(per_sync)))) if per_sync else 0, kinds=kinds,
        early_ns=_early_ns(ctx, picked, spans, bwd) if spans else 0)


def _gradient_ranges(ctx: Context) -> np.ndarray:
    """Indices of the host reduction ranges of gradients: on a thread that holds gradient nodes or
    FSDP's post-backward ranges, those that start inside one (not a SyncBatchNorm's in its own
    node); on the other threads (the backend's workers: ``gloo:all_reduce``), all of them, which
    nothing ties to the call that queued them."""
    tr = ctx.tr
    ranges = np.flatnonzero(ctx.host & ctx.in_window & tr.name_mask(_REDUCE_RANGE.match))
    holders = np.flatnonzero(ctx.host & ctx.in_window & tr.name_mask(_is_holder))
    return ranges[_held(tr, ranges, holders) | ~np.isin(tr.tid[ranges], tr.tid[holders])]


def _is_holder(name: str) -> bool:
    return name == GRADIENT_NODE or bool(_FSDP_BACKWARD.match(name))


def _gradient_calls(ctx: Context, host: np.ndarray) -> np.ndarray:
    """The reduction calls made inside a gradient's node or FSDP's post-backward range on their own
    thread, sorted by start."""
    tr = ctx.tr
    calls = np.flatnonzero(host & tr.name_mask(_REDUCE_CALL.match))
    calls = calls[_held(tr, calls, np.flatnonzero(host & tr.name_mask(_is_holder)))]
    return calls[np.argsort(tr.ts[calls], kind="stable")]


def _held(tr: RankTrace, idx: np.ndarray, holders: np.ndarray) -> np.ndarray:
    """Which events of ``idx`` start inside one of the ``holders`` ranges on their own thread."""
    out = np.zeros(idx.size, bool)
    for tid in np.unique(tr.tid[idx]):
        on = tr.tid[idx] == tid
        mine = holders[tr.tid[holders] == tid]
        out[on] = _inside(tr.ts[idx[on]], iv.union(tr.ts[mine], tr.end[mine]))
    return out


def _root_forwards(ctx: Context, host: np.ndarray) -> tuple[str, np.ndarray] | None:
    """(wrapper, sorted start times) of the first wrapper whose forward ranges the window holds:
    outermost on their thread, and outside backward (a checkpoint's recompute)."""
    tr = ctx.tr
    for name, label in ROOT_FORWARDS:
        m = host & tr.name_mask(lambda n, name=name: n.startswith(name))
        if m.any():
            starts = np.sort(tr.ts[outermost(tr, np.flatnonzero(m))])  # FSDP1's nested units record it too
            starts = starts[~_inside(starts, ctx.clipped_union(host & ctx.backward_mask))]
            return label, starts
    return None


def _micro_batches(starts: np.ndarray, bwd: iv.Intervals) -> np.ndarray:
    """The root forwards that start a micro-batch: the first, and each one with backward since the
    previous root forward."""
    if starts.size < 2:
        return starts
    ran = iv.covered_by(starts[:-1], starts[1:], bwd) > 0
    return starts[np.concatenate(([True], ran))]


def _early_ns(ctx: Context, calls: np.ndarray, spans: list[tuple[int, int]], bwd: iv.Intervals) -> int:
    """The reductions' time as the module docstring counts it: the exposed device rows launched by
    ``calls`` with device activity, else the host reduction ranges inside ``spans`` while backward ran."""
    tr = ctx.tr
    if not (ctx.device_work & ctx.in_window).any():  # as the rules' has_device_trace: the window's own
        s0 = np.array([a for a, _ in spans], np.int64)
        s1 = np.array([b for _, b in spans], np.int64)
        ranges = _gradient_ranges(ctx)
        ranges = iv.clip(iv.union(tr.ts[ranges], tr.end[ranges]), ctx.win.start, ctx.win.end)
        return iv.total(iv.intersect(iv.intersect(ranges, iv.union(s0, s1)), bwd))
    launches = np.flatnonzero(tr.mask(Cat.RUNTIME, Cat.DRIVER) & (tr.correlation >= 0) & ctx.in_window)
    launches = launches[_held(tr, launches, calls)]
    rows = ctx.device_work & np.isin(tr.correlation, tr.correlation[launches])
    own = ctx.clipped_union(rows)
    return iv.total(iv.subtract(own, ctx.clipped_union(ctx.device_work & ~rows)))


def _inside(ts: np.ndarray, within: iv.Intervals) -> np.ndarray:
    """Which instants of ``ts`` lie inside the interval set."""
    return iv.covered_by(ts, ts + 1, within) > 0

