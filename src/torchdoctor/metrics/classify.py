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
    r"^(nccl|gloo|mpi|ucc|hccl|xccl|c10d)[:_]|^c10d::|^record_param_comms$|^ProcessGroup|"
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
