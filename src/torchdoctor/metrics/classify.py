"""Name-based classification of kernels and host events.

Each classifier runs once per unique name (names are interned), never per event.
"""

from __future__ import annotations

import re
from enum import IntEnum
from functools import lru_cache


class KernelKind(IntEnum):
    GEMM = 0
    CONV = 1
    ATTENTION = 2
    ELEMENTWISE = 3
    REDUCTION = 4
    COMM = 5
    MEMCPY = 6
    MEMSET = 7
    OTHER = 8


KERNEL_KIND_LABELS = {k: k.name.lower() for k in KernelKind}

# NCCL renamed its kernels (ncclKernel_* -> ncclDevKernel_*); RCCL keeps nccl names on ROCm.
# Communication outside NCCL moves data from kernels too: expert-parallel all-to-all (DeepEP's
# `deep_ep::{intranode,internode,internode_ll}::dispatch/combine/notify_*`, DeepSeek's own
# `dpsk::ep::internode::*` in their published H800 trace; `deep_ep::layout::*` computes, it is not
# matched) and TransformerEngine's userbuffers (`userbuffers_*` reduce-scatter/all-gather kernels).
_COMM = re.compile(
    r"^nccl|ncclKernel|ncclDevKernel|^rccl|cross_device_reduce|custom_?all_?reduce|"
    r"^(gloo|c10d)[:_]|nvshmem|one_shot_all_reduce|two_shot_all_reduce|multimem_all_reduce|"
    r"ep::(intra|inter)node(_ll)?::|userbuffers_",
    re.IGNORECASE,
)
_ATTENTION = re.compile(r"flash|fmha|attention|attn|sdpa|mha_|_mha|cudnn_mha", re.IGNORECASE)
_CONV = re.compile(
    r"conv(?!ert)|fprop|dgrad|wgrad|winograd|implicit_?gemm|implicit_convolve|fft2d|"
    r"im2col|col2im|depthwise|scudnn|cudnn_(infer|train)",
    re.IGNORECASE,
)
# GEMM libraries by their kernel names: cuBLAS (`ampere_sgemm_*`, `sm80_xmma_gemm_*`; Hopper and
# Blackwell cuBLASLt's `nvjet_*` and `sm90_xmma_*`/`sm100_xmma_*`), CUTLASS 2 and 3
# (`cutlass_80_tensorop_*`, `cutlass3x_sm90_*`, `cutlass::Kernel2<...>`), WGMMA/GMMA/HMMA kernels,
# rocBLAS/hipBLASLt (Tensile's `Cijk_*`), Triton (Inductor templates `triton_tem_*`, `triton_mm`,
# user `matmul_kernel`s). Checked after attention and convolution, whose kernels are GEMMs too.
_GEMM = re.compile(
    r"gemm|gemv|cutlass|cublas|matmul|xmma|nvjet|wgmma|gmma|hmma|tensorop|^ampere_|^volta_|^turing_|"
    r"^sm\d+_|Kernel2|dot_kernel|triton_tem|triton_b?mm|splitKreduce|bmm|hipblaslt|rocblas|Cijk_",
    re.IGNORECASE,
)
_REDUCTION = re.compile(
    r"reduce|softmax|norm|bn_fw|bn_bw|triton_red|triton_per|sum_kernel|mean|argm|topk|scan|"
    r"cross_entropy|nll_loss|welford|histogram|pool|Moments|GammaBeta",
    re.IGNORECASE,
)
_ELEMENTWISE = re.compile(
    r"elementwise|triton_poi|vectorized|unrolled|copy|fill|index|where|cat_|_kernel_impl|"
    r"pointwise|clamp|relu|gelu|silu|sigmoid|tanh|add|mul|div|dropout|embedding|ToNhwc|ToNchw|"
    r"transpose|permute",
    re.IGNORECASE,
)


@lru_cache(maxsize=65536)
def kernel_kind(name: str) -> KernelKind:
    """Classify a device kernel by name (memcpy/memset are classified by category, not here)."""
    for pattern, kind in (
        (_COMM, KernelKind.COMM),
        (_ATTENTION, KernelKind.ATTENTION),
        (_CONV, KernelKind.CONV),
        (_GEMM, KernelKind.GEMM),
        (_REDUCTION, KernelKind.REDUCTION),
        (_ELEMENTWISE, KernelKind.ELEMENTWISE),
    ):
        if pattern.search(name):
            return kind
    return KernelKind.OTHER


# --- math path of GEMM / convolution kernels ------------------------------------------------------

# Tensor-core (NVIDIA) / matrix-core (AMD MFMA, Tensile's `MI32x32x8`) kernels by name: TBP's list
# (tensor_core.py) plus newer cuBLAS/CUTLASS/cuDNN/rocBLAS spellings. Data-type words (bf16, fp16,
# tf32) only mean tensor cores on a kernel already classified GEMM or CONV.
_TENSOR_CORE = re.compile(
    r"h884|s884|h1688|s1688|hmma|i8816|16816|1688|tensorop|xmma|wgmma|gmma|nvjet|tf32|bf16|f16f16|"
    r"e4m3|e5m2|fp16|_half|c10::Half|BFloat16|MI\d+x\d+x\d+|dgrad_1x1_stride_2x2|first_layer_wgrad_kernel|"
    r"conv1x1",
    re.IGNORECASE,
)
# Plain FP32 (SIMT) GEMM/conv kernels: cuBLAS sgemm, cuDNN scudnn, complex/FFT paths, gemv on floats.
_FP32_SIMT = re.compile(r"sgemm|scudnn|gcgemm|fft2d|_engine<float|gemv2?[NT]_kernel.*float|gemmSN_", re.IGNORECASE)
# cuBLAS xmma kernels that run FP32 FMAs name the instruction (`..._f32f32_f32f32_f32_..._ffma_...`):
# `xmma` alone does not mean tensor cores.
_FFMA = re.compile(r"_ffma_|_ffma$", re.IGNORECASE)


class MathPath(IntEnum):
    """How a GEMM/conv kernel does its arithmetic, as far as its name says."""

    UNKNOWN = 0  # e.g. Triton GEMMs: the dtype decides, the name does not say
    TENSOR_CORE = 1
    FP32_SIMT = 2


@lru_cache(maxsize=65536)
def math_path(name: str) -> MathPath:
    """Tensor cores, plain FP32, or unknown, for a kernel that kernel_kind calls GEMM or CONV."""
    if _FFMA.search(name):
        return MathPath.FP32_SIMT
    if _TENSOR_CORE.search(name):
        return MathPath.TENSOR_CORE
    if _FP32_SIMT.search(name):
        return MathPath.FP32_SIMT
    return MathPath.UNKNOWN


# --- input precision of GEMM / convolution kernels, from their names ---------------------------

# Where the launching op's `Input type` is missing (record_shapes off, a custom op such as vLLM's
# MoE), the library kernels that spell their operand type in a fixed place still say it. Each
# pattern reads the A operand's type:
#   cuBLAS/cuDNN xmma   sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n..., sm80_xmma_fprop_implicit_gemm_f16f16_...,
#                       sm80_xmma_gemm_f32f32_tf32f32_f32_... (A and B, then the math: TF32, or bf16 for
#                       FP32 inputs under set_float32_matmul_precision("medium"))
#   cuBLAS (legacy)     ampere_bf16_s16816gemm_bf16_..., volta_fp16_s884gemm_fp16_..., turing_h1688gemm_...
#   CUTLASS 2.x         [C_]<acc><shape>[tf32]gemm[_<epilogue>][_A]_<tile>: cutlass_75_tensorop_bf16_s1688gemm_bf16_...,
#                       cutlass_80_tensorop_s1688tf32gemm_..., cutlass_80_tensorop_h16816gemm_relu_...,
#                       cutlass_tensorop_bf16_s16816fprop_optimized_bf16_... (cuDNN's); A is named after
#                       the core unless it is the accumulator's type (h: fp16)
#   CUTLASS 3.x         cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32_void_bf16_...
#   MIOpen igemm        igemm_fwd_gtcx3_nhwc_bf16_..., igemm_bwd_gtcx_nchw_fp16_...
#   Tensile/hipBLASLt   Cijk_Ailk_Bljk_BBS_BH_... (bf16 in, single compute), Cijk_..._HHS_BH_... (fp16)
#   TensorRT-LLM gen    bmm_<out>_<A><B>_<acc>: bmm_Bfloat16_E4m3E4m3_Fp32_..., bmm_MxE4m3_MxE2m1MxE4m3_Fp32_...
#                       (the wider of A and B sets the roof: FP4 x FP8 runs at the FP8 rate on Blackwell)
# Names that do not say (nvjet_*, Triton, CK's mangled templates) stay unknown: no guess.
_XMMA = re.compile(r"_xmma_\w*?(?:gemm|fprop|dgrad|wgrad)_(?:indexed_)?(bf16|f16|tf32|f32|e4m3|e5m2)"
                   r"(?:bf16|f16|tf32|f32|e4m3|e5m2)_(\w+?)_", re.I)
_LEGACY = re.compile(r"(?:^|_)(?:maxwell|pascal|volta|turing|ampere|ada|hopper|sm\d+)_(?:(bf16|fp16)_[hs]\d+|(h)\d+|(s))gemm",
                     re.I)
_CUTLASS = re.compile(r"cutlass\w*?_(?:wmma_)?tensorop_(?:\w+?_)?([hsi])\d+(tf32)?(?:gemm|fprop|dgrad|wgrad)((?:_\w+?)*?)"
                      r"_\d+x\d+", re.I)
_CUTLASS_TYPES = {"bf16": "bf16", "f16": "fp16", "e4m3": "fp8", "e5m2": "fp8", "tf32": "tf32"}
_CUTLASS3 = re.compile(r"cutlass3x_sm\d+_tensorop_\w*?gemm_(bf16|f16|e4m3|e5m2)_", re.I)
_IGEMM = re.compile(r"igemm_\w+?_(?:nhwc|nchw)_(bf16|fp16|fp32)_", re.I)
_TENSILE = re.compile(r"^Cijk_A\w+?_B\w+?_(BBS|BSS|BBH|HHS|HSS|HHH)_")
_TRT = r"(Bfloat16|Fp16|MxE4m3|MxE2m1|E4m3|E5m2|E2m1)"
_TRTLLM = re.compile(rf"^bmm_(?:Fp32|{_TRT})_{_TRT}{_TRT}_", re.I)
_WIDTH = {"fp4": 4, "fp8": 8, "bf16": 16, "fp16": 16}
_TRTLLM_TYPES = {"bfloat16": "bf16", "fp16": "fp16", "e4m3": "fp8", "e5m2": "fp8", "mxe4m3": "fp8",
                 "e2m1": "fp4", "mxe2m1": "fp4"}


@lru_cache(maxsize=65536)
def name_precision(name: str) -> str | None:
    """The device table's precision key (fp32, tf32, bf16, fp16, fp8, fp4) that a GEMM/conv kernel's
    name spells, None where the name does not say (see the table above)."""
    if m := _XMMA.search(name):
        a, math = m.group(1).lower(), m.group(2).lower()
        if a == "f32":  # FP32 operands: the math says which tensor-core path, if any
            return next((p for t, p in (("tf32", "tf32"), ("bf16", "bf16"), ("f16", "fp16")) if math.startswith(t)),
                        "fp32")
        return {"bf16": "bf16", "f16": "fp16", "tf32": "tf32"}.get(a, "fp8")
    if m := _LEGACY.search(name):
        a = next(g for g in m.groups() if g).lower()
        return {"bf16": "bf16", "fp16": "fp16", "h": "fp16"}.get(a, "fp32")
    if m := _CUTLASS.search(name):
        named = next((_CUTLASS_TYPES[t.lower()] for t in m.group(3).split("_") if t.lower() in _CUTLASS_TYPES), None)
        if named:
            return named
        if m.group(2):
            return "tf32"
        return "fp16" if m.group(1).lower() == "h" else None  # an FP32 or int accumulator names no A
    if m := _CUTLASS3.search(name):
        return {"bf16": "bf16", "f16": "fp16"}.get(m.group(1).lower(), "fp8")
    if m := _IGEMM.search(name):
        return {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}[m.group(1).lower()]
    if m := _TENSILE.search(name):
        return "bf16" if m.group(1).startswith("B") else "fp16"
    if m := _TRTLLM.search(name):
        a, b = (_TRTLLM_TYPES[g.lower()] for g in m.groups()[1:])
        return max(a, b, key=_WIDTH.__getitem__)
    return None


# --- host side -------------------------------------------------------------------------------

LAUNCH_APIS = frozenset({
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel", "cuLaunchKernel",
    "cuLaunchKernelEx", "hipLaunchKernel", "hipExtLaunchKernel", "hipModuleLaunchKernel",
    "hipExtModuleLaunchKernel", "cudaGraphLaunch", "hipGraphLaunch", "cuGraphLaunch",
})
MEMORY_APIS = frozenset({
    "cudaMemcpyAsync", "cudaMemsetAsync", "cudaMemcpy", "cudaMemset", "cudaMemcpy2DAsync",
    "hipMemcpyAsync", "hipMemsetAsync", "hipMemcpy", "hipMemset", "hipMemcpyWithStream",
})
# Calls that block the host until the device catches up.
SYNC_APIS = frozenset({
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cuStreamSynchronize",
    "cuCtxSynchronize", "cuEventSynchronize", "hipStreamSynchronize", "hipDeviceSynchronize",
    "hipEventSynchronize",
})
# Synchronous copies: the host waits for them like for a sync.
BLOCKING_COPY_APIS = frozenset({"cudaMemcpy", "hipMemcpy", "cudaMemcpy2D", "hipMemcpy2D"})

_DATALOADER = re.compile(r"^enumerate\(DataLoader\)#.*__next__")
_OPTIMIZER = re.compile(r"^Optimizer\.(step|zero_grad)#")
_COMM_HOST = re.compile(
    r"^(nccl|gloo|mpi|ucc|hccl|xccl|c10d|_c10d_functional)[:_]|^c10d::|^record_param_comms$|^ProcessGroup|"
    r"^FSDP::(all_gather|post_backward_reduce|.*_wait)",
)
_BACKWARD = re.compile(r"^autograd::engine::evaluate_function|^## backward ##|^autograd::backward")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
SYNC_OPS_EXPLAINED = {
    "aten::_local_scalar_dense": ".item() / scalar read of a device tensor",
    "aten::item": ".item()",
    "aten::nonzero": "nonzero() / boolean-mask indexing (output size depends on data)",
    "aten::masked_select": "masked_select / boolean-mask indexing",
    "aten::unique": "unique()",
    "aten::_to_copy": ".to('cpu') / .cpu() / .numpy()",
    "aten::copy_": "copy to host (.cpu(), .numpy(), .tolist())",
    "aten::is_nonzero": "Python bool() of a device tensor (e.g. `if loss > x:`)",
    "aten::equal": "torch.equal",
    "aten::allclose": "torch.allclose",
    "aten::to": ".to(device) of a host tensor / .cpu()",
    "aten::repeat_interleave": "repeat_interleave without output_size",
}


def is_dataloader(name: str) -> bool:
    return bool(_DATALOADER.match(name))


def is_optimizer(name: str) -> bool:
    return bool(_OPTIMIZER.match(name))


def is_comm_host(name: str) -> bool:
    return bool(_COMM_HOST.match(name))


def is_backward(name: str) -> bool:
    return bool(_BACKWARD.match(name))


def step_number(name: str) -> int | None:
    m = _STEP.match(name)
    return int(m.group(1)) if m else None


def memcpy_kind(name: str) -> tuple[str, str]:
    """('HtoD'|'DtoH'|'DtoD'|'PtoP'|'other', 'pageable'|'pinned'|'device'|'managed'|'') from a Kineto name.

    Kineto names copies "Memcpy HtoD (Pageable -> Device)"; the host side's memory kind decides
    whether the copy can be asynchronous (pageable host memory makes it synchronous).
    """
    direction = "other"
    for d in ("HtoD", "DtoH", "DtoD", "PtoP", "HtoH"):
        if d in name:
            direction = d
            break
    lowered = name.lower()
    host = ""
    if "pageable" in lowered:
        host = "pageable"
    elif "pinned" in lowered:
        host = "pinned"
    elif "managed" in lowered:
        host = "managed"
    elif "device" in lowered:
        host = "device"
    return direction, host
