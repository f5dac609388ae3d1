"""Compiled regions and the eager time graph breaks leave between them (metrics/compiled.py)."""

from __future__ import annotations

from kineto_builder import TraceBuilder
from torchdoctor.metrics.rank import analyze_rank
from torchdoctor.trace.load import load_trace


def compiled_step(b: TraceBuilder, t0: float, gap: float) -> None:
    """One step as torch.compile records it (µs): region 0/0 runs graph 0 in CompiledFunction, the
    break's eager code for ``gap``, then the resume function's region 1/0 nested inside 0/0."""
    b.op("Torch-Compiled Region: 0/0", t0 + 10, 400 + gap)
    b.op("CompiledFunction", t0 + 40, 200)          # guard checks before it are not a gap
    b.op("aten::item", t0 + 240 + gap / 2, 5)       # the break: eager code
    b.op("Torch-Compiled Region: 1/0", t0 + 240 + gap, 150)
    b.op("## Call CompiledFxGraph abc ##", t0 + 250 + gap, 120)


def test_the_gap_before_a_resume_region_is_the_break_s_eager_time_per_step(tmp_path):
    b = TraceBuilder(device_name=None)
    for n, gap in enumerate((60, 80, 100)):
        b.step(n + 1, n * 1000, 1000)
        compiled_step(b, n * 1000, gap)
    r = analyze_rank(load_trace(str(b.write(tmp_path / "t.json"))), "all")
    assert r.compile_regions == {"0/0": 3, "1/0": 3}
    assert r.compile_gaps_ms == {"1/0": 0.08}  # (60 + 80 + 100) µs over 3 steps


def test_no_gap_without_a_graph_call_before_the_break_nor_for_top_level_regions(tmp_path):
    """The eager backend records no graph-call range: the region's start (guards) is not a gap;
    two top-level regions one after the other are two frames, not a break inside one."""
    b = TraceBuilder(device_name=None)
    b.step(1, 0, 1000)
    b.op("Torch-Compiled Region: 0/0", 10, 400)
    b.op("Torch-Compiled Region: 1/0", 200, 150)
    b.op("Torch-Compiled Region: 2/0", 500, 100)
    r = analyze_rank(load_trace(str(b.write(tmp_path / "t.json"))), "all")
    assert r.compile_gaps_ms == {}


def test_compiling_inside_the_gap_is_not_eager_time(tmp_path):
    """The resume function is compiled on its first call, inside the gap: 60 µs of eager code
    around 5 ms of nested compile ranges leaves 60 µs."""
    b = TraceBuilder(device_name=None)
    b.step(1, 0, 10000)
    b.op("Torch-Compiled Region: 0/0", 10, 5400)
    b.op("CompiledFunction", 40, 200)
    b.op("entire_frame_compile", 260, 5000)
    b.op("_compile.compile_inner (dynamo_timed)", 270, 4900)
    b.op("Torch-Compiled Region: 1/0", 5300, 100)
    r = analyze_rank(load_trace(str(b.write(tmp_path / "t.json"))), "all")
    assert r.compile_gaps_ms == {"1/0": 0.06}
