"""metrics/classify: one place that names a kernel's kind and math path, for every GEMM library."""

from __future__ import annotations

import pytest

from kineto_builder import TraceBuilder
from torchdoctor.metrics.classify import KernelKind, MathPath, kernel_kind, math_path, name_precision
from torchdoctor.metrics.rank import analyze_rank
from torchdoctor.trace.load import load_trace

# Hopper cuBLASLt's GEMM kernels (torch 2.x on H100/H200) carry no "gemm" in their names.
NVJET = "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT"
TC_GEMMS = [
    NVJET,
    "nvjet_hsh_192x128_64x5_2x1_v_bz_coopB_TNT",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
    "void cutlass::device_kernel<cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32_void_bf16_128x256x64_1x2x1_0_tnn_align8_warpspecialized_cooperative_epi_tma>(Params)",
    "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(Params)",
    "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_tn_align1>(Params)",
    "sm100_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize256x128x64_cublas",
    "Cijk_Alik_Bljk_BBS_BH_MT128x128x64_MI32x32x8x1_SN_1LDSB0_GRVW8_ISA942",  # hipBLASLt/Tensile MFMA
    "sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_tilesize128x128x128_cublas",  # FP8
]
SIMT_GEMMS = [
    "ampere_sgemm_128x64_nn",
    "volta_sgemm_128x32_nt",
    "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_aligna4_alignc4_execute_kernel_cublas",
]
UNKNOWN_PATH_GEMMS = ["triton_tem_fused_mm_0", "triton_mm", "matmul_kernel"]  # Triton: the dtype decides


@pytest.mark.parametrize("name", TC_GEMMS)
def test_tensor_core_gemms(name):
    assert kernel_kind(name) == KernelKind.GEMM and math_path(name) == MathPath.TENSOR_CORE


@pytest.mark.parametrize("name", SIMT_GEMMS)
def test_fp32_simt_gemms(name):
    assert kernel_kind(name) == KernelKind.GEMM and math_path(name) == MathPath.FP32_SIMT


@pytest.mark.parametrize("name", UNKNOWN_PATH_GEMMS)
def test_triton_gemms_are_gemms_of_unknown_path(name):
    assert kernel_kind(name) == KernelKind.GEMM and math_path(name) == MathPath.UNKNOWN


@pytest.mark.parametrize(("name", "kind"), [
    ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_cudnn", KernelKind.CONV),
    ("fmha_cutlassF_f16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel)", KernelKind.ATTENTION),
    ("triton_poi_fused_add_cos_sin_0", KernelKind.ELEMENTWISE),
    ("triton_red_fused_sum_0", KernelKind.REDUCTION),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*)", KernelKind.COMM),
    # Expert-parallel all-to-all outside NCCL: DeepEP, and DeepSeek's own kernels in their H800 trace.
    ("void deep_ep::intranode::dispatch<8, 768, 6>(int4*, float*, int*)", KernelKind.COMM),
    ("void deep_ep::internode_ll::combine<false>(void*, int*)", KernelKind.COMM),
    ("void dpsk::ep::internode::combine<false, 8, __nv_bfloat16, 8, 2, 16, 24>(int4*, float*)", KernelKind.COMM),
    ("void dpsk::ep::internode::cached_notify<false>(int, int, int, int, int*)", KernelKind.COMM),
    ("void userbuffers_fp16_sum_inplace_gpu_rr_rs<8>(int, int, int, int)", KernelKind.COMM),
    # DeepEP's layout kernel computes token counts: not communication.
    ("void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*, int*)", KernelKind.OTHER),
])
def test_other_library_kernels_keep_their_kind(name, kind):
    assert kernel_kind(name) == kind


def test_hopper_nvjet_gemm_counts_as_gemm_and_tensor_core_in_a_trace(tmp_path):
    b = TraceBuilder(device_name="NVIDIA H100 80GB HBM3")
    b.step(1, 0.0, 10_000.0)
    b.gemm("aten::mm", 100.0, 40.0, [[4096, 4096], [4096, 4096]], kernel=NVJET, kernel_at=200.0, kernel_dur=900.0)
    b.gemm("aten::mm", 1200.0, 40.0, [[4096, 4096], [4096, 4096]], kernel=NVJET, kernel_at=1300.0,
           kernel_dur=900.0)
    r = analyze_rank(load_trace(str(b.write(tmp_path / "t.json"))))
    [top] = r.kernels.top
    assert (top.name, top.kind, top.count) == (NVJET, "gemm", 2)
    gemm = next(k for k in r.kernels.by_kind if k.kind == "gemm")
    assert gemm.ns == 1_800_000
    sig = r.signals
    assert sig.matmul_ns == sig.tensor_core_ns == 1_800_000 and sig.fp32_simt_ns == 0


# Kernel names from real traces (TraceLens' H100/B200/MI300X traces, HTA's A100/V100 ones) and the
# libraries' naming schemes: the A operand's type where the name spells it, None where it does not.
NAMED_PRECISIONS = [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas", "bf16"),
    ("sm80_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x16_stage4_warpsize2x2x1_tensor16x8x8_kernel", "tf32"),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_aligna4_alignc4_execute_kernel", "fp32"),
    ("sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_tilesize128x128x128_cublas", "fp8"),
    ("sm80_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x32", "bf16"),
    ("void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_nn_align1>(Params)", "bf16"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_32x1_nn_align8>(Params)", "bf16"),
    ("void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816fprop_optimized_bf16_256x64_32x4_nhwc_align8>(P)", "bf16"),
    ("cutlass_80_tensorop_s1688tf32gemm_256x128_16x3_nn_align4", "tf32"),
    ("cutlass_80_tensorop_h16816gemm_relu_256x128_32x3_nn_align8", "fp16"),
    ("void cutlass::device_kernel<cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32_void_bf16_128x256x64_1x2x1_0_tnn>(P)", "bf16"),
    ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn", "bf16"),
    ("volta_fp16_s884gemm_fp16_128x128_ldg8_f2f_nn", "fp16"),
    ("turing_h1688gemm_128x128_ldg8_nn", "fp16"),
    ("ampere_sgemm_128x64_nn", "fp32"),
    ("igemm_fwd_gtcx3_nhwc_bf16_bx0_ex1_bt128x128x32_wt32x32x8_ws1x1_wr2x2", "bf16"),
    ("Cijk_Alik_Bljk_BBS_BH_MT128x128x64_MI32x32x8x1_SN_1LDSB0_GRVW8_ISA942", "bf16"),
    ("Cijk_Ailk_Bljk_HHS_BH_MT64x64x32_MI16x16x16x1", "fp16"),
    ("bmm_MxE4m3_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_et128x16_m128x16x32_cga1x1x1_16dp256b_rM_TN", "fp8"),
    # TensorRT-LLM's names put the output first: bf16 out of MXFP4 x MXFP8 runs at the FP8 rate.
    ("bmm_Bfloat16_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_et128x16_m128x16x32_cga1x1x1_16dp256b_rM_TN", "fp8"),
    ("bmm_Bfloat16_E2m1E2m1_Fp32_t128x8x256u2_s3_et64x8_m64x8x64_cga1x1x1_16dp256b_TN_transOut", "fp4"),
    ("bmm_Bfloat16_E4m3E4m3_Fp32_t128x8x128u2_s6_et64x8_m64x8x32_cga1x1x1_16dp256b_TN_transOut", "fp8"),
    ("bmm_E4m3_Bfloat16Bfloat16_Fp32_t128x8x64_s4_et64x8_m64x8x16_cga1x1x1_16dp256b_TN", "bf16"),
    ("sm80_xmma_gemm_f32f32_bf16f32_f32_tn_n_tilesize128x128x32_stage4_warpsize2x2x1_tensor16x8x16", "bf16"),
    ("sm80_xmma_fprop_implicit_gemm_indexed_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x32", "bf16"),
    ("sm80_xmma_dgrad_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4", "tf32"),
    ("cutlass_80_tensorop_bf16_s16832gemm_e4m3_128x128_64x3_tn_align16", "fp8"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s16816gemm_bf16_128x128_32x5_tn_align8>(Params)", "bf16"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(Params)", "bf16"),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_tn_align1>(Params)", None),
    (NVJET, None),  # cuBLASLt's nvjet names carry no operand type
    ("Cijk_Ailk_Bljk_SB_MT64x64x16_MI32x32x2x1", None),
    ("triton_tem_fused_mm_0", None),
]


@pytest.mark.parametrize("name,expected", NAMED_PRECISIONS)
def test_a_kernel_name_gives_its_precision_only_where_it_spells_it(name, expected):
    assert name_precision(name) == expected
