"""Kernel breakdown: which pointwise/reduction kernels compiling could fuse (`eager_fusable`)."""

from __future__ import annotations

from kineto_builder import TraceBuilder
from torchdoctor.metrics.rank import analyze_rank
from torchdoctor.trace.load import load_trace

ATEN_ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>"
HAND_FUSED = "void cuda::per_channel_cast_and_transpose<256, 128, false>(void const*, void*)"
LAYER_NORM = "void layer_norm::ln_fwd_kernel<layer_norm::Kernel_traits<__nv_bfloat16>>(void*)"


def kernels(b: TraceBuilder, tmp_path):
    return analyze_rank(load_trace(str(b.write(tmp_path / "t.json")))).kernels


def launch(b: TraceBuilder, at: float, kernel: str, kernel_at: float) -> None:
    corr = b.runtime("cudaLaunchKernel", at, 2.0)
    b.kernel(kernel, kernel_at, 10.0, corr=corr)


def test_only_kernels_that_aten_ops_launch_are_fusable(tmp_path):
    b = TraceBuilder()
    b.step(1, 0.0, 20_000.0)
    t, dev = 10.0, 10.0
    for _ in range(30):  # aten::add > launch: ATen's kernel
        b.op("aten::add", t, 8.0)
        launch(b, t + 3.0, ATEN_ADD, dev)
        t, dev = t + 10.0, dev + 20.0
    for _ in range(20):  # aten::add > aten::empty (ended), then the launch: still aten::add's
        b.op("aten::add", t, 8.0)
        b.op("aten::empty", t + 0.5, 1.0)
        launch(b, t + 3.0, ATEN_ADD, dev)
        t, dev = t + 10.0, dev + 20.0
    # A custom autograd Function launching its hand-fused kernels after an aten op of its own;
    # an aten::mul inside it launches an ATen kernel, which counts.
    b.op("DropoutAddLayerNormFn", t, 200.0)
    b.op("aten::view", t + 1.0, 1.0)
    for j in range(10):
        launch(b, t + 5.0 + 10 * j, LAYER_NORM, dev)
        dev += 20.0
    b.op("aten::mul", t + 150.0, 8.0)
    launch(b, t + 152.0, ATEN_ADD, dev)
    dev += 20.0
    t += 210.0
    # Kernels launched under a user annotation only (an extension called from Python).
    b.annotation("mlp(F)", t, 200.0)
    for j in range(15):
        launch(b, t + 5.0 + 10 * j, HAND_FUSED, dev)
        dev += 20.0
    k = kernels(b, tmp_path)
    got = k.eager_fusable
    assert (got.count, got.ns) == (51, 510_000)
    counts = {x.kind: x.count for x in k.by_kind}
    assert counts == {"elementwise": 66, "reduction": 10}  # the kinds still hold every kernel


def test_without_launch_correlation_there_is_no_split(tmp_path):
    b = TraceBuilder()
    b.step(1, 0.0, 1_000.0)
    b.op("aten::add", 10.0, 8.0)
    b.kernel(ATEN_ADD, 20.0, 10.0)  # no correlation id
    assert kernels(b, tmp_path).eager_fusable is None
