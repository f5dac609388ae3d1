"""Kernel choice (metrics/choice.py): attention paths, hand-written chains, GEMM formats, priced by
the kernel registry."""

from __future__ import annotations

import pytest

from choice_traces import STEP, big_gemm, manual_fp32, rms_norm_chain, sdpa_flash, sdpa_math
from kineto_builder import TraceBuilder
from torchdoctor.metrics.rank import analyze_rank
from torchdoctor.trace.load import load_trace

ATTN_FLOPS = 2 * 2 * 128 * 1024 * 1024 * 64  # per call


def choice(path: str):
    r = analyze_rank(load_trace(path))
    assert r.choice is not None
    return r.choice


def test_sdpa_on_the_math_path_is_found_with_its_reasons_and_priced_as_flash(tmp_path):
    c = choice(sdpa_math(tmp_path))
    (s,) = c.attention
    assert (s.path, s.calls, s.dtype, s.precision) == ("math", 3, "c10::BFloat16", "bf16")
    assert (s.q_dims, s.kv_len, s.head_dim, s.has_mask, s.is_causal) == ([8, 16, 1024, 64], 1024, 64, True, False)
    assert s.device_ns == 3 * 800_000 and s.fusable_ns == 3 * 200_000 and s.simt_ns == 0
    assert s.flops == pytest.approx(3 * ATTN_FLOPS)
    assert any("attn_mask" in r for r in s.reasons) and not any("fp16/bf16 only" in r for r in s.reasons)
    # FlashAttention-2 on the A100-80GB: 50% of 312 TFLOP/s, forward only (no backward in the window).
    assert s.family == "attention.flash.ampere" and not s.with_backward
    assert s.expected_ns == pytest.approx(3 * ATTN_FLOPS / (312e3 * 0.5))


def test_the_reason_without_a_mask_is_what_the_trace_cannot_see(tmp_path):
    (s,) = choice(sdpa_math(tmp_path, mask=False)).attention
    assert not s.has_mask and len(s.reasons) == 1 and "disabled" in s.reasons[0]


def test_sdpa_on_flash_is_recorded_and_not_priced(tmp_path):
    (s,) = choice(sdpa_flash(tmp_path)).attention
    assert (s.path, s.calls, s.is_causal, s.device_ns) == ("flash", 3, True, 3 * 250_000)
    assert s.expected_ns is None and s.reasons == []


def test_attention_by_hand_is_matched_from_matmul_softmax_matmul(tmp_path):
    (s,) = choice(manual_fp32(tmp_path)).attention
    assert (s.path, s.calls, s.dtype, s.q_dims, s.kv_len, s.head_dim) == ("manual", 3, "float", [2, 16, 256, 64], 256, 64)
    # Both GEMMs, the scale and the softmax: 270 µs per call, 200 of it plain FP32 GEMMs.
    assert s.device_ns == 3 * 270_000 and s.simt_ns == 3 * 200_000 and s.fusable_ns == 3 * 70_000
    assert s.flops == pytest.approx(3 * 2 * 2 * 32 * 256 * 256 * 64)
    assert any("by hand" in r for r in s.reasons) and any("fp16/bf16 only" in r for r in s.reasons)
    # fp32 stays on the memory-efficient backend's fp32 roof: 30% of 19.5 TFLOP/s.
    assert s.family == "attention.efficient.nvidia"
    assert s.expected_ns == pytest.approx(s.flops / (19.5e3 * 0.3))


def test_a_backward_pass_adds_flash_attentions_backward_flops(tmp_path):
    (s,) = choice(manual_fp32(tmp_path, backward=True)).attention
    assert s.with_backward and s.expected_ns == pytest.approx(s.flops * 3.5 / (19.5e3 * 0.3))


def test_rms_norm_by_hand_is_one_chain_priced_as_one_pass_over_the_tensor(tmp_path):
    (s,) = choice(rms_norm_chain(tmp_path)).chains
    assert (s.pattern, s.calls, s.kernels_per_call) == ("rms_norm", 3, 6.0)
    assert s.ops == ["pow", "mean", "add", "rsqrt", "mul", "mul"] and s.input_dims == [4096, 4096]
    assert s.device_ns == 3 * 300_000
    assert s.nbytes == 3 * 2 * 4096 * 4096 * 2  # read once, write once, bf16
    assert s.expected_ns == pytest.approx(s.nbytes / (2039 * 0.6))


def test_chains_inside_a_backward_pass_are_left_out(tmp_path):
    assert choice(rms_norm_chain(tmp_path, in_backward=True)).chains == []


def test_bf16_gemms_on_v100_are_priced_as_fp16_tensor_core_gemms(tmp_path):
    c = choice(big_gemm(tmp_path, "Tesla V100-SXM2-32GB", kernel_us=1000.0, kernel="volta_gemm_bf16_kernel"))
    u = c.unsupported
    assert (u.precision, u.target, u.calls, u.ns) == ("bf16", "fp16", 3, 3_000_000)
    # 60% of the V100's 125 TFLOP/s fp16: no fp16 GEMMs of its own to measure.
    assert u.efficiency == 0.6 and u.expected_ns == pytest.approx(3 * 2 * 4096**3 / (125e3 * 0.6))
    assert c.fp8 is None and c.sparse24 is None and "bf16" not in c.supported


def test_fp8_candidates_on_h100_scale_the_registry_by_the_ranks_own_bf16_shortfall(tmp_path):
    c = choice(big_gemm(tmp_path, "NVIDIA H100 80GB HBM3"))
    f = c.fp8
    assert (f.target, f.precision, f.calls, f.ns, f.shapes) == ("fp8", "bf16", 3, 1_200_000, ["4096x4096x4096 x3"])
    achieved = 2 * 4096**3 / 400e3 / 989.4e3  # the rank's bf16 GEMMs: 34.7% of the bf16 peak
    assert f.efficiency == pytest.approx(0.4 * achieved / 0.6, abs=1e-4)
    assert f.expected_ns == pytest.approx(3 * 2 * 4096**3 / (1978.9e3 * 0.4 * achieved / 0.6), rel=1e-3)
    assert c.gemm_ns == {"bf16": 1_200_000}


def test_small_gemms_are_not_fp8_candidates(tmp_path):
    # M = 1024 < the FP8 family's min_dim (2048): the casts would cost more than FP8 saves.
    c = choice(big_gemm(tmp_path, "NVIDIA H100 80GB HBM3", m=1024))
    assert c.fp8 is None and c.gemm_ns == {"bf16": 1_200_000}


def test_linear_gemms_on_a100_are_2_4_sparsity_candidates(tmp_path):
    c = choice(big_gemm(tmp_path, "NVIDIA A100-SXM4-80GB", op="aten::addmm"))
    s = c.sparse24
    assert (s.target, s.calls, s.ns) == ("sparse24", 3, 1_200_000)
    assert s.expected_ns == pytest.approx(3 * 2 * 4096**3 / (624e3 * s.efficiency))
    assert c.fp8 is None  # no FP8 tensor cores on Ampere


def test_fp32_gemms_are_priced_at_what_the_ranks_tf32_gemms_reach(tmp_path):
    c = choice(big_gemm(tmp_path, "NVIDIA A100-SXM4-80GB", dtype="float", kernel="ampere_sgemm_128x64_nn",
                        kernel_us=10_000.0))
    g = c.fp32_simt
    assert (g.target, g.precision, g.calls, g.ns) == ("tf32", "fp32", 3, 30_000_000)
    # No TF32 GEMMs of its own: the registry's 60% of 156 TFLOP/s.
    assert g.efficiency == 0.6 and g.expected_ns == pytest.approx(3 * 2 * 4096**3 / (156e3 * 0.6))


def test_precision_advisor_follows_the_device(tmp_path):
    fp32 = choice(big_gemm(tmp_path, "NVIDIA A100-SXM4-80GB", dtype="float", kernel="ampere_sgemm_128x64_nn",
                           kernel_us=1000.0)).precision
    assert fp32.shares == {"fp32": 100.0} and fp32.dominant == "fp32"
    assert (fp32.recommended, fp32.remedy, fp32.numerics) == ("tf32, then bf16 autocast", "precision.tf32", True)
    v100 = choice(big_gemm(tmp_path, "Tesla V100-SXM2-32GB", kernel="volta_gemm_bf16_kernel", m=1024)).precision
    assert v100.recommended.startswith("fp16 autocast + GradScaler") and v100.remedy is None
    h100 = choice(big_gemm(tmp_path, "NVIDIA H100 80GB HBM3")).precision
    assert h100.recommended.startswith("fp8 for the large GEMMs") and h100.remedy is None
    small = choice(big_gemm(tmp_path, "NVIDIA H100 80GB HBM3", m=1024)).precision
    assert small.recommended == "keep" and small.dominant == "bf16"
    # An H100 has FP8: "bf16 is the fastest path" was false; the GEMMs are too small for it.
    assert small.why == ("no bf16 GEMM with recorded shapes has M, N and K of 2048 or more, below which FP8's casts cost more "
                         "than NVIDIA H100 SXM5 80GB's faster FP8 GEMMs save")
    a100 = choice(big_gemm(tmp_path, "NVIDIA A100-SXM4-80GB")).precision
    assert a100.recommended == "keep" and a100.why.startswith("bf16 is the fastest training format")
    # AMD's matrix units are matrix cores (MFMA), not tensor cores.
    mi300 = choice(big_gemm(tmp_path, "AMD Instinct MI300X")).precision
    assert mi300.why == "3 GEMM calls are large enough for AMD Instinct MI300X's FP8 matrix cores"


def test_without_the_ops_dtypes_the_kernel_names_give_the_precision(tmp_path):
    """TraceLens' H100 Qwen trace: 31.5% of GEMM time 'unknown' where the cuBLAS kernels spell bf16; its
    MI300X ResNet: 'keep' judged on the 16% of GEMM time the trace named."""
    b = TraceBuilder(device_name="NVIDIA H100 80GB HBM3")
    for n in range(3):
        t0 = n * STEP
        b.step(n, t0, STEP)
        b.launching("aten::mm", t0 + 10, 20.0, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64",
                    t0 + 100, 300.0)  # no Input Dims / Input type: record_shapes off
        b.launching("vllm::moe_forward", t0 + 40, 20.0, "fused_moe_kernel_gemm", t0 + 420, 700.0)
    c = choice(str(b.write(tmp_path / "names.json")))
    assert c.gemm_ns == {"bf16": 900_000, "": 2_100_000}
    p = c.precision
    assert p.shares == {"": 70.0, "bf16": 30.0} and (p.dominant, p.recommended) == ("bf16", "keep")
    assert p.why == ("the trace gives no bf16 GEMM shapes to judge NVIDIA H100 SXM5 80GB's FP8 by "
                     "(record_shapes=True); judged on the 30% of GEMM time whose precision the trace names")


def test_fp32_ffma_gemms_on_h100_are_priced_as_tf32(tmp_path):
    # Hopper cuBLAS names its plain-FP32 GEMMs after the FFMA instruction (classify._FFMA): SIMT, not tensor cores.
    c = choice(big_gemm(tmp_path, "NVIDIA H100 80GB HBM3", dtype="float", kernel_us=5000.0,
                        kernel="sm90_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4"))
    g = c.fp32_simt
    assert (g.target, g.ns) == ("tf32", 15_000_000)
    assert g.expected_ns == pytest.approx(3 * 2 * 4096**3 / (494.7e3 * 0.6))
    assert c.precision.recommended == "tf32, then bf16 autocast" and c.precision.remedy == "precision.tf32"


def test_bias_dropout_add_is_one_chain_of_three_passes(tmp_path):
    from choice_traces import POINTWISE, STEP
    from kineto_builder import TraceBuilder
    b = TraceBuilder()
    for n in range(3):
        t0 = n * STEP
        b.step(n, t0, STEP)
        for i, op in enumerate(("add", "dropout", "add")):
            b.launching(f"aten::{op}", t0 + 10 + 30 * i, 20.0, POINTWISE, t0 + 400 + 80 * i, 60.0,
                        dims=[[8, 512, 1024], [1024]], types=["c10::BFloat16", "c10::BFloat16"])
    (s,) = choice(str(b.write(tmp_path / "bda.json"))).chains
    assert (s.pattern, s.calls, s.ops, s.device_ns) == ("bias_dropout_add", 3, ["add", "dropout", "add"], 3 * 180_000)
    assert s.nbytes == 3 * 3 * 8 * 512 * 1024 * 2  # x, residual and the output, bf16


def test_hostile_shapes_degrade_to_unknown_work_never_a_crash(tmp_path):
    from choice_traces import BF16, SOFTMAX, STEP, TC_GEMM
    from kineto_builder import TraceBuilder
    b = TraceBuilder()
    for n in range(3):
        t0 = n * STEP
        b.step(n, t0, STEP)
        # SDPA with a string dim, a boolean and an absurd size; a softmax whose neighbours lie about theirs.
        b.launching("aten::_scaled_dot_product_attention_math", t0 + 10, 50.0, SOFTMAX, t0 + 100, 50.0,
                    dims=[[8, "x", 1024, 64], [True, 16, 1024, 64], [10**12, 10**12, 10**12, 10**12], [], [], []],
                    types=[BF16] * 3 + ["", "Scalar", "Scalar"], concrete=[{"a": 1}, None, 3, [], "", "maybe"])
        b.gemm("aten::bmm", t0 + 70, 10.0, [[128, "L", 64], [128, 64, 1024]], dtype=BF16, kernel=TC_GEMM,
               kernel_at=t0 + 200, kernel_dur=50.0)
        b.launching("aten::_softmax", t0 + 90, 10.0, SOFTMAX, t0 + 300, 50.0, dims=[[8, 16, 1024, 1024], [], []],
                    types=[BF16, "Scalar", "Scalar"])
        b.gemm("aten::bmm", t0 + 110, 10.0, [[128, 1024, 1024], "nope"], dtype=BF16, kernel=TC_GEMM,
               kernel_at=t0 + 400, kernel_dur=50.0)
    c = choice(str(b.write(tmp_path / "hostile.json")))
    (s,) = c.attention  # the SDPA call; the softmax has no GEMMs it can trust around it
    assert s.path == "math" and s.q_dims == [] and s.flops is None and s.expected_ns is None and s.is_causal is None
