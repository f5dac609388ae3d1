"""Hardware-layer rules (HW-1..HW-7, HW-11)."""

from __future__ import annotations

import pytest

from kineto_builder import TraceBuilder
from torchdoctor.facts import BackendFacts, DeviceFacts
from torchdoctor.metrics.model import KindTime, MemcpyRow, SmFill
from torchdoctor.session import analyze_paths

from .conftest import MS, gpu_facts, gpu_result, idle, only, run


def fp32(cc="8.0", simt_ms=40.0):
    r = gpu_result(busy=100.0)
    r.signals.compute_capability = cc
    r.signals.matmul_ns = int(50 * 5 * MS)
    r.signals.fp32_simt_ns = int(simt_ms * 5 * MS)
    return r


def test_hw1_fp32_matmuls_on_ampere_warn_with_tf32_fix():
    got = only(run("HW-1", (fp32(), None)), "HW-1")
    assert got.severity == "critical" and got.remedy == "precision.tf32"
    assert abs(got.recoverable_pct - 20.0) < 0.1


def test_hw1_before_ampere_advises_fp16_gradscaler_and_names_no_remedy_that_refuses_it():
    # V100 (7.0): no TF32, no bf16. The autocast remedy is bf16-only and refuses fp16, so the
    # finding names no automatic remedy; its advice is the fp16 + GradScaler code change.
    got = only(run("HW-1", (fp32(cc="7.0"), None)), "HW-1")
    assert got.severity == "info" and got.remedy is None
    assert "GradScaler" in got.fix.snippet and "float16" in got.fix.snippet and "bf16-only" in got.fix.text
    from torchdoctor.remedies.catalogue import BY_ID
    assert "fp16 is refused" in BY_ID["precision.autocast"].preconditions  # what the remedy accepts


def test_hw1_unknown_capability_routes_to_the_bf16_autocast_it_advises():
    got = only(run("HW-1", (fp32(cc=None), None)), "HW-1")
    assert got.remedy == "precision.autocast" and "bf16 autocast" in got.fix.text
    assert "bfloat16" in got.fix.snippet


def test_hw1_from_facts_only():
    f = gpu_facts(backends=BackendFacts(cuda_matmul_allow_tf32=False, float32_matmul_precision="highest",
                                        autocast_used=False))
    got = only(run("HW-1", (None, f)), "HW-1")
    assert got.severity == "info" and got.confirm


def test_hw1_silent_on_tensor_cores_or_cpu():
    assert run("HW-1", (fp32(simt_ms=0.0), None)) == []
    f = gpu_facts(backends=BackendFacts(cuda_matmul_allow_tf32=True, autocast_used=False))
    assert run("HW-1", (None, f)) == []


def test_hw3_layout_conversions():
    r = gpu_result(busy=100.0)
    r.signals.layout_transpose_count = 500
    r.signals.layout_transpose_ns = 8 * 5 * MS
    assert abs(only(run("HW-3", (r, None)), "HW-3").recoverable_pct - 8.0) < 0.1


def test_hw3_silent_without_conversions():
    assert run("HW-3", (gpu_result(), None)) == []


def test_hw5_small_batch():
    f = gpu_facts(device=DeviceFacts(kind="cuda", total_memory_bytes=80 * 2**30, max_memory_allocated_bytes=8 * 2**30))
    assert only(run("HW-5", (gpu_result(busy=30.0), f)), "HW-5").severity == "info"


def test_hw5_silent_on_busy_device():
    f = gpu_facts(device=DeviceFacts(kind="cuda", total_memory_bytes=80 * 2**30, max_memory_allocated_bytes=8 * 2**30))
    assert run("HW-5", (gpu_result(busy=95.0), f)) == []


def test_hw6_memory_full_or_retrying():
    f = gpu_facts(device=DeviceFacts(kind="cuda", total_memory_bytes=100, max_memory_allocated_bytes=95,
                                     num_alloc_retries=3))
    got = only(run("HW-6", (None, f)), "HW-6")
    assert got.severity == "warning" and "95%" in got.title


def test_hw6_silent_with_headroom():
    f = gpu_facts(device=DeviceFacts(kind="cuda", total_memory_bytes=100, max_memory_allocated_bytes=50))
    assert run("HW-6", (None, f)) == []


def test_hw7_allocator_calls_in_steady_state():
    r = idle(gpu_result(busy=90.0), "host_ops", 10.0)
    r.signals.alloc_calls = 40
    r.signals.alloc_ns = 6 * 5 * MS
    got = only(run("HW-7", (r, None)), "HW-7")
    assert abs(got.recoverable_ms - 6.0) < 1e-6


def test_hw7_silent_without_allocator_calls():
    assert run("HW-7", (gpu_result(), None)) == []


def test_hw11_device_to_device_copies():
    r = gpu_result(busy=100.0)
    r.kernels.memcpy = [MemcpyRow("DtoD", "device", 500, 20 * 5 * MS, 5 * 10**9)]
    got = only(run("HW-11", (r, None)), "HW-11")
    assert got.severity == "info" and abs(got.recoverable_pct - 10.0) < 0.1


def test_hw11_silent_without_copies():
    assert run("HW-11", (gpu_result(), None)) == []


# --- HW-2 / HW-4 on code-built traces (decode -> metrics -> signals -> rule) --------------------------

BF16 = "c10::BFloat16"
TC_GEMM = "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"


def lm_head_trace(tmp_path, dtype: str = BF16, vocab: int = 50257) -> str:
    """3 steps of 1 ms: linear -> addmm [64, 1000] x [1000, vocab] (600 µs kernel), an aligned mm (200 µs)."""
    b = TraceBuilder()
    for n in range(3):
        t0 = n * 1000.0
        b.step(n, t0, 1000.0)
        b.op("aten::linear", t0 + 10, 60.0, dims=[[64, 1000], [vocab, 1000], [vocab]], types=[dtype] * 3)
        b.gemm("aten::addmm", t0 + 20, 40.0, [[vocab], [64, 1000], [1000, vocab], [], []], dtype=dtype,
               kernel_at=t0 + 100, kernel_dur=600.0)
        b.gemm("aten::mm", t0 + 80, 20.0, [[64, 1024], [1024, 1024]], dtype=dtype, kernel_at=t0 + 750,
               kernel_dur=200.0)
    return str(b.write(tmp_path / "lm.json"))


def findings(path: str, fid: str):
    rep = analyze_paths([path])
    assert not rep.errors and not [w for w in rep.warnings if "rule" in w.message]
    return [f for f in rep.findings if f.id == fid]


def test_hw2_bf16_matmul_with_odd_vocab_fires(tmp_path):
    (f,) = findings(lm_head_trace(tmp_path), "HW-2")
    # 600 µs per step of misaligned GEMM kernels x 1/4 x busy share 0.8 = 120 µs of a 1 ms step.
    assert f.recoverable_ms == pytest.approx(0.12)
    assert f.severity == "warning" and f.confidence == "medium"
    assert "1 fp16/bf16 matmul per step has N not a multiple of 8" in f.title
    ev = f.evidence[0]
    assert ev.values["count"] == 3 and ev.values["half_gemms"] == 6 and ev.values["time_source"] == "device"
    (site,) = ev.items
    assert site["name"] == "aten::addmm [[50257],[64,1000],[1000,50257],[],[]]"
    assert site["count"] == 3 and site["ms_per_step"] == 0.6 and site["misaligned"] == ["N"]
    assert site["ts_ns"] == 20_000  # the first step's addmm
    assert "50264" in f.fix.snippet


@pytest.mark.parametrize(("dtype", "vocab"), [("float", 50257), (BF16, 50264)])
def test_hw2_silent_on_fp32_or_aligned_matmuls(tmp_path, dtype, vocab):
    assert findings(lm_head_trace(tmp_path, dtype, vocab), "HW-2") == []


def small_kernel_trace(tmp_path, blocks_per_sm: float) -> str:
    """3 steps of 1 ms, each one 800 µs tensor-core GEMM launched with `blocks_per_sm` blocks per SM."""
    b = TraceBuilder()
    for n in range(3):
        t0 = n * 1000.0
        b.step(n, t0, 1000.0)
        b.op("aten::mm", t0 + 10, 30.0)
        b.kernel(TC_GEMM, t0 + 100, 800.0, launch_at=t0 + 15, blocks_per_sm=blocks_per_sm,
                 warps_per_sm=4 * blocks_per_sm, occupancy=6)
    return str(b.write(tmp_path / f"k{blocks_per_sm}.json"))


def test_hw4_kernels_with_fewer_blocks_than_sms_fire(tmp_path):
    (f,) = findings(small_kernel_trace(tmp_path, 0.2), "HW-4")
    # 800 µs x (1 - 0.2) = 640 µs of empty SM-time per step; 1/4 of it x busy share 0.8 = 128 µs.
    assert f.recoverable_ms == pytest.approx(0.128)
    assert f.severity == "warning" and "est. SM efficiency 20%" in f.title
    ev = f.evidence[0]
    assert ev.values["empty_sm_ms"] == pytest.approx(0.64) and ev.values["empty_sm_pct_of_busy"] == 80.0
    assert ev.values["occupancy_pct"] == 6.0
    (k,) = ev.items
    assert (k["name"], k["count"], k["blocks_per_sm"], k["kind"]) == (TC_GEMM, 3, 0.2, "gemm")


def test_hw4_without_num_sms_uses_the_table_sm_count(tmp_path):
    # The same 800 µs GEMMs, recorded without numSms (Kineto's blocks per SM is -1): 22 blocks
    # on the table's 108 SMs of the A100-SXM4-80GB the trace names = 0.204 blocks per SM.
    b = TraceBuilder(device_props={"computeMajor": 8, "computeMinor": 0})
    for n in range(3):
        t0 = n * 1000.0
        b.step(n, t0, 1000.0)
        b.op("aten::mm", t0 + 10, 30.0)
        b.kernel(TC_GEMM, t0 + 100, 800.0, launch_at=t0 + 15, blocks_per_sm=-1, grid=[22, 1, 1])
    (f,) = findings(str(b.write(tmp_path / "t.json")), "HW-4")
    ev = f.evidence[0]
    assert ev.values["sms"] == 108 and "device table" in ev.values["sms_source"]
    assert "Fill against 108 SMs" in ev.text and ev.items[0]["blocks_per_sm"] == pytest.approx(22 / 108, abs=1e-4)


def test_hw4_silent_when_kernels_fill_the_device(tmp_path):
    assert findings(small_kernel_trace(tmp_path, 2.0), "HW-4") == []


def sm_fill_result(by_kind: dict[str, float], simt_ms: float = 0.0, fusable_per_step: int = 500):
    """A busy rank whose compute kernels leave `by_kind` ms per step of SM-time empty."""
    r = gpu_result(busy=100.0)
    n = len(r.window.steps)
    r.signals.sm_fill = SmFill(kernel_ns=int(80 * n * MS), underfilled_ns=int(40 * n * MS),
                               sm_idle_ns=int(sum(by_kind.values()) * n * MS), sm_efficiency_pct=75.0,
                               idle_by_kind={k: int(v * n * MS) for k, v in by_kind.items()},
                               idle_fp32_simt_ns=int(simt_ms * n * MS))
    r.kernels.by_kind = [KindTime("elementwise", int(30 * n * MS), fusable_per_step * n, 30.0)]
    return r


def test_hw4_leaves_fused_pointwise_kernels_to_cg1():
    # Eager, 500 pointwise kernels per step: CG-1 prices them, HW-4 only the GEMMs' 10 ms.
    r = sm_fill_result({"elementwise": 20.0, "gemm": 10.0})
    cg1 = only(run("CG-1", (r, None)), "CG-1")
    hw4 = only(run("HW-4", (r, None)), "HW-4")
    assert hw4.recoverable_ms == pytest.approx(10.0 * 0.25)
    assert cg1.recoverable_ms == pytest.approx(30.0 / 3)
    # Compiled: nothing left for CG-1, HW-4 prices all 30 ms.
    r.compile_regions = {"0/0": 5}
    assert run("CG-1", (r, None)) == []
    assert only(run("HW-4", (r, None)), "HW-4").recoverable_ms == pytest.approx(30.0 * 0.25)


def test_hw4_leaves_fp32_gemms_to_hw1_and_stays_quiet_below_its_threshold():
    r = sm_fill_result({"gemm": 10.0}, simt_ms=6.0)
    r.signals.fp32_simt_ns = int(20 * 5 * MS)
    assert only(run("HW-4", (r, None)), "HW-4").recoverable_ms == pytest.approx(4.0 * 0.25)
    # 4 ms of empty SM-time in a 100 ms busy step is under 5% of busy time.
    assert run("HW-4", (sm_fill_result({"gemm": 4.0}), None)) == []

