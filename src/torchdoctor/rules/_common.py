"""Shared plumbing for the rules: one `View` per rank, shares of the step, findings merged over ranks.

Every `recoverable_pct` is ms per step the fix gives back divided by the full step time (the
window's wall time per step on traces, the probe's median step on live runs), capped at 100,
so fixing it moves every headline number the right way.

The idle-time budget: device idle time per step is split by the metrics into causes (DataLoader,
sync, optimizer, host collective calls, other host ops, untraced). Findings claim parts of it
through the engine's claims ledger (rules/ledger.py); the budgets' sizes are defined here
(`@capacity`), and a rule reads what earlier rules left with `View.left(budget)`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

import numpy as np

from ..facts import DataLoaderFacts, RankFacts, StepTiming, sampled_comm_median
from ..metrics.between import Between, long_steps, loop_steps
from ..metrics.model import IdleCause, RankResult
from ..metrics.steps import WARMUP_FACTOR
from .engine import RankInputs, RuleInputs
from .ledger import Ledger, capacity
from .model import Claim, Evidence, Finding, Fix, Layer, Severity

# Severity ladder when a rule has no sharper source: TBP flags a cause above 5% of the step
# (DataLoader rule, data.py), TML turns critical at 20% (INPUT_BOUND/RESIDUAL_HEAVY policy).
WARN_PCT = 5.0
# Other processes using this share of the CPUs a rank runs on make the machine a shared one
# (foreign_load). Measured on 2 CPUs: 4-17% of a core by others on quiet runs (3-8% of the
# capacity), 71-101% with one busy loop beside the job (35-50%).
FOREIGN_LOAD_SHARE = 0.2
# Host conversions per batch that make a collate "element by element" when the batch size is unknown.
MIN_CONVERSIONS = 16
CRIT_PCT = 20.0
# Below this share of the step a finding is not worth a line even at info level.
NOISE_PCT = 0.5


class View:
    """What one rank shows: its trace metrics (`r`) and/or its live facts (`f`), and its step time.

    With `source` (a rank whose result lives in a compressed store, metrics/store.py), `r` is read
    from it on each access, as a view that decodes the fields read (the store keeps the last ranks'
    views), so the views of thousands of ranks, and the ledger that keeps them, never hold their
    decoded results all at once."""

    __slots__ = ("rank", "_r", "f", "step_ms", "n_steps", "ledger", "_source", "timed", "between")

    def __init__(self, rank: int | None, r: RankResult | None, f: RankFacts | None, probe: ProbeSteps,
                 ledger: Ledger | None = None, source: RankInputs | None = None) -> None:
        self.rank, self._r, self.f = rank, r, f
        self.step_ms, self.n_steps = probe.step_ms, probe.n_steps
        # The probe's steady step timings (without leading warm-up steps, nor the long steps of a
        # loop's regular work between steps, which HO-16 prices against the job) and those long
        # steps: worked out once per diagnosis (``views``), read by every rule.
        self.timed, self.between = probe.timed, probe.between
        self.ledger, self._source = ledger, source

    @property
    def r(self) -> RankResult | None:
        """The rank's trace metrics (read-only; a stored rank's is a view decoding the fields read)."""
        return self._source.view if self._source is not None else self._r

    def left(self, budget: str) -> float:
        """ms per step still unclaimed in ``budget`` (and every budget above it) on this rank."""
        if self.ledger is None:
            return CAPACITY_OF(self, budget)
        return self.ledger.left(self.rank, budget)

    def claimed(self, budget: str) -> float:
        """ms per step earlier findings were granted from ``budget`` on this rank."""
        return self.ledger.claimed(self.rank, budget) if self.ledger is not None else 0.0

    @property
    def accel(self) -> bool:
        """The model trains on an accelerator (device work in the trace, or a non-CPU device fact)."""
        if self.r is not None and self.r.device_kind != "cpu":
            return True
        return self.f is not None and self.f.device.kind not in ("cpu", "")

    @property
    def has_device_trace(self) -> bool:
        """A trace with device work inside the window (a window without any says nothing)."""
        return self.r is not None and self.r.device_kind != "cpu" and bool(self.r.metrics.busy_pct)

    @property
    def stepless(self) -> bool:
        """Only a trace without steps (no ProfilerStep, none inferred): 'per step' means the whole window."""
        return self.r is not None and not self.r.window.steps and not (self.f is not None and self.f.steps)

    def ms(self, ns: int | float) -> float:
        """A window total in ns as ms per step."""
        return float(ns) / 1e6 / max(self.n_steps, 1)

    def pct(self, ms: float) -> float:
        if not self.step_ms or self.step_ms <= 0:
            return 0.0
        return round(min(100.0, max(0.0, 100.0 * ms / self.step_ms)), 2)

    def window_ms(self, pct: float | None) -> float:
        """A share of the window (metrics' *_pct) as ms per step."""
        return 0.0 if pct is None or not self.step_ms else pct / 100.0 * self.step_ms

    def cause(self, name: str) -> IdleCause | None:
        if self.r is None:
            return None
        return next((c for c in self.r.idle_causes if c.cause == name), None)

    def cause_ms(self, name: str) -> float:
        c = self.cause(name)
        return self.ms(c.ns) if c else 0.0

    @property
    def profiler_inflation_ms(self) -> float:
        """How much longer the profiled window's steps ran than the probe's unprofiled steps (ms per
        step, >= 0; 0 without both). Kineto's per-event cost lands in whatever the window recorded
        densely (hundreds of small collectives, say): time the job does not lose without the profiler."""
        if self.r is None or not self.r.window.steps or not self.step_ms or not self.timed:
            return 0.0
        return max(0.0, self.step_ms - float(np.median([s.total_ms for s in self.timed])))

    def facts_median(self, attr: str) -> float | None:
        """Median over the probe's steady-state step timings of one StepTiming field."""
        if not self.timed:
            return None
        return float(np.median([getattr(s, attr) for s in self.timed]))

    def comm_median(self) -> float | None:
        """``facts.sampled_comm_median`` over the steady-state steps (None without any)."""
        return sampled_comm_median(self.timed) if self.timed else None


def every_step(f: RankFacts | None) -> list[StepTiming]:
    """The probe's steps of a rank with those of the profiler's window put back, in step order: for
    what happened in a step rather than how long it took (a save at an epoch's end that fell in the
    window: timm's train.py saves after every epoch, and with 6 steps an epoch one of every three
    saves was lost, which made it "one every 15 steps" of 18)."""
    if f is None:
        return []
    if not f.profiled_steps:
        return f.steps
    return sorted([*f.steps, *f.profiled_steps], key=lambda s: s.step)


def checkpoint_saves(v: View) -> tuple[int, float, int]:
    """(saves, ms blocked in them, steps recorded) over the probe's steps of this rank, the
    profiled ones included (DI-15's facts; its amortised cost per step is the middle over the last)."""
    steps = every_step(v.f)
    return sum(s.checkpoint_saves for s in steps), sum(s.checkpoint_ms for s in steps), len(steps)


def steady(steps: list[StepTiming]) -> list[StepTiming]:
    """Drop leading steps slower than WARMUP_FACTOR x the median of the rest (as metrics/steps.py does
    for ProfilerSteps): the first steps pay for worker start-up, allocator growth, autotuning."""
    rest = list(steps)
    while len(rest) >= 3 and rest[0].total_ms > WARMUP_FACTOR * float(np.median([s.total_ms for s in rest[1:]])):
        rest.pop(0)
    return rest


class ProbeSteps(NamedTuple):
    """What one rank's step timings give every rule: its step time and the steady steps."""

    step_ms: float | None  # the trace window's wall time per step, else the probe's median steady step
    n_steps: int
    # the probe's steady steps (``steady`` less a regular pattern's long steps, or without a pattern the
    # one or two stray ones: metrics/between.loop_steps)
    timed: list[StepTiming]
    between: Between | None  # the long steps of work between steps (metrics/between.py)


def probe_steps(r: RankResult | None, f: RankFacts | None) -> ProbeSteps:
    """The long steps of the rank's run, found once; the steady steps are ``steady`` of the steps
    less a regular pattern's long ones (an evaluation after every other step would otherwise be
    half of the steps that a median or a sum over them reads as the training step), or, without a
    pattern, less the one or two stray long steps (two epoch-end evaluations that a sum counts)."""
    found = long_steps(f.steps, f.train_wall_s) if f is not None else (None, [])
    between = found[0]
    timed = steady(loop_steps(f.steps, found)) if f is not None else []
    if r is not None and r.window.end_ns > r.window.start_ns:
        n = max(len(r.window.steps), 1)
        return ProbeSteps((r.window.end_ns - r.window.start_ns) / 1e6 / n, n, timed, between)
    if timed:
        return ProbeSteps(float(np.median([s.total_ms for s in timed])), len(timed), timed, between)
    return ProbeSteps(None, 0, timed, between)


def views(inputs: RuleInputs) -> list[View]:
    """One View per rank, seen by the ledger. Step times and steady steps are worked out once per
    diagnosis (a stored rank would otherwise be decoded for them by every rule)."""
    steps = inputs.memo.get("view_steps")
    if steps is None or len(steps) != len(inputs.ranks):
        steps = inputs.memo["view_steps"] = [probe_steps(ri.view, ri.facts) for ri in inputs.ranks]
    out = []
    for ri, probe in zip(inputs.ranks, steps, strict=True):
        f = ri.facts
        rank = ri.rank if ri.rank is not None else (f.rank if f is not None else None)
        stored = ri.stored is not None
        v = View(rank, None if stored else ri.result, f, probe, inputs.ledger, ri if stored else None)
        inputs.ledger.see(v)
        out.append(v)
    return out


def severity(pct: float, warn: float = WARN_PCT, crit: float = CRIT_PCT) -> Severity:
    if pct >= crit:
        return "critical"
    if pct >= warn:
        return "warning"
    return "info"


def finding(v: View, id: str, layer: Layer, title: str, ms: float, *, sev: Severity | None = None,
            evidence: Iterable[Evidence] = (), fix: Fix | None = None, confidence: str = "medium",
            confirm: str = "", remedy: str | None = None, source: str = "",
            warn: float = WARN_PCT, crit: float = CRIT_PCT,
            budget: str | dict[str, float] = "step") -> Finding:
    """A finding for one rank; `ms` is the time per step the fix gives back.

    ``budget`` names the ledger budget `ms` is claimed from, or maps budgets to the parts of
    `ms` claimed from each. The engine grants the claims (rules/engine.py).
    """
    parts = budget if isinstance(budget, dict) else {budget: ms}
    claims = [Claim(b, round(float(x), 6), rank=v.rank) for b, x in parts.items() if x > 0]
    pct = v.pct(ms)
    level = sev or severity(pct, warn, crit)
    evidence = list(evidence)
    if v.stepless:
        # No steps to divide by: speak of the traced window, say how to get steps, and do not
        # call anything critical on a trace that may not even be training.
        title = (title.replace(" per step", " in the traced window").replace("of the step", "of the window")
                 .replace("each step waits", "the traced window waits"))
        for e in evidence:
            e.text = e.text.replace(" per step", " in the window").replace("/step", "")
        confidence = "low"
        confirm = confirm or "the trace has no ProfilerStep: call prof.step() every iteration to get per-step numbers"
        level = "warning" if level == "critical" else level
        crit = float("inf")
    return Finding(
        id=id, layer=layer, severity=level, title=title,
        recoverable_pct=pct, recoverable_ms=round(ms, 3),
        evidence=evidence, fix=fix, confidence=confidence,  # type: ignore[arg-type]
        confirm=confirm, remedy=remedy, ranks=[v.rank] if v.rank is not None else [], source=source,
        claims=claims, ladder=[warn, crit] if sev is None else None, per="window" if v.stepless else "step",
    )


def per_rank(inputs: RuleInputs, fn: Callable[[View], Finding | None]) -> list[Finding]:
    """Run a one-rank rule on every rank and merge: the worst rank speaks for the job.

    In synchronous data-parallel training every rank waits for the slowest, so the job gains what
    the worst rank gains. The merged finding lists every rank that shows the problem.
    """
    vs = views(inputs)
    hits = [(v, f) for v in vs if (f := fn(v)) is not None]
    if not hits:
        return []
    _, best = max(hits, key=lambda h: h[1].recoverable_pct)
    # The other ranks' claims are granted here, on their own budgets; the engine grants the
    # speaking rank's (those the finding carries).
    for _, f in hits:
        if f is not best:
            for c in f.claims:
                inputs.ledger.grant(f.id, c.rank, c.budget, c.asked_ms)
    best.ranks = sorted({r for _, f in hits for r in f.ranks})
    if len(vs) > 1:
        shares = [f.recoverable_pct for _, f in hits]
        best.evidence.append(Evidence(
            f"Seen on {len(hits)} of {len(vs)} ranks (recoverable share: median "
            f"{float(np.median(shares)):.1f}%, max {max(shares):.1f}%).",
            {"ranks_hit": len(hits), "ranks": len(vs)}))
    return [best]


def fmt_ms(ms: float) -> str:
    return f"{ms:.1f} ms" if ms >= 1 else f"{ms * 1000:.0f} µs"


def ts_item(name: str, ns: int | float, count: int = 0, first_ts_ns: int | None = None,
            steps: int = 1, **extra) -> dict:
    """An offending op/kernel as an evidence item: name, ms per step, count, where to find it."""
    item = {"name": name, "ms_per_step": round(float(ns) / 1e6 / max(steps, 1), 3)}
    if count:
        item["count"] = count
    if first_ts_ns is not None:
        item["ts_ns"] = int(first_ts_ns)
    item.update(extra)
    return item


def env_on(f: RankFacts | None, name: str) -> bool:
    """An environment flag set to a truthy value (1/true/yes/on)."""
    if f is None:
        return False
    return f.env.get(name, "").strip().lower() in ("1", "true", "yes", "on", "y")


# --- the budgets' sizes (rules/ledger.py) --------------------------------------------------------

def CAPACITY_OF(v: View, budget: str) -> float:  # noqa: N802 - the ledger's sizing, without a ledger
    from .ledger import CAPACITY
    return max(0.0, float(CAPACITY[budget](v))) if budget in CAPACITY else 0.0


@capacity("step")
def step_capacity(v: View) -> float:
    """The step; unknown (facts without step timings) leaves claims uncapped by it."""
    return v.step_ms if v.step_ms else float("inf")


@capacity("idle")
def idle_capacity(v: View) -> float:
    """Device idle per step; on a job without device activity the whole step is 'idle'."""
    if v.has_device_trace and v.r is not None:
        return v.window_ms(v.r.metrics.idle_pct)
    return step_capacity(v)


@capacity("idle.host")
def host_idle_capacity(v: View) -> float:
    """Device idle while the host runs ops, untraced Python or the optimizer."""
    return v.cause_ms("host_ops") + v.cause_ms("untraced") + v.cause_ms("optimizer")


@capacity("idle.host.optimizer")
def optimizer_idle_capacity(v: View) -> float:
    return v.cause_ms("optimizer")


@capacity("idle.sync")
def sync_idle_capacity(v: View) -> float:
    return v.cause_ms("sync")


@capacity("device.busy")
def busy_capacity(v: View) -> float:
    return v.window_ms(v.r.metrics.busy_pct) if v.has_device_trace and v.r is not None else 0.0


def handoff_share(v: View) -> float:
    """Share of the data wait spent receiving batches that were already produced (probe only).

    Workers present: the probe checks the iterator's queue before each ``__next__``; the wait for a
    ready batch is the handoff (queue, unpickling, shared-memory mapping), which more workers or a
    deeper prefetch do not shorten. 0 without that knowledge (then all the wait counts as starved).
    """
    known = [s for s in v.timed if s.dataloader_unready_ms is not None]
    waited = sum(s.dataloader_ms for s in known)
    if not waited:
        return 0.0
    return max(0.0, 1.0 - sum(s.dataloader_unready_ms or 0.0 for s in known) / waited)


def host_peers(f: RankFacts, all_views: list[View]) -> list[RankFacts]:
    """The ranks on ``f``'s host whose CPUs overlap its own (``f`` included)."""
    mine = set(f.cpu.affinity)
    return [w.f for w in all_views if w.f is not None and w.f.hostname == f.hostname
            and (not mine or not w.f.cpu.affinity or mine & set(w.f.cpu.affinity))]


def foreign_cpu_pct(f: RankFacts, all_views: list[View]) -> float | None:
    """CPU time other processes (and the hypervisor's steal) took on the CPUs ``f`` runs on, percent
    of one core over the run: those CPUs' busy time less what the job's ranks there and their
    DataLoader workers and other child processes used (the probe's counters). None without the
    busy time."""
    busy = f.cpu.affinity_cpus_busy_pct
    if busy is None:
        return None
    job = sum((p.cpu.main_process_cpu_pct or 0.0) + (p.cpu.dataloader_workers_cpu_pct or 0.0)
              + (p.cpu.child_processes_cpu_pct or 0.0) for p in host_peers(f, all_views))
    return max(0.0, busy - job)


def foreign_load(f: RankFacts | None, all_views: list[View]) -> tuple[float, int] | None:
    """(percent of one core other processes took on ``f``'s CPUs, those CPUs) when that is at least
    FOREIGN_LOAD_SHARE of their capacity: the machine is shared, and timings that compare ranks
    (who is late) measure its load as much as the job. None below it or without the counters."""
    if f is None:
        return None
    pct = foreign_cpu_pct(f, all_views)
    cpus = len(f.cpu.affinity) or f.cpu.logical_cpus or 0
    if pct is None or not cpus or pct < FOREIGN_LOAD_SHARE * 100.0 * cpus:
        return None
    return pct, cpus


def worker_loader(v: View) -> DataLoaderFacts | None:
    """The worker loader whose workers measured their own batches (probe/workers.py): the one that
    produced the most batches; None without one."""
    seen = [d for d in (v.f.dataloaders if v.f is not None else []) if d.num_workers and d.worker_batches]
    return max(seen, key=lambda d: d.worker_batches or 0) if seen else None


def converting_collate(v: View) -> DataLoaderFacts | None:
    """A worker loader whose collate_fn converts tensors element by element (at least one host
    conversion per sample of the batch, MIN_CONVERSIONS when the batch size is unknown: a padding
    collate's one ``lengths.max().item()`` per batch is not that) and whose CPU time the workers
    measured."""
    d = worker_loader(v)
    if d is None or not d.worker_collate_syncs_per_batch or not d.worker_collate_cpu_ms_mean:
        return None
    return d if d.worker_collate_syncs_per_batch >= (d.batch_size or MIN_CONVERSIONS) else None


def unready_wait_ms(v: View) -> float:
    """The step's wait for batches the workers had not produced yet (the data wait less the
    handoff of ready batches), ms per step, before any claim on it."""
    return data_wait_ms(v) * (1.0 - handoff_share(v))


def worker_collate_wait_ms(v: View, d: DataLoaderFacts) -> float:
    """The part of the step's wait for batches the workers had not produced yet that their collate_fn
    costs: that wait times the collate's share of a worker's time per batch (both measured)."""
    per_batch = (d.worker_dataset_ms_mean or 0.0) + (d.worker_collate_ms_mean or 0.0)
    if per_batch <= 0:
        return 0.0
    unready = v.left("data.wait") * (1.0 - handoff_share(v))
    return unready * (d.worker_collate_ms_mean or 0.0) / per_batch


def worker_split_text(d: DataLoaderFacts) -> str:
    """One sentence: where a worker's time per batch goes (probe/workers.py)."""
    conv = (f", {d.worker_collate_syncs_per_batch:.0f} host conversions (.item()/.tolist()/.numpy()) per batch"
            if d.worker_collate_syncs_per_batch else "")
    return (f"Inside the workers, a batch takes {fmt_ms((d.worker_dataset_ms_mean or 0) + (d.worker_collate_ms_mean or 0))}: "
            f"{fmt_ms(d.worker_dataset_ms_mean or 0)} in the dataset's reads and {fmt_ms(d.worker_collate_ms_mean or 0)} "
            f"in collate_fn {d.collate_fn or ''} ({fmt_ms(d.worker_collate_cpu_ms_mean or 0)} of CPU{conv}); "
            f"measured by the workers over {d.worker_batches} batches.")


@capacity("data.wait")
def data_wait_ms(v: View) -> float:
    """Time per step the step waits for the next batch.

    Trace: DataLoader `__next__` time while the device is idle (all of it on a CPU-only trace,
    where the training loop itself waits); a trace without steps: that time in the whole window.
    Live run without trace steps: the probe's median wait in `__next__`.
    """
    timed = v.timed
    rows = v.r.window.steps if v.r is not None else []
    # A trace without steps: the share of the whole window, in the window's terms (`finding`).
    if v.r is not None and (rows or v.stepless) and (v.accel or len(timed) <= len(rows)):
        return v.window_ms(v.r.metrics.dataloader_exposed_pct)
    if timed and v.step_ms:
        # CPU run: the probe's wall wait is the exposed wait, over many more steps than the window.
        share = sum(s.dataloader_ms for s in timed) / max(sum(s.total_ms for s in timed), 1e-9)
        return share * v.step_ms
    return 0.0


# --- claims on the idle budget (shared by the specific rules and the generic one) ---------------

@capacity("idle.host.dtoh_copy")
def blocking_copy_idle_ms(v: View) -> float:
    """Device idle per step while the host sat in a blocking device-to-host copy (HO-3 claims it)."""
    if v.r is None or v.r.signals is None:
        return 0.0
    return v.ms(sum(c.idle_ns for c in v.r.signals.blocking_copies if c.direction == "DtoH"))


@capacity("idle.host.htod_pageable")
def pageable_h2d_idle_ms(v: View) -> float:
    """Device idle per step while the host sat in a blocking pageable host-to-device copy (DL-4)."""
    if v.r is None or v.r.signals is None:
        return 0.0
    return v.ms(sum(c.idle_ns for c in v.r.signals.blocking_copies
                    if c.direction == "HtoD" and c.host_memory == "pageable"))


def launch_overhead_ms(v: View) -> float:
    """Host time per step spent inside kernel-launch calls while the queue ran dry (HO-2 claims it).

    launches/step x median launch cost x share of launches that found <= 1 kernel queued: only
    launches into an (almost) empty queue leave the device waiting for the host.
    """
    if v.r is None:
        return 0.0
    ls = v.r.launches
    if not ls.launches or ls.launch_ns_median is None or ls.queue_le1_pct is None:
        return 0.0
    per_step = ls.launches / max(v.n_steps, 1)
    starving = per_step * ls.launch_ns_median / 1e6 * ls.queue_le1_pct / 100.0
    idle = v.cause_ms("host_ops") + v.cause_ms("untraced")
    return min(starving, max(0.0, idle - blocking_copy_idle_ms(v) - pageable_h2d_idle_ms(v)))


def device_bound(v: View) -> float:
    """How much faster kernels shorten the step: the busy share of the window.

    In a host-bound step the device already waits for the host, so faster kernels only widen
    the gaps; we scale gains on kernel time by the busy share (1 when compute-bound).
    """
    if v.r is None or v.r.metrics.busy_pct is None:
        return 1.0
    return max(0.0, min(1.0, v.r.metrics.busy_pct / 100.0))


def alloc_idle_ms(v: View) -> float:
    """Host time per step in allocator calls inside steady-state steps (HW-7 claims it)."""
    if v.r is None or v.r.signals is None or not v.r.window.steps or not v.r.signals.alloc_calls:
        return 0.0
    return min(v.ms(v.r.signals.alloc_ns), v.cause_ms("host_ops"))


def at(v: View, ts_ns: int | None) -> str:
    """Where an event sits, as an offset from the window start (what a trace viewer shows)."""
    if ts_ns is None or v.r is None:
        return ""
    return f"at {(ts_ns - v.r.window.start_ns) / 1e6:+.1f} ms"


def tops_text(v: View, tops: Iterable, n: int = 3, width: int = 60) -> str:
    """'name (x ms/step, k calls, at +t ms); ...' for NamedTime-like rows (name, ns, count, first_ts_ns)."""
    parts = []
    for t in list(tops)[:n]:
        name = t.name if len(t.name) <= width else t.name[: width - 1] + "…"
        bits = [f"{fmt_ms(v.ms(t.ns))}/step"]
        if getattr(t, "count", 0):
            bits.append(f"{t.count}x")
        if (where := at(v, getattr(t, "first_ts_ns", None))):
            bits.append(f"longest {where}")
        parts.append(f"{name} ({', '.join(bits)})")
    return "; ".join(parts)


def built_by(v: View) -> str | None:
    """The library that built the job's optimizer or DataLoader ("torchtune": its recipes build both
    through its config; "transformers": the Trainer), where its settings, not the job's code, hold the fix."""
    if v.f is None:
        return None
    return next((made.created_by for made in [*v.f.optimizers, *v.f.dataloaders] if made.created_by), None)


def work_ms(v: View, host_ns: int, device_ns: int | None) -> tuple[float, bool, float]:
    """(ms per step, on the device?, the gain it gives back) of work a change removes: the device time of what it
    launched on an accelerator trace, scaled by the busy share (a host-bound step does not get shorter by doing less
    device work), else its host time."""
    if device_ns is not None and v.has_device_trace:
        ms = v.ms(device_ns)
        return ms, True, ms * device_bound(v)
    ms = v.ms(host_ns)
    return ms, False, ms

