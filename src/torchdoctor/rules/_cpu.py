"""Who holds the CPUs the training thread waits for: shared by HO-13 (the rank's own threads) and
HO-14 (the DataLoader workers), which claim different parts of the same measured run-queue delay.

The probe reads the training thread's scheduler counters at every step edge
(``StepTiming.run_delay_ms``: time it was ready to run but waited for a CPU). Who held the CPUs
meanwhile is apportioned by CPU time on the rank's CPUs over the run (``CpuFacts``, percent of one
core):

  own threads   this process's other threads (intra-op pool, comm, pin-memory): the process's
                CPU time minus the training thread's
  other ranks   the main processes of the other ranks on the same host whose CPUs overlap
  workers       the DataLoader workers of those ranks and of this one
  children      their other child processes (a data-augmentation pool outside torch's DataLoader,
                such as nnU-Net's batchgenerators augmenters; a multiprocessing Pool)
  others        everything else that kept those CPUs busy (other processes, the hypervisor's
                steal): the CPUs' busy time minus the job's

The job's own threads compete only when the ranks on the host run more intra-op threads than there
are CPUs (``threads x local ranks > CPUs``): a job sized to its cores gives each of them a core.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._common import View, foreign_cpu_pct, host_peers


@dataclass(frozen=True)
class Holders:
    """CPU time of who competes with the training thread, percent of one core over the run."""

    own_threads: float
    other_ranks: float
    workers: float
    others: float
    children: float = 0.0

    @property
    def total(self) -> float:
        return self.own_threads + self.other_ranks + self.workers + self.others + self.children


@dataclass(frozen=True)
class RunDelay:
    """The training thread's run-queue delay over the probe's steady steps, and who caused it."""

    delay_ms: float  # mean per step
    step_ms: float  # mean step of the same steps
    thread_pct: float  # the training thread's own CPU time, percent of one core
    holders: Holders

    def part(self, share: float) -> float:
        """The delay (ms per step) apportioned to a holder whose CPU time is ``share`` (% of a core)."""
        return self.delay_ms * share / self.holders.total if self.holders.total > 0 else 0.0

    def to_view(self, v: View) -> float:
        """Factor from these steady steps' ms to the view's: the finding speaks in shares of the
        view's step (a profiler window's steps can be longer), so a claim keeps its measured share."""
        return (v.step_ms / self.step_ms) if v.step_ms else 1.0

    @property
    def job_threads_ms(self) -> float:
        """The part held by the job's own intra-op threads: this process's and the other ranks'."""
        return self.part(self.holders.own_threads + self.holders.other_ranks)


def training_processes(v: View, all_views: list[View]) -> int:
    """The job's processes on ``v``'s host whose CPUs overlap its own (``v`` included; 1 without facts)."""
    return len(host_peers(v.f, all_views)) if v.f is not None else 1


def holders(v: View, all_views: list[View], thread_pct: float) -> Holders | None:
    """CPU time of the training thread's competitors on ``v``'s CPUs (module docstring); None when
    the probe did not measure the CPU use it needs."""
    f = v.f
    if f is None or f.cpu.main_process_cpu_pct is None:
        return None
    mine = set(f.cpu.affinity)
    peers = host_peers(f, all_views)
    threads = sum(p.cpu.torch_num_threads or 1 for p in peers)
    cpus = len(mine) or f.cpu.logical_cpus or 0
    oversubscribed = bool(cpus) and threads > cpus
    own = max(0.0, f.cpu.main_process_cpu_pct - thread_pct) if oversubscribed else 0.0
    ranks = sum(p.cpu.main_process_cpu_pct or 0.0 for p in peers if p is not f) if oversubscribed else 0.0
    workers = sum(p.cpu.dataloader_workers_cpu_pct or 0.0 for p in peers)
    others = foreign_cpu_pct(f, all_views) or 0.0
    children = sum(p.cpu.child_processes_cpu_pct or 0.0 for p in peers)
    return Holders(own, ranks, workers, others, children)


def run_delay(v: View, all_views: list[View]) -> RunDelay | None:
    """The measured delay and its holders; None without the probe's scheduler and CPU counters."""
    steps = v.timed
    if not steps or any(s.run_delay_ms is None for s in steps) or v.f is None:
        return None
    total = sum(s.total_ms for s in steps)
    if total <= 0:
        return None
    thread_pct = 100.0 * sum(s.thread_cpu_ms or 0.0 for s in steps) / total
    h = holders(v, all_views, thread_pct)
    if h is None:
        return None
    return RunDelay(sum(s.run_delay_ms or 0.0 for s in steps) / len(steps), total / len(steps), thread_pct, h)


def oversubscribed_by_job(v: View, all_views: list[View]) -> bool:
    """The job's intra-op threads on this host cover every CPU of the rank's mask (threads >= CPUs)."""
    f = v.f
    if f is None:
        return False
    cpus = len(f.cpu.affinity) or f.cpu.logical_cpus or 0
    return bool(cpus) and sum(p.cpu.torch_num_threads or 1 for p in host_peers(f, all_views)) >= cpus
