"""A rank's summary: a few KB whatever the trace's length, and the same diagnosis as the full result."""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest

from torchdoctor import session
from torchdoctor.metrics.intervals import merge_busy
from torchdoctor.metrics.store import StoredResult
from torchdoctor.metrics.summary import SKETCH_INTERVALS, TOP_KERNELS, compact, summary_bytes
from torchdoctor.report.json_out import to_json
from torchdoctor.rules import RankInputs
from torchdoctor.session import analyze_rank_file, build_report

GPU_TRACES = ["a100_16rank_rank0.json.gz", "a100_2rank_rank0_nccl.json.gz", "a100_8rank_rank3.json.gz",
              "sampled_128rank_rank0.json.gz", "v100_2rank_rank1_diff.json.gz", "v100_resnet_rank0.json.gz"]


@pytest.fixture(scope="module")
def results(traces_dir):
    return {name: analyze_rank_file(str(traces_dir / name)) for name in GPU_TRACES}


def test_merge_busy_keeps_the_largest_gaps():
    s = np.array([0, 10, 20, 100, 105, 300])
    e = np.array([5, 15, 30, 103, 200, 310])
    ms, me = merge_busy(s, e, 3)
    assert ms.tolist() == [0, 100, 300] and me.tolist() == [30, 200, 310]  # gaps 70 and 100 kept
    assert merge_busy(s, e, 10)[0] is s


@pytest.mark.parametrize("name", GPU_TRACES)
def test_summary_is_small_and_bounded(results, name):
    full = results[name]
    small = compact(full)
    assert summary_bytes(small) <= 16_000, summary_bytes(small)
    assert summary_bytes(full) >= 3 * summary_bytes(small)
    assert len(small.timeline_busy) <= SKETCH_INTERVALS and len(small.timeline_gaps) <= SKETCH_INTERVALS
    assert len(small.kernels.top) <= TOP_KERNELS
    # The sketch is coarser, never shifted: it spans the same time.
    assert small.timeline_busy[0][0] == full.timeline_busy[0][0]
    assert small.timeline_busy[-1][1] == full.timeline_busy[-1][1]
    assert msgspec.to_builtins(small.steps) == msgspec.to_builtins(full.steps)
    assert summary_bytes(full) == summary_bytes(results[name])  # the full result was left as it was


def test_summaries_give_the_same_diagnosis(results):
    """What the rules and the cross-rank analysis read is kept whole: same findings, same numbers."""
    def report(rs):
        inputs = [RankInputs(i, result=msgspec.structs.replace(r, rank=i)) for i, r in enumerate(rs)]
        return json.loads(to_json(build_report(inputs)))

    full = report(list(results.values()))
    small = report([compact(r) for r in results.values()])
    assert small["findings"] == full["findings"] and small["findings"]
    assert small["cross_rank"] == full["cross_rank"]
    assert small["blind_spots"] == full["blind_spots"] and small["healthy"] == full["healthy"]


def test_many_ranks_travel_as_summaries(traces_dir, monkeypatch):
    files = [str(traces_dir / n) for n in GPU_TRACES[:4]]
    monkeypatch.setattr(session, "SUMMARY_RANKS", 3)
    outcomes = session.analyze_files(files, jobs=2)
    # Held compressed on the driver, decoded when read (metrics/store.py).
    assert all(status == "ok" and isinstance(r, StoredResult) for status, r, _ in outcomes)
    assert all(len(r.load().kernels.top) <= TOP_KERNELS and summary_bytes(r.load()) <= 16_000
               for _, r, _ in outcomes)
    monkeypatch.setattr(session, "SUMMARY_RANKS", 4)
    assert any(len(r.kernels.top) > TOP_KERNELS for _, r, _ in session.analyze_files(files, jobs=2))
