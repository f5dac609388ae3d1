"""Compile-layer rules (CG-1..CG-5)."""

from __future__ import annotations

from torchdoctor.facts import BackendFacts, CompileFacts
from torchdoctor.metrics.model import KindTime

from .conftest import MS, gpu_facts, gpu_result, only, run


def eager(count_per_step=1000, ms_per_step=30.0):
    r = gpu_result(busy=90.0)
    r.kernels.by_kind = [KindTime("elementwise", int(ms_per_step * 5 * MS), count_per_step * 5, 30.0)]
    return r


def test_cg1_eager_pointwise_suggests_compile_as_info():
    got = only(run("CG-1", (eager(), None)), "CG-1")
    assert got.severity == "info" and got.remedy == "compile"
    assert abs(got.recoverable_ms - 30.0 / 3 * 0.9) < 1e-6  # a third, scaled by the busy share


def test_cg1_silent_when_compiled():
    r = eager()
    r.compile_regions = {"0/0": 5}
    assert run("CG-1", (r, None)) == []
    assert run("CG-1", (eager(count_per_step=10), None)) == []


def test_cg2_graph_breaks():
    f = gpu_facts(compile=CompileFacts(used=True, graph_breaks=3, graph_break_reasons=["Tensor.item"]))
    got = only(run("CG-2", (None, f)), "CG-2")
    assert got.severity == "warning" and "3 time" in got.title


def test_cg2_silent_without_breaks():
    assert run("CG-2", (None, gpu_facts(compile=CompileFacts(used=True, graph_breaks=0)))) == []


def test_cg3_recompile_limit_is_critical():
    f = gpu_facts(compile=CompileFacts(used=True, recompiles=9, recompile_reasons=["size mismatch"]))
    assert only(run("CG-3", (None, f)), "CG-3").severity == "critical"


def test_cg3_silent_without_recompiles():
    assert run("CG-3", (None, gpu_facts(compile=CompileFacts(used=True, recompiles=0)))) == []


def test_cg4_cudagraph_skips():
    f = gpu_facts(compile=CompileFacts(used=True, cudagraph_skips=2))
    assert only(run("CG-4", (None, f)), "CG-4").remedy == "cudagraphs"


def test_cg4_silent_without_skips():
    assert run("CG-4", (None, gpu_facts())) == []


def test_cg5_cudnn_benchmark_off_for_convs():
    r = gpu_result(busy=100.0)
    r.signals.conv_ns = 50 * 5 * MS
    f = gpu_facts(backends=BackendFacts(cudnn_benchmark=False))
    got = only(run("CG-5", (r, f)), "CG-5")
    assert got.remedy == "cudnn.benchmark" and abs(got.recoverable_ms - 5.0) < 1e-6


def test_cg5_silent_when_on_or_without_convs():
    r = gpu_result()
    assert run("CG-5", (r, gpu_facts(backends=BackendFacts(cudnn_benchmark=False)))) == []  # no convolutions
    r.signals.conv_ns = 50 * 5 * MS
    assert run("CG-5", (r, gpu_facts(backends=BackendFacts(cudnn_benchmark=True)))) == []
