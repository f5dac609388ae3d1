"""metrics/signals.py: the narrow numbers the rules read, on code-built traces."""

from __future__ import annotations

from torchdoctor.metrics.rank import analyze_rank
from torchdoctor.trace.load import load_trace

from .kineto import Trace

TC = "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x128_32x3_nn_align1>(Params)"
SIMT = "ampere_sgemm_128x64_nn"
AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)"


def signals(t: Trace, tmp_path):
    return analyze_rank(load_trace(t.write(tmp_path / "t.json.gz"))).signals


def test_blocking_device_to_host_copy(tmp_path):
    t = Trace()
    for n in range(2):
        s = n * 10_000.0
        t.step(n, s, 10_000.0)
        t.host("aten::mm", s + 10, 20.0)
        t.kernel(TC, s + 15, s + 40, 4000.0)
        t.host("## sparse_data_dist ##", s + 100, 6000.0, cat="user_annotation")
        t.host("aten::to", s + 110, 5000.0)
        t.host("aten::copy_", s + 111, 4990.0)
        # The host waits in cudaMemcpyAsync until the copy runs at the end of the queue.
        t.kernel("Memcpy DtoH (Device -> Pageable)", s + 120, s + 5050, 5.0, api="cudaMemcpyAsync",
                 api_dur=4950.0, cat="gpu_memcpy", nbytes=64)
        t.kernel(TC, s + 6200, s + 6210, 3700.0)
    sig = signals(t, tmp_path)
    [site] = sig.blocking_copies
    assert (site.direction, site.host_memory, site.op, site.region) == ("DtoH", "pageable", "aten::copy_",
                                                                        "## sparse_data_dist ##")
    assert site.count == 2 and site.bytes == 128
    assert 1.8e6 < site.idle_ns < 2.2e6  # device idle from 4040 to 5050 µs in each step


def test_pageable_host_to_device_copy_that_waited_for_the_queue(tmp_path):
    # kineto's tb_plugin V100 samples: the call waits for the queued kernels, then stages the
    # batch; it returns 56 µs before the last chunk's DMA ends. A pinned copy that returns at
    # once is not blocking.
    t = Trace()
    for n in range(2):
        s = n * 20_000.0
        t.step(n, s, 20_000.0)
        t.host("aten::mm", s + 10, 20.0)
        t.kernel(TC, s + 15, s + 40, 6000.0)
        t.host("aten::to", s + 100, 9000.0)
        t.host("aten::copy_", s + 101, 8990.0)
        t.kernel("Memcpy HtoD (Pageable -> Device)", s + 110, s + 6050, 3000.0, api="cudaMemcpyAsync",
                 api_dur=8884.0, cat="gpu_memcpy", nbytes=1000)
        if n == 0:  # the first step's copy also stalls with the device idle: 4 ms more
            t.host("aten::to", s + 10_000, 4200.0)
            t.host("aten::copy_", s + 10_001, 4190.0)
            t.kernel("Memcpy HtoD (Pageable -> Device)", s + 10_010, s + 14_000, 100.0, api="cudaMemcpyAsync",
                     api_dur=4080.0, cat="gpu_memcpy", nbytes=1000)
        t.host("aten::to", s + 15_000, 30.0)
        t.kernel("Memcpy HtoD (Pinned -> Device)", s + 15_005, s + 15_100, 500.0, api="cudaMemcpyAsync",
                 api_dur=10.0, cat="gpu_memcpy", nbytes=1000)
    sig = signals(t, tmp_path)
    [site] = sig.blocking_copies
    assert (site.direction, site.host_memory, site.count) == ("HtoD", "pageable", 3)
    assert 21.6e6 < site.host_ns < 22.0e6  # 2 x 8.92 ms + 4.08 ms
    assert 3.8e6 < site.idle_ns < 4.2e6  # the device idles only in the first step's stall


def test_comm_block_at_end_of_step_and_collectives(tmp_path):
    t = Trace(backend="nccl")
    for n in range(2):
        s = n * 10_000.0
        t.step(n, s, 10_000.0)
        t.kernel(TC, s + 5, s + 10, 6000.0)
        for i in range(20):  # 20 small all-reduces back to back after the compute
            t.kernel(AR, s + 100 + i, s + 6100 + i * 150, 100.0, stream=20)
    sig = signals(t, tmp_path)
    assert sig.comm.kernels_per_step == 20
    assert abs(sig.comm.block_ms - 2.0) < 0.01 and sig.comm.block_start_pct > 55
    assert sig.collectives["all_reduce"][0] == 40 and sig.collectives["all_reduce"][2] == 100_000


def optimizer_trace(ops: list[str], launch: bool = True) -> Trace:
    t = Trace()
    for n in range(2):
        s = n * 10_000.0
        t.step(n, s, 10_000.0)
        t.host("Optimizer.zero_grad#SGD.zero_grad", s + 10, 500.0, cat="user_annotation")
        for i in range(10):
            t.host("aten::zero_", s + 20 + 40 * i, 30.0)
        t.host("Optimizer.step#SGD.step", s + 1000, 5000.0, cat="user_annotation")
        for i, op in enumerate(ops):
            t.host(op, s + 1010 + 100 * i, 80.0)
            if launch:
                t.kernel("void at::native::vectorized_elementwise_kernel<4>()", s + 1020 + 100 * i,
                         s + 1030 + 100 * i, 5.0)
    return t


def test_single_tensor_optimizer_and_zero_grad_fills(tmp_path):
    sig = signals(optimizer_trace(["aten::add_"] * 30), tmp_path)
    assert sig.optimizer_impl == "single_tensor" and sig.optimizer_classes == ["SGD"]
    assert sig.optimizer_launches_per_step == 30 and sig.zero_grad_fills_per_step == 10


def test_optimizer_step_host_time_and_the_device_time_it_launched(tmp_path):
    """HO-18's inputs: Optimizer.step's ranges (5 ms a step) and its 30 kernels of 5 µs a step; the
    zero_grad fills outside it launch nothing and count in neither."""
    t = optimizer_trace(["aten::add_"] * 30)
    r = analyze_rank(load_trace(t.write(tmp_path / "t.json.gz")))
    n = len(r.window.steps)
    assert n >= 1
    assert r.signals.optimizer_step_ns == n * 5_000_000
    assert r.signals.optimizer_device_ns == n * 30 * 5_000
    cpu = signals(optimizer_trace(["aten::add_"] * 30, launch=False), tmp_path / "cpu")
    assert cpu.optimizer_step_ns == n * 5_000_000 and cpu.optimizer_device_ns == 0


def test_nested_same_name_ops_count_once(tmp_path):
    # Traces of torch <= 1.9 (kineto's tb_plugin ResNet-50 samples) record the autograd layer's
    # op around the kernel's op of the same name: 161 gradients read as 322 fills, 484 ops as 967.
    t = Trace()
    for n in range(2):
        s = n * 10_000.0
        t.step(n, s, 10_000.0)
        t.host("Optimizer.zero_grad#SGD.zero_grad", s + 10, 500.0, cat="user_annotation")
        for i in range(10):
            t.host("aten::zero_", s + 20 + 40 * i, 30.0)
            t.host("aten::zero_", s + 21 + 40 * i, 28.0)
            t.host("aten::fill_", s + 22 + 40 * i, 20.0)
        t.host("Optimizer.step#SGD.step", s + 1000, 5000.0, cat="user_annotation")
        for i in range(30):
            t.host("aten::add_", s + 1010 + 100 * i, 80.0)
            t.host("aten::add_", s + 1011 + 100 * i, 70.0)
            t.kernel("void at::native::vectorized_elementwise_kernel<4>()", s + 1020 + 100 * i,
                     s + 1030 + 100 * i, 5.0)
    sig = signals(t, tmp_path)
    assert sig.zero_grad_fills_per_step == 10 and sig.optimizer_ops_per_step == 30
    assert sig.optimizer_impl == "single_tensor"


def test_foreach_optimizer_and_cpu_loop_are_not_single_tensor(tmp_path):
    assert signals(optimizer_trace(["aten::_foreach_add_"] * 2), tmp_path).optimizer_impl == "foreach"
    assert signals(optimizer_trace(["aten::add_"] * 30, launch=False), tmp_path / "cpu").optimizer_impl is None


def test_matmul_paths_allocator_and_ddp_self_time(tmp_path):
    t = Trace()
    for n in range(2):
        s = n * 10_000.0
        t.step(n, s, 10_000.0)
        t.host("DistributedDataParallel.forward", s + 10, 4000.0)
        t.host("aten::linear", s + 20, 1000.0)
        t.kernel(SIMT, s + 30, s + 100, 3000.0)
        t.kernel(TC, s + 40, s + 3200, 1000.0)
        t.host("cudaMalloc", s + 5000, 200.0, cat="cuda_runtime")
    sig = signals(t, tmp_path)
    assert sig.fp32_simt_ns == 6_000_000 and sig.tensor_core_ns == 2_000_000 and sig.matmul_ns == 8_000_000
    assert sig.fp32_simt_top[0].name == SIMT
    assert sig.alloc_calls == 2 and sig.alloc_ns == 400_000
    # 4 ms of DDP.forward minus 1 ms of aten::linear and the 5 µs launches inside it
    assert 5_900_000 <= sig.ddp_forward_self_ns <= 6_000_000
    assert sig.compute_capability == "8.0"
