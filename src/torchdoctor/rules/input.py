"""Input layer: the accelerator (or the CPU training loop) waits for the next batch (DL-1..DL-7).

The data-wait budget of a step (the ledger's ``data.wait``) is split without overlap: a timed
converting collate_fn (HO-3) claims first; with `num_workers=0` DL-2 claims the part more
workers can hide and DL-1 (generic) what even they cannot; with workers, DL-7 claims the bursts
above the typical wait (prefetch) and DL-1 the typical wait (more or faster workers).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..advice.framework_settings import loader_fix
from ..advice.workers import LoadingAdvice, advise_loading, training_busy_pct, workers_wait_on_io
from ..facts import DataLoaderFacts, StepTiming, sampled_comm_median
from ._common import (
    View,
    at,
    data_wait_ms,
    finding,
    fmt_ms,
    handoff_share,
    pageable_h2d_idle_ms,
    per_rank,
    steady,
    tops_text,
    ts_item,
    views,
    worker_loader,
    worker_split_text,
)
from ._cpu import oversubscribed_by_job
from .engine import GENERIC, RuleInputs, rule
from .model import Evidence, Finding, Fix

# GPP prefetch_queue_starved: >= 20% of steps starved and p95 wait >= 20 ms (insights.py).
STARVED_STEPS_MIN = 0.20
STARVED_P95_MS = 20.0
# A step is starved when its data wait exceeds TBP's DataLoader ratio (5% of the step).
STARVED_STEP_SHARE = 0.05
# Workers assumed when the job's CPU count is unknown (trace only).
DEFAULT_WORKERS = 2
# A distribution of waits needs at least this many steps (p95 of 3 steps is noise).
MIN_STEPS = 8
# Worker start-up cost assumed per worker and epoch without persistent_workers: a forked worker
# imports nothing new and starts in ~0.1 s; spawn costs seconds. We claim the cheap case.
WORKER_START_S = 0.1


# The data wait sits at epoch starts when at least this share of the unready wait falls there.
EPOCH_START_SHARE = 0.7


# --- shared numbers ------------------------------------------------------------------------------

@dataclass(frozen=True)
class EpochStarts:
    """What the first step of each epoch costs, from the probe's steady-state step timings.

    A step that created a DataLoader iterator (``StepTiming.epoch_starts``) starts an epoch. Sums
    are over the steady steps; shares are of their total time, i.e. of the job's average step
    (epoch starts are rare, slow steps: the median step and the profiler window miss them).
    """

    steps: int  # steady steps seen
    starts: int  # epoch starts among them
    excess_share: float  # sum over epoch starts of (step - median step) / total time
    wait_share: float  # sum over epoch starts of (data wait - median data wait) / total time
    unready_at_starts: float  # share of all unready data wait that falls in epoch-start steps
    excess_ms: float  # mean excess of one epoch start, ms
    every: float  # steps per epoch: the median spacing of epoch starts, the first one counted from step 0
    # The loader's own part of the excess, summed over epoch starts / total time, and its mean per
    # start (ms): creating the iterator (workers started) plus the data wait above the median (the
    # old workers' shutdown, the first batch) plus the model's forward, backward and optimizer time
    # above their median (less forwards without autograd): after a fork every page the training
    # process writes is copied once more, and starting workers take the CPUs (Lightning Fabric's
    # pattern on 2 CPUs: 3,241 page faults and 57 ms of system time in each epoch's first step,
    # forward and backward 31 ms against 4.4; DL-6 claimed 20.5% without it, `fix` measured 42.0%
    # [37.0%, 46.7%]). The rest of the excess is whatever else the job does between epochs
    # (evaluation, checkpoints), which persistent workers do not shorten.
    loader_share: float = 0.0
    loader_ms: float = 0.0


def epoch_starts(v: View) -> EpochStarts | None:
    """The epoch starts among the probe's steps after warm-up (None: no live timings or no epoch
    start). The long steps of work between steps stay in: a loop that evaluates at each epoch's end
    restarts its loader in those same steps."""
    timed = steady(v.f.steps) if v.f is not None else []
    starts = [s for s in timed if s.epoch_starts]
    if len(timed) < MIN_STEPS or not starts:
        return None
    total = sum(s.total_ms for s in timed)
    med_step = float(np.median([s.total_ms for s in timed]))
    med_wait = float(np.median([s.dataloader_ms for s in timed]))
    unready = sum(unready_ms(s) for s in timed)
    at_starts = sum(unready_ms(s) for s in starts)
    excess = sum(max(0.0, s.total_ms - med_step) for s in starts)
    wait = sum(max(0.0, s.dataloader_ms - med_wait) for s in starts)
    med_model = float(np.median([model_ms(s) for s in timed]))
    med_faults = float(np.median([s.minor_faults or 0 for s in timed]))
    med_sys = float(np.median([s.thread_sys_ms or 0.0 for s in timed]))

    def slowed(s: StepTiming) -> float:
        """The model's time above its median, where the step shows the fork (its page faults or system
        time far above the median step's); else none: an evaluation with autograd on, or a closure's
        data wait inside the optimizer, is not the restart's."""
        forked = ((s.minor_faults or 0) > 2 * med_faults + FORK_FAULTS
                  or (s.thread_sys_ms or 0.0) > med_sys + FORK_SYS_MS)
        return max(0.0, model_ms(s) - med_model) if forked else 0.0

    loader = sum(min(max(0.0, s.total_ms - med_step), s.loader_iter_ms + max(0.0, s.dataloader_ms - med_wait)
                     + slowed(s)) for s in starts)
    gaps = np.diff([0, *(s.step for s in starts)])  # the first epoch started in step 0
    return EpochStarts(len(timed), len(starts), excess / total, min(excess, wait) / total,
                       at_starts / unready if unready > 0 else 0.0, excess / len(starts),
                       float(np.median(gaps)) if gaps.size else len(timed) / len(starts),
                       loader / total, loader / len(starts))


# A step that forked workers: page faults or system time this far above the median step's (Lightning
# Fabric's epoch starts: 3,241 faults and 57 ms of system time against 6-11 faults and 0 ms).
FORK_FAULTS = 500
FORK_SYS_MS = 5.0


def model_ms(s: StepTiming) -> float:
    """The step's forward, backward and optimizer time, less its forwards without autograd (an
    evaluation between epochs is the job's own work, not the loader's)."""
    return max(0.0, s.forward_ms + s.backward_ms + s.optimizer_ms - s.inference_ms)


def unready_ms(s: StepTiming) -> float:
    """The step's wait for batches not produced yet (all of its wait when readiness is unknown)."""
    return s.dataloader_ms if s.dataloader_unready_ms is None else s.dataloader_unready_ms


def step_waits(v: View) -> tuple[list[float], list[float]]:
    """(data wait, step time) per step, ms, from whichever source saw more steps.

    The profiler window holds a few steps; the probe times every other step of a live run, which
    is what a distribution (bursts, p95) needs. The probe's wait counts only batches that were not
    ready yet (``dataloader_unready_ms``) when it knows: a ready batch's handoff is no burst. Steps
    that start an epoch are left out: their wait is the queue's refill, which no prefetch depth
    carries across epochs (DL-6 / DL-1 speak of it).
    """
    rows = v.r.steps if v.r is not None else []
    timed = [s for s in v.timed if not s.epoch_starts]
    if len(timed) > len(rows):
        return [unready_ms(s) for s in timed], [s.total_ms for s in timed]
    return [s.dataloader_exposed_ms for s in rows], [s.dur_ms for s in rows]


def num_workers(v: View) -> int | None:
    """Workers of the main DataLoader: from the facts, else from the iterator class in the trace."""
    if v.f is not None and v.f.dataloaders:
        vals = [d.num_workers for d in v.f.dataloaders if d.num_workers is not None]
        if vals:
            return min(vals)
    it = v.r.signals.dataloader_iter if v.r is not None and v.r.signals else None
    if it == "_SingleProcessDataLoaderIter":
        return 0
    return None


def advised_workers(v: View) -> tuple[int, str]:
    """Workers to suggest for this rank, and why (advice.workers.advise_workers, as the remedy).

    Without live facts the job's CPUs are unknown (this machine's count says nothing about the
    job's): assume DEFAULT_WORKERS, the smallest suggestion on any host with 3+ CPUs per rank.
    """
    cpus = cpu_count(v)
    if cpus is None:
        return DEFAULT_WORKERS, f"a default of {DEFAULT_WORKERS}: the job's CPUs are not known from a trace"
    a = loading_advice(v, cpus)
    return a.workers, a.why


def loading_advice(v: View, cpus: int) -> LoadingAdvice:
    """advice.workers.advise_loading for this rank (its CPUs known)."""
    lws = (v.f.cpu.local_world_size if v.f is not None else None) or 1
    timed = v.timed[2:] or v.timed
    step = float(np.median([s.total_ms for s in timed])) if timed else v.step_ms
    wait = float(np.median([s.dataloader_ms for s in timed])) if timed else data_wait_ms(v)
    busy = training_busy_pct(timed, v.f.cpu.main_process_cpu_pct if v.f is not None else None)
    blocked = sampled_comm_median(timed)
    return advise_loading(cpus, lws, step, wait, busy, blocked_ms=blocked)


def no_core_for_workers(v: View, all_views: list[View]) -> bool:
    """A CPU-only rank whose loading is CPU-bound while the job's torch threads already hold every
    CPU of its mask: a worker would take its core from the training's own compute, not from idle
    time (pytorch-lightning job on 2 CPUs: DL-2 claimed 42% and `fix` measured x0.62 with 1 worker)."""
    cpus = cpu_count(v)
    if v.accel or cpus is None or v.f is None:
        return False
    return not loading_advice(v, cpus).latency_bound and oversubscribed_by_job(v, all_views)


def suggested_workers(v: View) -> int:
    return advised_workers(v)[0]


def cpu_count(v: View) -> int | None:
    """CPUs the rank may use, from the live facts (affinity mask first)."""
    if v.f is not None:
        if v.f.cpu.affinity:
            return len(v.f.cpu.affinity)
        if v.f.cpu.logical_cpus:
            return v.f.cpu.logical_cpus
    return None


def bursts(v: View) -> tuple[float, float, float, int]:
    """(burst ms per step above the median wait, share of starved steps, p95 wait ms, steps seen).

    The burst share is taken against the same source's median step and applied to this view's
    step, so that the claim stays a share of the step whichever source it came from.
    """
    waits, totals = step_waits(v)
    if len(waits) < 2 or not v.step_ms:
        return 0.0, 0.0, 0.0, len(waits)
    w, t = np.array(waits), np.array(totals)
    med_step = float(np.median(t)) or v.step_ms
    starved = float((w > STARVED_STEP_SHARE * med_step).mean())
    share = float(np.clip(w - np.median(w), 0, None).mean()) / med_step
    return share * v.step_ms, starved, float(np.percentile(w, 95)), len(waits)


def _dl_evidence(v: View, wait: float) -> list[Evidence]:
    ev = [Evidence(f"The step waits {fmt_ms(wait)} for the next batch ({v.pct(wait):.1f}% of a "
                   f"{fmt_ms(v.step_ms or 0)} step).",
                   {"data_wait_ms": round(wait, 3), "step_ms": round(v.step_ms or 0, 3)})]
    if v.r is not None and v.r.steps:
        worst = max(v.r.steps, key=lambda s: s.dataloader_exposed_ms)
        c = v.cause("dataloader")
        items = [ts_item(t.name, t.ns, t.count, t.first_ts_ns, v.n_steps) for t in (c.top if c else [])[:3]]
        tops = f" In __next__: {tops_text(v, c.top)}." if c is not None and c.top else ""
        ev.append(Evidence(f"Worst step: #{worst.step} ({at(v, worst.start_ns)}) waited "
                           f"{fmt_ms(worst.dataloader_exposed_ms)}.{tops}",
                           {"worst_step": worst.step, "worst_wait_ms": worst.dataloader_exposed_ms},
                           items + [{"step": worst.step, "ts_ns": worst.start_ns}]))
    return ev


def _pin(v: View) -> str:
    """The snippet's pin_memory argument: only for a model on an accelerator (on a CPU-only job
    pinning does nothing but print torch's "no accelerator is found" warning)."""
    return " pin_memory=True," if v.accel else ""


def _loader_fix(v: View, text: str, snippet: str) -> Fix:
    """A DataLoader fix at the job's own loader: its DataLoader(...) line, or the TrainingArguments
    fields when transformers' Trainer builds it (advice/framework_settings.py); `{where}` in the text
    takes the site."""
    return loader_fix(v.f.dataloaders if v.f is not None else [], text, snippet)


def dl7_claim(v: View) -> float:
    """DL-7's share of the data wait: bursts above the median wait, when workers exist."""
    nw = num_workers(v)
    multi = v.r is not None and v.r.signals is not None and \
        v.r.signals.dataloader_iter == "_MultiProcessingDataLoaderIter"
    if not nw and not (nw is None and multi):
        return 0.0
    burst, starved, p95, n = bursts(v)
    if n < MIN_STEPS or starved < STARVED_STEPS_MIN or p95 < STARVED_P95_MS or v.pct(burst) < 0.5:
        return 0.0
    # A deeper queue absorbs bursts only when the workers keep up on average: the typical
    # (median) step must not wait. Otherwise the queue drains whatever its depth (DL-1's case).
    waits, totals = step_waits(v)
    if float(np.median(waits)) > STARVED_STEP_SHARE * float(np.median(totals)):
        return 0.0
    return min(burst, v.left("data.wait"))


# --- rules ---------------------------------------------------------------------------------------

def dl2_claim(v: View, wait: float) -> float:
    """What workers can hide: load - max(0, load/N - compute), load = what is left of the wait
    (a timed converting collate_fn is HO-3's claim)."""
    n = suggested_workers(v)
    compute = max(0.0, (v.step_ms or 0.0) - wait)
    load = v.left("data.wait")
    return max(0.0, load - max(0.0, load / n - compute))


@rule("DL-2", budgets=("data.wait",))
def synchronous_loading(inputs: RuleInputs) -> list[Finding]:
    """DataLoader with num_workers=0: batches are loaded in the training process.

    Threshold: TBP recommends workers when the DataLoader takes > 5% of the step (data.py), TML
    turns critical at 20%; TT's SynchronizedDataLoaderPattern fires on presence. The gain is the
    wait that N workers (advised_workers: PL's formula, more for latency-bound loading) can hide
    behind compute: wait - max(0, wait/N - compute).
    """
    all_views = views(inputs)

    def one(v: View) -> Finding | None:
        if num_workers(v) != 0:
            return None
        wait = data_wait_ms(v)
        gain = dl2_claim(v, wait)
        n, how = advised_workers(v)
        src = ("facts: num_workers=0" if v.f is not None and v.f.dataloaders
               else "trace: _SingleProcessDataLoaderIter")
        if v.pct(wait) < 0.5:
            return None
        crowded = no_core_for_workers(v, all_views)
        if crowded:
            threads = v.f.cpu.torch_num_threads if v.f is not None else None
            title = (f"The DataLoader runs in the training process (num_workers=0): each step waits {fmt_ms(wait)} "
                     f"({v.pct(wait):.0f}%) for its batch, but no CPU is free for a worker: the job's torch threads "
                     f"({threads or '?'} per rank) hold every CPU of the rank, and a worker would take its core "
                     "from the training's own compute.")
            fix = _loader_fix(v, f"Make room before adding workers{{where}}: fewer torch threads "
                              f"(torch.set_num_threads) and num_workers={n}; `torchdoctor fix` measures whether "
                              "the trade pays.", f"torch.set_num_threads({max(1, (threads or 2) - 1)})\n"
                              f"DataLoader(dataset, batch_size=..., num_workers={n})")
            gain = 0.0
        else:
            title = (f"The DataLoader runs in the training process (num_workers=0): each step waits "
                     f"{fmt_ms(wait)} ({v.pct(wait):.0f}%) for its batch; {n} worker(s) could hide about {fmt_ms(gain)}.")
            fix = _loader_fix(v, f"Load in worker processes{{where}}: set num_workers={n} ({how}), then tune.",
                              f"DataLoader(dataset, batch_size=..., num_workers={n},{_pin(v)}\n"
                              f"           persistent_workers=True, prefetch_factor=2)")
        return finding(
            v, "DL-2", "input", title,
            gain, sev="info" if crowded else None,
            evidence=_dl_evidence(v, wait) + [Evidence(f"Loading is synchronous ({src}).",
                                                       {"advised_workers": n, "no_free_cpu": crowded})],
            fix=fix,
            confidence="high" if v.f is not None else "medium",
            confirm="" if v.f is not None else "run under `torchdoctor run` to read the DataLoader settings",
            remedy="dataloader.workers", source="TBP DataLoader > 5% of step; TT SynchronizedDataLoader; PL workers formula",
            budget="data.wait")
    return per_rank(inputs, one)


@rule("DL-1", priority=GENERIC, budgets=("data.wait",))
def input_bound(inputs: RuleInputs) -> list[Finding]:
    """Input-bound step: the device (or the CPU loop) waits for the next batch.

    TBP: exposed DataLoader time > 5% of the step → warning (data.py::analyze); TML INPUT_BOUND
    critical at 20%. Generic rule: it claims what the specific findings left of the wait (the
    collate, DL-2's share with num_workers=0, DL-7's bursts with workers); with workers, the
    handoff of batches that were already ready is reported, not claimed.
    """
    all_views = views(inputs)

    def one(v: View) -> Finding | None:
        wait = data_wait_ms(v)
        nw = num_workers(v)
        at_starts = False
        if nw == 0:
            rest = v.left("data.wait")
            why = ("no CPU is free for loader workers (the job's torch threads hold them all), so producing the "
                   "batch stays on the step" if no_core_for_workers(v, all_views) else
                   f"even {suggested_workers(v)} worker(s) would not keep up: loading is slower than the compute")
        else:
            starved_or_handoff = v.left("data.wait")
            handoff = starved_or_handoff * handoff_share(v)
            rest = starved_or_handoff - handoff
            ep = epoch_starts(v)
            at_starts = ep is not None and ep.unready_at_starts >= EPOCH_START_SHARE
            why = (f"the wait sits at the start of each epoch (every ~{ep.every:.0f} steps, "
                   f"{ep.unready_at_starts:.0%} of the unready wait): the workers' queue drains at the end of "
                   "an epoch and refills at the next, and more workers do not shorten the first batch"
                   if at_starts and ep is not None else "the loader cannot keep up on average")
            if v.pct(rest) < 0.5:
                return _handoff(v, handoff, wait)
        if v.pct(rest) < 0.5:
            return None
        known = nw is not None
        epoch_bound = nw != 0 and at_starts
        loaders = [d for d in v.f.dataloaders if d.num_workers] if v.f is not None else []
        persistent = bool(loaders) and all(d.persistent_workers for d in loaders)
        # fastai builds new workers every epoch whatever persistent_workers says (the probe leaves it
        # unknown there): keeping them alive is no setting of its loaders.
        can_persist = not loaders or any(d.persistent_workers is not None for d in loaders)
        cheaper = ("move decoding/augmentation to the GPU (torchvision.transforms.v2 on tensors, DALI), "
                   if v.accel else
                   # A CPU-only job has no device to move the work to: cut the per-sample overhead.
                   "index whole batches of in-memory data (a BatchSampler with batch_size=None, one tensor "
                   "index per batch instead of one __getitem__ and a collate per sample), ")
        # Workers at (or past) the count this host allows already: more is no advice (ddpm's Trainer
        # runs cpu_count() workers; DL-1 said "add workers (up to CPUs // local ranks - 1)" with 2 on 2 CPUs).
        advised = advised_workers(v) if nw and v.f is not None and cpu_count(v) is not None else None
        at_most = advised is not None and nw is not None and nw >= advised[0] and not epoch_bound
        cheaper_batch = f"Make each batch cheaper to produce: {cheaper}pre-decode the data set, use a faster storage format"
        fix_text = (f"{cheaper_batch}; then add workers." if nw == 0 else
                    f"{cheaper_batch}; {nw} workers are already at least the {advised[0]} advised ({advised[1]})"
                    + ("; keep them alive (persistent_workers=True)." if can_persist and not persistent else ".")
                    if at_most and advised is not None else
                    "Make epochs longer (a sampler that spans several passes over the data) or the first "
                    "batch of an epoch cheaper{where}" + ("; the workers are already kept alive (persistent_workers="
                                                   "True), but they start on an epoch's first batches only "
                                                   "when that epoch begins."
                                                   if persistent else
                                                   "; keep the workers alive (persistent_workers=True)." if can_persist
                                                   else ".")
                    if epoch_bound else
                    "Add DataLoader workers (up to CPUs // local ranks - 1), "
                    + ("keep them alive (persistent_workers=True) " if can_persist else "")
                    + "and pin memory; if the CPUs are saturated, move augmentation to the GPU.")
        # A loader whose workers cannot persist (fastai's) takes no torch DataLoader snippet either:
        # its own class has neither a sampler argument nor a lasting persistent_workers.
        if not can_persist:
            snippet = ""
        elif epoch_bound:
            snippet = ("sampler = RandomSampler(dataset, num_samples=passes * len(dataset))\n"
                       "DataLoader(dataset, sampler=sampler, num_workers=N, persistent_workers=True)")
        elif at_most:
            snippet = "" if persistent else f"DataLoader(dataset, num_workers={nw}, persistent_workers=True)"
        else:
            snippet = f"DataLoader(dataset, num_workers=N,{_pin(v)} persistent_workers=True)"
        evidence = _dl_evidence(v, wait)
        inside = worker_loader(v)
        if inside is not None:  # where the workers' time per batch goes: reads or collate
            evidence.append(Evidence(worker_split_text(inside), {
                "dataset_ms": inside.worker_dataset_ms_mean, "collate_ms": inside.worker_collate_ms_mean,
                "collate_cpu_ms": inside.worker_collate_cpu_ms_mean,
                "conversions_per_batch": inside.worker_collate_syncs_per_batch}))
        return finding(
            v, "DL-1", "input",
            f"Input-bound: each step waits {fmt_ms(rest)} ({v.pct(rest):.0f}% of the step) for the "
            f"DataLoader; {why}.",
            rest, evidence=evidence,
            fix=_loader_fix(v, fix_text, snippet),
            confidence="high" if v.r is not None and v.r.window.steps else "medium",
            confirm="" if known else "run under `torchdoctor run` to read the DataLoader settings",
            remedy=None if nw == 0 or epoch_bound or at_most else "dataloader.workers",
            source="TBP DataLoader > 5% of step; TML INPUT_BOUND 10%/20%", budget="data.wait")
    return per_rank(inputs, one)


def _handoff(v: View, handoff: float, wait: float) -> Finding | None:
    """The workers keep up, yet receiving each ready batch costs time.

    More workers or a deeper prefetch queue do not shorten the handoff (pickling, the queue,
    mapping shared memory). Reported when it reaches TBP's 5% DataLoader ratio, where it would
    otherwise read as an input-bound step. When a worker makes a batch in less time than the
    training thread spends receiving one (in-memory rows, a cheap collate: skorch's README example
    with two workers, 873 µs to make against 1.5 ms to receive), loading in the training process
    costs less: the claim is the difference per batch, times the batches a step receives (the
    workers' CPU contention, HO-14's, goes with them and is not claimed here). Otherwise info,
    nothing claimed.
    """
    if v.pct(handoff) < 5.0:
        return None
    ready = next((d.ready_share for d in v.f.dataloaders if d.ready_share is not None), None) if v.f else None
    timed = next((d for d in v.f.dataloaders if d.ready_wait_ms_mean), None) if v.f else None
    per_batch = timed.ready_wait_ms_mean if timed is not None else None
    cheaper = cheaper_in_process(timed) if timed is not None else None
    if cheaper is not None:
        return _workers_cost_more(v, handoff, *cheaper, timed)
    return finding(
        v, "DL-1", "input",
        f"The workers keep up ({'most' if ready is None else f'{ready:.0%}'} of batches were ready when asked "
        "for), but receiving a ready batch "
        f"costs {fmt_ms(per_batch or handoff)}: {fmt_ms(handoff)} per step ({v.pct(handoff):.0f}%) more workers "
        "would not remove.", 0.0, sev="info",
        evidence=[Evidence(f"Of the {fmt_ms(wait)} data wait per step, {fmt_ms(handoff)} went to batches the "
                           "workers had already produced (checked on the iterator's queue before each batch).",
                           {"data_wait_ms": round(wait, 3), "handoff_ms": round(handoff, 3),
                            "ready_share": ready, "ready_wait_ms_mean": per_batch})],
        fix=Fix("Send compact batches from the workers (uint8 images, scaled on the device), fewer and larger "
                "tensors per batch; on a GPU, pin_memory=True moves the copy to a background thread.",
                "return torch.from_numpy(pixels_uint8), label   # in Dataset.__getitem__\n"
                "images = images.to(device, non_blocking=True).float().div_(255)"),
        confidence="medium", source="TBP DataLoader > 5% of step (the part workers cannot hide)")


def cheaper_in_process(d: DataLoaderFacts) -> tuple[float, float] | None:
    """(ms the training thread takes to receive a ready batch, ms a worker takes to make one) when
    making it costs clearly less than receiving it (under CHEAPER_SHARE of it, and CHEAPER_MIN_MS less):
    the loader is better off without workers (DL-1, DL-6, HO-14). The receive time is the wall time
    of ``__next__`` on a ready batch (the probe's shim and the sampler included), the worker's its
    fetch and collate only: the margin keeps noise on sub-millisecond batches from flipping advice."""
    per = d.ready_wait_ms_mean
    if not per or d.worker_dataset_ms_mean is None or d.worker_collate_ms_mean is None:
        return None
    own = d.worker_dataset_ms_mean + d.worker_collate_ms_mean
    return (per, own) if own < CHEAPER_SHARE * per and per - own >= CHEAPER_MIN_MS else None


CHEAPER_SHARE = 0.7
CHEAPER_MIN_MS = 0.1


def no_workers_fix(loaders: list, why: str) -> Fix:
    """The num_workers=0 fix (DL-1, DL-6, HO-14), told where the loader is built; `why` follows it."""
    return loader_fix(loaders, "Load in the training process{where}: num_workers=0" + why,
                      "DataLoader(dataset, batch_size=..., num_workers=0)")


def _workers_cost_more(v: View, handoff: float, per_batch: float, own: float, d) -> Finding:
    """DL-1 when making a batch in the training process costs less than receiving it from a worker."""
    gain = min(handoff, (per_batch - own) * handoff / per_batch)
    return finding(
        v, "DL-1", "input",
        f"The DataLoader workers cost the step more than they save: receiving a ready batch takes "
        f"{fmt_ms(per_batch)}, making one takes a worker {fmt_ms(own)}; loading in the training process "
        f"(num_workers=0) would save about {fmt_ms(gain)} per step ({v.pct(gain):.0f}%).",
        gain, sev="warning" if v.pct(gain) >= 5.0 else "info",
        evidence=[Evidence(f"Per batch: {fmt_ms(per_batch)} in the training thread to receive a batch the workers had "
                           f"already produced (pickling, the queue, shared memory), against {fmt_ms(own)} in a worker to "
                           f"make it ({fmt_ms(d.worker_dataset_ms_mean)} reading, {fmt_ms(d.worker_collate_ms_mean)} "
                           f"collating); {fmt_ms(handoff)} of receiving per step. Claimed: the difference; the "
                           "workers' competition for the CPUs (HO-14) goes with them and is not counted here.",
                           {"handoff_ms": round(handoff, 3), "ready_wait_ms_mean": per_batch,
                            "worker_batch_ms": round(own, 3), "advised_workers": 0})],
        fix=no_workers_fix(v.f.dataloaders if v.f is not None else [], "; the batches are cheaper to make than to receive (in-memory data; "
                                          "index whole batches to make them cheaper still)."),
        confidence="medium", confirm="`torchdoctor fix --apply dataloader.workers=0` measures it",
        remedy="dataloader.workers", source="the workers' own batch timing against the handoff (probe/workers.py)",
        budget="data.wait")


@rule("DL-7", budgets=("data.wait",))
def prefetch_starved(inputs: RuleInputs) -> list[Finding]:
    """Bursty loader: some steps wait long, others not at all (workers present).

    GPP prefetch_queue_starved: >= 20% of steps starved and p95 wait >= 20 ms. A step is starved
    above TBP's 5% DataLoader ratio. The gain is the wait above the median step's wait, which a
    deeper prefetch queue absorbs when the workers keep up on average; so it fires only when the
    median step itself is not starved (else the loader is too slow, DL-1's finding).
    """
    def one(v: View) -> Finding | None:
        burst = dl7_claim(v)
        if not burst:
            return None
        nw = num_workers(v)
        _, starved, p95, n = bursts(v)
        waits = step_waits(v)[0]
        pf = next((d.prefetch_factor for d in (v.f.dataloaders if v.f else []) if d.prefetch_factor), None)
        new_pf = (pf or 2) * 2
        return finding(
            v, "DL-7", "input",
            f"The loader is bursty: {starved:.0%} of steps wait for data (p95 {fmt_ms(p95)}); a deeper "
            f"prefetch queue could absorb about {fmt_ms(burst)} per step.",
            burst, evidence=[Evidence(f"Data wait over {n} steps: median {fmt_ms(float(np.median(waits)))}, p95 "
                                      f"{fmt_ms(p95)}; {starved:.0%} of steps wait over 5% of the step.",
                                      {"starved_share": round(starved, 3), "p95_wait_ms": round(p95, 3), "steps": n,
                                       "waits_ms": [round(w, 3) for w in waits][:50]})],
            fix=_loader_fix(v, f"Raise prefetch_factor (now {pf or 2}) to {new_pf}, or add workers{{where}}.",
                            f"DataLoader(..., num_workers={nw or 'N'}, prefetch_factor={new_pf}, persistent_workers=True)"),
            confidence="medium", remedy="dataloader.prefetch",
            source="GPP prefetch_queue_starved (>=20% of steps, p95 >= 20 ms)", budget="data.wait")
    return per_rank(inputs, one)


@rule("DL-3")
def too_many_workers(inputs: RuleInputs) -> list[Finding]:
    """More DataLoader workers than CPUs: loading slows down or freezes, training competes for CPU.

    PT's check_worker_number_rationality warns when num_workers > CPUs available (warning here);
    SMD's Dataloader rule flags loader processes above 200% of cores. Summed over local ranks
    (num_workers x local ranks > CPUs) we report at info level, unless the workers mostly wait
    on I/O (under half a core each: latency-bound loading, where extra workers are the cure). The
    time lost is not measurable from these facts, so no gain is claimed.
    """
    def one(v: View) -> Finding | None:
        nw = num_workers(v)
        if v.f is None or not nw:
            return None
        cpus = cpu_count(v)
        if cpus is None:
            return None
        lws = v.f.cpu.local_world_size or 1
        total = nw * lws
        if total <= cpus or workers_wait_on_io(nw, v.f.cpu.dataloader_workers_cpu_pct):
            return None
        sev = "warning" if nw > cpus else "info"
        return finding(
            v, "DL-3", "input",
            f"{nw} DataLoader workers x {lws} local rank(s) = {total} processes for {cpus} CPUs: "
            "the loader and the training loop compete for cores.", 0.0, sev=sev,  # type: ignore[arg-type]
            evidence=[Evidence(f"{nw} workers x {lws} rank(s) vs {cpus} CPUs in the affinity mask.",
                               {"num_workers": nw, "local_world_size": lws, "cpus": cpus})],
            fix=_loader_fix(v, f"Use at most {suggested_workers(v)} worker(s) per rank{{where}}.",
                            f"DataLoader(..., num_workers={suggested_workers(v)})"),
            confidence="medium", confirm="`torchdoctor fix --apply dataloader.workers` measures the effect",
            remedy="dataloader.workers", source="PT check_worker_number_rationality; SMD Dataloader > 200% of cores")
    return per_rank(inputs, one)


@rule("DL-4", budgets=("idle.host.htod_pageable", "device.busy"))
def pageable_memory(inputs: RuleInputs) -> list[Finding]:
    """Host-to-device copies from pageable memory (pin_memory=False).

    NSYS cuda_memcpy_async flags every pageable async copy; TTG: pin_memory=True on GPU. Threshold
    (catalogue, proposed): exposed copy time > 2% of the step → warning. Gain: the device idle
    while the host sat in pageable copies, plus half their device time (pinned transfers run at
    about twice the bandwidth and overlap compute with non_blocking=True — pinmem tutorial).
    """
    def one(v: View) -> Finding | None:
        if not v.accel:
            return None  # pinning only matters for copies to an accelerator
        unpinned = [d for d in (v.f.dataloaders if v.f else []) if d.pin_memory is False]
        rows = [m for m in (v.r.kernels.memcpy if v.r else []) if m.direction == "HtoD" and m.host_memory == "pageable"]
        h2d = [m for m in (v.r.kernels.memcpy if v.r else []) if m.direction == "HtoD"]
        pg_bytes = sum(m.bytes for m in rows)
        all_bytes = sum(m.bytes for m in h2d) or 1
        traced = v.has_device_trace
        if not unpinned and not (rows and pg_bytes > 0.1 * all_bytes):
            return None
        idle = pageable_h2d_idle_ms(v) if traced else 0.0
        faster = 0.5 * v.ms(sum(m.ns for m in rows)) if traced else 0.0
        gain = idle + faster
        if traced and not unpinned and v.pct(gain) < 0.5:
            return None
        ev = []
        if rows:
            ev.append(Evidence(
                f"{sum(m.count for m in rows)} host-to-device copies from pageable memory "
                f"({pg_bytes / 1e6:.1f} MB, {fmt_ms(v.ms(sum(m.ns for m in rows)))} of copy per step; "
                f"{100 * pg_bytes / all_bytes:.0f}% of H2D bytes).",
                {"pageable_h2d_bytes": pg_bytes, "h2d_bytes": all_bytes}))
        waits = [c for c in (v.r.signals.blocking_copies if v.r and v.r.signals else [])
                 if c.direction == "HtoD" and c.host_memory == "pageable"]
        if waits and traced:
            longest = max(waits, key=lambda c: c.host_ns)
            sat = v.ms(sum(c.host_ns for c in waits))
            ev.append(Evidence(
                f"The host sat {fmt_ms(sat)} per step in these copies "
                f"(a pageable copy waits for the work queued before it, then stages the data); the device "
                f"idled {fmt_ms(idle)} of it. The longest (in {longest.op or longest.api}) began {at(v, longest.first_ts_ns)}.",
                {"host_blocked_ms": round(sat, 3), "idle_ms": round(idle, 3)},
                [ts_item(c.region or c.op, c.host_ns, c.count, c.first_ts_ns, v.n_steps, op=c.op, bytes=c.bytes)
                 for c in waits[:4]]))
        if unpinned:
            ev.append(Evidence("DataLoader(pin_memory=False) while the model trains on an accelerator.",
                               {"dataloaders_unpinned": len(unpinned)}))
        return finding(
            v, "DL-4", "input",
            "Batches are copied to the device from pageable memory (pin_memory=False)"
            + (f": about {fmt_ms(gain)} per step to gain." if traced else "."),
            gain, evidence=ev, warn=2.0,
            sev=None if traced else "info",
            fix=_loader_fix(v, "Pin host memory in the loader and copy asynchronously (pin in the loader, not in "
                            "the loop){where}.", "DataLoader(..., pin_memory=True)\nx = x.to(device, non_blocking=True)"),
            confidence="high" if rows else "medium",
            confirm="" if traced else "the profiler window of `torchdoctor run` measures the copy time",
            remedy="dataloader.pin_memory", source="NSYS cuda_memcpy_async; TTG pin_memory; proposed 2% of step",
            budget={"idle.host.htod_pageable": idle, "device.busy": faster})
    return per_rank(inputs, one)


@rule("DL-5", budgets=("idle.host",))
def blocking_h2d(inputs: RuleInputs) -> list[Finding]:
    """Blocking host-to-device copies from pinned memory (non_blocking=False).

    A pinned copy can be asynchronous; when the host still waits for it to finish, the call was
    made with non_blocking=False. TML H2D_BOUND flags H2D time at 10%/20% of the step; we claim
    the device idle during those waits and warn from 2% (as DL-4).
    """
    def one(v: View) -> Finding | None:
        if v.r is None or v.r.signals is None:
            return None
        sites = [c for c in v.r.signals.blocking_copies if c.direction == "HtoD" and c.host_memory == "pinned"]
        idle = v.ms(sum(c.idle_ns for c in sites))
        if v.pct(idle) < 0.5:
            return None
        return finding(
            v, "DL-5", "input",
            f"The host waits for pinned host-to-device copies to finish ({fmt_ms(idle)} of idle device per step).",
            idle, warn=2.0,
            evidence=[Evidence("Blocking pinned copies.", {"idle_ms": round(idle, 3)},
                               [ts_item(c.op or c.api, c.host_ns, c.count, c.first_ts_ns, v.n_steps,
                                        region=c.region) for c in sites])],
            fix=Fix("Copy with non_blocking=True from pinned memory; optionally prefetch the next batch "
                    "on a side stream.", "x = x.to(device, non_blocking=True)"),
            confidence="medium", source="TML H2D_BOUND; pinmem tutorial", budget="idle.host")
    return per_rank(inputs, one)


def restartable_loaders(loaders: list) -> list:
    """The loaders DL-6 is about: the training loop's, when the probe counted each loader's batches
    (those this rank drew at least half as many from as from the busiest; an evaluation loader draws
    fewer), if their workers are not persistent; without counts (an older run directory, a loader
    drawn from on another thread), every loader with workers that are not.
    The epoch starts DL-6 times are the training loop's: pytorch/ignite's cifar10 example, its
    training loader made persistent, had DL-6 price its evaluation loader with them ("every 4 steps",
    that loader's length) and name the training loader's line."""
    with_workers = [d for d in loaders if d.num_workers]
    # Only when every loader with workers was counted: one a prefetching thread draws from is
    # counted nowhere (the counts are the training thread's). Loaders drawn from alike (zip of two
    # training loaders) all stay.
    if with_workers and all(d.batches for d in with_workers):
        most = max(d.batches for d in with_workers)
        with_workers = [d for d in with_workers if 2 * d.batches >= most]
    return [d for d in with_workers if d.persistent_workers is False]


# Below this share of the step, restarting the workers once an epoch is not worth a finding.
NEGLIGIBLE_RESTART_PCT = 0.1


@rule("DL-6", budgets=("data.wait", "step"))
def workers_restart(inputs: RuleInputs) -> list[Finding]:
    """Workers restarted every epoch (num_workers > 0, persistent_workers=False).

    PL warns for workers without persistence (spawn); GPP's first_step_outlier sees the stall.
    Gain, measured on a live run: the loader's part of what the epoch-start steps take beyond the
    median step (``EpochStarts.loader_share``: creating the iterator, where the workers start and
    worker_init_fn runs, and the data wait above the median, where the old workers shut down and
    the first batch comes), as a share of the average step; its data-wait part is claimed from
    ``data.wait`` so DL-1 does not count it again. It includes the first batch's production, which
    persistent workers wait for too (a slight over-estimate). Not the whole excess: an evaluation
    loop and a checkpoint between epochs land in the same step (pytorch/examples super_resolution:
    713 ms of excess, 177 ms of it the loader's; `fix` measured 2.0% [-1.1%, 4.9%] against a claim
    of 11.5% on the whole excess). Without epoch starts in the steady steps: WORKER_START_S x
    workers / steps per epoch (assumed fork start), info, and no finding below
    NEGLIGIBLE_RESTART_PCT of the step (an epoch of 10^10 samples restarts nothing in a job's life).
    """
    def one(v: View) -> Finding | None:
        if v.f is None:
            return None
        for d in restartable_loaders(v.f.dataloaders):
            per_epoch = d.batches_per_epoch or (
                max(1, d.dataset_len // d.batch_size) if d.dataset_len and d.batch_size else None)
            ep = epoch_starts(v)
            facts = {"num_workers": d.num_workers, "steps_per_epoch": per_epoch}
            # Workers that cost more than they give (DL-1: a batch is cheaper to make than to receive):
            # without them there is nothing to restart either, and "keep them alive" would contradict it.
            cheaper = cheaper_in_process(d)
            if cheaper is not None:
                facts["advised_workers"] = 0
                fix = no_workers_fix([d], f", which removes the restarts with the workers (a worker makes a batch in "
                                          f"{fmt_ms(cheaper[1])}, receiving it takes {fmt_ms(cheaper[0])}).")
                remedy = "dataloader.workers"
            else:
                fix = loader_fix([d], "Keep the workers alive across epochs{where}.",
                                 "DataLoader(..., persistent_workers=True)")
                remedy = "dataloader.persistent_workers"
            if ep is not None and ep.loader_ms > 0 and v.step_ms:
                gain, wait = ep.loader_share * v.step_ms, min(ep.loader_share, ep.wait_share) * v.step_ms
                # The steps between epoch starts as timed (the first epoch started in step 0); with
                # one later start only, the loader's own length when known.
                every = round(ep.every) if ep.starts > 1 or not d.batches_per_epoch else d.batches_per_epoch
                return finding(
                    v, "DL-6", "input",
                    f"DataLoader workers ({d.num_workers}) are restarted at every epoch (persistent_workers=False): "
                    f"each epoch after the first spends {fmt_ms(ep.loader_ms)} restarting them (their start-up, the "
                    f"wait for its first batch, the model slowed while they start), every {every} steps; "
                    f"{ep.starts} such start(s) in this run, "
                    f"{v.pct(gain):.0f}% of its average step.",
                    gain, evidence=[Evidence(
                        f"{ep.starts} epoch start(s) in {ep.steps} steady steps; each took {fmt_ms(ep.excess_ms)} more "
                        f"than the median step, {fmt_ms(ep.loader_ms)} of it in the loader: creating its iterator "
                        "(worker start-up, worker_init_fn), the data wait above the median (the old workers' "
                        "shutdown, the first batch; persistent workers still wait for that batch) and the forward, "
                        "backward and optimizer time above their median, less forwards without autograd (after a "
                        "fork the training process copies each page it writes again, and starting workers take "
                        "CPUs). The rest is the job's own work between epochs (evaluation, checkpoints).",
                        {**facts, "epoch_starts": ep.starts, "steps": ep.steps,
                         "excess_ms_per_epoch": round(ep.excess_ms, 3), "loader_ms_per_epoch": round(ep.loader_ms, 3)})],
                    fix=fix, confidence="medium", remedy=remedy,
                    source="PL persistent_workers warning; GPP first_step_outlier; probe step timings",
                    budget={"data.wait": wait, "step": max(0.0, gain - wait)})
            gain = 1000.0 * WORKER_START_S * d.num_workers / per_epoch if per_epoch else 0.0
            if cheaper is None and per_epoch and v.step_ms and v.pct(gain) < NEGLIGIBLE_RESTART_PCT:
                # An epoch far longer than a restart: karpathy/minGPT's Trainer draws from a
                # RandomSampler of 10^10 samples, one iterator for the whole job, and DL-6 told it
                # "restarted at every epoch" at 0.0%.
                continue
            return finding(
                v, "DL-6", "input",
                f"DataLoader workers ({d.num_workers}) are restarted at every epoch (persistent_workers=False).",
                gain, sev="info",
                evidence=[Evidence(f"{d.num_workers} workers, persistent_workers=False, "
                                   f"{per_epoch or '?'} steps per epoch; no epoch start was timed, so the "
                                   f"start-up is assumed ({WORKER_START_S:g} s per worker, fork).", facts)],
                fix=fix, confidence="low", remedy=remedy,
                confirm="run past an epoch boundary under `torchdoctor run` to time the restarts",
                source="PL persistent_workers warning; GPP first_step_outlier")
        return None
    return per_rank(inputs, one)
