"""Was the machine quiet while an arm ran? The CPU time that processes other than `fix` and the job
took on the job's CPUs, so that `fix` says when a run was measured on a busy machine.

- Busy time of the CPUs this process may run on (``os.sched_getaffinity``, inherited by the job):
  the per-CPU lines of Linux's ``/proc/stat``, user + nice + system + steal (the hypervisor's share
  is lost to the job too), in clock ticks. Interrupt time is left out: much of it is the job's own
  (gloo's loopback traffic, its disk reads).
- Minus the CPU time of `fix` itself and of the job's whole process tree (``getrusage`` of this
  process and of its reaped children: the job, its ranks and their workers, which the job reaped).
  A run with the profiler window on is not measured: the probe hands its trace to a detached
  post-processing process that nobody reaps while the run is timed.
- Over the run's wall time x those CPUs: ``other_share`` in [0, 1]. Work of the job's processes
  that nobody reaped (a daemon left running) counts as other.

Elsewhere (no ``/proc/stat``) the share is unknown (None) and nothing is said.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass

BUSY_SHARE = 0.10  # other processes' share of the job's CPUs above which a run was on a busy machine
_STAT = "/proc/stat"


@dataclass(frozen=True)
class Mark:
    cpus: frozenset[int]
    busy_s: float
    own_s: float
    wall: float


def _cpus() -> frozenset[int]:
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return frozenset(range(os.cpu_count() or 1))


def busy_seconds(cpus: frozenset[int] | set[int], text: str) -> float | None:
    """Busy seconds of ``cpus`` in a /proc/stat text; None when none of them is listed."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total, seen = 0, False
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or not name[3:].isdigit() or int(name[3:]) not in cpus:
            continue
        fields = [int(x) for x in rest.split()]
        user, nice, system, _idle, _iowait, _irq, _softirq, steal = (fields + [0] * 8)[:8]
        total += user + nice + system + steal
        seen = True
    return total / tick if seen else None


def _read_busy(cpus: frozenset[int]) -> float | None:
    try:
        with open(_STAT, encoding="ascii") as f:
            return busy_seconds(cpus, f.read())
    except (OSError, ValueError):
        return None


def _own_seconds() -> float:
    return sum(r.ru_utime + r.ru_stime
               for r in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)))


def start() -> Mark | None:
    """Before a run: the counters to compare with; None where they cannot be read."""
    cpus = _cpus()
    busy = _read_busy(cpus)
    return None if busy is None else Mark(cpus, busy, _own_seconds(), time.monotonic())


def other_share(mark: Mark | None) -> float | None:
    """After the run (its processes reaped): the share of the job's CPUs other processes took."""
    if mark is None:
        return None
    busy = _read_busy(mark.cpus)
    wall = time.monotonic() - mark.wall
    if busy is None or wall <= 0:
        return None
    other = (busy - mark.busy_s) - (_own_seconds() - mark.own_s)
    return round(min(1.0, max(0.0, other / (wall * len(mark.cpus)))), 4)


def busy_text(labels_shares: list[tuple[str, float]]) -> str | None:
    """The warning for runs measured on a busy machine, or None when every run was quiet."""
    busy = [(label, share) for label, share in labels_shares if share > BUSY_SHARE]
    if not busy:
        return None
    runs = ", ".join(f"{label} ({share:.0%})" for label, share in busy)
    many = len(busy) > 1
    return (f"warning: other processes took more than {BUSY_SHARE:.0%} of the job's CPUs during run{'s' if many else ''} "
            f"{runs}: {'those runs' if many else 'that run'} timed a busy machine, not only the job; rerun `fix` "
            "when the machine is quiet before trusting the speed-up.")
