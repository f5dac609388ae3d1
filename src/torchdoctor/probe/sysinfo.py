"""Host facts without psutil: CPU time of this process and of its DataLoader workers, CPUs, NUMA.

CPU use is reported in percent of one core over a wall-clock interval (200 = two busy cores).
Worker CPU time is the sum of two parts: workers already reaped by this process (their time is in
``RUSAGE_CHILDREN``) and workers still alive (read from ``/proc/<pid>/stat``). ``RUSAGE_CHILDREN``
also counts any other reaped child of the process (rare in training jobs).
"""

from __future__ import annotations

import glob
import os
import resource

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def own_cpu_s() -> float:
    """User + system CPU seconds of this process (all threads)."""
    t = os.times()
    return t.user + t.system


def reaped_children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def live_child_cpu_s(pids: list[int]) -> float:
    """CPU seconds of those ``pids`` that are still our children (not yet reaped)."""
    me = os.getpid()
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        # Fields after the command name (which may contain spaces) start at field 3 (state).
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) < 13 or int(fields[1]) != me:  # field 4: ppid (pid reused by someone else)
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICKS  # fields 14, 15: utime, stime
    return total


def affinity() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return []


def numa_nodes() -> int | None:
    nodes = glob.glob("/sys/devices/system/node/node[0-9]*")
    return len(nodes) or None


def percent(cpu_s: float, wall_s: float) -> float | None:
    if wall_s <= 0:
        return None
    return round(100.0 * cpu_s / wall_s, 1)
