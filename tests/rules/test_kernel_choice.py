"""Kernel-choice advisors (HW-13..HW-17) on code-built traces, through `analyze`."""

from __future__ import annotations

import pytest

from choice_traces import big_gemm, manual_fp32, rms_norm_chain, sdpa_flash, sdpa_math
from torchdoctor.session import analyze_paths


def report(path: str):
    rep = analyze_paths([path])
    assert not rep.errors and not [w for w in rep.warnings if "rule" in w.message]
    return rep


def by_id(rep, fid: str):
    return [f for f in rep.findings if f.id == fid]


def granted(f, budget: str) -> float:
    return sum(c.granted_ms or 0.0 for c in f.claims if c.budget == budget)


def test_hw13_sdpa_math_path_priced_against_flash(tmp_path):
    (f,) = by_id(report(sdpa_math(tmp_path)), "HW-13")
    # 800 µs forward per step; FlashAttention-2 at 50% of 312 TFLOP/s does 34.36 GFLOP in 220.3 µs;
    # the device is busy 800 of 2000 µs: (800 - 220.3) x 0.4 = 231.9 µs.
    expected_us = 2 * 2 * 128 * 1024 * 1024 * 64 / (312e3 * 0.5) / 1e3
    assert f.recoverable_ms == pytest.approx((800 - expected_us) * 0.4 / 1e3, abs=5e-4)
    assert f.severity == "warning" and f.confidence == "medium" and f.remedy is None
    assert "SDPA's math path" in f.title and "is_causal=True" in f.fix.text
    ev = f.evidence[0].values
    assert ev["path"] == "math" and ev["has_mask"] and ev["forward_ms_per_step"] == 0.8
    # The softmax's share of the gain comes out of the pointwise/reduction budget (CG-1's).
    assert granted(f, "device.busy.fusable") == pytest.approx(f.recoverable_ms * 200 / 800, rel=1e-3)


def test_hw13_silent_when_flash_ran(tmp_path):
    assert by_id(report(sdpa_flash(tmp_path)), "HW-13") == []


def test_hw13_and_hw1_share_the_plain_fp32_gemm_time_of_attention_by_hand(tmp_path):
    rep = report(manual_fp32(tmp_path))
    (a,) = by_id(rep, "HW-13")
    (t,) = by_id(rep, "HW-1")
    assert "written by hand" in a.title and "scaled_dot_product_attention" in a.fix.text
    assert "bf16 autocast" in a.fix.text  # fp32: flash needs fp16/bf16
    # Both price the same 200 µs of sgemm per step; together they never claim more than it.
    assert 0 < granted(a, "device.busy.fp32_simt") + granted(t, "device.busy.fp32_simt") <= 0.2
    assert "TF32 could save" in t.title
    assert any("tensor-core GEMM at 60% of the dense peak" in e.text for e in t.evidence)


def test_hw14_rms_norm_by_hand(tmp_path):
    rep = report(rms_norm_chain(tmp_path))
    (f,) = by_id(rep, "HW-14")
    # 300 µs of six kernels per step against one pass over 64 MiB at 60% of 2039 GB/s (54.8 µs);
    # busy 300 of 2000 µs.
    one_pass_us = 2 * 4096 * 4096 * 2 / (2039 * 0.6) / 1e3
    assert f.recoverable_ms == pytest.approx((300 - one_pass_us) * 0.15 / 1e3, abs=5e-4)
    assert "RMSNorm runs as 6 separate ops" in f.title and "RMSNorm" in f.fix.snippet
    # CG-1 (fusion) gets only what HW-14 left of the pointwise/reduction time.
    for g in by_id(rep, "CG-1"):
        assert granted(g, "device.busy.fusable") + granted(f, "device.busy.fusable") <= 0.3 + 1e-9


def test_hw15_bf16_on_v100(tmp_path):
    rep = report(big_gemm(tmp_path, "Tesla V100-SXM2-32GB", kernel_us=1800.0, kernel="volta_gemm_bf16_kernel", m=1024))
    (f,) = by_id(rep, "HW-15")
    fp16_us = 2 * 1024 * 4096 * 4096 / (125e3 * 0.6) / 1e3  # 458 µs at 60% of 125 TFLOP/s
    assert f.recoverable_ms == pytest.approx((1800 - fp16_us) * 0.9 / 1e3, abs=5e-4)
    assert f.severity == "critical" and "GradScaler" in f.fix.snippet and "no bf16 tensor cores" in f.title


def test_hw16_fp8_on_h100_is_info_and_low_confidence(tmp_path):
    (f,) = by_id(report(big_gemm(tmp_path, "NVIDIA H100 80GB HBM3")), "HW-16")
    assert f.severity == "info" and f.confidence == "low" and "convert_to_float8_training" in f.fix.snippet
    ev = f.evidence[0].values
    assert ev["target"] == "fp8" and ev["shapes"] == ["4096x4096x4096 x3"]
    # 400 µs measured, 300 µs priced; busy 400 of 2000 µs.
    assert f.recoverable_ms == pytest.approx((0.4 - ev["expected_ms_per_step"]) * 0.2, abs=2e-4)


def test_hw17_sparsity_and_hw16_share_one_budget(tmp_path):
    rep = report(big_gemm(tmp_path, "NVIDIA A100-SXM4-80GB", op="aten::addmm", kernel_us=1000.0))
    (s,) = by_id(rep, "HW-17")
    assert s.severity == "info" and "sparsify_" in s.fix.snippet and by_id(rep, "HW-16") == []
    assert s.recoverable_ms <= 1.0 * 0.5


def test_hw1_with_tf32_already_on_advises_shapes_or_bf16_not_the_flag():
    # a100_8rank_rank3 runs 75% of its GEMM time as FP32 on tensor cores (TF32 is on); the sgemm
    # kernels left are there for their shapes, so the TF32 remedy would change nothing.
    from real_traces import trace
    from torchdoctor.report.roofline_text import roofline_lines
    rep = analyze_paths([trace("a100_8rank_rank3.json.gz")])
    (f,) = by_id(rep, "HW-1")
    assert f.remedy == "precision.autocast" and "TF32 is already on (75%" in f.fix.text
    assert "TF32 on for the others" in f.title
    # The precision advisor says the same.
    (line,) = [x for x in roofline_lines(rep.ranks[0].analysis) if x.startswith("precision:")]
    assert "75.5% tf32" in line and "recommended bf16 autocast" in line and "precision.autocast" in line


def test_hw16_says_whether_torchao_is_in_the_jobs_environment():
    from torchdoctor.facts import DeviceFacts, RankFacts
    from torchdoctor.metrics.model import GemmCandidates, KernelChoice

    from .conftest import gpu_result, only, run

    r = gpu_result(busy=100.0)
    r.choice = KernelChoice(device_key="H100-SXM", fp8=GemmCandidates(
        target="fp8", calls=30, ns=50_000_000, flops=4e12, precision="bf16", family="gemm_fp8.nvidia",
        family_note="FP8 GEMM", efficiency=0.4, expected_ns=10_000_000))

    def facts(version):
        return RankFacts(rank=0, device=DeviceFacts(kind="cuda", name="NVIDIA H100"), torchao_version=version)

    assert "torchao 0.12.0 is installed" in only(run("HW-16", (r, facts("0.12.0"))), "HW-16").fix.text
    assert "pip install torchao" in only(run("HW-16", (r, facts(""))), "HW-16").fix.text
    assert "installed" not in only(run("HW-16", (r, None)), "HW-16").fix.text  # a trace alone cannot say
