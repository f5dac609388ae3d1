"""How many DataLoader workers a rank should get (rules DL-1/DL-2/DL-3 and the workers remedy).

One function, so that the finding's advice and the remedy's value never disagree.

What bounds the count depends on why the loading is slow:

- CPU-bound loading (the training process computes while it waits for a batch): the workers
  compete for cores, so the free cores bound them. PL's formula, CPUs // local ranks - 1.
- Latency-bound loading (the training process sits idle while it waits: storage, network): the
  workers mostly wait too, so cores do not bound them; the wait does. With N workers loading in
  parallel, a batch that takes ``wait`` ms arrives every ``wait / N`` ms, and the step consumes
  one every ``rest`` ms (the step without the wait): N = ceil(wait / rest) keeps up. The same
  ratio is the prefetch depth: each worker keeps that many batches queued, so one late batch
  does not stall the step. What bounds N is memory: every worker is a process with its own
  resident set (a copy of the dataset object, its buffers).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# The loading is latency-bound (storage, network) when the training process used no CPU for at
# least this share of its wait for batches: then workers beyond the CPUs per rank still help,
# because they mostly wait too.
LATENCY_BOUND_IDLE = 0.5
# A worker using less than half a core is waiting on I/O, not competing for the CPU.
IDLE_WORKER_PCT = 50.0
# Share of the available memory the workers of all local ranks may take: the rest stays for the
# training process's own growth (optimizer state, caches) and the page cache the loading reads.
WORKER_MEM_SHARE = 0.5
# Without memory figures, latency-bound workers per rank are capped at this many per CPU of the
# rank: a worker blocked on I/O costs no core, but each one still costs a process and its memory,
# and beyond a few per core the wait (not the worker count) is what a faster store must fix.
WORKERS_PER_CPU_CAP = 4
# torch's DataLoader default prefetch_factor with workers.
DEFAULT_PREFETCH = 2


@dataclass(frozen=True)
class LoadingAdvice:
    """Workers per DataLoader, the prefetch depth per worker, and why (one sentence)."""

    workers: int
    prefetch: int
    why: str
    latency_bound: bool = False


def pl_workers(cpus: int, local_ranks: int) -> int:
    """PL's suggested_max_num_workers (fabric/utilities/data.py): CPUs // local ranks - 1, >= 1."""
    return max(1, cpus // max(local_ranks, 1) - 1)


def worker_cap(cpus: int, local_ranks: int, mem_available_mb: float | None,
               worker_rss_mb: float | None) -> tuple[int, str]:
    """Most workers per rank that latency-bound loading may use, and what sets that bound.

    With memory figures: WORKER_MEM_SHARE x available memory / (worker RSS x local ranks).
    Without them: WORKERS_PER_CPU_CAP x the rank's CPUs (CPUs // local ranks, at least 1).
    """
    ranks = max(local_ranks, 1)
    if mem_available_mb and worker_rss_mb and mem_available_mb > 0 and worker_rss_mb > 0:
        cap = max(1, math.floor(WORKER_MEM_SHARE * mem_available_mb / (worker_rss_mb * ranks)))
        return cap, (f"memory: {WORKER_MEM_SHARE:g} x {mem_available_mb:.0f} MB available / "
                     f"({worker_rss_mb:.0f} MB per worker x {ranks} local rank(s)) = {cap}")
    per_rank = max(1, cpus // ranks)
    cap = WORKERS_PER_CPU_CAP * per_rank
    return cap, f"memory unknown: at most {WORKERS_PER_CPU_CAP} x {per_rank} CPU(s) per rank = {cap}"


def advise_loading(cpus: int, local_ranks: int, step_ms: float | None, wait_ms: float | None,
                   main_cpu_pct: float | None, mem_available_mb: float | None = None,
                   worker_rss_mb: float | None = None, blocked_ms: float | None = None) -> LoadingAdvice:
    """Workers and prefetch depth for one rank's DataLoader.

    ``step_ms`` and ``wait_ms``: the median step and the median wait for a batch in it;
    ``main_cpu_pct``: the training process's CPU use in percent of one core; ``blocked_ms``: the
    median time per step the training thread is known to block on something else than data
    (inside collectives: a DDP rank waiting for its peers). The loading is latency-bound when the
    step's wall time without CPU use (step x (1 - CPU share)), less that blocked time, covers at
    least LATENCY_BOUND_IDLE of the wait. CPU-bound (or unknown): PL's formula, torch's default
    prefetch; both are capped by memory when its figures are given. Latency-bound:
    max(PL's formula, ceil(wait / rest of the step)) workers and max(2, the same ratio) batches
    per worker, both capped by ``worker_cap`` (memory, or a multiple of the CPUs when unknown).
    """
    pl = pl_workers(cpus, local_ranks)
    formula = f"CPUs // local ranks - 1 = {cpus} // {local_ranks} - 1"
    mem_known = bool(mem_available_mb and worker_rss_mb)
    cap, cap_why = worker_cap(cpus, local_ranks, mem_available_mb, worker_rss_mb)
    if not (step_ms and wait_ms and main_cpu_pct is not None and wait_ms > 0):
        return _cpu_bound(pl, formula, cap if mem_known else None, cap_why)
    # Wall time per step with no CPU used that could be the loading's: not the collectives' waits.
    idle = max(0.0, step_ms * (1 - main_cpu_pct / 100.0) - (blocked_ms or 0.0))
    if idle < LATENCY_BOUND_IDLE * wait_ms:
        return _cpu_bound(pl, f"CPU-bound loading: {formula}", cap if mem_known else None, cap_why)
    need = math.ceil(wait_ms / max(step_ms - wait_ms, 1.0))
    n = min(max(pl, need), cap)
    prefetch = min(max(DEFAULT_PREFETCH, need), cap)
    why = (f"latency-bound loading (the training process was busy {main_cpu_pct:.0f}% of a core while it "
           f"waited {wait_ms:.3g} ms per step for data): ceil(wait / rest of the step) = {need}, "
           f"at least PL's {pl}, at most {cap} ({cap_why}); prefetch_factor {prefetch}")
    return LoadingAdvice(n, prefetch, why, latency_bound=True)


def _cpu_bound(pl: int, why: str, mem_cap: int | None, cap_why: str) -> LoadingAdvice:
    """PL's count, lowered to the memory cap when that is known and smaller."""
    if mem_cap is not None and mem_cap < pl:
        return LoadingAdvice(mem_cap, DEFAULT_PREFETCH, f"{why}, lowered to {mem_cap} by {cap_why}")
    return LoadingAdvice(pl, DEFAULT_PREFETCH, why)


def training_busy_pct(steps: Sequence[Any], process_cpu_pct: float | None) -> float | None:
    """The training thread's busy share of its steps, percent of one core: on a CPU or runnable
    and waiting for one (``StepTiming.thread_cpu_ms + run_delay_ms`` over ``total_ms``), so the
    rest is time it was blocked (a batch's latency, I/O, sleep). Measured per step from the
    scheduler's counters, it does not move with the machine's other load, which the process's
    CPU share over the run does (its CPU time stretches with steal and other threads). Without
    those counters: ``process_cpu_pct``."""
    if not steps or any(getattr(s, "thread_cpu_ms", None) is None or getattr(s, "run_delay_ms", None) is None
                        for s in steps):
        return process_cpu_pct
    total = sum(s.total_ms for s in steps)
    if total <= 0:
        return process_cpu_pct
    return 100.0 * min(1.0, sum(s.thread_cpu_ms + s.run_delay_ms for s in steps) / total)


def advise_workers(
    cpus: int, local_ranks: int, step_ms: float | None, wait_ms: float | None, main_cpu_pct: float | None,
    mem_available_mb: float | None = None, worker_rss_mb: float | None = None, blocked_ms: float | None = None,
) -> tuple[int, str]:
    """Workers per DataLoader, and why that many (``advise_loading``'s count and sentence)."""
    a = advise_loading(cpus, local_ranks, step_ms, wait_ms, main_cpu_pct, mem_available_mb, worker_rss_mb,
                       blocked_ms)
    return a.workers, a.why


def workers_wait_on_io(num_workers: int, workers_cpu_pct: float | None) -> bool:
    """True when the workers together use under IDLE_WORKER_PCT of a core each: they wait on I/O."""
    return bool(num_workers) and workers_cpu_pct is not None and workers_cpu_pct / num_workers < IDLE_WORKER_PCT
