"""metrics/opwork + work: FLOPs and bytes per op call, given to the kernels the call launched."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from kineto_builder import TraceBuilder
from real_traces import trace
from torchdoctor.metrics.context import Context
from torchdoctor.metrics.opwork import conv_work, gemm_work, op_work, tensor_bytes
from torchdoctor.metrics.rank import analyze_rank
from torchdoctor.metrics.steps import choose_window
from torchdoctor.metrics.work import kernel_work
from torchdoctor.trace.load import load_trace

HALF = "c10::Half"
# ResNet-50's first convolution: x[32, 3, 224, 224] * w[64, 3, 7, 7], stride 2, padding 3.
# Output side (224 + 2*3 - 1*(7-1) - 1) // 2 + 1 = 223 // 2 + 1 = 112.
# FLOPs = 2 * N * K * P * Q * C * R * S = 2 * 32 * 64 * 112 * 112 * 3 * 7 * 7
#       = 2 * 32 * 118,013,952 (the 118 M multiply-adds per image of the ResNet paper's conv1)
#       = 7,552,892,928.
CONV1_FLOPS = 7_552_892_928
# Bytes at 2 per fp16 element: input 32*3*224*224 = 4,816,896; weight 64*3*7*7 = 9,408;
# output 32*64*112*112 = 25,690,112; (4,816,896 + 9,408 + 25,690,112) * 2 = 61,032,832.
CONV1_BYTES = 61_032_832
CUDNN_CONV1 = {  # aten::cudnn_convolution(self, weight, padding, stride, dilation, groups, benchmark, ...)
    "dims": [[32, 3, 224, 224], [64, 3, 7, 7], [], [], [], [], [], [], []],
    "concrete": ["", "", "[3, 3]", "[2, 2]", "[1, 1]", "1", "False", "False", "True"],
}


def test_conv1_flops_and_bytes_by_hand():
    types = [HALF, HALF] + ["ScalarList"] * 3 + ["Scalar"] * 4
    w = conv_work("aten::cudnn_convolution", CUDNN_CONV1["dims"], types, CUDNN_CONV1["concrete"])
    assert (w.flops, w.nbytes, w.why) == (CONV1_FLOPS, CONV1_BYTES, "")
    # The same call through aten::convolution's argument order (stride before padding).
    conv = conv_work("aten::convolution", [[32, 3, 224, 224], [64, 3, 7, 7], [], [], [], [], [], [], []], types,
                     ["", "", "", "[2, 2]", "[3, 3]", "[1, 1]", "False", "[0, 0]", "1"])
    assert conv.flops == CONV1_FLOPS


def test_v100_resnet_records_no_shapes_so_conv_flops_are_null_with_the_reason():
    # The real trace was recorded without record_shapes: no event has Input Dims, so no
    # convolution's FLOPs can be read from it; every conv kernel says why, none is zero.
    with gzip.open(trace("v100_resnet_rank0.json.gz"), "rt") as f:
        events = json.load(f)["traceEvents"]
    assert not any("Input Dims" in e.get("args", {}) for e in events)
    k = analyze_rank(load_trace(trace("v100_resnet_rank0.json.gz"))).kernels
    convs = [s for s in k.top if s.kind == "conv"]
    assert convs and all(s.flops is None and "record_shapes off" in s.roofline for s in convs)


def test_conv1_shapes_put_into_the_real_v100_resnet_trace(tmp_path):
    # The same real trace with ResNet-50's conv1 shapes (batch 32, fp32) written onto the first
    # aten::cudnn_convolution of each step: the real op > launch > kernel chain carries them to
    # the real scudnn kernel, not to the cuDNN helper kernel the op launched before it.
    with gzip.open(trace("v100_resnet_rank0.json.gz"), "rt") as f:
        doc = json.load(f)
    evs = doc["traceEvents"]
    starts = sorted(e["ts"] for e in evs if e.get("name", "").startswith("ProfilerStep#"))
    firsts = {}
    for e in evs:
        if e.get("name") == "aten::cudnn_convolution":
            step = sum(e["ts"] >= s for s in starts)
            if step not in firsts or e["ts"] < firsts[step]["ts"]:
                firsts[step] = e
    for e in firsts.values():
        e["args"].update({"Input Dims": CUDNN_CONV1["dims"], "Input type": ["float"] * 2 + ["ScalarList"] * 3
                          + ["Scalar"] * 4, "Concrete Inputs": CUDNN_CONV1["concrete"]})
    path = tmp_path / "v100.json"
    path.write_text(json.dumps(doc))
    tr = load_trace(str(path))
    w = kernel_work(Context(tr, choose_window(tr, "all")))
    got = np.flatnonzero(np.isfinite(w.flops))
    assert got.size == len(firsts)
    assert {tr.names[tr.name[k]] for k in got.tolist()} == {"cudnn_infer_volta_scudnn_128x64_relu_xregs_large_nn_v1"}
    assert (w.flops[got] == CONV1_FLOPS).all() and (w.nbytes[got] == CONV1_BYTES * 2).all()  # fp32: 4 bytes
    assert {w.dtype(k) for k in got.tolist()} == {"float"}


def gemm_bytes_trace() -> TraceBuilder:
    b = TraceBuilder(device_name="NVIDIA H100 80GB HBM3")
    b.step(1, 0.0, 10_000.0)
    # mm(a[4096, 4096], b[4096, 4096]) bf16: FLOPs 2*4096^3; bytes (3 * 4096^2) * 2.
    b.gemm("aten::mm", 100.0, 40.0, [[4096, 4096], [4096, 4096]], kernel="nvjet_tst_128x256_64x4_1x2_h_bz_NNT",
           kernel_at=200.0, kernel_dur=200.0)
    # add(x[1024, 4096], y[4096]) fp32: reads 1024*4096*4 + 4096*4, writes 1024*4096*4 bytes.
    b.launching("aten::add", 1000.0, 10.0, "vectorized_elementwise_kernel<4, add>", 1100.0, 20.0,
                dims=[[1024, 4096], [4096], []], types=["float", "float", "Scalar"])
    # sum(x[1024, 4096]) fp32: a reduction reads its input; its output is not counted.
    b.launching("aten::sum", 2000.0, 10.0, "reduce_kernel<512, 1>", 2100.0, 20.0,
                dims=[[1024, 4096], [], [], []], types=["float", "", "Scalar", ""])
    return b


def test_top_kernels_get_bytes_intensity_and_bound(tmp_path):
    r = analyze_rank(load_trace(str(gemm_bytes_trace().write(tmp_path / "t.json"))))
    by = {s.kind: s for s in r.kernels.top}
    g, add, red = by["gemm"], by["elementwise"], by["reduction"]
    assert g.bytes == 3 * 4096**2 * 2 and g.intensity == pytest.approx(2 * 4096**3 / (3 * 4096**2 * 2), abs=0.01)
    # 1365 FLOP/byte is past the H100 bf16 ridge (989.4e12 / 3350e9 = 295 FLOP/byte).
    assert g.bound == "compute" and g.achieved_gbps == pytest.approx(g.bytes / 200e3, rel=1e-3)
    assert add.bytes == 1024 * 4096 * 4 * 2 + 4096 * 4 and add.bound == "memory" and add.flops is None
    assert add.achieved_gbps == pytest.approx(add.bytes / 20e3, rel=1e-3)
    assert add.pct_of_bandwidth == pytest.approx(100 * add.achieved_gbps / 3350, rel=1e-3)
    assert red.bytes == 1024 * 4096 * 4 and red.bound == "memory"


@pytest.mark.parametrize(("op", "dims", "types", "want"), [
    ("aten::copy_", [[10, 10], [10, 10], []], ["c10::Half", "float", "Scalar"], 100 * 2 + 100 * 4),
    ("aten::fill_", [[10, 10], []], ["float", "Scalar"], 400),
    ("aten::mul_", [[10, 10], [10, 10]], ["float", "float"], 400 * 3),
    ("aten::mul", [[10, 1], [1, 10]], ["float", "float"], 40 + 40 + 400),
])
def test_tensor_bytes_rules(op, dims, types, want):
    assert tensor_bytes(op, dims, types).nbytes == want


@pytest.mark.parametrize(("op", "dims", "types", "concrete", "why"), [
    ("aten::cudnn_convolution", [[8, 3, 32, 32], [16, 3, 3, 3]], ["float", "float"], None, "Concrete Inputs"),
    ("aten::convolution", [[8, 3, 32, 32], [16, 3, 3, 3]], ["float"] * 2, ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]",
                                                                            "True", "[0, 0]", "1"], "transposed"),
    ("aten::conv2d", [[8, 3, 32, 32], [16, 3, 3, 3]], ["float"] * 2, ["", "", "", "[1, 1]", "'same'", "[1, 1]", "1"],
     "not readable"),
    ("aten::conv2d", [[8, 4, 32, 32], [16, 3, 3, 3]], ["float"] * 2, ["", "", "", "[1]", "[1]", "[1]", "2"], "groups"),
    ("aten::conv2d", [[8, 3, 2, 2], [16, 3, 7, 7]], ["float"] * 2, ["", "", "", "[1]", "[0]", "[1]", "1"], "no output"),
    ("aten::conv2d", [[10**9, 10**9, 10**9, 10**9], [10**9, 10**9, 1, 1]], ["float"] * 2,
     ["", "", "", "[1]", "[0]", "[1]", "1"], "absurd"),
    ("aten::add", [[10, 10], [3, 7]], ["float"] * 2, None, "broadcast"),
    ("aten::add", [[10, 10], [10, 10]], ["float", "c10::Weird"], None, "not sizeable"),
    ("aten::add", [[10, "x"], [10, 10]], ["float"] * 2, None, "not readable"),
    ("aten::_foreach_add_", [[[128, 128], [128]], [[128, 128], [128]], []], ["TensorList", "TensorList", "Scalar"],
     None, "not sizeable"),
    ("aten::mm", [[10**8, 10**8], [10**8, 10**8]], ["float"] * 2, None, "absurd"),
])
def test_bad_shapes_degrade_to_null_with_the_reason(op, dims, types, concrete, why):
    w = op_work(op, json.dumps(dims).encode(), json.dumps(types).encode(),
                json.dumps(concrete).encode() if concrete is not None else b"")
    assert w.flops is None and why in w.why
    assert op_work(op, b"[[1, 2", b"[]").why  # unreadable JSON never raises


def test_gemm_bytes_count_the_bias():
    # addmm(bias[96], x[1024, 512], W^T[512, 96]) fp32: reads 96 + 1024*512 + 512*96, writes 1024*96.
    w = gemm_work("aten::addmm", [[96], [1024, 512], [512, 96], [], []], ["float"] * 3 + ["Scalar"] * 2)
    assert w.nbytes == (96 + 1024 * 512 + 512 * 96 + 1024 * 96) * 4


def test_an_op_with_several_runtime_calls_but_one_kernel_gets_its_bytes(tmp_path):
    # aten::sum with a cudaMemsetAsync before its launch: two runtime calls, one kernel.
    b = TraceBuilder(device_name="NVIDIA H100 80GB HBM3")
    b.step(1, 0.0, 1_000.0)
    b.op("aten::sum", 100.0, 20.0, dims=[[1024, 4096], [], [], []], types=["float", "", "Scalar", ""])
    b.runtime("cudaMemsetAsync", 102.0, 2.0)
    corr = b.runtime("cudaLaunchKernel", 110.0, 5.0)
    b.kernel("reduce_kernel<512, 1>", 200.0, 20.0, corr=corr)
    # An op launching two kernels: its bytes go to neither, and both say why.
    b.op("aten::mul", 300.0, 20.0, dims=[[64, 64], [64, 64]], types=["float", "float"])
    for t in (302.0, 310.0):
        c = b.runtime("cudaLaunchKernel", t, 5.0)
        b.kernel("vectorized_elementwise_kernel<4, mul>", t + 100, 10.0, corr=c)
    tr = load_trace(str(b.write(tmp_path / "t.json")))
    w = kernel_work(Context(tr, choose_window(tr, "all")))
    red = int(np.flatnonzero(tr.name == tr.names.index("reduce_kernel<512, 1>"))[0])
    assert w.nbytes[red] == 1024 * 4096 * 4
    muls = np.flatnonzero(tr.name == tr.names.index("vectorized_elementwise_kernel<4, mul>")).tolist()
    assert all(np.isnan(w.nbytes[k]) and "launched 2 kernels" in w.why(k) for k in muls)
