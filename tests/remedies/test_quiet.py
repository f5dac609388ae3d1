"""A busy machine during `fix`'s runs: the CPU time others took on the job's CPUs (remedies/quiet.py)."""

from __future__ import annotations

import os

from torchdoctor.remedies import quiet

STAT = """cpu  900 0 300 5000 10 0 5 0 0 0
cpu0 400 0 100 2500 5 0 5 20 0 0
cpu1 500 0 200 2500 5 0 0 0 0 0
cpu2 7 0 0 9 0 0 0 0 0 0
intr 12345
ctxt 999
"""


def test_busy_seconds_count_the_jobs_cpus_steal_included_idle_iowait_and_interrupts_not():
    tick = os.sysconf("SC_CLK_TCK")
    # cpu0: user 400 + system 100 + steal 20 (softirq 5 left out); cpu1: 500 + 200.
    assert quiet.busy_seconds({0, 1}, STAT) == (520 + 700) / tick
    assert quiet.busy_seconds({1}, STAT) == 700 / tick
    assert quiet.busy_seconds({7}, STAT) is None  # none of them listed: unknown, not idle


def test_the_warning_names_the_busy_runs_only():
    assert quiet.busy_text([("A1", 0.02), ("B1", 0.1)]) is None  # 10% is not above 10%
    text = quiet.busy_text([("A1", 0.57), ("B1", 0.003)])
    assert text is not None and "during run A1 (57%): that run timed a busy machine" in text
    assert "runs A1 (57%), B2 (20%): those runs" in quiet.busy_text([("A1", 0.57), ("B2", 0.2)])


def test_the_share_is_unknown_without_proc_stat(monkeypatch):
    monkeypatch.setattr(quiet, "_STAT", "/nonexistent/stat")
    assert quiet.start() is None and quiet.other_share(None) is None
