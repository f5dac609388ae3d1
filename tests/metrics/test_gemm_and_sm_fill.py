"""GEMM shapes (HW-2) and SM fill (HW-4) metrics on code-built traces."""

from __future__ import annotations

import pytest

from kineto_builder import TraceBuilder
from real_traces import trace
from torchdoctor.metrics.gemm import gemm_dims
from torchdoctor.metrics.rank import analyze_rank
from torchdoctor.trace.load import load_trace

BF16 = "c10::BFloat16"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>"
GEMM = "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"


def signals(b: TraceBuilder, tmp_path):
    return analyze_rank(load_trace(str(b.write(tmp_path / "t.json")))).signals


def step(b: TraceBuilder) -> TraceBuilder:
    b.step(1, 0.0, 10_000.0)
    return b


@pytest.mark.parametrize(("op", "dims", "want"), [
    ("aten::mm", [[1024, 1705], [1705, 512]], {"M": 1024, "K": 1705, "N": 512}),
    ("aten::addmm", [[512], [64, 100], [100, 512], [], []], {"M": 64, "K": 100, "N": 512}),
    ("aten::bmm", [[12, 77, 64], [12, 64, 77]], {"M": 77, "K": 64, "N": 77}),
    ("aten::linear", [[8, 128, 1000], [50257, 1000], [50257]], {"M": 1024, "K": 1000, "N": 50257}),
    ("aten::matmul", [[4, 10, 16], [16, 24]], {"M": 10, "K": 16, "N": 24}),
])
def test_gemm_dims_read_the_matrix_inputs(op, dims, want):
    dtype, got = gemm_dims(op, dims, [BF16] * len(dims))
    assert dtype == BF16 and got == want


def test_gemm_dims_reject_matrix_vector_products():
    assert gemm_dims("aten::matmul", [[4, 16], [16]], [BF16, BF16]) is None
    assert gemm_dims("aten::addmm", [[5], [4, 16]], [BF16, BF16]) is None


def test_each_gemm_counted_once_with_its_kernel_time(tmp_path):
    b = step(TraceBuilder())
    # linear -> addmm (misaligned N=50257): one GEMM, its kernel 300 µs.
    b.op("aten::linear", 100.0, 60.0, dims=[[64, 1024], [50257, 1024], [50257]], types=[BF16] * 3)
    b.gemm("aten::addmm", 110.0, 40.0, [[50257], [64, 1024], [1024, 50257], [], []], kernel_at=200.0,
           kernel_dur=300.0)
    # matmul -> mm, aligned: counted as a half GEMM, not misaligned.
    b.op("aten::matmul", 600.0, 50.0, dims=[[64, 1024], [1024, 1024]], types=[BF16] * 2)
    b.gemm("aten::mm", 610.0, 30.0, [[64, 1024], [1024, 1024]], kernel_at=700.0, kernel_dur=100.0)
    # The backward GEMM on the autograd thread, K misaligned, twice with the same shape.
    for t0 in (1000.0, 1200.0):
        b.gemm("aten::mm", t0, 40.0, [[64, 50257], [50257, 1024]], tid=77, kernel_at=t0 + 500, kernel_dur=160.0)
    # fp32 and misaligned: HW-1's, not counted here.
    b.gemm("aten::mm", 2000.0, 20.0, [[64, 1705], [1705, 512]], dtype="float", kernel_at=2100.0, kernel_dur=80.0)
    g = signals(b, tmp_path).misaligned_gemms
    assert g.half_gemms == 4
    assert g.count == 3
    assert g.time_source == "device"
    assert g.device_ns == (300 + 160 + 160) * 1000
    assert g.host_ns == (40 + 40 + 40) * 1000
    top, second = g.sites
    assert (top.op, top.count, top.device_ns, top.misaligned) == ("aten::mm", 2, 320_000, ["K"])
    assert top.dims == {"M": 64, "K": 50257, "N": 1024} and top.dtype == BF16
    assert top.first_ts_ns == 1_000_000
    assert (second.op, second.misaligned, second.shapes) == ("aten::addmm", ["N"], "[[50257],[64,1024],[1024,50257],[],[]]")


def test_gemm_time_falls_back_to_the_host_without_correlation(tmp_path):
    b = step(TraceBuilder())
    b.op("aten::mm", 100.0, 25.0, dims=[[30, 30], [30, 30]], types=[BF16] * 2)
    g = signals(b, tmp_path).misaligned_gemms
    assert (g.count, g.device_ns, g.host_ns, g.time_source) == (1, 0, 25_000, "host")


def test_gemm_signal_absent_without_shapes_and_empty_when_aligned(tmp_path):
    b = step(TraceBuilder())
    b.op("aten::mm", 100.0, 25.0)
    assert signals(b, tmp_path).misaligned_gemms is None
    b.gemm("aten::mm", 200.0, 20.0, [[64, 64], [64, 128]])
    g = signals(b, tmp_path).misaligned_gemms
    assert (g.half_gemms, g.count, g.sites) == (1, 0, [])


def test_sm_fill_of_one_underfilled_kernel(tmp_path):
    b = step(TraceBuilder())
    b.kernel(GEMM, 100.0, 400.0, launch_at=90.0, blocks_per_sm=0.25, warps_per_sm=1.0, occupancy=3)
    b.kernel(ELEMENTWISE, 600.0, 100.0, launch_at=590.0, blocks_per_sm=4.0, warps_per_sm=32.0, occupancy=50)
    f = signals(b, tmp_path).sm_fill
    assert f.kernel_ns == 500_000 and f.underfilled_ns == 400_000
    assert f.sm_idle_ns == 300_000  # 400 µs x (1 - 0.25)
    assert f.sm_efficiency_pct == pytest.approx(40.0)  # (100 + 100) of 500 µs
    assert f.occupancy_pct == pytest.approx((3 * 400 + 50 * 100) / 500)
    assert f.idle_by_kind == {"gemm": 300_000}
    (k,) = f.top
    assert (k.name, k.count, k.ns, k.blocks_per_sm, k.occupancy_pct, k.idle_ns) == (GEMM, 1, 400_000, 0.25, 3.0,
                                                                                     300_000)


def test_concurrent_kernels_fill_each_others_sms(tmp_path):
    b = step(TraceBuilder())
    # Two half-filling kernels on two streams: together they fill the device for 100 µs.
    b.kernel(GEMM, 100.0, 200.0, stream=7, launch_at=90.0, blocks_per_sm=0.5)
    b.kernel(ELEMENTWISE, 200.0, 100.0, stream=8, launch_at=91.0, blocks_per_sm=0.5)
    # Communication is not compute (NCCL uses few blocks by design); no launch args: unknown.
    b.kernel(NCCL, 1000.0, 500.0, stream=20, launch_at=95.0, blocks_per_sm=0.1)
    b.kernel("kernel_without_args", 2000.0, 500.0, launch_at=96.0)
    f = signals(b, tmp_path).sm_fill
    assert f.kernel_ns == 300_000
    assert f.sm_idle_ns == 50_000  # [100,200) and [300,300) half empty; [200,300) full
    assert f.sm_efficiency_pct == pytest.approx(75.0)
    # Split in proportion to each kernel's own empty time (100 vs 50 µs).
    assert f.idle_by_kind == {"gemm": 33_333, "elementwise": 16_667}


def test_communication_kernels_hold_the_sms_they_run_on(tmp_path):
    # Expert-parallel all-to-all (DeepEP) keeps a share of the SMs on purpose and the GEMM beside
    # it is sized for the rest: the device is full, nothing is left empty.
    b = step(TraceBuilder())
    b.kernel(GEMM, 100.0, 400.0, stream=7, launch_at=90.0, blocks_per_sm=0.8)
    b.kernel("void deep_ep::intranode::dispatch<8, 768, 6>(int4*, float*)", 100.0, 400.0, stream=20,
             launch_at=91.0, blocks_per_sm=0.2)
    f = signals(b, tmp_path).sm_fill
    assert f.kernel_ns == 400_000  # the dispatch is not compute time
    assert f.sm_idle_ns == 0 and f.sm_efficiency_pct == pytest.approx(100.0)
    # Alone, the same GEMM leaves a fifth of the device empty.
    b = step(TraceBuilder())
    b.kernel(GEMM, 100.0, 400.0, stream=7, launch_at=90.0, blocks_per_sm=0.8)
    assert signals(b, tmp_path).sm_fill.sm_idle_ns == 80_000


def test_sm_fill_absent_without_launch_args(tmp_path):
    b = step(TraceBuilder())
    b.kernel(GEMM, 100.0, 400.0, launch_at=90.0)
    assert signals(b, tmp_path).sm_fill is None


# --- SM fill against the device table's SM count (issue 14, item 6) ------------------------------

def small_grid_trace(props: dict) -> TraceBuilder:
    """An A100-SXM4-80GB (108 SMs) running 27-block kernels, recorded with the given properties."""
    b = TraceBuilder(device_name="NVIDIA A100-SXM4-80GB", device_props=props)
    b.step(1, 0.0, 2_000.0)
    for i in range(10):
        b.kernel("void at::native::vectorized_elementwise_kernel<4, add>", 100.0 + 150 * i, 100.0,
                 launch_at=90.0 + 150 * i, grid=[27, 1, 1], blocks_per_sm=None if "numSms" not in props else 27 /
                 props["numSms"])
    return b


def test_without_num_sms_the_grid_is_divided_by_the_table_sm_count(tmp_path):
    # Kineto writes `blocks per SM` -1 when it does not know the SM count: the fill comes from the
    # grid (27 blocks) and the table's 108 SMs: 0.25 blocks per SM, 75% of the SM-time empty.
    props = {"computeMajor": 8, "computeMinor": 0, "totalGlobalMem": 85_899_345_920}
    r = analyze_rank(load_trace(str(small_grid_trace(props).write(tmp_path / "t.json"))))
    f = r.signals.sm_fill
    assert f.sms == 108 and "device table" in f.sms_source and "lack numSms" in f.sms_source
    assert f.top[0].blocks_per_sm == pytest.approx(0.25) and f.sm_efficiency_pct == pytest.approx(25.0)
    assert "tiny grid: 0.25 blocks per SM" in r.kernels.top[0].roofline


def test_num_sms_that_disagrees_with_the_table_is_kept_and_said(tmp_path):
    # A MIG slice of an A100 80GB shows 98 SMs: the process sees 98, the table has 108.
    props = {"computeMajor": 8, "computeMinor": 0, "totalGlobalMem": 85_899_345_920, "numSms": 98}
    r = analyze_rank(load_trace(str(small_grid_trace(props).write(tmp_path / "t.json"))))
    f = r.signals.sm_fill
    assert f.sms == 98 and "not the 108" in f.sms_source and "MIG" in f.sms_source
    assert f.top[0].blocks_per_sm == pytest.approx(27 / 98, rel=1e-4)


def test_unknown_device_without_num_sms_has_no_fill(tmp_path):
    b = TraceBuilder(device_name="NVIDIA RTX 6000 Ada Generation")
    b.step(1, 0.0, 1_000.0)
    b.kernel("elementwise_kernel", 100.0, 100.0, launch_at=90.0, grid=[4, 1, 1])
    r = analyze_rank(load_trace(str(b.write(tmp_path / "t.json"))))
    assert r.signals.sm_fill is None  # no SM count anywhere: no guess


def test_real_traces_agree_with_the_table():
    r = analyze_rank(load_trace(trace("v100_resnet_rank0.json.gz")))
    assert r.signals.sm_fill.sms == 80 and "agrees with the device table" in r.signals.sm_fill.sms_source
