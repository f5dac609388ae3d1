"""How many DataLoader workers a rank should get (rules DL-1/DL-2/DL-3 and the workers remedy).

One function, so that the finding's advice and the remedy's value never disagree.
"""

from __future__ import annotations

import math

# The loading is latency-bound (storage, network) when the training process used no CPU for at
# least this share of its wait for batches: then workers beyond the CPUs per rank still help,
# because they mostly wait too.
LATENCY_BOUND_IDLE = 0.5
# A worker using less than half a core is waiting on I/O, not competing for the CPU.
IDLE_WORKER_PCT = 50.0


def pl_workers(cpus: int, local_ranks: int) -> int:
    """PL's suggested_max_num_workers (fabric/utilities/data.py): CPUs // local ranks - 1, >= 1."""
    return max(1, cpus // max(local_ranks, 1) - 1)


def advise_workers(
    cpus: int, local_ranks: int, step_ms: float | None, wait_ms: float | None, main_cpu_pct: float | None
) -> tuple[int, str]:
    """Workers per DataLoader, and why that many.

    CPU-bound loading: PL's formula, CPUs // local ranks - 1 (at least 1). Latency-bound loading
    (the training process sat idle for at least LATENCY_BOUND_IDLE of its wait for batches): enough
    workers for a batch to be ready at every step, ceil(wait / rest of the step), up to the CPUs
    of the affinity mask (torch's own limit, DataLoader.check_worker_number_rationality).
    ``main_cpu_pct`` is the training process's CPU use in percent of one core.
    """
    pl = pl_workers(cpus, local_ranks)
    formula = f"CPUs // local ranks - 1 = {cpus} // {local_ranks} - 1"
    if not (step_ms and wait_ms and main_cpu_pct is not None and wait_ms > 0):
        return pl, formula
    idle = max(0.0, step_ms * (1 - main_cpu_pct / 100.0))  # wall time per step with no CPU used
    if idle < LATENCY_BOUND_IDLE * wait_ms:
        return pl, f"CPU-bound loading: {formula}"
    need = math.ceil(wait_ms / max(step_ms - wait_ms, 1.0))
    n = max(pl, min(need, cpus))
    return n, (f"latency-bound loading (the training process used {main_cpu_pct:.0f}% of a core while it "
               f"waited {wait_ms:.0f} ms per step for data): ceil(wait / rest of the step) = {need}, "
               f"at most the {cpus} CPUs of the affinity mask")


def workers_wait_on_io(num_workers: int, workers_cpu_pct: float | None) -> bool:
    """True when the workers together use under IDLE_WORKER_PCT of a core each: they wait on I/O."""
    return bool(num_workers) and workers_cpu_pct is not None and workers_cpu_pct / num_workers < IDLE_WORKER_PCT
