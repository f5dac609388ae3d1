"""Host metrics: syncs tied to their aten op, launch statistics, the CPU step split."""

from __future__ import annotations

from kineto_builder import TraceBuilder
from torchdoctor.metrics.rank import analyze_rank
from torchdoctor.trace.load import load_trace


def run(b: TraceBuilder, tmp_path, steps=None):
    return analyze_rank(load_trace(str(b.write(tmp_path / "t.json"))), steps)


def test_sync_tied_to_item(tmp_path):
    b = TraceBuilder()
    for n in range(3):
        t0 = n * 1000
        b.step(n + 1, t0, 1000)
        b.kernel("gemm", t0 + 10, 400, launch_at=t0 + 5)
        b.op("aten::item", t0 + 20, 450)
        b.op("aten::_local_scalar_dense", t0 + 21, 448)
        b.runtime("cudaStreamSynchronize", t0 + 30, 420)
    r = run(b, tmp_path, "all")
    assert r.syncs.count == 3 and r.syncs.per_step == 1.0
    (site,) = r.syncs.sites
    assert (site.api, site.op, site.top_op) == ("cudaStreamSynchronize", "aten::_local_scalar_dense", "aten::item")
    assert ".item()" in site.explanation
    assert site.ns == 3 * 420_000
    assert r.steps[1].syncs == 1 and r.steps[1].sync_ms == 0.42


def test_launch_statistics(tmp_path):
    b = TraceBuilder()
    b.step(1, 0, 1000)
    for i in range(10):
        # 8 µs launches of 2 µs kernels back to back: short kernels, device starved.
        b.kernel("vectorized_elementwise_kernel", i * 10 + 9, 2, launch_at=i * 10, launch_dur=8)
    r = run(b, tmp_path)
    la = r.launches
    assert la.launches == 10 and la.by_api == {"cudaLaunchKernel": 10}
    assert la.launch_ns_median == 8000
    assert la.short_kernels == 10 and la.short_kernels_pct == 100.0
    assert la.launch_delay_ns_median == 1000
    # Each launch finds only the previous kernel still running: the queue never builds up.
    assert la.queue_depth_median == 1 and la.queue_le1_pct == 100.0
    assert la.kernels_per_step == 10


def test_cpu_only_step_split(tmp_path):
    b = TraceBuilder(device_name=None)
    for n in range(2):
        t0 = n * 1000
        b.step(n + 1, t0, 1000)
        b.dataloader(t0, 200)
        b.op("aten::linear", t0 + 200, 200)
        b.op("autograd::engine::evaluate_function: AddmmBackward0", t0 + 450, 100)
        b.op("autograd::engine::evaluate_function: MulBackward0", t0 + 600, 100)
        b.annotation("gloo:all_reduce", t0 + 700, 100)
        b.annotation("Optimizer.step#SGD.step", t0 + 850, 100)
    r = run(b, tmp_path, "all")
    assert r.device_kind == "cpu"
    assert r.metrics.busy_pct is None and r.metrics.idle_pct is None
    # Backward spans the first to the last autograd function (the 50 µs between them included).
    assert r.host.phases_ms == {"data": 0.2, "forward": 0.2, "backward": 0.25, "optimizer": 0.1,
                                "comm": 0.1, "other": 0.15}
    assert sum(r.steps[0].host_split_ms.values()) == 1.0
    assert r.metrics.dataloader_exposed_pct == 20.0
    assert r.metrics.comm_pct == 10.0
    assert r.comm_ops[0].name == "gloo:all_reduce"
