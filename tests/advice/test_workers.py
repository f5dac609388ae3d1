"""Worker advice: CPU-bound loading is bounded by cores, latency-bound loading by the wait and memory."""

from __future__ import annotations

from torchdoctor.advice.workers import (
    WORKER_MEM_SHARE,
    WORKERS_PER_CPU_CAP,
    advise_loading,
    advise_workers,
    pl_workers,
    worker_cap,
)


def test_cpu_bound_loading_uses_pl_formula() -> None:
    # The training process computes while it waits (95% of a core): the workers compete for cores.
    n, why = advise_workers(16, 2, 100.0, 60.0, 95.0)
    assert n == pl_workers(16, 2) == 7 and why.startswith("CPU-bound loading")
    # Nothing measured: the formula, whatever the memory.
    assert advise_workers(16, 1, None, None, None) == (15, "CPUs // local ranks - 1 = 16 // 1 - 1")
    assert pl_workers(1, 4) == 1  # at least one


def test_latency_bound_loading_is_not_capped_by_the_cpu_count() -> None:
    # 2 CPUs, one rank; each step waits 48 ms for data with 2 ms of work besides, and the training
    # process sits idle (5% of a core): ceil(48 / 2) = 24 workers would keep up. Memory unknown:
    # the cap is WORKERS_PER_CPU_CAP x 2 CPUs = 8, four times the CPU count.
    a = advise_loading(2, 1, 50.0, 48.0, 5.0)
    assert WORKERS_PER_CPU_CAP == 4
    assert (a.workers, a.prefetch, a.latency_bound) == (8, 8, True)
    assert "ceil(wait / rest of the step) = 24" in a.why and "memory unknown" in a.why
    # ceil(30 / 20) = 2 workers hide the wait, but never fewer than PL's formula: 15 on 16 CPUs
    # (workers that wait cost no cores); with 2 CPUs per rank PL gives 1 and the wait's 2 count.
    assert advise_workers(16, 1, 50.0, 30.0, 10.0)[0] == 15
    assert advise_loading(4, 2, 50.0, 30.0, 10.0).workers == 2  # PL gives 1; the wait needs 2


def test_latency_bound_workers_are_capped_by_memory_when_known() -> None:
    # 8000 MB available, 500 MB per worker, 2 local ranks: 0.5 x 8000 / (500 x 2) = 4 per rank.
    assert WORKER_MEM_SHARE == 0.5
    assert worker_cap(2, 2, 8000.0, 500.0)[0] == 4
    a = advise_loading(2, 2, 50.0, 48.0, 5.0, mem_available_mb=8000.0, worker_rss_mb=500.0)
    assert a.workers == 4 and a.prefetch == 4 and "memory: 0.5 x 8000 MB available" in a.why
    # Plenty of memory: the wait's 24 workers, 24 batches queued per worker.
    b = advise_loading(2, 1, 50.0, 48.0, 5.0, mem_available_mb=64000.0, worker_rss_mb=200.0)
    assert (b.workers, b.prefetch) == (24, 24)
    # Memory also lowers PL's count for CPU-bound loading: 0.5 x 2000 / 500 = 2 < 15.
    c = advise_loading(16, 1, 100.0, 60.0, 95.0, mem_available_mb=2000.0, worker_rss_mb=500.0)
    assert c.workers == 2 and "lowered to 2" in c.why and not c.latency_bound


def test_latency_bound_threshold_and_positional_callers() -> None:
    # idle = step x (1 - CPU share) against LATENCY_BOUND_IDLE (0.5) x wait: 100 x 0.25 = 25 = 0.5 x 50.
    assert advise_loading(16, 1, 100.0, 50.0, 75.0).latency_bound
    assert not advise_loading(16, 1, 100.0, 50.0, 76.0).latency_bound
    # The callers' positional form (rules/input.py, remedies/select.py): 2 CPUs, 2 local ranks,
    # ceil(95 / 45) = 3 workers, within the cap of 4 x 1 CPU per rank.
    n, why = advise_workers(2, 2, 140.0, 95.0, 20.0)
    assert n == 3 and "latency-bound" in why and "prefetch_factor 3" in why


def test_training_busy_share_comes_from_the_threads_counters_when_the_probe_has_them():
    from torchdoctor.advice.workers import training_busy_pct
    from torchdoctor.facts import StepTiming

    steps = [StepTiming(step=i, total_ms=200.0, thread_cpu_ms=40.0, run_delay_ms=10.0) for i in range(4)]
    # 50 ms of 200 on a CPU or waiting for one: 25%, whatever the process's CPU share over the run says.
    assert training_busy_pct(steps, 90.0) == 25.0
    assert training_busy_pct([StepTiming(step=0, total_ms=200.0)], 90.0) == 90.0  # no counters: the fallback
    assert training_busy_pct([], None) is None


def test_time_blocked_in_collectives_is_not_taken_for_a_slow_store() -> None:
    """A DDP rank of the pytorch/examples tutorial (2 CPUs, 2 ranks): a 1.4 ms step, 63% of a core
    busy, 0.15 ms waiting for batches and 0.5 ms blocked in gloo's all-reduce. The idle time is
    the collective's, not the loading's: CPU-bound loading, PL's formula (it was called
    latency-bound, with a wait printed as "0 ms")."""
    latency = advise_loading(2, 2, 1.4, 0.15, 63.0)
    assert latency.latency_bound and "waited 0.15 ms per step" in latency.why
    a = advise_loading(2, 2, 1.4, 0.15, 63.0, blocked_ms=0.5)
    assert not a.latency_bound and a.why.startswith("CPU-bound loading") and a.workers == 1
    # A rank that blocks in collectives and also waits on a slow store stays latency-bound.
    assert advise_loading(2, 1, 50.0, 30.0, 10.0, blocked_ms=10.0).latency_bound
