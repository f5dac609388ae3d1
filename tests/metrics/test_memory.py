"""Device memory from the allocator's `[memory]` records (trace/decode.py, metrics/memory.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kineto_builder import TraceBuilder
from memory_traces import GIB, memory_trace
from real_traces import trace
from torchdoctor.metrics.rank import analyze_rank
from torchdoctor.trace.load import load_trace


def test_memory_records_give_peaks_floor_slack_and_batch_room(tmp_path):
    m = analyze_rank(load_trace(memory_trace(tmp_path))).memory
    assert (m.records, m.peak_allocated, m.peak_reserved, m.floor_allocated) == (9, 12 * GIB, 60 * GIB, 10 * GIB)
    assert m.cache_slack_pct == pytest.approx(100 * 48 / 60)
    assert m.allocs_per_step == 2.0 and m.alloc_bytes_per_step == 2 * GIB and m.reserved_growth == 0
    # 2 GiB per step on top of the floor; 90% of 80 GiB leaves room for (72 - 12) / 2 = 30 more of them.
    assert m.total_memory == 80 * GIB and m.batch_scale == pytest.approx(31.0)


def test_malformed_memory_records_are_dropped_not_fatal(tmp_path):
    path = memory_trace(tmp_path)
    p = Path(path)
    p.write_text(p.read_text().replace('"Bytes": -2147483648', '"Bytes": "lots"', 1))
    tr = load_trace(path)
    assert tr.memory.shape == (8, 5) and len(tr) > 0


def test_a_trace_without_memory_records_has_no_memory_stats(tmp_path):
    b = TraceBuilder()
    b.step(0, 0.0, 1000.0).kernel("k", 10.0, 100.0, launch_at=5.0)
    assert analyze_rank(load_trace(str(b.write(tmp_path / "t.json")))).memory is None


def test_the_real_profile_memory_trace():
    # v100_2rank_rank1_memory (HTA's test trace, profile_memory=True): 26,770 device records in the window.
    m = analyze_rank(load_trace(trace("v100_2rank_rank1_memory.json.gz"))).memory
    assert (m.records, m.peak_allocated, m.peak_reserved) == (26770, 6629508096, 12782141440)
    assert m.cache_slack_pct == pytest.approx(48.13, abs=0.01) and m.total_memory == 34089730048


def test_the_console_says_the_memory_in_one_sentence(tmp_path):
    from torchdoctor.report.roofline_text import roofline_lines
    lines = roofline_lines(analyze_rank(load_trace(memory_trace(tmp_path))))
    assert ("memory: tensors peak at 12.00 GiB (floor 10.00 GiB), the allocator reserves 60.00 GiB of 80.0 GiB "
            "(80% of it cache).") in lines
