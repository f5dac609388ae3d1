"""HO-15: the training thread's measured page faults per step (the allocator gives memory back)."""

from __future__ import annotations

import pytest

from torchdoctor.facts import DeviceFacts, StepTiming

from .conftest import cpu_facts, only, run


def faulting(n=20, total=40.0, faults=2500, sys_ms=4.8, **kw):
    steps = [StepTiming(step=i, total_ms=total, thread_cpu_ms=30.0, run_delay_ms=1.0, minor_faults=faults,
                        thread_sys_ms=sys_ms) for i in range(n)]
    return cpu_facts(steps=steps, **kw)


def test_thousands_of_faults_per_step_claim_the_threads_system_time():
    # The demo's numbers (2 ranks, glibc): 2,500 faults and 4.8 ms of system time in a 40 ms step.
    got = only(run("HO-15", (None, faulting())), "HO-15")
    assert got.recoverable_ms == pytest.approx(4.8, abs=1e-3)
    assert got.recoverable_pct == pytest.approx(12.0, abs=0.01)
    assert got.severity == "warning" and got.remedy == "memory.host_allocator"
    assert "2,500 page faults" in got.title and "10 MiB" in got.title
    assert "MALLOC_MMAP_THRESHOLD_=33554432" in got.fix.snippet
    assert got.evidence[0].values["minor_faults_per_step"] == 2500


def test_few_faults_or_little_system_time_say_nothing():
    assert not run("HO-15", (None, faulting(faults=200)))  # < 1 MiB mapped again: normal growth
    assert not run("HO-15", (None, faulting(sys_ms=0.3)))  # < 1% of the step
    no_counters = faulting(faults=None, sys_ms=None)
    assert not run("HO-15", (None, no_counters))  # not measured (not Linux): nothing claimed


def test_on_an_accelerator_the_claim_comes_from_the_hosts_share_of_the_idle_time():
    f = faulting(device=DeviceFacts(kind="cuda", name="H200"))
    got = only(run("HO-15", (None, f)), "HO-15")
    assert [c.budget for c in got.claims] == ["idle.host"]


def test_system_time_beyond_what_the_faults_can_cost_is_not_claimed():
    # 300 faults and 20 ms of system time (a main-process loader's file reads): the faults can
    # explain at most 300 x 10 us; the reads are another rule's.
    got = only(run("HO-15", (None, faulting(faults=300, sys_ms=20.0))), "HO-15")
    assert got.recoverable_ms == pytest.approx(3.0, abs=1e-3)
    assert got.evidence[0].values["thread_sys_ms"] == 20.0 and got.evidence[0].values["fault_ms_claimed"] == 3.0
