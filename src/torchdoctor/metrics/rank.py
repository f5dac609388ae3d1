"""Assemble every metric of one rank into a `RankResult`."""

from __future__ import annotations

import numpy as np

from ..hardware.devices import from_trace_properties
from ..trace.model import RankTrace
from . import intervals as iv
from .choice import kernel_choice
from .collectives import collectives
from .compiled import break_gaps, compiled_regions
from .context import Context
from .device import device_kind, idle_causes, pct, stream_idle, timeline_sketch, utilisation
from .host import comm_ops, host_split, launches, syncs
from .kernels import kernel_breakdown
from .memory import memory_stats
from .model import Headline, RankResult, StepRow, WindowInfo
from .recompute import recompute
from .rooflinesum import roofline_summary
from .signals import rule_signals
from .steps import choose_window
from .weight_copies import weight_copies
from .work import kernel_work


def analyze_rank(tr: RankTrace, steps: str | None = None, label: str | None = None) -> RankResult:
    """All metrics of one rank over its window (see `steps.choose_window` for `steps`)."""
    win = choose_window(tr, steps)
    ctx = Context(tr, win)
    w = win.dur
    head = Headline()
    if ctx.has_device:
        for k, v in utilisation(ctx).items():
            setattr(head, k, v)
    causes, cause_sets = idle_causes(ctx)
    split, split_rows = host_split(ctx)
    dl = iv.total(ctx.dataloader)
    head.dataloader_pct = pct(dl, w)
    # Without a device the host waits for every batch it loads: all DataLoader time is exposed.
    exposed = iv.intersect(ctx.dataloader, ctx.idle) if ctx.has_device else ctx.dataloader
    head.dataloader_exposed_pct = pct(iv.total(exposed), w)
    head.sync_pct = pct(iv.total(ctx.sync), w) if ctx.has_device else None
    if not ctx.has_device:
        comm_host = ctx.clipped_union(ctx.comm_host_mask)
        head.comm_pct = pct(iv.total(comm_host), w)
        head.comm_exposed_pct = head.comm_pct
    if win.steps:
        head.step_ms_median = round(float(np.median([s.dur for s in win.steps])) / 1e6, 4)
    rows = step_rows(ctx, split_rows)
    busy, gaps = timeline_sketch(ctx, cause_sets) if ctx.has_device else ([], [])
    dev = from_trace_properties(tr.device_properties)
    work = kernel_work(ctx) if ctx.has_device else None
    return RankResult(
        rank=tr.rank, file=label or tr.path, device=tr.device_name, device_kind=device_kind(ctx),
        window=WindowInfo(win.start, win.end, [s.number for s in win.steps], win.mode,
                          list(win.skipped_warmup), win.boundaries),
        metrics=head, world_size=tr.world_size, backend=tr.backend, rank_source=tr.rank_source,
        steps=rows, stream_idle=stream_idle(ctx), idle_causes=causes, syncs=syncs(ctx),
        launches=launches(ctx), kernels=kernel_breakdown(ctx, dev=dev, work=work), host=split, comm_ops=comm_ops(ctx),
        timeline_busy=busy, timeline_gaps=gaps, events=len(tr), warnings=list(tr.warnings),
        compile_regions=compiled_regions(tr), compile_gaps_ms=break_gaps(tr, win), signals=rule_signals(ctx, cause_sets),
        collectives=collectives(ctx), roofline=roofline_summary(ctx, work, dev) if work is not None else None,
        choice=kernel_choice(ctx, work, dev) if work is not None else None, memory=memory_stats(ctx),
        recompute=recompute(ctx), weight_copies=weight_copies(ctx),
    )


def step_rows(ctx: Context, split_rows: list[dict[str, float]]) -> list[StepRow]:
    """Per-step numbers (ms), each measured inside the step's own [start, end)."""
    rows = []
    sync_idx = np.flatnonzero(ctx.sync_mask & ctx.in_window)
    for i, s in enumerate(ctx.win.steps):
        def within(x: iv.Intervals, s=s) -> int:
            return iv.total(iv.clip(x, s.start, s.end))

        row = StepRow(step=s.number, start_ns=s.start, dur_ms=round(s.dur / 1e6, 4))
        if ctx.has_device:
            busy = within(ctx.busy)
            comm = within(ctx.comm)
            row.busy_ms = round(busy / 1e6, 4)
            row.idle_ms = round((s.dur - busy) / 1e6, 4)
            row.comm_ms = round(comm / 1e6, 4)
            row.comm_exposed_ms = round((comm - within(iv.intersect(ctx.comm, ctx.compute))) / 1e6, 4)
            row.dataloader_exposed_ms = round(within(iv.intersect(ctx.dataloader, ctx.idle)) / 1e6, 4)
        else:
            row.dataloader_exposed_ms = round(within(ctx.dataloader) / 1e6, 4)
        row.dataloader_ms = round(within(ctx.dataloader) / 1e6, 4)
        row.sync_ms = round(within(ctx.sync) / 1e6, 4)
        ts = ctx.tr.ts[sync_idx]
        row.syncs = int(((ts >= s.start) & (ts < s.end)).sum())
        if i < len(split_rows):
            row.host_split_ms = split_rows[i]
        rows.append(row)
    return rows


