"""The kernel registry (hardware/kernels.toml): families, sources, and the pricing arithmetic."""

from __future__ import annotations

import pytest

from torchdoctor.hardware.devices import match_device
from torchdoctor.hardware.registry import best, families

A100 = match_device("NVIDIA A100-SXM4-80GB")
H100 = match_device("NVIDIA H100 80GB HBM3")
V100 = match_device("Tesla V100-SXM2-32GB")


def test_every_family_loads_with_a_source_and_an_efficiency_in_range():
    fams = families()
    assert len({f.key for f in fams}) == len(fams) >= 10
    for f in fams:
        assert 0 < f.efficiency <= 1 and f.source and f.roof in ("compute", "sparse", "memory")
        # An assumed efficiency says why in its note; a cited one names its paper.
        assert (f.assumed and f.note) or "FlashAttention" in f.source


def test_best_family_follows_architecture_and_precision():
    assert best("attention", A100, "bf16").key == "attention.flash.ampere"
    assert best("attention", H100, "bf16").key == "attention.flash.hopper"
    assert best("attention", A100, "fp32").key == "attention.efficient.nvidia"  # flash takes fp16/bf16 only
    assert best("gemm_fp8", A100, "fp8") is None  # Ampere has no FP8 tensor cores
    assert best("gemm_fp8", H100, "fp8").key == "gemm_fp8.nvidia"
    assert best("gemm_sparse24", V100, "fp16") is None  # 2:4 sparsity needs Ampere
    assert best("norm", V100, "fp32").key == "norm.fused"  # memory-bound families hold everywhere
    assert best("gemm", None, "bf16") is None


def test_expected_time_is_work_over_roof_times_efficiency():
    flash = best("attention", A100, "bf16")
    # 1 TFLOP at 50% of the A100's 312 TFLOP/s bf16 dense peak: 1e12 / 156e12 s = 6.41 ms.
    assert flash.expected_ns(1e12, A100, "bf16") == pytest.approx(6.41e6, rel=1e-3)
    # The same at an efficiency this rank measured instead (20% of the peak).
    assert flash.expected_ns(1e12, A100, "bf16", efficiency=0.2) == pytest.approx(1e12 / (312e3 * 0.2))
    norm = best("norm", A100, "bf16")
    # 100 MB at 60% of 2039 GB/s.
    assert norm.expected_ns(1e8, A100, "bf16") == pytest.approx(1e8 / (2039 * 0.6))
    sparse = best("gemm_sparse24", A100, "bf16")
    assert sparse.expected_ns(1e12, A100, "bf16") == pytest.approx(1e12 / (624e3 * sparse.efficiency))
    assert flash.expected_ns(0.0, A100, "bf16") is None
    assert "50% of the dense peak" in flash.cite() and "FlashAttention-2" in flash.cite()
