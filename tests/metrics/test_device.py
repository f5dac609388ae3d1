"""Device metrics on code-built traces: overlap across streams, comm exposure, sync events, gaps."""

from __future__ import annotations

from kineto_builder import TraceBuilder
from torchdoctor.metrics.rank import analyze_rank
from torchdoctor.trace.load import load_trace

GEMM = "ampere_sgemm_128x64_nn"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def run(b: TraceBuilder, tmp_path, steps=None):
    return analyze_rank(load_trace(str(b.write(tmp_path / "t.json"))), steps)


def one_step(b: TraceBuilder, n=1, start=0.0, dur=1000.0):
    b.step(n, start, dur)
    return b


def test_busy_is_the_union_over_streams(tmp_path):
    b = one_step(TraceBuilder())
    b.kernel(GEMM, 100, 300, stream=7, launch_at=10)  # [100,400)
    b.kernel(GEMM, 200, 300, stream=8, launch_at=11)  # [200,500) overlaps
    b.kernel("Memcpy HtoD (Pinned -> Device)", 600, 100, stream=9, cat="gpu_memcpy", launch_at=12)
    r = run(b, tmp_path)
    m = r.metrics
    assert m.busy_pct == 50.0  # 400 µs union of kernels + 100 µs memcpy over 1000 µs
    assert m.idle_pct == 50.0
    assert m.compute_pct == 40.0
    assert m.memcpy_pct == 10.0
    assert m.comm_pct == 0.0 and m.overlap_pct is None


def test_exposed_communication_and_overlap(tmp_path):
    b = one_step(TraceBuilder())
    b.kernel(GEMM, 0, 400, stream=7, launch_at=0)
    b.kernel(NCCL, 300, 300, stream=20, launch_at=1)  # 100 µs under compute, 200 exposed
    r = run(b, tmp_path)
    m = r.metrics
    assert m.comm_pct == 30.0
    assert m.comm_exposed_pct == 20.0
    assert round(m.overlap_pct, 3) == round(100 / 3, 3)
    assert r.steps[0].comm_exposed_ms == 0.2


def test_cuda_sync_events_are_not_busy(tmp_path):
    b = one_step(TraceBuilder())
    b.kernel(GEMM, 0, 100, launch_at=0)
    b.sync_event("Stream Sync", 100, 800)
    r = run(b, tmp_path)
    assert r.metrics.busy_pct == 10.0
    assert r.syncs.device_sync_events == {"Stream Sync": 1}


def test_sub_microsecond_and_zero_length_kernels(tmp_path):
    b = one_step(TraceBuilder(), dur=10)
    for i in range(10):
        b.kernel(GEMM, i + 0.1, 0.25, launch_at=i)  # 250 ns each
    b.kernel(GEMM, 9.9, 0.0, launch_at=9)
    r = run(b, tmp_path)
    assert r.metrics.busy_pct == 25.0
    top = r.kernels.top[0]
    assert (top.count, top.total_ns, top.min_ns, top.max_ns) == (11, 2500, 0, 250)


def test_idle_gap_classes_per_stream(tmp_path):
    b = one_step(TraceBuilder(), dur=2000)
    b.kernel(GEMM, 0, 100, launch_at=0)
    b.kernel(GEMM, 110, 100, launch_at=5)  # 10 µs gap, launched early: kernel_wait
    b.kernel(GEMM, 400, 100, launch_at=390)  # launched after the previous ended: host_wait (190 µs)
    b.kernel(GEMM, 600, 100, launch_at=420)  # launched early but 100 µs gap: other
    r = run(b, tmp_path)
    (s,) = r.stream_idle
    assert (s.kernel_wait.ns, s.kernel_wait.count) == (10_000, 1)
    assert (s.host_wait.ns, s.host_wait.count) == (190_000, 1)
    assert (s.other.ns, s.other.count) == (100_000, 1)
    assert s.busy_ns == 400_000


def test_idle_attributed_to_what_the_host_was_doing(tmp_path):
    b = one_step(TraceBuilder(), dur=1000)
    b.dataloader(0, 300)  # device idle meanwhile
    b.kernel(GEMM, 310, 200, launch_at=305)
    b.op("aten::item", 520, 100)
    b.runtime("cudaStreamSynchronize", 525, 90)
    b.annotation("Optimizer.step#SGD.step", 700, 200)
    r = run(b, tmp_path)
    causes = {c.cause: c.ns for c in r.idle_causes}
    assert causes["dataloader"] == 300_000
    assert causes["sync"] == 90_000
    assert causes["optimizer"] == 200_000
    assert sum(causes.values()) == 1_000_000 - 200_000
    assert r.metrics.dataloader_exposed_pct == 30.0
    dl = next(c for c in r.idle_causes if c.cause == "dataloader")
    assert dl.top[0].name.startswith("enumerate(DataLoader)")


def test_steps_window_excludes_warmup_and_cuts_events(tmp_path):
    b = TraceBuilder()
    b.step(1, 0, 5000)  # slow first step: warm-up
    for n in range(2, 6):
        b.step(n, 5000 + (n - 2) * 1000, 1000)
    b.kernel(GEMM, 4500, 1000, launch_at=4400)  # straddles the window start: only 500 µs count
    r = run(b, tmp_path)
    assert r.window.steps == [2, 3, 4, 5] and r.window.skipped_warmup == [1]
    assert r.metrics.busy_pct == 12.5
    assert r.steps[0].busy_ms == 0.5 and r.steps[1].busy_ms == 0.0  # steps without kernels
    assert run(b, tmp_path, "all").window.steps == [1, 2, 3, 4, 5]
    assert run(b, tmp_path, "3:5").window.steps == [3, 4]


def test_trace_window_spans_first_to_last_device_event(tmp_path):
    b = one_step(TraceBuilder(), dur=1000)
    b.kernel(GEMM, 200, 100, launch_at=100)
    b.kernel(GEMM, 700, 100, launch_at=600)
    r = run(b, tmp_path, "trace")
    assert (r.window.end_ns - r.window.start_ns) == 600_000
    assert round(r.metrics.idle_pct, 3) == round(100 * 400 / 600, 3)


def test_idle_in_a_labelled_region_is_marked_as_a_region(tmp_path):
    b = one_step(TraceBuilder(), dur=1000)
    b.kernel(GEMM, 0, 100, launch_at=0)
    b.annotation("1F1B", 100, 800)  # record_function region: Python with one op inside
    b.op("aten::empty_like", 150, 50)
    b.kernel(GEMM, 900, 100, launch_at=890)
    r = run(b, tmp_path)
    host = next(c for c in r.idle_causes if c.cause == "host_ops")
    tops = {t.name: (t.ns, t.region) for t in host.top}
    assert tops == {"1F1B": (800_000, True), "aten::empty_like": (50_000, False)}
