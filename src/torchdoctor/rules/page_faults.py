"""Host layer, page faults: the allocator hands memory back to the kernel every step (HO-15).

Measured, not assumed: the probe reads the training thread's minor page faults and system CPU
time at every step edge (``StepTiming.minor_faults``, ``thread_sys_ms``: getrusage with
RUSAGE_THREAD). A steady training step allocates and frees the same activations every step; an
allocator that keeps them reuses the pages, one that gives them back to the kernel (glibc malloc
does for blocks above its mmap threshold, 128 KiB until a freed block raises it, and for heap tops
above its trim threshold) makes the kernel zero and map them again on the next step: thousands of
faults per step, each a few microseconds of system time on the training thread, on the step's
critical path. CPU training with PyTorch's own CPU allocator (plain malloc) hits this; PyTorch's
CPU tuning guide recommends jemalloc or tcmalloc for it.

Measured on the bundled DDP demo (2 ranks, 2 CPUs, glibc 2.36): 2,500 faults and 4.5 ms of system
time per step on each training thread; with ``MALLOC_MMAP_THRESHOLD_=33554432
MALLOC_TRIM_THRESHOLD_=268435456`` 6 faults, 0.1 ms, and the job 9% faster over 4 A/B pairs without
the probe (27.2-28.7 against 30.6-31.3 steps/s). The claim is the training thread's system time
per step, at most MAX_FAULT_US per fault: the zeroing and mapping the fix removes. It leaves out
the caches the zeroing evicts (the user time dropped too, by a few ms), so it is a lower bound. On an accelerator the host's time
matters only where the device waits for it: the claim is then taken from the device's idle time.
"""

from __future__ import annotations

from ..advice.host_allocator import SNIPPET
from ._common import View, finding, fmt_ms, per_rank
from .engine import RuleInputs, rule
from .model import Evidence, Finding, Fix

# 256 faults = 1 MiB of 4 KiB pages mapped again per step: below that the faults are the normal
# growth of a process (new Python objects, a new batch's buffers); the demo's churn is 10x that.
MIN_FAULTS_PER_STEP = 256
# Below this share of the step the system time is not worth a finding (timer and syscall noise).
MIN_SYS_PCT = 1.0
# The most system time one minor fault is taken to cost: zeroing and mapping a 4 KiB page took 0.5-1.9
# us here (mlp: 0.4 ms for 740 faults; the demo: 4.7 ms for 2,536). The rest of a thread's system
# time is other syscalls (file reads in a main-process loader, socket writes): not this rule's.
MAX_FAULT_US = 10.0


def fault_counters(v: View) -> tuple[float, float] | None:
    """(minor faults, ms of system time) of the training thread per steady step, medians; None
    where the probe did not count them (not Linux, or no live facts)."""
    steps = v.timed
    if not steps or any(s.minor_faults is None or s.thread_sys_ms is None for s in steps):
        return None
    return v.facts_median("minor_faults") or 0.0, v.facts_median("thread_sys_ms") or 0.0


@rule("HO-15", budgets=("step", "idle.host"))
def page_faults(inputs: RuleInputs) -> list[Finding]:
    """The training thread takes page faults every step: the allocator returns memory to the kernel."""

    def one(v: View) -> Finding | None:
        counted = fault_counters(v)
        if counted is None:
            return None
        faults, sys_ms = counted
        step = v.facts_median("total_ms") or 0.0
        if faults < MIN_FAULTS_PER_STEP or step <= 0 or 100.0 * sys_ms / step < MIN_SYS_PCT:
            return None
        # Measured over the steady steps; the finding speaks in shares of the view's step (a
        # profiler window's steps can be longer), so the claim keeps the measured share.
        to_view = (v.step_ms / step) if v.step_ms else 1.0
        fault_ms = min(sys_ms, faults * MAX_FAULT_US / 1e3)
        gain = fault_ms * to_view
        mib = faults * 4096 / 2**20
        return finding(
            v, "HO-15", "host",
            f"The training thread takes {faults:,.0f} page faults per step ({mib:.0f} MiB mapped again, "
            f"{fmt_ms(sys_ms)} of system time, {100 * sys_ms / step:.0f}% of the step): the memory allocator "
            "gives the step's buffers back to the kernel and faults them in again every step.",
            gain, budget="idle.host" if v.accel else "step",
            evidence=[Evidence(
                f"getrusage(RUSAGE_THREAD) of the training thread, median over {len(v.timed)} steady steps: "
                f"{faults:,.0f} minor page faults and {fmt_ms(sys_ms)} of system CPU time in a {fmt_ms(step)} step.",
                {"minor_faults_per_step": round(faults), "thread_sys_ms": round(sys_ms, 3),
                 "fault_ms_claimed": round(fault_ms, 3),
                 "step_ms": round(step, 3), "steps": len(v.timed)})],
            fix=Fix("Keep freed memory in the process: raise glibc malloc's mmap and trim thresholds and serve "
                    "big blocks from the heap (resident memory then stays at the step's peak or above it: a heap "
                    "that keeps its memory fragments; word_language_model's Transformer went from 806 to 2,911 MiB "
                    "at its peak, which `torchdoctor fix` prints for both runs), or run the job with jemalloc or "
                    "tcmalloc (LD_PRELOAD), as PyTorch's CPU tuning guide advises.",
                    SNIPPET,
                    "shell"),
            confidence="medium", remedy="memory.host_allocator",
            confirm="the claim is the system time of the faults; part of it can come back as user time, since "
                    "reused memory is colder in the caches than a page the kernel just zeroed (word_language_model: "
                    "72 ms of system time gone, about 37 ms more user time); `torchdoctor fix --apply "
                    "memory.host_allocator` measures it",
            source="getrusage(2) RUSAGE_THREAD; glibc mallopt(3) M_MMAP_THRESHOLD/M_TRIM_THRESHOLD; PyTorch CPU "
                   "performance tuning guide (switch memory allocator)")

    return per_rank(inputs, one)
