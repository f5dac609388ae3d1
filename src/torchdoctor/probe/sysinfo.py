"""Host facts without psutil: CPU time of this process and of its DataLoader workers, its peak
resident memory, CPUs, NUMA, the scheduler's counters of the training thread, and the machine's
busy CPU time.

CPU use is reported in percent of one core over a wall-clock interval (200 = two busy cores).
Worker CPU time is the sum of two parts: workers already reaped by this process (their time is in
``RUSAGE_CHILDREN``) and workers still alive (read from ``/proc/<pid>/stat``). ``RUSAGE_CHILDREN``
also counts any other reaped child of the process (rare in training jobs).
"""

from __future__ import annotations

import contextlib
import glob
import os
import resource
import sys
import threading

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def own_cpu_s() -> float:
    """User + system CPU seconds of this process (all threads)."""
    t = os.times()
    return t.user + t.system


def reaped_children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def peak_rss_mib() -> float | None:
    """This process's peak resident memory so far, MiB (None where getrusage has no ru_maxrss)."""
    try:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except Exception:
        return None
    # Linux reports KiB, macOS bytes.
    return round(peak / (2**20 if sys.platform == "darwin" else 2**10), 1) if peak > 0 else None


def live_child_cpu(pids: list[int]) -> dict[int, float]:
    """CPU seconds (since each started) of those ``pids`` that are still our children (not yet reaped)."""
    me = os.getpid()
    out: dict[int, float] = {}
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
        out[pid] = (int(fields[11]) + int(fields[12])) / _TICKS  # fields 14, 15: utime, stime
    return out


def live_child_cpu_s(pids: list[int]) -> float:
    """CPU seconds of those ``pids`` that are still our children (not yet reaped)."""
    return sum(live_child_cpu(pids).values())


def child_pids() -> list[int]:
    """This process's live child processes: the children of each of its threads (a child belongs
    to the thread that started it), from /proc/self/task/*/children; [] where the kernel has no
    such file."""
    pids: set[int] = set()
    for path in glob.glob("/proc/self/task/*/children"):
        with contextlib.suppress(OSError, ValueError), open(path, encoding="ascii") as f:
            pids.update(int(p) for p in f.read().split())
    return sorted(pids)


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


_RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", None)  # Linux only


def thread_faults() -> tuple[int, int] | None:
    """The calling thread's (minor page faults, ns of system CPU time) since it started, from
    ``getrusage(RUSAGE_THREAD)`` (Linux, one syscall of ~1 us); None where unavailable.

    A minor fault maps a page the process already owns but had given back (or never touched):
    the kernel zeroes 4 KiB and maps it. A training step that frees and re-allocates the same
    buffers through an allocator that returns them to the kernel (glibc malloc: blocks above its
    mmap threshold, heap tops above its trim threshold) faults its activations in again every
    step, in system time on the training thread (probe: StepTiming.minor_faults, thread_sys_ms)."""
    if _RUSAGE_THREAD is None:
        return None
    try:
        usage = resource.getrusage(_RUSAGE_THREAD)
    except (OSError, ValueError):
        return None
    return usage.ru_minflt, int(usage.ru_stime * 1e9)


class ThreadSchedstat:
    """The calling thread's scheduler counters: (ns on a CPU, ns runnable but waiting for one).

    Read from ``/proc/self/task/TID/schedstat`` (Linux, CONFIG_SCHED_INFO) through a file
    descriptor kept open per thread: one ``pread`` of ~3 us, cheap enough for every step boundary.
    The second number is the run-queue delay: time the thread was ready to run while the
    scheduler gave its CPU to someone else (another thread of the job, a DataLoader worker,
    another rank, another process). ``read`` returns None, for good, where that file does not
    exist or cannot be parsed: the probe never fails the job for it.
    """

    def __init__(self) -> None:
        self._fd: int | None = None
        self._tid: int | None = None
        self.broken = not os.path.exists("/proc/self/task")

    def read(self) -> tuple[int, int] | None:
        if self.broken:
            return None
        try:
            tid = threading.get_native_id()
            if tid != self._tid:
                self.close()
                self._fd = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                self._tid = tid
            assert self._fd is not None
            on_cpu, waiting = os.pread(self._fd, 96, 0).split()[:2]
            return int(on_cpu), int(waiting)
        except (OSError, ValueError, AttributeError, AssertionError):
            self.broken = True
            self.close()
            return None

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = self._tid = None


def cpus_busy_s(cpus: list[int]) -> float | None:
    """Busy CPU seconds since boot of the CPUs ``cpus`` (all of them when empty), by every process
    on the machine, from the per-CPU lines of /proc/stat; busy includes steal (time the hypervisor
    gave to other guests). None where /proc/stat is unreadable. In a container without its own
    /proc (lxcfs) these are the host's CPUs, which the affinity mask narrows to ours."""
    want = {f"cpu{c}" for c in cpus}
    busy = 0.0
    seen = False
    try:
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                if not line.startswith("cpu"):
                    break
                name, *rest = line.split()
                if name == "cpu" or (want and name not in want):
                    continue
                ticks = [int(x) for x in rest[:8]]
                if len(ticks) >= 5:
                    busy += sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait
                    seen = True
    except (OSError, ValueError):
        return None
    return busy / _TICKS if seen else None
