"""Gradient accumulation's reductions per micro-batch on traces the installed torch records: FSDP2
and DDP on two gloo ranks, each accumulating over MICRO micro-batches with and without skipping
the reductions of all but the last (set_requires_gradient_sync / no_sync). The root forwards and
the collective calls the metric reads are torch's own names, not a code-built trace's guess."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from kineto_builder import TraceBuilder
from torchdoctor.metrics.accumulation import accumulation
from torchdoctor.metrics.context import Context
from torchdoctor.metrics.steps import choose_window
from torchdoctor.trace.load import load_trace

pytest.importorskip("torch")

MICRO, BLOCKS = 4, 3
RECORD = textwrap.dedent("""
    import os, sys, torch, torch.nn as nn, torch.distributed as dist, torch.multiprocessing as mp
    from torch.profiler import profile, ProfilerActivity

    def job(rank, out, micro, blocks):
        dist.init_process_group("gloo", init_method="file://" + os.path.join(out, "rendezvous"), rank=rank, world_size=2)
        torch.manual_seed(0); torch.set_num_threads(1)
        for wrapper in ("fsdp2", "ddp"):
            for skip in (False, True):
                model = nn.Sequential(*(nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(blocks)))
                if wrapper == "fsdp2":
                    from torch.distributed.fsdp import fully_shard
                    for block in model:
                        fully_shard(block)
                    fully_shard(model)
                else:
                    model = nn.parallel.DistributedDataParallel(model)
                opt = torch.optim.SGD(model.parameters(), lr=0.01)
                x = torch.randn(16, 256)

                def step():
                    for i in range(micro):
                        last = i == micro - 1
                        if wrapper == "fsdp2":
                            if skip:
                                model.set_requires_gradient_sync(last)
                            model(x).square().mean().backward()
                        elif skip and not last:
                            with model.no_sync():
                                model(x).square().mean().backward()
                        else:
                            model(x).square().mean().backward()
                    opt.step(); opt.zero_grad()

                step()
                # A schedule, as real jobs profile: the steps are ProfilerStep#N annotations.
                path = os.path.join(out, f"{wrapper}_{'skip' if skip else 'every'}.json")
                with profile(activities=[ProfilerActivity.CPU],
                             schedule=torch.profiler.schedule(wait=0, warmup=1, active=3),
                             on_trace_ready=(lambda prof, path=path: prof.export_chrome_trace(path)) if rank == 0
                             else None) as p:
                    for _ in range(4):
                        step(); p.step()
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(job, args=(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])), nprocs=2)
""")


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    out = tmp_path_factory.mktemp("accumulation")
    script = out / "record.py"
    script.write_text(RECORD)
    done = subprocess.run([sys.executable, str(script), str(out), str(MICRO), str(BLOCKS)],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    got = {}
    for name in ("fsdp2_every", "fsdp2_skip", "ddp_every", "ddp_skip"):
        tr = load_trace(str(out / f"{name}.json"))
        got[name] = Context(tr, choose_window(tr, "all"))
    return got


@pytest.mark.parametrize("wrapper, label, calls", [("fsdp2", "FSDP2", BLOCKS), ("ddp", "DDP", 1)])
def test_every_micro_batch_reducing_is_found(traces, wrapper, label, calls):
    acc = accumulation(traces[f"{wrapper}_every"])
    assert acc is not None
    assert (acc.wrapper, acc.steps, acc.synced_steps, acc.micro_batches) == (label, 3, 3, MICRO)
    # FSDP2: one reduce-scatter per unit with parameters (the blocks: the root holds none); DDP: one bucket for this small model.
    assert acc.reductions_per_micro_batch == calls
    assert acc.early_ns > 0


@pytest.mark.parametrize("wrapper", ["fsdp2", "ddp"])
def test_skipping_the_reductions_is_not_flagged(traces, wrapper):
    acc = accumulation(traces[f"{wrapper}_skip"])
    assert acc is not None
    assert (acc.steps, acc.synced_steps, acc.early_ns) == (3, 0, 0)


def test_early_time_is_the_reductions_outside_the_last_micro_batch(tmp_path):
    """Code-built: two steps of three micro-batches whose reductions take 100, 200 and 300 µs on the
    host, one optimizer step after the last; only the first two micro-batches' reductions count."""
    b = TraceBuilder()
    for n in range(2):
        _ddp_step(b, n * 10_000.0, [[("c10d::allreduce_", red)] for red in (100.0, 200.0, 300.0)])
    acc = _read(b, tmp_path / "acc.json")
    assert acc is not None
    assert (acc.wrapper, acc.steps, acc.synced_steps, acc.micro_batches) == ("DDP", 2, 2, 3)
    assert acc.early_ns == 2 * 300_000  # (100 + 200) µs per step


def test_two_optimizer_steps_is_not_accumulation(tmp_path):
    """A GAN's two DDP models (two forwards, two optimizer steps per step) are not read."""
    b = TraceBuilder()
    for n in range(2):
        t0 = n * 10_000.0
        b.step(n + 1, t0, 10_000.0)
        for i in range(2):
            at = t0 + 100 + i * 4_000
            b.annotation("DistributedDataParallel.forward", at, 500.0)
            b.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", at + 900, 500.0)
            b.op("c10d::allreduce_", at + 1_000, 200.0)
            b.annotation("Optimizer.step#Adam.step", at + 2_000, 300.0)
    tr = load_trace(str(b.write(tmp_path / "gan.json")))
    assert accumulation(Context(tr, choose_window(tr, "all"))) is None


def test_on_a_device_the_early_time_is_the_reduction_kernels_compute_does_not_cover(tmp_path):
    """Code-built GPU trace, FSDP2, two micro-batches per step: each micro-batch's backward runs a
    compute kernel over [t+1000, t+2500) µs and a reduce-scatter kernel over [t+2000, t+3000) on
    the communication stream (its host call inside backward); all-gathers are not reductions. Only the
    first micro-batch's reduce-scatter counts, and only its 500 µs that no other device work covers."""
    b = TraceBuilder()
    rs = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
    ag = "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
    for n in range(3):
        t0 = n * 10_000.0
        b.step(n + 1, t0, 10_000.0)
        for i in range(2):
            t = t0 + 100 + i * 4_000
            b.annotation("FSDP::root_pre_forward", t, 50.0)
            b.kernel(ag, t + 100, 300.0, stream=20, launch_at=t + 60)
            b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", t + 1_000, 1_500.0, launch_at=t + 900)
            b.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", t + 1_850, 200.0)
            b.op("c10d::_reduce_scatter_base_", t + 1_900, 50.0)
            b.kernel(rs, t + 2_000, 1_000.0, stream=20, launch_at=t + 1_920)
        b.annotation("Optimizer.step#AdamW.step", t0 + 9_000, 500.0)
    tr = load_trace(str(b.write(tmp_path / "gpu.json")))
    acc = accumulation(Context(tr, choose_window(tr, "all")))
    assert acc is not None
    assert (acc.wrapper, acc.steps, acc.synced_steps, acc.reductions_per_micro_batch) == ("FSDP2", 3, 3, 1)
    assert acc.early_ns == 3 * 500_000


def _ddp_step(b: TraceBuilder, t0: float, micro: list[list[tuple[str, float]]], before: int = 0,
              sync_bn: int = 0) -> None:
    """One step of DDP micro-batches at t0: each a forward, then a gradient's backward node holding
    the listed (reduction call, µs) in order; `before`: that many 20 µs loss/metric all-reduces after
    each forward, outside backward; `sync_bn`: that many 20 µs SyncBatchNorm all-reduces in each
    micro-batch's backward, inside their own node."""
    b.step(int(t0 // 10_000) + 1, t0, 10_000.0)
    for i, calls in enumerate(micro):
        t = t0 + 100 + i * 3_000
        b.annotation("DistributedDataParallel.forward", t, 500.0)
        for j in range(before):
            b.op("c10d::allreduce_", t + 520 + j * 30, 20.0)
        for j in range(sync_bn):
            b.op("autograd::engine::evaluate_function: SyncBatchNormBackward", t + 700 + j * 60, 50.0)
            b.op("c10d::allreduce_", t + 710 + j * 60, 20.0)
        b.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", t + 1_000, 1_500.0)
        at = t + 1_100
        for name, dur in calls:
            b.op(name, at, dur)
            at += dur + 10
    b.annotation("Optimizer.step#SGD.step", t0 + 9_500, 300.0)


def _read(b: TraceBuilder, path):
    tr = load_trace(str(b.write(path)))
    return accumulation(Context(tr, choose_window(tr, "all")))


@pytest.mark.parametrize("others", [{"before": 3}, {"sync_bn": 3}])
def test_other_all_reduces_are_not_gradient_reductions(tmp_path, others):
    """no_sync() on 2 of 3 micro-batches, one gradient bucket at the end, and three other all-reduces
    in every micro-batch (loss and metrics after the forward, or SyncBatchNorm's in its backward
    node): counted as gradients' they would make 3, 3, 4 calls, a step that reduces everywhere. Not
    flagged. Without no_sync, the bucket's all-reduce in every micro-batch is, and only its time counts."""
    b = TraceBuilder()
    for n in range(2):
        _ddp_step(b, n * 10_000.0, [[], [], [("c10d::allreduce_", 200.0)]], **others)
    acc = _read(b, tmp_path / "no_sync.json")
    assert acc is not None and (acc.steps, acc.synced_steps, acc.early_ns) == (2, 0, 0)
    b = TraceBuilder()
    for n in range(2):
        _ddp_step(b, n * 10_000.0, [[("c10d::allreduce_", 200.0)]] * 3, **others)
    acc = _read(b, tmp_path / "every.json")
    assert acc is not None and (acc.synced_steps, acc.reductions_per_micro_batch, acc.kinds) == (2, 1, ["all-reduce"])
    assert acc.early_ns == 2 * 2 * 200_000  # the bucket's all-reduce in the first two micro-batches of each step


def test_hsdp_that_skips_only_the_replicas_all_reduce_is_not_flagged(tmp_path):
    """HSDP with set_requires_all_reduce(False): every micro-batch reduce-scatters (by design, to keep
    gradients sharded), the last one also all-reduces across replicas: half the last's calls."""
    b = TraceBuilder()
    rs, ar = ("c10d::_reduce_scatter_base_", 100.0), ("c10d::allreduce_", 100.0)
    for n in range(2):
        _ddp_step(b, n * 10_000.0, [[rs, rs], [rs, rs], [rs, ar, rs, ar]])
    acc = _read(b, tmp_path / "hsdp.json")
    assert acc is not None and (acc.steps, acc.synced_steps) == (2, 0)


def test_two_forwards_before_one_backward_are_one_micro_batch(tmp_path):
    """DPO's chosen and rejected forwards (or an evaluation forward) before one backward: one
    micro-batch. Two such pairs, each with its backward, are two micro-batches; a step of one pair
    and one backward is not read as accumulation."""
    b = TraceBuilder()
    for n in range(2):
        t0 = n * 10_000.0
        b.step(n + 1, t0, 10_000.0)
        for i in range(2):  # two micro-batches, each with two forwards then one backward
            t = t0 + 100 + i * 4_000
            b.annotation("DistributedDataParallel.forward", t, 400.0)
            b.annotation("DistributedDataParallel.forward", t + 500, 400.0)
            b.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", t + 1_000, 1_500.0)
            b.op("c10d::allreduce_", t + 1_100, 200.0)
        b.annotation("Optimizer.step#SGD.step", t0 + 9_500, 300.0)
    acc = _read(b, tmp_path / "dpo.json")
    assert acc is not None and (acc.micro_batches, acc.synced_steps, acc.early_ns) == (2, 2, 2 * 200_000)

    b = TraceBuilder()
    for n in range(2):
        t0 = n * 10_000.0
        b.step(n + 1, t0, 10_000.0)
        b.annotation("DistributedDataParallel.forward", t0 + 100, 400.0)
        b.annotation("DistributedDataParallel.forward", t0 + 600, 400.0)
        b.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", t0 + 1_100, 1_500.0)
        b.op("c10d::allreduce_", t0 + 1_200, 200.0)
        b.annotation("Optimizer.step#SGD.step", t0 + 9_500, 300.0)
    assert _read(b, tmp_path / "one.json") is None
