"""Host layer: the device waits for the CPU — syncs, launch overhead, slow host code (HO-1..HO-13).

Idle-budget ownership (claims ledger, rules/ledger.py): HO-11 claims first the blocking
device-to-host copies around modules left on the CPU, HO-3 the rest of those copies and, with
HO-4/HO-7, the blocking syncs (split by site); HO-9/HO-10 the idle during the optimizer; HO-2
the launch cost into an empty queue; HO-5, the generic host-bound rule, claims what is left of
the host-op, untraced and optimizer idle.
"""

from __future__ import annotations

import re

from ..advice.command import job_command
from ..advice.optimizer import FUSED_CLASSES
from ..callsite import display_name, library_of, package_relative
from ..facts import forward_unseen
from ..metrics.classify import BLOCKING_COPY_APIS
from ..metrics.model import SyncSite
from ._common import (
    View,
    at,
    converting_collate,
    data_wait_ms,
    env_on,
    finding,
    fmt_ms,
    launch_overhead_ms,
    per_rank,
    tops_text,
    ts_item,
    views,
    worker_collate_wait_ms,
    worker_split_text,
)
from ._cpu import run_delay, training_processes
from .engine import GENERIC, MEASURED, UMBRELLA, RuleInputs, rule
from .model import Evidence, Finding, Fix

# HTA cuda_kernel_analysis: runtime_cutoff 50 µs, launch_delay_cutoff 100 µs.
RUNTIME_CUTOFF_NS = 50_000
LAUNCH_DELAY_CUTOFF_NS = 100_000
# The aten ops around a host-device copy, and how much more idle than the copy findings claimed
# one may hold and still be theirs (the op also holds its own dispatch, outside the copy call).
COPY_OPS = frozenset({"aten::to", "aten::_to_copy", "aten::copy_"})
COPY_CLAIM_COVER = 1.2
# TBP: per-GPU utilization < 50% → "increase batch size" (HO-1 umbrella).
LOW_UTIL_IDLE_PCT = 50.0
# Optimizers whose torch.optim constructor takes fused=True (checked against the pinned torch in
# tests/rules/test_host.py); the others get foreach (Adamax, RAdam and NAdam have foreach but no
# fused: `NAdam(params, fused=True)` is a TypeError).
TORCH_OPTIMIZERS = FUSED_CLASSES | {"Adamax", "RAdam", "NAdam", "RMSprop", "Rprop", "ASGD", "Adadelta", "Adafactor"}


# --- sync-site classes and their share of the sync idle -----------------------------------------

def sync_class(s: SyncSite) -> str:
    if s.api in BLOCKING_COPY_APIS:
        return "HO-4"
    if "Synchronize" in s.api and not s.op:
        return "HO-7"
    return "HO-3"


def sync_idle_ms(v: View, cls: str) -> tuple[float, list[SyncSite]]:
    """Sync-cause idle per step owned by one class, split over sites by their host time."""
    if v.r is None:
        return 0.0, []
    sites = v.r.syncs.sites
    total = sum(s.ns for s in sites) or 1
    mine = [s for s in sites if sync_class(s) == cls]
    return v.cause_ms("sync") * sum(s.ns for s in mine) / total, mine


def off_device(v: View) -> list:
    return list(v.f.modules_off_device) if v.f is not None else []


def optimizer_idle_ms(v: View, zero_grad: bool) -> float:
    """Device idle per step during Optimizer.step (zero_grad=False) or Optimizer.zero_grad."""
    c = v.cause("optimizer")
    if c is None or not c.ns:
        return 0.0
    named = sum(t.ns for t in c.top) or 1
    part = sum(t.ns for t in c.top if t.name.startswith("Optimizer.zero_grad") == zero_grad)
    return v.ms(c.ns) * part / named


def single_tensor(v: View) -> tuple[bool, str]:
    """(the optimizer runs one parameter at a time, evidence)."""
    if v.f is not None:
        for o in v.f.optimizers:
            if v.accel and o.foreach is False and not o.fused:
                return True, f"{o.cls or 'optimizer'}(foreach=False) on an accelerator"
    s = v.r.signals if v.r is not None else None
    if s is not None and s.optimizer_impl == "single_tensor":
        return True, (f"{', '.join(s.optimizer_classes)} issues {s.optimizer_ops_per_step:.0f} in-place ops and "
                      f"{s.optimizer_launches_per_step:.0f} kernel launches per step, one parameter at a time")
    return False, ""


def collate_ms(v: View) -> float:
    """Measured time per batch in a converting collate_fn run in the training process (num_workers=0).

    Only the probe sees it (``collate_ms_mean``, one batch per step). The gain assumes a collate
    built from whole-tensor ops (torch.stack) costs little next to per-sample conversions.
    """
    if v.f is None:
        return 0.0
    ms = [d.collate_ms_mean for d in v.f.dataloaders
          if d.num_workers == 0 and d.collate_syncs_per_batch and d.collate_ms_mean]
    return ms[0] if ms else 0.0


# --- rules -----------------------------------------------------------------------------------------

@rule("HO-1", priority=UMBRELLA)
def low_utilisation(inputs: RuleInputs) -> list[Finding]:
    """Umbrella: the device is idle most of the step (TBP: utilization < 50%; NSYS gpu_time_util 50%).

    Never fixed directly (catalogue): it claims no time and only shows where the idle time goes;
    the other rules own the parts.
    """
    def one(v: View) -> Finding | None:
        if v.r is not None and v.r.device_kind != "cpu" and not v.has_device_trace:
            return finding(
                v, "HO-1", "host", "The analysed window holds no device work: the kernels ran outside the "
                f"profiler steps ({v.r.window.mode}).", 0.0, sev="info", confidence="high",
                evidence=[Evidence(f"Window: {len(v.r.window.steps)} step(s), {fmt_ms(v.step_ms or 0)} per step, "
                                   f"device busy {v.r.metrics.busy_pct or 0:.3f}% of it.",
                                   {"steps": v.r.window.steps, "busy_pct": v.r.metrics.busy_pct})],
                source="window selection (metrics/steps.py)",
                fix=Fix("Analyse the whole trace instead of the steps.", "torchdoctor analyze TRACE --steps trace",
                        "shell"))
        if not v.has_device_trace or v.r is None or (v.r.metrics.idle_pct or 0) < LOW_UTIL_IDLE_PCT:
            return None
        idle = v.window_ms(v.r.metrics.idle_pct)
        parts = {c.cause: round(v.ms(c.ns), 3) for c in v.r.idle_causes if c.ns}
        return finding(
            v, "HO-1", "host",
            f"The device is idle {v.r.metrics.idle_pct:.0f}% of the step ({fmt_ms(idle)} of {fmt_ms(v.step_ms or 0)}); "
            "the findings above attribute it.", 0.0, sev="info",
            evidence=[Evidence("Idle per step by what the host was doing: "
                               + ", ".join(f"{k} {fmt_ms(x)}" for k, x in parts.items()) + ".", parts)],
            confidence="high", source="TBP GPU utilization < 50%; NSYS gpu_time_util")
    return per_rank(inputs, one)


@rule("HO-2", budgets=("idle.host",))
def launch_bound(inputs: RuleInputs) -> list[Finding]:
    """Launch-bound: many short kernels launched into an (almost) empty queue.

    HTA: a launch usually costs 5-20 µs; a short kernel runs shorter than its launch. Fires when
    most launches find <= 1 kernel queued (BE/HTA queue depth ≈ 0) or >= 30% of kernels are short.
    Gain: the launch cost of launches into a starving queue (see _common.launch_overhead_ms).
    """
    def one(v: View) -> Finding | None:
        if not v.has_device_trace or v.r is None:
            return None
        ls = v.r.launches
        if (ls.queue_le1_pct or 0) < 50 and (ls.short_kernels_pct or 0) < 30:
            return None
        gain = launch_overhead_ms(v)
        if v.pct(gain) < 0.5:
            return None
        compiled = bool(v.r.compile_regions)
        return finding(
            v, "HO-2", "host",
            f"Launch-bound: {ls.kernels_per_step or 0:.0f} kernels per step, {ls.short_kernels_pct or 0:.0f}% of them "
            f"shorter than their launch, and {ls.queue_le1_pct or 0:.0f}% of launches find the queue (almost) empty.",
            gain,
            evidence=[Evidence(f"Median launch {(ls.launch_ns_median or 0) / 1e3:.1f} µs, median queue depth "
                               f"{ls.queue_depth_median}; launch cost into a starving queue {fmt_ms(gain)} per step.", {
                "kernels_per_step": ls.kernels_per_step, "launch_us_median": round((ls.launch_ns_median or 0) / 1e3, 2),
                "short_kernels_pct": ls.short_kernels_pct, "queue_le1_pct": ls.queue_le1_pct,
                "queue_depth_median": ls.queue_depth_median})],
            fix=Fix("Cut launches: capture the step in CUDA graphs (torch.compile mode='reduce-overhead'), "
                    "fuse with torch.compile, or raise the batch size.",
                    "model = torch.compile(model, mode='reduce-overhead')"),
            confidence="medium", remedy="cudagraphs" if compiled else "compile",
            source="HTA launch 5-20 µs, short kernels; BE queue depth", budget="idle.host")
    return per_rank(inputs, one)


def _sync_finding(v: View, sid: str, ms: float, sites: list[SyncSite], title: str, fix: Fix,
                  source: str, extra: list[Evidence] | None = None, site_ms: float | None = None) -> Finding:
    site_ms = ms if site_ms is None else site_ms
    budget = {"idle.sync": site_ms, "idle.host.dtoh_copy": ms - site_ms}
    items = [ts_item(s.op or s.api, s.ns, s.count, s.first_ts_ns, v.n_steps, api=s.api,
                     top_op=s.top_op, why=s.explanation) for s in sites[:5]]
    where = "; ".join(f"{s.api} in {s.op or 'no aten op'} under {s.top_op or '-'} = {s.explanation} "
                      f"({s.count}x, {fmt_ms(v.ms(s.ns))}/step, first {at(v, s.first_ts_ns)})" for s in sites[:3])
    ev = [Evidence(f"{sum(s.count for s in sites)} blocking sync calls in the window; the device sits idle "
                   f"{fmt_ms(site_ms)} per step meanwhile. {where}.", {"idle_ms": round(site_ms, 3)}, items)
          ] if sites and site_ms >= 0.001 else []
    # The larger share of the idle speaks first.
    parts = sorted(ev + (extra or []), key=lambda e: -max((x for x in e.values.values()
                                                           if isinstance(x, (int, float))), default=0))
    return finding(v, sid, "host", title, ms, evidence=parts, fix=fix, confidence="high", source=source,
                   budget=budget)


# Share of the counted syncs that must lie in one installed package for HO-3 to call them its own.
LIBRARY_SYNC_SHARE = 0.9


def library_sync(sites: list[tuple[str, int]]) -> tuple[str, str] | None:
    """(package, "its/file.py:LINE") when LIBRARY_SYNC_SHARE or more of the syncs the probe counted
    lie in one installed package (mmengine's RuntimeInfoHook logs the loss through
    MessageHub.update_scalar, .item() at message_hub.py:346, at every iteration); else None (the
    job's own lines hold more than the rest, or several packages share the syncs: the generic text
    then, whose evidence lists the sites). The probe records the innermost frame outside torch, so a
    site in a package is that package's code, called from the job's loop or from the package's own."""
    total = sum(n for _, n in sites)
    if not total:
        return None
    by_lib: dict[str, int] = {}
    first: dict[str, str] = {}  # each package's most frequent site (``sites`` come most frequent first)
    for site, n in sites:
        lib = library_of(site.rpartition(":")[0] or site)
        if lib is not None:
            by_lib[lib] = by_lib.get(lib, 0) + n
            first.setdefault(lib, site)
    lib = max(by_lib, key=lambda k: by_lib[k], default=None)
    if lib is None or by_lib[lib] < LIBRARY_SYNC_SHARE * total:
        return None
    return display_name(lib), package_relative(first[lib])


@rule("HO-3", priority=MEASURED, budgets=("idle.sync", "idle.host.dtoh_copy", "data.wait"))
def implicit_syncs(inputs: RuleInputs) -> list[Finding]:
    """Implicit host-device syncs in the hot loop: .item(), .cpu(), .tolist(), .numpy(), nonzero...

    Trace: cudaStreamSynchronize & co. tied to their aten op, and device-to-host copies into
    pageable memory during which the host waited (they sync too, and the sync APIs miss them).
    Threshold (catalogue, proposed): sync time > 5% of the step → warning. Gain: the device idle
    while the host was blocked. Live facts: syncs counted per step and in collate_fn.
    """
    out: list[Finding] = []

    def traced(v: View) -> Finding | None:
        ms, sites = sync_idle_ms(v, "HO-3")
        copies = [c for c in (v.r.signals.blocking_copies if v.r and v.r.signals else []) if c.direction == "DtoH"]
        copy_ms = v.left("idle.host.dtoh_copy")  # HO-11 claims the copies around CPU modules first
        total = ms + copy_ms
        facts_syncs = v.f.host_syncs_per_step if v.f is not None else None
        if v.pct(total) < 0.5:
            if facts_syncs and facts_syncs >= 1:
                return _facts_syncs(v, facts_syncs)
            return None
        extra = []
        if copies and copy_ms:
            where = "; ".join(f"{c.op} in {c.region or '-'} ({c.count}x, host blocked {fmt_ms(v.ms(c.host_ns))}/step, "
                              f"{c.bytes} B, longest {at(v, c.first_ts_ns)})" for c in copies[:3])
            extra.append(Evidence(
                "Device-to-host copies into pageable memory block the host until the queue drains "
                f"({fmt_ms(copy_ms)} of device idle per step): {where}.", {"copy_idle_ms": round(copy_ms, 3)},
                [ts_item(c.region or c.op, c.host_ns, c.count, c.first_ts_ns, v.n_steps, op=c.op,
                         bytes=c.bytes) for c in copies[:4]]))
        where = (copies[0].region or copies[0].op) if copies and copy_ms >= ms else (sites[0].op if sites else "")
        what = sites[0].explanation if sites and ms >= copy_ms else ".cpu()/.tolist()/.item() into pageable memory"
        return _sync_finding(
            v, "HO-3", total, sites,
            f"Hidden host-device syncs ({what}) in {where or 'the step'} leave the device idle "
            f"{fmt_ms(total)} per step ({v.pct(total):.0f}%).",
            Fix("Keep values on the device and read them every N steps; copy results into a pinned "
                "buffer with non_blocking=True and wait on an event only when needed; replace "
                "data-dependent shapes (nonzero, boolean masks) with torch.where.",
                "if step % 50 == 0:\n    print(loss.item())   # not every step\n"
                "buf = torch.empty(n, pin_memory=True); buf.copy_(t, non_blocking=True); ev.record()"),
            "NSYS cuda_api_sync; TTG avoid syncs; proposed > 5% of step", extra, site_ms=ms)

    def _facts_syncs(v: View, per_step: float) -> Finding:
        sites = sorted(v.f.host_sync_sites.items(), key=lambda kv: -kv[1]) if v.f else []
        on_dev = v.accel
        lib = library_sync(sites)
        fix = Fix("Log every N steps, or accumulate on the device and read once.",
                  "running += loss.detach()\nif step % 50 == 0:\n    print((running / 50).item()); running.zero_()")
        if lib is not None:
            fix = Fix(f"The sync is inside {lib[0]} ({lib[1]}), not in the job's own lines: the job calls {lib[0]} "
                      f"in its loop (a metric, a logger), or {lib[0]} runs the loop and reads the value itself. "
                      f"Call it less often where the job calls it; where {lib[0]} runs the loop, only a setting of "
                      "its own that reads less often removes it.")
        return finding(
            v, "HO-3", "host",
            f"{per_step:.0f} host sync(s) per step "
            + (f"(in {lib[0]}'s code, {lib[1]})" if lib is not None else "(e.g. loss.item() every step)")
            + ("" if on_dev else ": free on the CPU, but each drains the queue on an accelerator."),
            0.0, sev="warning" if on_dev and per_step >= 1 else "info",
            evidence=[Evidence(f"{per_step:.1f} syncs per step counted by the probe"
                               + (": " + ", ".join(f"{s_} ({n}x)" for s_, n in sites[:3]) if sites else "") + "."
                               + ("" if on_dev else " Without an accelerator an installed library's conversions "
                                  "count only for tensors of the autograd graph (its metadata and shape tensors "
                                  "stay on the CPU on any machine; a detached loss it reads would not): a lower "
                                  "bound."),
                               {"per_step": per_step},
                               [{"site": s, "count": n} for s, n in sites[:5]])],
            fix=fix,
            confidence="medium" if on_dev else "high",
            confirm="the profiler window (`torchdoctor run` on the accelerator) measures the idle time" if on_dev else "",
            source="TTG avoid unnecessary synchronizations")

    def worker_collate(v: View) -> Finding | None:
        d = converting_collate(v)
        if d is None:
            return None
        gain = worker_collate_wait_ms(v, d)
        if v.pct(gain) < 0.5:
            return None  # the workers keep up: their collate costs CPU, not waiting (HO-14 prices that)
        wait = data_wait_ms(v)
        return finding(
            v, "HO-3", "host",
            f"collate_fn {d.collate_fn or ''} converts tensors element by element in the DataLoader workers "
            f"({d.worker_collate_syncs_per_batch:.0f} per batch, {fmt_ms(d.worker_collate_ms_mean or 0)} of a "
            f"worker's batch): the step waits for batches it slows down.",
            gain, evidence=[Evidence(worker_split_text(d) + f" Claimed: the collate's share of the "
                                     f"{fmt_ms(wait)} the step waits for batches not yet produced.",
                                     {"conversions_per_batch": d.worker_collate_syncs_per_batch,
                                      "collate_ms": d.worker_collate_ms_mean, "dataset_ms": d.worker_dataset_ms_mean,
                                      "data_wait_ms": round(wait, 3)})],
            fix=Fix("Collate with tensor ops (torch.stack / torch.as_tensor on whole arrays) instead of "
                    "per-sample .item()/.numpy(): each worker produces its batch sooner.",
                    "def collate(batch):\n    xs, ys = zip(*batch)\n    return torch.stack(xs), torch.as_tensor(ys)"),
            confidence="medium", confirm="an A/B with the vectorised collate",
            source="the workers' own collate timing (probe/workers.py)", budget="data.wait")

    def collate(v: View) -> Finding | None:
        if v.f is None:
            return None
        dls = [d for d in v.f.dataloaders if d.collate_syncs_per_batch]
        if not dls:
            return worker_collate(v)
        d = dls[0]
        wait = data_wait_ms(v)
        gain = min(collate_ms(v), v.left("data.wait"))  # the collate cost is inside the DataLoader wait
        cost = (f"it takes {fmt_ms(d.collate_ms_mean)} per batch of the {fmt_ms(wait)} the step waits for data"
                if d.collate_ms_mean else f"the batch wait is {fmt_ms(wait)} per step (claimed by the DataLoader findings)")
        return finding(
            v, "HO-3", "host",
            f"collate_fn {d.collate_fn or ''} converts tensors element by element (.item()/.numpy()/.tolist(), "
            f"{d.collate_syncs_per_batch:.0f} per batch): slow Python on the data path"
            + (", and a device sync for tensors on the accelerator." if v.accel else "."),
            # Timed: the collate's own share of the step decides (HO-3's 5%); untimed, the wait it hides in.
            gain, sev="warning" if v.pct(gain if d.collate_ms_mean else wait) >= 5 else "info",
            evidence=[Evidence(f"Conversions per batch inside collate_fn; {cost}"
                               + (" (timed by the probe; the gain assumes a collate of whole-tensor ops costs "
                                  "little next to it)." if gain else "."),
                               {"collate_syncs_per_batch": d.collate_syncs_per_batch, "data_wait_ms": round(wait, 3),
                                "collate_ms": d.collate_ms_mean})],
            fix=Fix("Collate with tensor ops (torch.stack / torch.as_tensor on whole arrays) instead of "
                    "per-sample .item()/.numpy(); keep collate free of device tensors.",
                    "def collate(batch):\n    xs, ys = zip(*batch)\n    return torch.stack(xs), torch.as_tensor(ys)"),
            confidence="high", source="TTG avoid unnecessary synchronizations", budget="data.wait")

    out.extend(per_rank(inputs, traced))
    out.extend(per_rank(inputs, collate))
    return out


@rule("HO-4", priority=MEASURED, budgets=("idle.sync", "idle.host.dtoh_copy"))
def sync_copy_apis(inputs: RuleInputs) -> list[Finding]:
    """Synchronous memcpy/memset APIs (cudaMemcpy, cudaMemset without Async).

    NSYS cuda_memcpy_sync / cuda_memset_sync flag every call (H2D <= 64 KB excluded, which CUDA
    treats as asynchronous). Gain: the device idle while the host sat in them.
    """
    def one(v: View) -> Finding | None:
        ms, sites = sync_idle_ms(v, "HO-4")
        if not sites or v.pct(ms) < 0.5:
            return None
        return _sync_finding(
            v, "HO-4", ms, sites,
            f"Synchronous copy APIs ({', '.join(sorted({s.api for s in sites}))}) block the host; the device idles "
            f"{fmt_ms(ms)} per step.",
            Fix("Use asynchronous copies from pinned memory (tensor.to(device, non_blocking=True)) and keep "
                "device-to-host reads out of the hot loop.", "x = x.pin_memory().to(device, non_blocking=True)"),
            "NSYS cuda_memcpy_sync / cuda_memset_sync")
    return per_rank(inputs, one)


@rule("HO-7", priority=MEASURED, budgets=("idle.sync", "idle.host.dtoh_copy"))
def explicit_syncs(inputs: RuleInputs) -> list[Finding]:
    """Explicit torch.cuda.synchronize() / event.synchronize() in the loop (timing code).

    Trace: cudaDeviceSynchronize/cudaStreamSynchronize/cudaEventSynchronize outside any aten op;
    set_sync_debug_mode does not see these. NSYS cuda_api_sync lists them; gain = device idle.
    """
    def one(v: View) -> Finding | None:
        ms, sites = sync_idle_ms(v, "HO-7")
        if not sites or v.pct(ms) < 0.5:
            return None
        return _sync_finding(
            v, "HO-7", ms, sites,
            f"Explicit synchronize calls in the step leave the device idle {fmt_ms(ms)} per step.",
            Fix("Time with CUDA events read lazily; synchronize only at log intervals.",
                "start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)\n"
                "start.record(); ...; end.record()  # read end.elapsed_time(start) every N steps"),
            "NSYS cuda_api_sync")
    return per_rank(inputs, one)


@rule("HO-5", priority=GENERIC, budgets=("idle.host",))
def host_bound(inputs: RuleInputs) -> list[Finding]:
    """Host-bound: the device waits while the host runs ops or Python (queue-depth ≈ 0).

    HTA/BE: a queue near empty means host-bound. Generic rule (priority GENERIC): it claims what
    the specific findings left of the idle spent in host ops, untraced Python and the optimizer
    (the ledger's ``idle.host``). Severity ladder TBP 5% / TML RESIDUAL_HEAVY critical 20%.
    """
    def one(v: View) -> Finding | None:
        if not v.has_device_trace or v.r is None:
            return None
        ops, untraced, opt = v.cause_ms("host_ops"), v.cause_ms("untraced"), v.cause_ms("optimizer")
        rest = v.left("idle.host")
        claimed = v.claimed("idle.host")
        if v.pct(rest) < 0.5:
            return None
        c = v.cause("host_ops")
        tops = [t for t in (c.top if c else []) if not t.name.startswith("ProfilerStep#")]
        opt_left = v.left("idle.host.optimizer")
        oc = v.cause("optimizer")
        if oc is not None and opt_left > 0.1 * rest:
            tops += list(oc.top)
        tops.sort(key=lambda t: -t.ns)
        # Idle inside blocking copies is DL-4's and HO-3's: a copy op they priced does not lead here.
        copies = v.claimed("idle.host.htod_pageable") + v.claimed("idle.host.dtoh_copy")
        all_ops = [t for t in tops if not t.region]
        op_tops = [t for t in all_ops if not (t.name in COPY_OPS and v.ms(t.ns) <= COPY_CLAIM_COVER * copies)] or all_ops
        if untraced > ops:
            doing = "is outside any traced op (Python between ops, compilation, I/O, or an untraced thread)"
            lead = "untraced host work"
        elif tops and tops[0].region and (not all_ops or all_ops[0].ns < tops[0].ns / 2):
            # A labelled region (record_function) covers the idle but its ops do not: the time is
            # the region's own Python, and the region is the user's code, not something to move.
            inner = [f"`{_short(t.name)}`" for t in tops[1:] if t.region][:2]
            lead = (f"the Python between ops in the `{_short(tops[0].name)}` region"
                    + (f" (and in {', '.join(inner)})" if inner else ""))
            doing = f"runs {lead} and other host work"
        else:
            lead = _short(op_tops[0].name) if op_tops else "host ops"
            doing = f"runs {lead} and other host work"
        fix = _host_bound_fix(v, lead, tops, op_tops)
        ls = v.r.launches
        return finding(
            v, "HO-5", "host",
            ("Host-bound: t" if v.pct(rest) >= 5 else "T")
            + f"he device waits {fmt_ms(rest)} per step ({v.pct(rest):.0f}%) while the host {doing}.",
            rest,
            evidence=[Evidence(f"Device idle per step: host ops {fmt_ms(ops)}, untraced {fmt_ms(untraced)}, optimizer "
                               f"{fmt_ms(opt)}; specific findings claim {fmt_ms(claimed)}; "
                               f"{ls.queue_le1_pct or 0:.0f}% of launches find <= 1 kernel queued. "
                               f"Top host ops during that idle (before the shares): {tops_text(v, tops)}.",
                               {"host_ops_ms": round(ops, 3), "untraced_ms": round(untraced, 3),
                                "optimizer_ms": round(opt, 3), "claimed_elsewhere_ms": round(claimed, 3),
                                "queue_le1_pct": ls.queue_le1_pct},
                               [ts_item(t.name, t.ns, t.count, t.first_ts_ns, v.n_steps) for t in tops[:5]])],
            fix=fix, confidence="medium", remedy="compile",
            confirm="profile the host side (py-spy, or torch.profiler with_stack=True) to see the Python behind it",
            source="HTA/BE queue depth; TBP 5%; TML RESIDUAL_HEAVY 20%", budget="idle.host")
    return per_rank(inputs, one)


# torch.compile's answer to per-op overhead, with CUDA graphs where the trace replays none yet.
_FUSE = "torch.compile fuses the ops into fewer kernels"
_GRAPH = "mode='reduce-overhead' launches a step of static shapes as one CUDA (HIP) graph"


def _host_bound_fix(v: View, lead: str, tops: list, op_tops: list) -> Fix:
    """HO-5's fix by what leads the host time: work of the user's to move off the step, or the
    model's own ops (a namespaced op, a compiled region, a region around forward/backward), whose
    per-op overhead torch.compile and CUDA graphs cut; copies, and an inference engine's ops."""
    graphs = v.r.launches.graph_launches > 0
    first = op_tops[0].name if op_tops and lead == _short(op_tops[0].name) else None
    if first in COPY_OPS and any(m.direction == "HtoD" for m in v.r.kernels.memcpy):
        return Fix(f"Copies and casts run on the host in the step ({lead} leads): cast and copy on the device "
                   "(move the tensor first, then convert), copy from pinned memory with non_blocking=True, or "
                   "do it once outside the loop; a larger batch gives each launch more work.",
                   "x = x.to(device, non_blocking=True).to(torch.bfloat16)   # pinned source; cast on the device")
    if first is not None and _ENGINE_OP.match(first):
        # An inference engine's op (vLLM, SGLang): its own CUDA-graph mode, not torch.compile by hand.
        return Fix(f"The host issues the engine's ops more slowly than the device runs them ({lead} leads): "
                   "run the engine with its CUDA graphs for these batch sizes (vLLM without enforce_eager and "
                   "with capture sizes that cover the batch; SGLang without --disable-cuda-graph).",
                   "LLM(model=..., enforce_eager=False)   # vLLM: CUDA graphs for the decode batches")
    if tops and tops[0].region and lead.startswith("the Python between ops in") and _MODEL_REGION.search(tops[0].name):
        # A region around the model's forward or backward (DDP's forward, DLRM's "## forward ##"): its
        # Python is the model's own per-op work, nothing to move off the step.
        return Fix(f"The model's own Python issues its ops more slowly than the device runs them ({lead}): cut the "
                   f"per-op overhead: {_FUSE}{'' if graphs else ', and ' + _GRAPH}; a larger batch gives each "
                   "launch more work.", "model = torch.compile(model)")
    if first is not None and (_MODEL_OP.match(first) or first in COPY_OPS):
        # The model's own op (aten::linear in an eager Hugging Face model, a compiled region's launch,
        # a cast under autocast): nothing to move off the step, the host issues the model's ops slower
        # than the device runs them. CUDA (HIP) graphs only where the trace shows none already.
        compiled = bool(_COMPILED.match(first))
        if graphs:
            how, snippet = "fewer, larger ops (the trace already replays graphs: what is left runs outside them); ", ""
        elif compiled:
            how = ("capture the compiled step in CUDA (HIP) graphs (mode='reduce-overhead'), which launches it at "
                   "once, when its shapes are static; ")
            snippet = "model = torch.compile(model, mode=\"reduce-overhead\")"
        else:
            how, snippet = f"{_FUSE}, and {_GRAPH}; ", "model = torch.compile(model)   # or mode=\"reduce-overhead\" (CUDA graphs)"
        return Fix(f"The host issues the model's ops more slowly than the device runs them ({lead} leads): "
                   f"cut the per-op overhead: {how}a larger batch gives each launch more work.", snippet)
    return Fix(f"Shorten the host work on the step path: move {lead} off it (every N steps, another "
               "thread or the data pipeline); cut per-op overhead with torch.compile; a larger batch "
               "gives the device more work per host step.", "model = torch.compile(model)")


# A model's op, not a piece of the user's loop: a namespaced operator (aten::linear, vllm::moe_forward)
# or a compiled region's host side.
_MODEL_OP = re.compile(r"^(?:[A-Za-z_][\w.]*::\w|Torch-Compiled Region|CompiledFunction)")
_COMPILED = re.compile(r"^(?:Torch-Compiled Region|CompiledFunction)")
# record_function regions around the model's forward or backward: DDP/FSDP's own, nn.Module's, and the
# common "## forward ##" / "## backward ##" labels (DLRM, HTA's sample traces).
_MODEL_REGION = re.compile(r"\bforward\b|\bbackward\b|DistributedDataParallel|FullyShardedDataParallel|^nn\.Module",
                           re.I)
_ENGINE_OP = re.compile(r"^(?:vllm|_vllm\w*|sglang|sgl_kernel)::")


def _short(name: str, n: int = 60) -> str:
    return name if len(name) <= n else name[: n - 1] + "…"


@rule("HO-6")
def launch_outliers(inputs: RuleInputs) -> list[Finding]:
    """Runtime-call and launch-delay outliers (HTA runtime_cutoff 50 µs, launch_delay_cutoff 100 µs).

    Only meaningful when the queue is shallow (a deep queue delays launches by design). Info: the
    idle they cause is already in HO-5's share.
    """
    def one(v: View) -> Finding | None:
        if not v.has_device_trace or v.r is None:
            return None
        ls = v.r.launches
        slow_calls = (ls.launch_ns_p95 or 0) > RUNTIME_CUTOFF_NS
        # HTA's launch delay counts a kernel's wait for its stream's previous op or another
        # stream's op it depends on; only the unexplained part is the launch's (older summaries
        # have no such part: the delay stands).
        waited = ls.launch_wait_ns_p95 if ls.launch_wait_ns_p95 is not None else ls.launch_delay_ns_p95
        late = (waited or 0) > LAUNCH_DELAY_CUTOFF_NS and (ls.queue_depth_median or 0) <= 1
        if not (slow_calls or late):
            return None
        return finding(
            v, "HO-6", "host",
            "Kernel launches stall: " + ("5% of launch calls take over "
                                         f"{(ls.launch_ns_p95 or 0) / 1e3:.0f} µs" if slow_calls else "")
            + (" and " if slow_calls and late else "")
            + (f"kernels start {(waited or 0) / 1e3:.0f} µs after launch with an empty queue and "
               "nothing earlier on the device to wait for" if late else "")
            + ".", 0.0, sev="info",
            evidence=[Evidence(f"Launch call p95 {(ls.launch_ns_p95 or 0) / 1e3:.0f} µs (HTA cutoff 50), launch delay "
                               f"p95 {(ls.launch_delay_ns_p95 or 0) / 1e3:.0f} µs (cutoff 100), of which no earlier "
                               f"device work explains {(waited or 0) / 1e3:.0f} µs, median queue depth "
                               f"{ls.queue_depth_median}.", {"launch_us_p95": round((ls.launch_ns_p95 or 0) / 1e3, 1),
                                                         "launch_delay_us_p95": round((ls.launch_delay_ns_p95 or 0) / 1e3, 1),
                                                         "launch_wait_us_p95": round((waited or 0) / 1e3, 1),
                                                         "queue_depth_median": ls.queue_depth_median})],
            fix=Fix("Look for allocator calls (cudaMalloc/cudaFree), cross-stream waits and GIL contention "
                    "around the slow launches."),
            confidence="low", source="HTA runtime_cutoff 50 µs, launch_delay_cutoff 100 µs")
    return per_rank(inputs, one)


@rule("HO-8")
def debug_switches(inputs: RuleInputs) -> list[Finding]:
    """Debug / slow-mode switches left on (TTG "Disable debugging APIs"; CUDA guide on CUDA_LAUNCH_BLOCKING).

    Presence is the threshold (catalogue). Anomaly detection is priced by measurement: the NaN
    checks the autograd engine runs after every backward node (their host ops in the profiler
    window, metrics/signals.py::anomaly_checks) plus the stack traces it records for every node
    the forward creates (timed by the probe, StepTiming.anomaly_stack_ms). A trace alone shows the
    checks, so anomaly mode is found without live facts too. The other switches' cost is not
    measured here: no gain is claimed for them, and `torchdoctor fix --apply debug.off` measures it.
    """
    def one(v: View) -> Finding | None:
        f = v.f
        checks = v.r.signals.anomaly_checks if v.r is not None and v.r.signals is not None else []
        check_ms = v.ms(checks[1]) if checks else 0.0
        stack_ms = v.facts_median("anomaly_stack_ms") or 0.0
        anomaly = bool(f is not None and f.backends.anomaly_detection) or bool(checks)
        heavy, light = [], []
        if f is not None and env_on(f, "CUDA_LAUNCH_BLOCKING") and v.accel:
            heavy.append("CUDA_LAUNCH_BLOCKING=1 (every launch waits for its kernel)")
        if anomaly:
            heavy.append("autograd anomaly detection (torch.autograd.set_detect_anomaly)")
        if f is not None:
            b = f.backends
            if f.env.get("TORCH_DISTRIBUTED_DEBUG", "").upper() == "DETAIL":
                heavy.append("TORCH_DISTRIBUTED_DEBUG=DETAIL (collective fingerprint checks)")
            if b.sync_debug_mode:
                light.append(f"torch.cuda.set_sync_debug_mode({b.sync_debug_mode})")
            if b.deterministic_algorithms:
                light.append("torch.use_deterministic_algorithms(True)")
            if b.cudnn_deterministic and v.accel:
                light.append("cudnn.deterministic=True")
            if env_on(f, "TORCH_NCCL_BLOCKING_WAIT"):
                light.append("TORCH_NCCL_BLOCKING_WAIT=1")
            if f.env.get("NCCL_DEBUG", "").upper() in ("INFO", "TRACE"):
                light.append(f"NCCL_DEBUG={f.env['NCCL_DEBUG']}")
        if not heavy and not light:
            return None
        gain = check_ms + stack_ms if anomaly else 0.0
        evidence = [Evidence(("Read from the live run: " if f is not None else "Seen in the trace: ")
                             + "; ".join(heavy + light) + ".", {"heavy": heavy, "light": light})]
        if anomaly:
            parts = []
            if checks:
                parts.append(f"NaN checks after every backward node: {checks[0]} host ops, {fmt_ms(check_ms)} "
                             "per step (profiler window)")
            if stack_ms:
                parts.append(f"stack traces recorded for every node the forward creates: {fmt_ms(stack_ms)} "
                             "per step (timed by the probe)")
            unseen = ([] if checks else ["the NaN checks (no profiler window with backward ops)"]) + \
                     ([] if stack_ms or f is not None else ["the forward's stack recording (not in a trace)"])
            evidence.append(Evidence(
                "Anomaly mode costs " + ("; ".join(parts) if parts else "an unmeasured amount")
                + (f"; not measured: {', '.join(unseen)}" if unseen else "") + ".",
                {"nan_check_ops": checks[0] if checks else 0, "nan_check_ms": round(check_ms, 3),
                 "stack_ms": round(stack_ms, 3)}))
        measured = gain > 0
        return finding(
            v, "HO-8", "host", "Debug switches are on: " + "; ".join(heavy + light)
            + (f"; anomaly mode alone costs {fmt_ms(gain)} per step." if measured else "."), gain,
            sev=None if measured else ("warning" if heavy else "info"),
            evidence=evidence,
            fix=Fix("Turn them off outside debugging sessions.",
                    "unset CUDA_LAUNCH_BLOCKING TORCH_DISTRIBUTED_DEBUG\n"
                    "torch.autograd.set_detect_anomaly(False)", "shell"),
            confidence="high", confirm="" if measured else "`torchdoctor fix --apply debug.off` measures the gain",
            remedy="debug.off", source="TTG disable debugging APIs; CUDA guide CUDA_LAUNCH_BLOCKING")
    return per_rank(inputs, one)


@rule("HO-9", priority=MEASURED, budgets=("idle.host.optimizer",))
def single_tensor_optimizer(inputs: RuleInputs) -> list[Finding]:
    """Per-parameter (for-loop) optimizer on an accelerator.

    TT OptimizerSingleTensorPattern: any match. Trace: many in-place ops, one kernel each, inside
    Optimizer.step and no _foreach_/_fused_ op; live: foreach=False. Gain: the device idle during
    Optimizer.step (foreach/fused issue a handful of kernels instead).
    """
    def one(v: View) -> Finding | None:
        hit, why = single_tensor(v)
        if not hit:
            return None
        gain = optimizer_idle_ms(v, zero_grad=False)
        cls = (v.r.signals.optimizer_classes if v.r and v.r.signals else []) or \
              [o.cls for o in (v.f.optimizers if v.f else []) if o.cls]
        ours = [c for c in cls if c in TORCH_OPTIMIZERS]
        # The live facts name the optimizer that loops (foreach=False, not fused: single_tensor's
        # test) where the rank has several.
        looping = [o.cls for o in (v.f.optimizers if v.f else [])
                   if o.foreach is False and not o.fused and o.cls in TORCH_OPTIMIZERS]
        if cls and not ours and not looping:
            return None  # foreach/fused are torch.optim options
        name = (looping or ours or ["the optimizer"])[0]
        fused = name in FUSED_CLASSES
        return finding(
            v, "HO-9", "host",
            f"{name} updates parameters one at a time ({why}); the device idles {fmt_ms(gain)} per step in it.",
            gain, evidence=[Evidence(why, {"idle_ms": round(gain, 3)})],
            fix=Fix(f"Use the {'fused' if fused else 'foreach'} implementation.",
                    f"torch.optim.{name}(params, lr=..., {'fused' if fused else 'foreach'}=True)"),
            confidence="high", remedy="optim.fused" if fused else "optim.foreach",
            source="TT OptimizerSingleTensorPattern; PT _default_to_fused_or_foreach", budget="idle.host.optimizer")
    return per_rank(inputs, one)


@rule("HO-10", priority=MEASURED, budgets=("idle.host.optimizer",))
def zero_grad_fill(inputs: RuleInputs) -> list[Finding]:
    """Gradients zeroed instead of set to None (TT GradNotSetToNonePattern: aten::zero_ in zero_grad).

    Gain: the device idle during Optimizer.zero_grad.
    """
    def one(v: View) -> Finding | None:
        s = v.r.signals if v.r is not None else None
        if s is None or s.zero_grad_fills_per_step < 1:
            return None
        gain = optimizer_idle_ms(v, zero_grad=True)
        return finding(
            v, "HO-10", "host",
            f"zero_grad fills {s.zero_grad_fills_per_step:.0f} gradients with zeros every step instead of "
            f"dropping them ({fmt_ms(gain)} of idle device per step).",
            gain, evidence=[Evidence(f"{s.zero_grad_fills_per_step:.0f} aten::zero_ calls per step inside "
                                     "Optimizer.zero_grad.",
                                     {"fills_per_step": s.zero_grad_fills_per_step})],
            fix=zero_grad_fix(v.f.zero_grad_fills if v.f is not None else []),
            confidence="high", source="TT GradNotSetToNonePattern; TTG", budget="idle.host.optimizer")
    return per_rank(inputs, one)


def zero_grad_fix(fills: list) -> Fix:
    """HO-10's fix: where set_to_none=False comes from, when the probe saw the call (facts.ZeroGradFacts)."""
    snippet = "optimizer.zero_grad(set_to_none=True)"
    own = next((z for z in fills if z.call_site), None)
    if own is not None:
        return Fix(f"Your call at {own.call_site} passes set_to_none=False: drop it (torch's default since "
                   "2.0 sets gradients to None) unless the code reads the zeroed gradients.", snippet)
    lib = next((z for z in fills if z.called_by), None)
    if lib is None:
        return Fix("Set gradients to None (the default since PyTorch 2.0).", snippet)
    where = package_relative(lib.library_site or "")  # the package's own path is enough
    said = f"{lib.called_by} passes set_to_none=False to {lib.optimizer}.zero_grad (at {where})"
    if lib.entry and lib.entry.endswith(".zero_grad") and lib.caller:
        # The user's own zero_grad() call reached the library's (a wrapping optimizer's): the
        # argument can be given there.
        return Fix(f"{said}: your optimizer.zero_grad() at {lib.caller} calls {lib.entry}(), which does "
                   "not default to torch's set_to_none=True. Pass set_to_none=True there.", snippet)
    inside = f" inside {lib.entry}()" if lib.entry else ""
    came = f" called from {lib.caller}" if lib.caller else ""
    return Fix(f"{said}{inside}{came}: look for {lib.called_by}'s setting for it; torch's own default "
               "sets gradients to None.", snippet)


@rule("HO-11", priority=MEASURED - 5, budgets=("idle.host.dtoh_copy",))
def modules_on_cpu(inputs: RuleInputs) -> list[Finding]:
    """Modules left on the CPU while the model trains on an accelerator.

    Each forward then copies activations device→host (a sync) and back, and computes that module
    on the CPU. Live facts name the modules; the trace gives the time: device idle during blocking
    device-to-host copies (HO-3 yields that share when this rule fires). A misplaced module is a
    bug, so it warns even when the trace cannot price it.
    """
    def one(v: View) -> Finding | None:
        mods = off_device(v)
        if not mods or not v.accel:
            return None
        gain = v.left("idle.host.dtoh_copy")
        names = ", ".join(f"{m.name} ({m.device})" for m in mods[:4])
        return finding(
            v, "HO-11", "host",
            f"{len(mods)} module(s) stay on the CPU while the model trains on {mods[0].model_device}: {names}"
            + (f"; the copies around them leave the device idle {fmt_ms(gain)} per step." if gain else "."),
            gain, sev=None if v.pct(gain) >= 5 else "warning",
            evidence=[Evidence(f"Modules on another device than the model: {names}.", {},
                               [{"module": m.name, "device": m.device, "model_device": m.model_device,
                                 "params": m.num_params} for m in mods[:10]])],
            fix=Fix("Move the whole model once, after building it (including modules created later, e.g. in "
                    "forward or attached after .to()).", "model = model.to(device)"),
            confidence="high", confirm="" if gain else "the profiler window shows the copies around the module",
            source="TTG create tensors on the target device; catalogue HO-11", budget="idle.host.dtoh_copy")
    return per_rank(inputs, one)


@rule("HO-13")
def threads_vs_cpus(inputs: RuleInputs) -> list[Finding]:
    """Intra-op threads vs the CPUs the rank may use (torchrun sets OMP_NUM_THREADS=1 for a reason).

    Over-subscription (threads x local ranks > CPUs in the affinity mask) makes the threads queue
    for the cores and OpenMP barriers wait for descheduled threads. Local ranks: LOCAL_WORLD_SIZE, or
    the job's processes seen on the rank's CPUs when more (Hogwild children of torch.multiprocessing
    have no LOCAL_WORLD_SIZE; mnist_hogwild on 2 CPUs: 47.5% claimed, x3.88 measured with 1 thread
    each, 74% given back: their spin at barriers is CPU time the counters cannot tell from work).
    On a CPU-trained model, where the probe read the training thread's scheduler counters (Linux,
    rules/_cpu.py), the claim is
    the time per step the training thread was runnable but waited for a core held by the job's own
    threads (its intra-op pool, the other ranks): the run-queue delay apportioned to them.

    Not claimed: the rest of its time off a CPU (total - CPU time - run delay - data and comm
    waits), spent blocked at barriers. Part of it is the pool doing the work the training thread
    would do itself with fewer threads (a right-sized pool gives that back as the training
    thread's own CPU time), part is wake-up overhead; the counters cannot tell them apart. It is
    reported as evidence. Measured on the accuracy harness's lm and mlp jobs (4 threads per CPU,
    benchmarks/results/accuracy.md, 2026-12-05, 3 runs per case): claiming the whole off-CPU time
    had priced them at 53-63% of the step against measured gains of 16-47% (12-04 matrix, errors
    up to 38 points); the delay alone claims 11-27% against 22-43%, errors 1-25 points (median 14):
    close where the step is mostly parallel work, under-priced where the training thread's own
    serial work dominates (a main-process loader, anomaly mode's stack recording: every barrier
    then is overhead), hence medium confidence
    and the A/B that measures it. Without those counters, an assumption: compute x (1 - 1/k) / 2,
    k = threads x ranks / CPUs (low confidence). With an accelerator the host loop suffers less:
    info.
    """
    all_views = views(inputs)

    def blocked_ms(v: View, delay: float) -> float | None:
        """Time per step off a CPU outside the run-queue delay and the data and comm waits."""
        steps = v.timed
        if not steps or any(s.thread_cpu_ms is None for s in steps):
            return None
        off = sum(max(0.0, s.total_ms - (s.thread_cpu_ms or 0.0) - s.dataloader_ms - s.comm_ms) for s in steps)
        return max(0.0, off / len(steps) - delay)

    def one(v: View) -> Finding | None:
        c = v.f.cpu if v.f is not None else None
        if c is None or not c.torch_num_threads:
            return None
        cpus = len(c.affinity) or c.logical_cpus
        if not cpus:
            return None
        # Processes that train side by side without torchrun (Hogwild children of torch.multiprocessing)
        # have no LOCAL_WORLD_SIZE: the job's processes seen on this host's CPUs count as local ranks.
        lws = max(c.local_world_size or 1, training_processes(v, all_views))
        want = max(1, cpus // lws)
        demand = c.torch_num_threads * lws
        if demand <= cpus:
            return None
        k = demand / cpus
        compute = sum(x for x in (v.facts_median("forward_ms"), v.facts_median("backward_ms"),
                                  v.facts_median("optimizer_ms")) if x)
        # A forward the probe could not time counts as "other" in its split: the trace's split has it.
        blind = v.f is not None and forward_unseen(v.f.steps)
        if (not compute or blind) and v.r is not None and v.r.host.phases_ms:
            compute = sum(v.r.host.phases_ms.get(p, 0.0) for p in ("forward", "backward", "optimizer"))
        rd = None if v.accel else run_delay(v, all_views)
        measured = ""
        if v.accel:
            gain = 0.0
        elif rd is not None:
            gain = rd.job_threads_ms * rd.to_view(v)
            blocked = blocked_ms(v, rd.delay_ms)
            measured = (f"; the training thread waited {fmt_ms(rd.job_threads_ms)} per step for a core held by the "
                        f"job's own threads (run-queue delay {fmt_ms(rd.delay_ms)} of a {fmt_ms(rd.step_ms)} step, "
                        "apportioned by CPU time)")
            if blocked:
                measured += (f", and was blocked {fmt_ms(blocked)} more, at barriers: partly the pool doing work it "
                             "would do itself with fewer threads, partly overhead (not priced)")
        else:
            gain = compute * (1 - 1 / k) / 2
        return finding(
            v, "HO-13", "host",
            f"{c.torch_num_threads} intra-op threads x {lws} local rank(s) = {demand} threads on {cpus} CPUs: "
            f"the threads fight for cores (use {want} per rank).",
            gain, sev=None if not v.accel else "info",
            evidence=[Evidence(f"{c.torch_num_threads} threads x {lws} rank(s) vs {cpus} CPUs in the affinity mask"
                               + (f"; compute {fmt_ms(compute)} per step" if compute else "") + measured + ".",
                               {"torch_num_threads": c.torch_num_threads, "local_world_size": lws, "cpus": cpus,
                                "advised_threads": want,
                                "OMP_NUM_THREADS": v.f.env.get("OMP_NUM_THREADS") if v.f else None})],
            fix=Fix(f"Give each rank its own cores: {want} thread(s) per rank and a matching affinity mask.",
                    f"OMP_NUM_THREADS={want} {job_command(inputs.run, f'torchrun --nproc-per-node {lws} train.py')}"
                    f"   # or torch.set_num_threads({want})",
                    "shell"),
            confidence="medium" if rd is not None else "low",
            confirm="`torchdoctor fix --apply threads.affinity` measures the gain",
            remedy="threads.affinity", source="torchrun OMP_NUM_THREADS=1 default; torch NUMA binding docs 1-10%")
    return per_rank(inputs, one)
