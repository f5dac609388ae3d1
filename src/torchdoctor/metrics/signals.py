"""Narrow signals for the diagnosis rules (rules/): blocking copies, where communication sits,
allocator calls, the math path of GEMMs/convolutions, optimizer internals, notable host ops.

Each is a pure function of (trace, window, context); `rule_signals` bundles them.
"""

from __future__ import annotations

import re

import numpy as np

from ..trace.model import Cat, RankTrace
from . import intervals as iv
from .accumulation import accumulation
from .classify import KernelKind, MathPath, math_path, memcpy_kind
from .context import Context
from .device import launched_device_ns, lookup, top_by_name
from .gemm import misaligned_gemms
from .host import enclosing_ops
from .model import CommLayout, CopySite, NamedTime, RuleSignals
from .occupancy import sm_fill
from .steps import outermost

COPY_APIS = frozenset({
    "cudaMemcpyAsync", "cudaMemcpy", "cudaMemcpy2DAsync", "cudaMemcpy2D", "cuMemcpyAsync",
    "cuMemcpyDtoHAsync_v2", "cuMemcpyHtoDAsync_v2", "hipMemcpyAsync", "hipMemcpy", "hipMemcpyWithStream",
})
ALLOC_APIS = frozenset({
    "cudaMalloc", "cudaFree", "cudaHostAlloc", "cudaFreeHost", "cudaMallocHost", "cudaMallocAsync",
    "cudaFreeAsync", "cuMemCreate", "cuMemMap", "cuMemUnmap", "cuMemRelease", "cuMemAddressReserve",
    "hipMalloc", "hipFree", "hipHostMalloc", "hipHostFree", "hipExtMallocWithFlags",
})
# A copy call shorter than this cannot have stalled the host in a way worth reporting.
BLOCKING_MIN_NS = 20_000
# Host clock and device clock are aligned by Kineto only to a few µs.
CLOCK_SLACK_NS = 5_000
# Exposed-communication pieces closer than this (or 1% of the step) belong to one block.
CLUSTER_GAP_MIN_NS = 500_000
# A per-parameter optimizer loop issues at least this many in-place ops (and kernels) per step.
SINGLE_TENSOR_MIN_OPS = 20
_LAYOUT = re.compile(r"nchwToNhwc|nhwcToNchw", re.IGNORECASE)
_OPT_CLASS = re.compile(r"^Optimizer\.step#(\w+)\.step")
_DL_ITER = re.compile(r"^enumerate\(DataLoader\)#(\w+)\.__next__")
MARKER_PREFIXES = (
    "DataParallel.forward", "DistributedDataParallel.forward", "FullyShardedDataParallel.",
    "FSDP::", "nccl:broadcast", "c10d::broadcast_", "aten::_foreach_", "aten::_fused_",
)


def rule_signals(ctx: Context, cause_sets: dict[str, iv.Intervals]) -> RuleSignals:
    tr = ctx.tr
    props = tr.device_properties[0] if tr.device_properties else {}
    cc = None
    if isinstance(props.get("computeMajor"), int):
        cc = f"{props['computeMajor']}.{props.get('computeMinor', 0)}"
    mem = props.get("totalGlobalMem")
    out = RuleSignals(compute_capability=cc, device_memory_bytes=mem if isinstance(mem, int) else None)
    if ctx.has_device:
        out.blocking_copies = blocking_copies(ctx, cause_sets.get("host_ops", iv.EMPTY))
        out.comm = comm_layout(ctx)
        simt = matmul_paths(ctx, out)
        out.sm_fill = sm_fill(ctx, simt)
    out.misaligned_gemms = misaligned_gemms(ctx)
    alloc = ctx.tr.mask(Cat.RUNTIME, Cat.DRIVER) & tr.name_mask(ALLOC_APIS.__contains__) & ctx.in_window
    out.alloc_calls = int(alloc.sum())
    out.alloc_ns = int((tr.end[alloc] - tr.ts[alloc]).sum())
    optimizer_internals(ctx, out)
    out.anomaly_checks = anomaly_checks(ctx)
    out.markers = markers(ctx)
    out.collectives = collectives(ctx)
    out.accumulation = accumulation(ctx)
    out.ddp_forward_self_ns = self_time(ctx, "DistributedDataParallel.forward")
    for n in tr.names:
        m = _DL_ITER.match(n)
        if m:
            out.dataloader_iter = m.group(1)
            break
    return out


def blocking_copies(ctx: Context, host_ops_idle: iv.Intervals, top_n: int = 8) -> list[CopySite]:
    """Copy API calls during which the host waited for the device copy to finish.

    A copy call (cudaMemcpyAsync & co) is joined to its device memcpy by correlation id. It blocked
    the host when the call lasted at least BLOCKING_MIN_NS and returned only once the device copy
    had ended: a device-to-host copy into pageable memory (`.cpu()`, `.tolist()`, `.numpy()`),
    or any copy through pageable memory, waits for everything queued before it on the stream. These
    are host-device syncs that the sync APIs miss. `idle_ns` counts device idle during the calls
    that the earlier idle causes (DataLoader, sync, optimizer, collectives) leave unclaimed.
    """
    tr = ctx.tr
    w = ctx.win
    calls = np.flatnonzero(tr.mask(Cat.RUNTIME, Cat.DRIVER) & tr.name_mask(COPY_APIS.__contains__)
                           & (tr.ts >= w.start) & (tr.ts < w.end) & (tr.correlation >= 0))
    if calls.size == 0:
        return []
    dev = np.flatnonzero(tr.mask(Cat.MEMCPY) & (tr.correlation >= 0))
    order = np.argsort(tr.correlation[dev], kind="stable")
    pos = lookup(tr.correlation[dev][order], dev[order], tr.correlation[calls])
    ok = pos >= 0
    calls, pos = calls[ok], pos[ok]
    host_dur = tr.end[calls] - tr.ts[calls]
    # A copy from pageable memory is staged through a pinned buffer by the driver, after the
    # stream's earlier work: the call returns when the last chunk is staged, a little before its
    # DMA ends (56 µs on kineto's tb_plugin V100 samples, after 8.6 ms of waiting for the queue).
    # Still running when the device copy began, it waited for the queue.
    kind = {n: memcpy_kind(tr.names[n]) for n in np.unique(tr.name[pos]).tolist()}  # once per copy name
    paged = np.fromiter((kind[n][1] == "pageable" for n in tr.name[pos].tolist()), bool, pos.size)
    waited = (tr.end[calls] + CLOCK_SLACK_NS >= tr.end[pos]) | (paged & (tr.end[calls] >= tr.ts[pos]))
    blocked = (host_dur >= BLOCKING_MIN_NS) & waited
    calls, pos = calls[blocked], pos[blocked]
    if calls.size == 0:
        return []
    inner, _ = enclosing_ops(ctx, calls)
    groups: dict[tuple[str, str, str, str], list[int]] = {}
    for k, (c, p) in enumerate(zip(calls, pos, strict=True)):
        d, h = kind[int(tr.name[p])]
        groups.setdefault((tr.names[tr.name[c]], d, h, inner[k]), []).append(k)
    sites = []
    for (api, d, h, op), members in groups.items():
        m = np.array(members)
        c, p = calls[m], pos[m]
        spans = iv.union(tr.ts[c], tr.end[c])
        longest = int(c[np.argmax(tr.end[c] - tr.ts[c])])
        sites.append(CopySite(
            api=api, direction=d, host_memory=h, op=op, region=enclosing_region(ctx, longest),
            count=int(m.size), host_ns=iv.total(spans), idle_ns=iv.total(iv.intersect(spans, host_ops_idle)),
            bytes=int(np.clip(tr.nbytes[p], 0, None).sum()), first_ts_ns=int(tr.ts[longest]),
        ))
    sites.sort(key=lambda s: -s.host_ns)
    return sites[:top_n]


def enclosing_region(ctx: Context, i: int) -> str:
    """Outermost user annotation (other than ProfilerStep#) around event i on its thread."""
    tr = ctx.tr
    m = ((tr.cat == Cat.USER_ANNOTATION) & (tr.tid == tr.tid[i]) & (tr.ts <= tr.ts[i]) & (tr.end >= tr.end[i]))
    for j in np.flatnonzero(m):  # sorted by start: the first hit is the outermost
        name = tr.names[tr.name[j]]
        if not name.startswith("ProfilerStep#"):
            return name
    return ""


def comm_layout(ctx: Context) -> CommLayout | None:
    """Per step: the densest run of exposed communication, and where it sits in the step.

    Exposed comm = comm kernel time with no compute kernel running. Its pieces are chained into
    runs while the gap between them stays under max(CLUSTER_GAP_MIN_NS, 1% of the step); the block
    is the run holding the most exposed comm. DDP's all-reduce issued after the last backward
    kernel shows up as one long block late in the step holding most of the exposed comm;
    well-overlapped buckets leave only scattered slivers.
    """
    if iv.total(ctx.comm) == 0 or not ctx.win.steps:
        return None
    blocks, spans, starts, exposed = [], [], [], []
    for s in ctx.win.steps:
        ex = iv.subtract(iv.clip(ctx.comm, s.start, s.end), ctx.compute)
        exposed.append(iv.total(ex))
        if ex[0].size == 0:
            blocks.append(0)
            spans.append(0)
            starts.append(np.nan)
            continue
        gap = max(CLUSTER_GAP_MIN_NS, s.dur // 100)
        new = np.ones(ex[0].size, bool)
        new[1:] = ex[0][1:] - ex[1][:-1] > gap
        first = np.flatnonzero(new)
        held = np.add.reduceat(ex[1] - ex[0], first)
        k = int(np.argmax(held))
        last = (first[k + 1] if k + 1 < first.size else ex[0].size) - 1
        blocks.append(int(held[k]))
        spans.append(int(ex[1][last] - ex[0][first[k]]))
        starts.append(100.0 * (ex[0][first[k]] - s.start) / max(s.dur, 1))
    n_comm = int(((ctx.kind == KernelKind.COMM) & ctx.in_window).sum())
    start = np.array(starts, dtype=float)
    return CommLayout(
        block_ms=round(float(np.median(blocks)) / 1e6, 4),
        block_span_ms=round(float(np.median(spans)) / 1e6, 4),
        block_start_pct=None if np.isnan(start).all() else round(float(np.nanmedian(start)), 1),
        exposed_ms=round(float(np.median(exposed)) / 1e6, 4),
        kernels_per_step=round(n_comm / len(ctx.win.steps), 2),
    )


def matmul_paths(ctx: Context, out: RuleSignals) -> np.ndarray:
    """GEMM/conv device time on tensor cores vs plain FP32 kernels, and layout conversions.

    Returns the mask of the plain FP32 (SIMT) GEMM/conv kernels in the window."""
    tr = ctx.tr
    kern = tr.mask(Cat.KERNEL) & ctx.in_window
    mm = kern & np.isin(ctx.kind, [KernelKind.GEMM, KernelKind.CONV])
    tc_names = tr.name_mask(lambda n: math_path(n) == MathPath.TENSOR_CORE)
    simt_names = tr.name_mask(lambda n: math_path(n) == MathPath.FP32_SIMT)
    out.matmul_ns = iv.total(ctx.clipped_union(mm))
    out.tensor_core_ns = iv.total(ctx.clipped_union(mm & tc_names))
    simt = mm & simt_names
    out.fp32_simt_ns = iv.total(ctx.clipped_union(simt))
    whole = (np.array([ctx.win.start]), np.array([ctx.win.end]))
    out.fp32_simt_top = top_by_name(ctx, np.flatnonzero(simt), whole, n=3)
    layout = kern & tr.name_mask(lambda n: bool(_LAYOUT.search(n)))
    out.layout_transpose_ns = iv.total(ctx.clipped_union(layout))
    out.layout_transpose_count = int(layout.sum())
    out.conv_ns = iv.total(ctx.clipped_union(kern & (ctx.kind == KernelKind.CONV)))
    return simt


def optimizer_internals(ctx: Context, out: RuleSignals) -> None:
    """Launches and aten ops inside Optimizer.step, the implementation they reveal, zero_grad fills."""
    tr = ctx.tr
    steps = max(len(ctx.win.steps), 1)
    opt = np.flatnonzero(ctx.optimizer_mask & ctx.in_window)
    if opt.size == 0:
        return
    names = [tr.names[tr.name[i]] for i in opt]
    out.optimizer_classes = sorted({m.group(1) for n in names if (m := _OPT_CLASS.match(n))})
    is_step = np.array([n.startswith("Optimizer.step#") for n in names])
    inside_step = _inside(ctx, opt[is_step])
    inside_zero = _inside(ctx, opt[~is_step])
    launches = inside_step & tr.mask(Cat.RUNTIME, Cat.DRIVER) & tr.name_mask(lambda n: "Launch" in n)
    # Outermost aten ops only: traces of torch <= 1.9 record the autograd layer's op around the
    # kernel's op of the same name (aten::add_ inside aten::add_), which counted every op twice.
    aten = _outermost_mask(tr, inside_step & tr.mask(Cat.CPU_OP) & tr.name_mask(lambda n: n.startswith("aten::")))
    out.optimizer_launches_per_step = round(int(launches.sum()) / steps, 2)
    ranges = outermost(tr, opt[is_step])
    lo, hi = np.maximum(tr.ts[ranges], ctx.win.start), np.minimum(tr.end[ranges], ctx.win.end)
    out.optimizer_step_ns = int(np.maximum(hi - lo, 0).sum())
    out.optimizer_device_ns = int(launched_device_ns(ctx, np.flatnonzero(launches)).sum())
    out.optimizer_ops_per_step = round(int(aten.sum()) / steps, 2)
    op_names = {tr.names[n] for n in np.unique(tr.name[aten])}
    inplace = aten & tr.name_mask(lambda n: n.endswith("_") and not n.startswith("aten::_foreach_"))
    n_inplace = int(inplace.sum()) / steps
    if any(n.startswith("aten::_fused_") for n in op_names) or any(
            c.startswith("Fused") for c in out.optimizer_classes):
        out.optimizer_impl = "fused"
    elif any(n.startswith("aten::_foreach_") for n in op_names):
        out.optimizer_impl = "foreach"
    elif n_inplace >= SINGLE_TENSOR_MIN_OPS and out.optimizer_launches_per_step >= 0.5 * n_inplace:
        # In-place ops issued one parameter at a time, each launching its own kernels: the
        # for-loop implementation (on the host, without launches, it is simply the CPU default).
        out.optimizer_impl = "single_tensor"
    zero = _outermost_mask(tr, inside_zero & tr.mask(Cat.CPU_OP) & tr.name_mask(lambda n: n == "aten::zero_"))
    out.zero_grad_fills_per_step = round(int(zero.sum()) / steps, 2)


ANOMALY_CHECK_OPS = frozenset({"aten::isnan", "aten::_is_any_true", "aten::item"})


def anomaly_checks(ctx: Context) -> list[int]:
    """[count, total ns] of autograd anomaly mode's NaN checks in the window ([] when none).

    With ``set_detect_anomaly(True)`` the autograd engine checks every output of every backward
    node: ``isnan(out)._is_any_true().item()``, recorded as those host ops directly inside the
    node's ``autograd::engine::evaluate_function:`` range (after the node's own op). Without
    anomaly mode the engine runs none of them there. Durations are the ops' own ranges (their
    children, e.g. aten::ne under aten::isnan, are inside them).
    """
    tr = ctx.tr
    cand = ctx.host & tr.mask(Cat.CPU_OP) & ctx.in_window & tr.name_mask(ANOMALY_CHECK_OPS.__contains__)
    if not (cand & tr.name_mask(lambda n: n == "aten::_is_any_true")).any():
        return []  # the common case: no anomaly mode, nothing to walk
    idx = np.flatnonzero(cand)
    parents, _ = enclosing_ops(ctx, idx)
    mine = np.array([p.startswith("autograd::engine::evaluate_function:") for p in parents], bool)
    count, total = int(mine.sum()), int((tr.end[idx[mine]] - tr.ts[idx[mine]]).sum())
    return [count, total] if count else []


def _outermost_mask(tr: RankTrace, m: np.ndarray) -> np.ndarray:
    """`m` less the events nested inside another event of `m` on their thread."""
    keep = np.zeros_like(m)
    keep[outermost(tr, np.flatnonzero(m))] = True
    return keep


def _inside(ctx: Context, outer: np.ndarray) -> np.ndarray:
    """Events that start inside any of the `outer` events on the same thread."""
    tr = ctx.tr
    m = np.zeros(len(tr), bool)
    for i in outer:
        lo = np.searchsorted(tr.ts, tr.ts[i], side="left")
        hi = np.searchsorted(tr.ts, tr.end[i], side="right")
        seg = slice(lo, hi)
        m[seg] |= (tr.tid[seg] == tr.tid[i]) & (tr.end[seg] <= tr.end[i])
    return m


def markers(ctx: Context) -> dict[str, list[int]]:
    """Counts and total ns of notable host ops (wrappers, FSDP ranges, foreach/fused optimizer ops)."""
    tr = ctx.tr
    m = ctx.host & ctx.in_window & tr.name_mask(lambda n: n.startswith(MARKER_PREFIXES))
    out: dict[str, list[int]] = {}
    for nid in np.unique(tr.name[m]):
        sel = m & (tr.name == nid)
        out[tr.names[nid]] = [int(sel.sum()), int((tr.end[sel] - tr.ts[sel]).sum())]
    return out


_COLLECTIVE = (
    ("all_reduce", re.compile(r"all_?reduce", re.I)), ("all_gather", re.compile(r"all_?gather", re.I)),
    ("reduce_scatter", re.compile(r"reduce_?scatter", re.I)), ("all_to_all", re.compile(r"all_?to_?all", re.I)),
    ("broadcast", re.compile(r"broadcast", re.I)), ("send_recv", re.compile(r"send|recv", re.I)),
)


def collectives(ctx: Context) -> dict[str, list[int]]:
    """Communication kernels in the window by collective: [count, total ns, shortest ns]."""
    tr = ctx.tr
    m = np.flatnonzero((ctx.kind == KernelKind.COMM) & ctx.in_window)
    out: dict[str, list[int]] = {}
    for nid in np.unique(tr.name[m]):
        name = tr.names[nid]
        kind = next((k for k, p in _COLLECTIVE if p.search(name)), "other")
        sel = m[tr.name[m] == nid]
        d = tr.end[sel] - tr.ts[sel]
        acc = out.setdefault(kind, [0, 0, int(d.min())])
        acc[0] += int(sel.size)
        acc[1] += int(d.sum())
        acc[2] = min(acc[2], int(d.min()))
    return out


def self_time(ctx: Context, name: str) -> int:
    """Time inside host ops called `name` not covered by any other op on their thread."""
    tr = ctx.tr
    idx = np.flatnonzero(ctx.host & ctx.in_window & tr.name_mask(lambda n: n == name))
    ops = ctx.host & tr.mask(Cat.CPU_OP, Cat.USER_ANNOTATION, Cat.RUNTIME, Cat.DRIVER) & ~tr.name_mask(
        lambda n: n == name or n.startswith("ProfilerStep#"))
    total = 0
    for i in idx:
        lo = np.searchsorted(tr.ts, tr.ts[i], side="left")
        hi = np.searchsorted(tr.ts, tr.end[i], side="right")
        seg = np.arange(lo, hi)
        seg = seg[ops[seg] & (tr.tid[seg] == tr.tid[i])]
        inner = iv.clip(iv.union(tr.ts[seg], tr.end[seg]), int(tr.ts[i]), int(tr.end[i]))
        total += int(tr.end[i] - tr.ts[i]) - iv.total(inner)
    return total


__all__ = ["NamedTime", "rule_signals"]
