"""Hardware-layer rules (HW-1, HW-3, HW-5, HW-6, HW-7, HW-11)."""

from __future__ import annotations

from torchdoctor.facts import BackendFacts, DeviceFacts
from torchdoctor.metrics.model import MemcpyRow

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


def test_hw1_before_ampere_is_info_with_autocast():
    got = only(run("HW-1", (fp32(cc="7.0"), None)), "HW-1")
    assert got.severity == "info" and got.remedy == "precision.autocast"


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
