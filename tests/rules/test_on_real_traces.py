"""The matrix on the real traces in ../shared/traces: plausibility, not snapshots."""

from __future__ import annotations

import pytest

from .conftest import TRACES

ALL = sorted(p.name.split(".")[0] for p in TRACES.glob("*.json.gz")) if TRACES.is_dir() else []
IDLE_LAYERS = ("input", "host")


def top(report, n=3):
    return [f for f in report.findings if f.recoverable_pct > 0][:n]


@pytest.mark.parametrize("name", ALL)
def test_every_trace_diagnoses_cleanly(real, name):
    rep = real(name)
    assert not [w for w in rep.warnings if "rule" in w.message and "failed" in w.message]
    shares = [f.recoverable_pct for f in rep.findings]
    assert all(0.0 <= s <= 100.0 for s in shares)
    # Findings split the step between them: together they never give back more than the step.
    assert sum(shares) <= 100.0 + 1e-6
    assert [f.recoverable_pct for f in rep.findings] == sorted(shares, reverse=True)
    for f in rep.findings:
        assert f.title and f.evidence is not None and f.source


def test_healthy_resnet_raises_no_warning(real):
    rep = real("v100_resnet_rank0")
    assert rep.healthy is True
    assert not [f for f in rep.findings if f.severity != "info"]


def idle_claims(rep) -> float:
    return sum(f.recoverable_pct for f in rep.findings if f.layer in IDLE_LAYERS)


@pytest.mark.parametrize("name", ["a100_16rank_rank0", "a100_2rank_rank0_nccl", "sampled_128rank_rank0"])
def test_idle_time_is_accounted_for_without_double_counting(real, name):
    rep = real(name)
    idle = rep.ranks[0].analysis.metrics.idle_pct
    assert idle > 50
    claimed = idle_claims(rep)
    assert 0.85 * idle <= claimed <= idle + 0.5


def test_a100_16rank_top_findings(real):
    rep = real("a100_16rank_rank0")
    ids = [f.id for f in top(rep)]
    assert ids[:2] == ["HO-3", "HO-5"]  # the blocking .cpu() in sparse_data_dist, then the rest of the host
    ho3 = rep.findings[0]
    assert ho3.severity == "critical" and "sparse_data_dist" in ho3.title and 35 < ho3.recoverable_pct < 50
    assert sum(f.recoverable_pct for f in top(rep, 2)) > 0.9 * rep.ranks[0].analysis.metrics.idle_pct


def test_v100_memory_all_reduce_exposed_after_backward(real):
    rep = real("v100_2rank_rank1_memory")
    ids = {f.id for f in rep.findings}
    assert {"DI-4", "DI-10", "HO-9", "HO-10"} <= ids
    comm = rep.ranks[0].analysis.metrics.comm_exposed_pct
    assert sum(f.recoverable_pct for f in rep.findings if f.layer == "distributed") <= comm + 0.5
    di4 = next(f for f in rep.findings if f.id == "DI-4")
    assert "gradient all-reduce" in di4.title


def test_cpu_only_gloo_trace(real):
    rep = real("cpu_only_rank34")
    di3 = next(f for f in rep.findings if f.id == "DI-3")
    assert di3.severity == "critical" and "inside collectives" in di3.title
    assert di3.recoverable_pct < rep.ranks[0].analysis.metrics.comm_exposed_pct  # not all of it is avoidable


def test_traces_without_device_work_in_window_say_so(real):
    rep = real("mi250_rocm_minitoy")
    assert [f.id for f in rep.findings] == ["HO-1"] and rep.healthy is True


def test_two_ranks_together(real):
    rep = real("sampled_128rank_rank0", "sampled_128rank_rank1")
    assert rep.cross_rank is not None and len(rep.ranks) == 2
    assert all(f.ranks for f in rep.findings)
