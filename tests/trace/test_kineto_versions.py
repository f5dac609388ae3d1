"""CPU Kineto traces recorded with each torch release we claim decode and analyse the same way.

The traces are tests/data/kineto_versions/torch-<version>-cpu.json.gz (record.py there: one gloo
rank, a small MLP, 12 gradient all_reduces over 3 active ProfilerSteps). The expected numbers
below were read off the JSON independently of torchdoctor; the tests also recount them from the
JSON, so a re-recording only has to update this table.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from torchdoctor.session import analyze_paths

DATA = Path(__file__).resolve().parent.parent / "data" / "kineto_versions"

# file -> (ProfilerStep numbers, complete 'X' events, gloo:all_reduce events, c10d::allreduce_ ops)
EXPECTED = {
    "torch-2.13.0-cpu.json.gz": ([2, 3, 4], 382, 12, 12),
    "torch-2.14.1-cpu.json.gz": ([2, 3, 4], 382, 12, 12),
}


def events(name: str) -> list[dict]:
    with gzip.open(DATA / name) as f:
        return json.load(f)["traceEvents"]


def test_every_recorded_trace_is_listed():
    assert sorted(p.name for p in DATA.glob("*.json.gz")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_expected_numbers_match_the_json(name):
    steps, complete, gloo, allreduce = EXPECTED[name]
    evs = events(name)
    names = Counter(e.get("name") for e in evs if e.get("ph") == "X")
    assert sorted(int(n.split("#")[1]) for n in names if n.startswith("ProfilerStep#")) == steps
    assert sum(names.values()) == complete
    assert names["gloo:all_reduce"] == gloo
    assert names["c10d::allreduce_"] == allreduce


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_trace_analyses(name):
    steps, complete, gloo, allreduce = EXPECTED[name]
    rep = analyze_paths([str(DATA / name)])
    assert rep.errors == []
    assert len(rep.ranks) == 1
    a = rep.ranks[0].analysis
    assert a.warnings == []
    assert (a.rank, a.world_size, a.backend, a.rank_source) == (0, 1, "gloo", "distributedInfo")
    assert a.device_kind == "cpu" and a.metrics.idle_pct is None  # CPU only: no device numbers
    assert a.window.steps == steps and [s.step for s in a.steps] == steps
    assert a.events == complete
    # The collectives are seen, as gloo's annotation and as the c10d op, and timed as comm.
    comm = {op.name: op.count for op in a.comm_ops}
    assert comm == {"gloo:all_reduce": gloo, "c10d::allreduce_": allreduce}
    assert a.host.phases_ms["comm"] > 0
    assert a.host.phases_ms["forward"] > 0 and a.host.phases_ms["backward"] > 0
    assert a.signals.optimizer_classes == ["SGD"]
