"""metrics/roofline: GEMM FLOPs from recorded shapes, achieved TFLOP/s and % of the device's peak."""

from __future__ import annotations

import gzip
import json

import pytest

from kineto_builder import TraceBuilder
from real_traces import trace
from torchdoctor.metrics.opwork import MAX_FLOPS, gemm_work
from torchdoctor.metrics.rank import analyze_rank
from torchdoctor.trace.load import load_trace

NVJET = "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT"
BF16 = "c10::BFloat16"


def test_hand_checked_gemms_of_a100_8rank_rank3():
    with gzip.open(trace("a100_8rank_rank3.json.gz"), "rt") as f:
        events = json.load(f)["traceEvents"]
    shapes = {(e["name"], json.dumps(e["args"]["Input Dims"]), json.dumps(e["args"]["Input type"]))
              for e in events if e.get("name") in ("aten::addmm", "aten::mm") and "Input Dims" in e.get("args", {})}
    # addmm(bias[96], x[1024, 512], W^T[512, 96]): M=1024, K=512, N=96 -> 2*1024*512*96 FLOPs.
    addmm = ("aten::addmm", "[[96], [1024, 512], [512, 96], [], []]",
             '["float", "float", "float", "Scalar", "Scalar"]')
    # mm(grad^T[100, 1024], x[1024, 256]) (a weight gradient): 2*100*1024*256 FLOPs.
    mm = ("aten::mm", "[[100, 1024], [1024, 256]]", '["float", "float"]')
    assert addmm in shapes and mm in shapes
    assert gemm_work(addmm[0], json.loads(addmm[1]), json.loads(addmm[2])).flops == 100_663_296
    assert gemm_work(mm[0], json.loads(mm[1]), json.loads(mm[2])).flops == 52_428_800


def test_a100_8rank_rank3_top_gemm_against_the_a100_tf32_peak():
    k = analyze_rank(load_trace(trace("a100_8rank_rank3.json.gz"))).kernels
    assert k.device_key == "A100-SXM4-40GB"
    [g] = [s for s in k.top if s.kind == "gemm"]
    assert "tensorop_s1688gemm" in g.name and g.flops and g.flops % (2 * 1024) == 0
    # fp32 inputs on a tensor-core (s1688 = TF32) kernel: against the 156 TFLOP/s TF32 peak.
    assert g.achieved_tflops == pytest.approx(g.flops / g.total_ns / 1e3, rel=1e-3)
    assert g.pct_of_peak == pytest.approx(100 * g.achieved_tflops / 156, rel=1e-3)
    assert "tf32" in g.roofline
    others = [s for s in k.top if s.kind != "gemm"]
    assert all(s.flops is None and s.pct_of_peak is None and s.roofline for s in others)


def gemm_trace(device: str | None) -> TraceBuilder:
    b = TraceBuilder(device_name=device)
    b.step(1, 0.0, 10_000.0)
    for t0 in (100.0, 1200.0):
        b.gemm("aten::mm", t0, 40.0, [[4096, 4096], [4096, 4096]], dtype=BF16, kernel=NVJET, kernel_at=t0 + 100,
               kernel_dur=900.0)
    b.kernel("ampere_sgemm_128x64_nn", 3000.0, 100.0)  # no op with shapes launched it
    return b


def test_hopper_bf16_gemm_roofline(tmp_path):
    k = analyze_rank(load_trace(str(gemm_trace("NVIDIA H100 80GB HBM3").write(tmp_path / "t.json")))).kernels
    nvjet, sgemm = k.top
    assert nvjet.flops == 2 * 2 * 4096**3
    assert nvjet.achieved_tflops == pytest.approx(2 * 4096**3 / 900e-6 / 1e12, rel=1e-3)  # ≈152.7
    assert nvjet.pct_of_peak == pytest.approx(100 * nvjet.achieved_tflops / 989.4, rel=1e-3)
    assert "bf16 dense peak of NVIDIA H100 SXM5 80GB" in nvjet.roofline
    assert sgemm.flops is None and sgemm.pct_of_peak is None and "record_shapes" in sgemm.roofline


def test_unknown_device_gives_flops_but_no_percent(tmp_path):
    k = analyze_rank(load_trace(str(gemm_trace("NVIDIA RTX 6000 Ada Generation").write(tmp_path / "t.json")))).kernels
    assert k.device_key is None and "unknown device" in k.device_note
    nvjet = k.top[0]
    assert nvjet.flops == 2 * 2 * 4096**3 and nvjet.achieved_tflops is not None
    assert nvjet.pct_of_peak is None and "unknown device" in nvjet.roofline and "no roofline" in nvjet.roofline


@pytest.mark.parametrize(("op", "dims", "want"), [
    ("aten::bmm", [[12, 77, 64], [12, 64, 77]], 2 * 12 * 77 * 64 * 77),
    ("aten::linear", [[8, 128, 1000], [50257, 1000], [50257]], 2 * 1024 * 1000 * 50257),
    ("aten::matmul", [[4, 10, 16], [16, 24]], 2 * 4 * 10 * 16 * 24),
])
def test_gemm_flops_batch_and_linear(op, dims, want):
    w = gemm_work(op, dims, [BF16] * len(dims))
    assert (w.flops, w.dtype) == (want, BF16)


def test_absurd_shapes_are_dropped_not_overflowed():
    huge = 10**8
    w = gemm_work("aten::mm", [[huge, huge], [huge, huge]], [BF16, BF16])
    assert w.flops is None and "absurd" in w.why
    assert 2 * huge**3 > MAX_FLOPS
