"""Code-built traces for the kernel-choice advisors (metrics/choice.py, rules/kernel_choice.py).

Three steps of STEP µs each; every step runs the same calls, each op launching its kernels late in
the step so that the device time is what the numbers below say.
"""

from __future__ import annotations

from pathlib import Path

from kineto_builder import TraceBuilder

STEP = 2000.0
BF16 = "c10::BFloat16"
TC_GEMM = "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn"
SGEMM = "ampere_sgemm_128x64_nn"
SOFTMAX = "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float>"
POINTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float>>"
REDUCE = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps>>"


def sdpa_math(tmp: Path, mask: bool = True, steps: int = 3) -> str:
    """SDPA dispatched to the math backend: bmm (300 µs), softmax (200 µs), bmm (300 µs) per step.

    q, k, v [8, 16, 1024, 64] bf16: forward FLOPs 2 x 2·128·1024·1024·64 = 34.36 GFLOP per call."""
    b = TraceBuilder()
    qkv = [[8, 16, 1024, 64]] * 3
    dims = qkv + ([[8, 1, 1024, 1024]] if mask else [[]]) + [[], [], []]
    types = [BF16] * 3 + ([BF16] if mask else [""]) + ["Scalar", "Scalar", "Scalar"]
    for n in range(steps):
        t0 = n * STEP
        b.step(n, t0, STEP)
        b.op("aten::scaled_dot_product_attention", t0 + 10, 300.0, dims=dims, types=types,
             concrete=["", "", "", "", "0.", "False", ""])
        b.op("aten::_scaled_dot_product_attention_math", t0 + 20, 280.0, dims=dims, types=types,
             concrete=["", "", "", "", "0.", "False", "", "", ""])
        b.gemm("aten::bmm", t0 + 30, 20.0, [[128, 1024, 64], [128, 64, 1024]], dtype=BF16, kernel=TC_GEMM,
               kernel_at=t0 + 400, kernel_dur=300.0)
        b.launching("aten::_softmax", t0 + 60, 20.0, SOFTMAX, t0 + 700, 200.0, dims=[[8, 16, 1024, 1024], [], []],
                    types=[BF16, "Scalar", "Scalar"])
        b.gemm("aten::bmm", t0 + 90, 20.0, [[128, 1024, 1024], [128, 1024, 64]], dtype=BF16, kernel=TC_GEMM,
               kernel_at=t0 + 900, kernel_dur=300.0)
    return str(b.write(tmp / "sdpa_math.json"))


def sdpa_flash(tmp: Path) -> str:
    """The same call on the flash backend: one 250 µs flash kernel per step."""
    b = TraceBuilder()
    qkv = [[8, 16, 1024, 64]] * 3
    for n in range(3):
        t0 = n * STEP
        b.step(n, t0, STEP)
        b.op("aten::scaled_dot_product_attention", t0 + 10, 100.0, dims=qkv + [[], [], [], [], []],
             types=[BF16] * 3 + ["", "Scalar", "Scalar", "", "Scalar"], concrete=["", "", "", "", "0.", "True", "", "False"])
        b.launching("aten::_scaled_dot_product_flash_attention", t0 + 20, 80.0,
                    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4>>", t0 + 400, 250.0,
                    dims=qkv + [[], [], [], []], types=[BF16] * 3 + ["Scalar", "Scalar", "Scalar", "Scalar"],
                    concrete=["", "", "", "0.", "True", "False", ""])
    return str(b.write(tmp / "sdpa_flash.json"))


def manual_fp32(tmp: Path, backward: bool = False) -> str:
    """Attention by hand in fp32: bmm [32,256,64]x[32,64,256] (100 µs, plain FP32 sgemm), scale
    (mul, 20 µs), softmax [2,16,256,256] (50 µs), bmm [32,256,256]x[32,256,64] (100 µs) per step.

    Forward FLOPs 2 x 2·32·256·256·64 = 536.9 MFLOP per call."""
    b = TraceBuilder(device_props={"computeMajor": 8, "computeMinor": 0})
    for n in range(3):
        t0 = n * STEP
        b.step(n, t0, STEP)
        b.gemm("aten::bmm", t0 + 10, 20.0, [[32, 256, 64], [32, 64, 256]], dtype="float", kernel=SGEMM,
               kernel_at=t0 + 400, kernel_dur=100.0)
        b.launching("aten::mul", t0 + 40, 10.0, POINTWISE, t0 + 510, 20.0, dims=[[2, 16, 256, 256], []],
                    types=["float", "Scalar"])
        b.launching("aten::_softmax", t0 + 60, 20.0, SOFTMAX, t0 + 540, 50.0, dims=[[2, 16, 256, 256], [], []],
                    types=["float", "Scalar", "Scalar"])
        b.gemm("aten::bmm", t0 + 90, 20.0, [[32, 256, 256], [32, 256, 64]], dtype="float", kernel=SGEMM,
               kernel_at=t0 + 600, kernel_dur=100.0)
        if backward:
            b.op("autograd::engine::evaluate_function: BmmBackward0", t0 + 800, 100.0)
    return str(b.write(tmp / "manual.json"))


def rms_norm_chain(tmp: Path, in_backward: bool = False) -> str:
    """x * rsqrt(x.pow(2).mean(-1) + eps) * w on bf16 [4096, 4096]: 6 kernels of 50 µs per step."""
    b = TraceBuilder()
    chain = ("pow", "mean", "add", "rsqrt", "mul", "mul")
    for n in range(3):
        t0 = n * STEP
        b.step(n, t0, STEP)
        if in_backward:
            b.op("autograd::engine::evaluate_function: MulBackward0", t0 + 5, 200.0)
        for i, op in enumerate(chain):
            b.launching(f"aten::{op}", t0 + 10 + 25 * i, 20.0, REDUCE if op == "mean" else POINTWISE,
                        t0 + 400 + 60 * i, 50.0, dims=[[4096, 4096], []], types=[BF16, "Scalar"])
    return str(b.write(tmp / "rms.json"))


def big_gemm(tmp: Path, device: str, props: dict | None = None, op: str = "aten::mm", kernel_us: float = 400.0,
             dtype: str = BF16, kernel: str = TC_GEMM, m: int = 4096) -> str:
    """One [m, 4096] x [4096, 4096] GEMM per step (137.4 GFLOP at m = 4096) of `kernel_us` device time."""
    b = TraceBuilder(device_name=device, device_props=props or {})
    dims = [[m, 4096], [4096, 4096]] if op == "aten::mm" else [[4096], [m, 4096], [4096, 4096], [], []]
    for n in range(3):
        t0 = n * STEP
        b.step(n, t0, STEP)
        b.gemm(op, t0 + 10, 20.0, dims, dtype=dtype, kernel=kernel, kernel_at=t0 + 100, kernel_dur=kernel_us)
    return str(b.write(tmp / f"gemm_{device.split()[-1]}.json"))
