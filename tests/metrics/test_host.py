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


def test_launch_wait_leaves_out_what_earlier_device_work_explains(tmp_path):
    """HTA's launch delay counts a kernel's wait for its stream's previous kernel and for another
    stream's kernel it depends on; only the rest is the launch's."""
    b = TraceBuilder()
    b.step(1, 0, 2000)
    b.kernel("long_gemm", 10, 500, stream=7, launch_at=0)  # starts 5 µs after its launch
    b.kernel("queued_add", 510, 20, stream=7, launch_at=20)  # 485 µs behind long_gemm: explained
    b.kernel("waits_for_7", 532, 30, stream=8, launch_at=40)  # starts 2 µs after stream 7's end
    b.kernel("late_alone", 1400, 10, stream=8, launch_at=1000)  # 395 µs with nothing to wait for
    r = run(b, tmp_path)
    la = r.launches
    assert la.launch_delay_ns_p95 > 400_000  # HTA's definition: three late kernels
    # Waits: 5 µs, 0, 2 µs (the cross-stream event's latency) and 395 µs (late_alone's launch call
    # ends at 1005 µs): median 3.5 µs, p95 5 + 0.85 x 390 = 336.5 µs (numpy's linear percentile).
    assert la.launch_wait_ns_median == 3_500
    assert round(la.launch_wait_ns_p95) == 336_500


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


def test_gradient_accumulation_splits_forward_from_backward(tmp_path):
    """Two micro-batches per step: the second forward, between the two backward passes, is forward
    time (it used to be backward: one span from the first node to the last), and the engine's gap
    inside a pass stays backward."""
    b = TraceBuilder(device_name=None)
    for n in range(2):
        t0 = n * 1000
        b.step(n + 1, t0, 1000)
        for mb in range(2):
            m0 = t0 + mb * 400
            b.op("aten::linear", m0, 150)  # the micro-batch's forward
            b.op("aten::mul", m0 + 160, 40)  # its child ops are nested: they split nothing
            b.op("aten::mul", m0 + 170, 20)
            b.op("autograd::engine::evaluate_function: AddmmBackward0", m0 + 200, 80)
            b.op("aten::mm", m0 + 210, 50)  # a node's child, on the same thread (CPU autograd)
            b.op("autograd::engine::evaluate_function: MulBackward0", m0 + 300, 60)
        b.annotation("Optimizer.step#SGD.step", t0 + 850, 100)
    r = run(b, tmp_path, "all")
    # Per step: forward 2 x 190 (0..150 and 160..200), backward 2 x 160 (200..360, the engine's
    # 20 µs gap kept), optimizer 100; the old span (200..760) made it 560 µs of backward.
    assert r.host.phases_ms == {"data": 0.0, "forward": 0.38, "backward": 0.32, "optimizer": 0.1,
                                "comm": 0.0, "other": 0.2}


def test_an_lbfgs_closures_forward_and_backward_inside_the_optimizer_step(tmp_path):
    """LBFGS runs its closure (zero_grad, forward, backward) inside Optimizer.step: the passes are
    backward, the forward after each zero_grad is forward, the rest is the optimizer's own."""
    b = TraceBuilder(device_name=None)
    b.step(1, 0, 1000)
    b.annotation("Optimizer.step#LBFGS.step", 0, 1000)
    for k in range(2):
        c0 = 100 + k * 400
        b.annotation("Optimizer.zero_grad#LBFGS.zero_grad", c0 - 20, 10)
        b.op("aten::linear", c0, 100)
        b.op("autograd::engine::evaluate_function: AddmmBackward0", c0 + 150, 200)
    r = run(b, tmp_path, "all")
    # Forward 2 x 160 (from each zero_grad's end, 90 and 490 µs, to its pass), backward 2 x 200.
    assert r.host.phases_ms == {"data": 0.0, "forward": 0.32, "backward": 0.4, "optimizer": 0.28,
                                "comm": 0.0, "other": 0.0}


def test_lbfgs_recursion_before_zero_grad_does_not_pass_for_the_forward(tmp_path):
    """LBFGS's two-loop recursion between closures can hold more ops than a small model's
    forward: the part after zero_grad is still the forward while it holds ops at all."""
    b = TraceBuilder(device_name=None)
    b.step(1, 0, 2000)
    b.annotation("Optimizer.step#LBFGS.step", 0, 2000)
    b.op("aten::linear", 20, 30)  # the first closure: zero_grad below, then this small forward
    b.op("autograd::engine::evaluate_function: AddmmBackward0", 60, 40)
    for k in range(40):  # the recursion: 40 dot products / adds, 600 µs of ops
        b.op("aten::dot", 120 + k * 20, 15)
    b.annotation("Optimizer.zero_grad#LBFGS.zero_grad", 1000, 10)
    b.op("aten::linear", 1020, 60)  # the second closure's forward: a tenth of the recursion's ops
    b.op("autograd::engine::evaluate_function: AddmmBackward0", 1100, 40)
    r = run(b, tmp_path, "all")
    # Forward: 0..60 (no zero_grad before the first pass) and 1010..1100; backward 40 + 40.
    assert r.host.phases_ms["forward"] == 0.15 and r.host.phases_ms["backward"] == 0.08


def test_a_lightning_closure_runs_its_forward_before_zero_grad(tmp_path):
    """Lightning's automatic optimization hands Optimizer.step a closure that runs training_step,
    then zero_grad, then backward: the forward is before the zero_grad, and the step's own update
    after the closure is the optimizer's."""
    b = TraceBuilder(device_name=None)
    for n in range(2):
        t0 = n * 1000
        b.step(n + 1, t0, 1000)
        b.annotation("Optimizer.step#Adam.step", t0 + 100, 800)
        b.op("aten::linear", t0 + 110, 300)  # training_step's forward and loss
        b.op("aten::mse_loss", t0 + 420, 40)
        b.annotation("Optimizer.zero_grad#Adam.zero_grad", t0 + 470, 20)
        b.op("autograd::engine::evaluate_function: AddmmBackward0", t0 + 500, 200)
        b.op("aten::_foreach_add_", t0 + 720, 150)  # Adam's update
    r = run(b, tmp_path, "all")
    # Forward: 100..470 = 370 µs (the closure's start to its zero_grad); backward 200; optimizer:
    # zero_grad 20 + the update's 200 (700..900); other: 0..100 and 900..1000.
    assert r.host.phases_ms == {"data": 0.0, "forward": 0.37, "backward": 0.2, "optimizer": 0.23,
                                "comm": 0.0, "other": 0.2}
