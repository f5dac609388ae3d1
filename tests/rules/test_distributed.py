"""Distributed-layer rules (DI-1..DI-14) and the split of exposed communication between them."""

from __future__ import annotations

import pytest

from torchdoctor.facts import CpuFacts, DDPFacts, EmbeddingFacts, FSDPFacts, StepTiming
from torchdoctor.metrics.model import CommLayout
from torchdoctor.metrics.ranks import CrossRank, RankWait

from .conftest import MS, cpu_facts, cpu_result, gpu_facts, gpu_result, only, run, run_all

DISTRIBUTED = ("DI-2", "DI-3", "DI-4", "DI-5", "DI-6", "DI-10", "DI-11", "DI-13", "DI-14")


def comm_bound(exposed=20.0, overlap=0.0, compute=60.0, rank=0, backend="nccl", collectives=None):
    """A DDP rank whose all-reduce is exposed `exposed`% of the step."""
    r = gpu_result(busy=compute + exposed, rank=rank, compute_pct=compute, comm_pct=exposed / (1 - overlap / 100),
                   comm_exposed_pct=exposed, overlap_pct=overlap)
    r.backend, r.world_size = backend, 2
    r.signals.collectives = collectives or {"all_reduce": [20, 20 * 5 * 10**5, 10**5]}
    r.signals.comm = CommLayout(block_ms=exposed, block_span_ms=exposed, block_start_pct=75.0, exposed_ms=exposed)
    return r


def accumulating(**kw):
    """A rank whose all-reduce is exposed 10% of the step and whose first 4 steps run no optimizer:
    micro-batches of gradient accumulation."""
    r = comm_bound(exposed=10.0, overlap=50.0, **kw)
    for s in r.steps:
        s.comm_ms, s.comm_exposed_ms = 20.0, 10.0
    for s in r.steps[:4]:
        s.host_split_ms = {"optimizer": 0.0}
    return r


def claims(found) -> float:
    return sum(f.recoverable_pct for f in found if f.layer == "distributed")


def test_di1_data_parallel():
    r = gpu_result()
    r.signals.markers = {"DataParallel.forward": [5, 10 * MS]}
    assert only(run("DI-1", (r, None)), "DI-1").severity == "warning"


def test_di1_silent_with_ddp():
    r = gpu_result()
    r.signals.markers = {"DistributedDataParallel.forward": [5, 10 * MS]}
    assert run("DI-1", (r, None)) == []


def test_di2_gloo_on_gpu():
    got = only(run("DI-2", (comm_bound(backend="gloo"), None)), "DI-2")
    assert got.severity == "warning" and abs(got.recoverable_pct - 10.0) < 0.1


def test_di2_silent_with_nccl_or_on_cpu():
    assert run("DI-2", (comm_bound(), None)) == []
    assert run("DI-2", (cpu_result(comm_pct=30.0, comm_exposed_pct=30.0), cpu_facts(distributed_backend="gloo"))) == []


def test_di3_cpu_gloo_collectives():
    r = cpu_result(comm_pct=60.0, comm_exposed_pct=60.0)
    r.backend = "gloo"
    r.host.phases_ms = {"comm": 60.0, "forward": 10.0, "backward": 25.0, "optimizer": 5.0, "data": 0.0}
    got = only(run("DI-3", (r, None)), "DI-3")
    assert got.severity == "critical" and "inside collectives" in got.title
    assert abs(got.recoverable_ms - 25.0) < 1e-6  # only what could run under backward


def test_di3_host_only_comm_without_a_gain_is_info():
    # A CPU job's host trace: 16% of the step inside gloo all-reduce, one gradient bucket, so nothing
    # can run under backward. Transfer and waits for descheduled peers are not told apart: info.
    r = cpu_result(comm_pct=16.0, comm_exposed_pct=16.0)
    r.backend = "gloo"
    r.host.phases_ms = {"comm": 16.0, "forward": 30.0, "backward": 50.0, "optimizer": 4.0, "data": 0.0}
    f = cpu_facts(ddp=[DDPFacts(num_buckets=1, bucket_sizes=[100_000])])
    got = only(run("DI-3", (r, f)), "DI-3")
    assert got.severity == "info" and got.recoverable_pct == 0.0 and got.confidence == "low"


def test_di3_silent_on_little_comm():
    assert run("DI-3", (comm_bound(exposed=1.0, overlap=95.0), None)) == []


def test_di4_all_reduce_exposed_at_end_of_backward():
    found = run_all((comm_bound(exposed=20.0, overlap=0.0, compute=60.0), None))
    got = only(found, "DI-4")
    # 4 buckets per step: the last one is only ready when backward ends, so 3/4 of it can hide.
    assert abs(got.recoverable_pct - 15.0) < 0.1 and "75% into the step" in got.title
    assert claims(found) <= 20.0 + 1e-6  # the distributed findings never claim more than the exposed comm


def test_di4_single_bucket_cannot_overlap():
    f = cpu_facts(ddp=[DDPFacts(num_buckets=1, bucket_sizes=[2_000_000], avg_backward_comm_time_ns=20e6,
                                avg_backward_compute_comm_overlap_time_ns=1e6, avg_backward_compute_time_ns=30e6)],
                  steps=[StepTiming(step=i, total_ms=100.0) for i in range(3)])
    found = run_all((None, f))
    assert not [x for x in found if x.id == "DI-4"]
    assert only(found, "DI-3").severity == "warning"  # 19 ms exposed, nothing specific explains it


def test_di4_silent_when_overlapped():
    assert run("DI-4", (comm_bound(exposed=2.0, overlap=90.0), None)) == []


def stragglers():
    a, b = comm_bound(exposed=5.0, rank=0), comm_bound(exposed=20.0, rank=1)
    cross = CrossRank(ranks=2, step_ms_median=100.0, straggler=0, straggler_lead_ms=15.0, victims=[1],
                      per_rank=[RankWait(0, 100.0, 5.0, 0.0), RankWait(1, 100.0, 20.0, 15.0)])
    return a, b, cross


def test_di5_straggler_blames_the_rank_that_waits_least():
    a, b, cross = stragglers()
    got = only(run("DI-5", (a, None), (b, None), cross=cross), "DI-5")
    assert got.ranks == [1] and "Rank 0 is a straggler" in got.title and abs(got.recoverable_pct - 15.0) < 0.1


def test_di5_on_a_three_step_window_is_info():
    a, b, cross = stragglers()
    for r in (a, b):
        r.window.steps = r.window.steps[:3]
    assert only(run("DI-5", (a, None), (b, None), cross=cross), "DI-5").severity == "info"


def test_di5_from_live_step_timings():
    fs = [cpu_facts(rank=i, steps=[StepTiming(step=s, total_ms=100.0, comm_ms=c) for s in range(3)])
          for i, c in ((0, 5.0), (1, 30.0))]
    fs = [f for f in fs]
    for f in fs:
        f.ddp = [DDPFacts(avg_backward_comm_time_ns=30e6 if f.rank else 5e6, avg_backward_compute_comm_overlap_time_ns=0)]
    got = only(run("DI-5", (None, fs[0]), (None, fs[1])), "DI-5")
    assert got.ranks == [1] and "Rank 0" in got.title


def series_facts(rank: int, own: list[float], n: int = 30, phase: str = "other_ms", longer=None):
    """A DDP rank's probe facts over `n` steps of 100 ms with `own[s % len]` extra ms of its own work."""
    steps = []
    for s in range(n):
        extra = own[s % len(own)]
        parts = {"dataloader_ms": 5.0, "forward_ms": 20.0, "optimizer_ms": 5.0, "other_ms": 0.0}
        parts[phase] = parts.get(phase, 0.0) + extra
        if phase == "checkpoint_ms":
            parts["other_ms"] += extra
        busy = parts["dataloader_ms"] + parts["forward_ms"] + parts["optimizer_ms"] + parts["other_ms"]
        total = 100.0 + (longer[s % len(longer)] if longer else 0.0)
        steps.append(StepTiming(step=s, total_ms=total, backward_ms=total - busy, **parts))
    return cpu_facts(rank=rank, steps=steps, ddp=[DDPFacts(avg_backward_comm_time_ns=40e6,
                                                           avg_backward_compute_comm_overlap_time_ns=0)])


def test_di5_from_the_whole_run_warns_where_the_window_could_not():
    # 3-step windows (info at most) but 30 timed steps: rank 1 arrives 25 ms late every step.
    a, b, _ = stragglers()
    for r in (a, b):
        r.window.steps = r.window.steps[:3]
        r.window.end_ns = r.window.start_ns + int(3 * 100 * MS)
    got = only(run("DI-5", (a, series_facts(0, [25.0])), (b, series_facts(1, [0.0]))), "DI-5")
    # Rank 1 waits 25 ms, of which its window shows 20 ms exposed: 20% of the step, from 28 steps
    # (>= TML's 20 for critical).
    assert got.severity == "critical" and got.ranks == [1]
    assert got.title.startswith("Rank 0 is a straggler (it reaches the collectives last in 28 of 28 steps")
    assert "longer in the loop outside loading" in got.title and abs(got.recoverable_ms - 20.0) < 1e-6
    data = got.evidence[0].values
    assert data["persistent"] and data["gain_ms"] == 25.0 and data["lead_by_phase"]["other"] == 25.0


def test_di5_on_a_shared_machine_is_said_but_not_warned():
    # A persistent 25 ms straggler whose lead no phase of its own work explains (half in its
    # forward, half in its loading), on 2 CPUs that other processes kept 80% of a core busy (the
    # ranks and their workers used 110% of the 190% the CPUs were busy): the rank that loses CPU
    # time to them arrives last whatever the job does, so the finding stays at info.
    ranks = []
    for r, own in ((0, [12.5]), (1, [0.0])):
        f = series_facts(r, own, phase="forward_ms")
        if r == 0:
            for step in f.steps:
                step.dataloader_ms += 12.5
                step.backward_ms -= 12.5
        f.hostname = "h"
        f.cpu = CpuFacts(affinity=[0, 1], main_process_cpu_pct=50.0, dataloader_workers_cpu_pct=5.0,
                         affinity_cpus_busy_pct=190.0)
        ranks.append((None, f))
    got = only(run("DI-5", *ranks), "DI-5")
    assert got.severity == "info" and got.confidence == "low" and got.ranks == [1]
    assert got.recoverable_ms == pytest.approx(25.0, abs=0.5)  # the lateness is measured all the same
    (shared,) = [e for e in got.evidence if "foreign_cpu_pct" in e.values]
    assert shared.values == {"foreign_cpu_pct": 80.0, "cpus": 2} and "dedicated cores" in got.confirm
    # Other processes at 30% of a core (8% of the CPUs): a quiet machine, the straggler warns.
    for _, f in ranks:
        f.cpu.affinity_cpus_busy_pct = 140.0
    quiet = only(run("DI-5", *ranks), "DI-5")
    assert quiet.severity in ("warning", "critical") and quiet.confidence == "medium"
    # Under the same load, a lead that one phase explains (25 ms more in the loop, every step) is
    # the job's own: it warns.
    busy = []
    for r, own in ((0, [25.0]), (1, [0.0])):
        f = series_facts(r, own)
        f.hostname, f.cpu = "h", CpuFacts(affinity=[0, 1], main_process_cpu_pct=50.0, dataloader_workers_cpu_pct=5.0,
                                          affinity_cpus_busy_pct=190.0)
        busy.append((None, f))
    own = only(run("DI-5", *busy), "DI-5")
    assert own.severity in ("warning", "critical") and not [e for e in own.evidence if "foreign_cpu_pct" in e.values]


def test_di5_leaves_a_lead_its_own_page_faults_explain_to_ho15():
    # The demo with glibc's default thresholds (measured): one rank's training thread faults 3x more
    # than the other's (6,086 against 2,022 faults per step), 7 ms more system time, and arrives
    # last by as much, in its forward. The lead is measured and said, HO-15 claims and fixes it.
    ranks = []
    for r, own, sys_ms in ((0, [7.0], 12.0), (1, [0.0], 5.0)):
        f = series_facts(r, own, phase="forward_ms")
        for step in f.steps:
            step.minor_faults, step.thread_sys_ms = (6086 if r == 0 else 2022), sys_ms
        ranks.append((None, f))
    got = only(run("DI-5", *ranks), "DI-5")
    assert got.severity == "info" and got.ranks == [1]
    assert "rank 0's training thread spends 7.0 ms more in system time (page faults)" in got.title
    assert "HO-15" in got.fix.text
    # The same lead with even system time (the faults do not explain it) names the forward.
    for _, f in ranks:
        for step in f.steps:
            step.thread_sys_ms = 5.0
    plain = only(run("DI-5", *ranks), "DI-5")
    assert "longer in its forward" in plain.title and "HO-15" not in plain.fix.text


def test_di5_names_a_periodic_checkpoint_as_a_transient_straggler():
    saving = [0.0] * 4 + [100.0]
    got = only(run("DI-5", (None, series_facts(0, saving, phase="checkpoint_ms", longer=saving)),
                    (None, series_facts(1, [0.0], longer=saving))),
               "DI-5")
    assert "Rank 0 is a transient straggler" in got.title and "every 5 steps" in got.title
    assert "blocks 100.0 ms more in checkpoint saves than the other ranks" in got.title and got.confidence == "low"
    # 600 ms of waiting over 28 steps, a share of the run's mean step (100 ms + the waits).
    gain = 600.0 / 28
    assert got.ranks == [1] and abs(got.recoverable_pct - 100 * gain / (100 + gain)) < 0.01
    assert f"waits for it {gain:.1f} ms per step on average over the run (18% of its time)" in got.title


def test_di5_silent_without_cross_rank_spread():
    a, b, _ = stragglers()
    assert run("DI-5", (a, None), (b, None)) == []


def test_di6_all_reduce_in_micro_batches():
    got = only(run("DI-6", (accumulating(), None)), "DI-6")
    assert abs(got.recoverable_ms - 8.0) < 1e-6


def test_di6_silent_when_every_step_steps_the_optimizer():
    assert run("DI-6", (comm_bound(), None)) == []


def test_di6_reductions_in_every_micro_batch_of_a_step():
    """torchtune's distributed recipe (FSDP2, 8 micro-batches per optimizer step, no
    set_requires_gradient_sync): each profiler step holds every micro-batch, and each micro-batch
    reduce-scatters. The claim is the reductions of all but the last micro-batch (the metric's
    early_ns, per step), FSDP2's advice from the trace's root forwards alone, and DI-16 then counts
    its all-gathers per micro-batch and is not squeezed by DI-6's claim."""
    from torchdoctor.metrics.model import Accumulation

    r = comm_bound(exposed=30.0, collectives={"all_gather": [80, 6 * 10**6, 10**5],
                                                "reduce_scatter": [40, 4 * 10**6, 10**5]})
    r.signals.accumulation = Accumulation(wrapper="FSDP2", steps=5, synced_steps=5, micro_batches=8.0,
                                          reductions_per_micro_batch=7, early_ns=5 * 12 * MS, kinds=["reduce-scatter"])
    got = only(run("DI-6", (r, None)), "DI-6")
    assert abs(got.recoverable_ms - 12.0) < 1e-6
    assert "8 micro-batches per optimizer step, each with 7 reduce-scatter call(s) (FSDP2)" in got.title
    assert "set_requires_gradient_sync" in got.fix.snippet and "no_sync" not in got.fix.snippet
    f = gpu_facts(fsdp=[FSDPFacts(version=2, reshard_after_forward=True, units=7, unit_mb_median=10.0, model_mb=70.0)])
    f.world_size = 2
    found = run_all((r, f))
    assert abs(only(found, "DI-6").recoverable_ms - 12.0) < 1e-6
    di16 = only(found, "DI-16")
    assert "twice per micro-batch (16 times per step over 8 micro-batches)" in di16.title
    # Backward's all-gathers: half of the all-gathers' 60% of the 30 ms exposed, whatever DI-6 took first.
    assert abs(di16.recoverable_ms - 30.0 * 0.5 * 0.6) < 1e-6
    assert "about 35 MB more per rank" in only(found, "DI-6").evidence[1].text  # 70 MB unsharded, half its own
    assert only(found, "DI-6").confidence == "medium"
    # At 79 of 80 GB the unsharded gradients do not fit: said, and the finding drops to info.
    gb = 2**30
    f.device.total_memory_bytes, f.device.max_memory_allocated_bytes = 80 * gb, 79 * gb
    tight = only(run_all((r, f)), "DI-6")
    assert tight.severity == "info" and tight.confidence == "low" and "more than the device has room" in tight.evidence[1].text
    assert tight.recoverable_ms == 0.0 and "12.0 ms, which memory does not allow to skip," in tight.title
    f.device.max_memory_allocated_bytes = 20 * gb
    # Under a policy that reduces in fp32 beside bf16 parameters, the kept gradients are fp32: twice the size.
    f.fsdp[0].mixed_precision = "MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)"
    assert "about 70 MB more per rank" in only(run_all((r, f)), "DI-6").evidence[1].text
    f.fsdp[0].mixed_precision = None
    # torchtune built the optimizer: its recipes have no setting for it, nor a line of the user's.
    from torchdoctor.facts import OptimizerFacts
    f.optimizers = [OptimizerFacts(cls="AdamW", created_by="torchtune")]
    found = run_all((r, f))
    assert "tune cp" in only(found, "DI-6").fix.text and "self._model.set_requires_gradient_sync" in only(
        found, "DI-6").fix.snippet
    assert "fsdp_reshard_after_forward: False" in only(found, "DI-16").fix.snippet
    r.signals.accumulation = Accumulation(wrapper="DDP", steps=5, synced_steps=5, micro_batches=4.0,
                                          reductions_per_micro_batch=2, early_ns=5 * 6 * MS, kinds=["all-reduce"])
    got = only(run("DI-6", (r, None)), "DI-6")
    assert "each with 2 all-reduce call(s) (DDP)" in got.title and "no_sync" in got.fix.snippet
    r.signals.accumulation.synced_steps, r.signals.accumulation.early_ns = 0, 0  # no_sync() used
    assert run("DI-6", (r, None)) == []


def test_di16_keeps_its_claim_only_beside_di6s_reductions():
    """DI-6's claim from profiler steps that are micro-batches is all their exposed communication,
    all-gathers included: DI-16 then prices backward's all-gathers from what is left, not as if
    DI-6 had taken reductions only."""
    r = accumulating(collectives={"all_gather": [80, 6 * 10**6, 10**5], "reduce_scatter": [40, 4 * 10**6, 10**5]})
    f = gpu_facts(fsdp=[FSDPFacts(version=2, reshard_after_forward=True, units=7, unit_mb_median=10.0, model_mb=70.0)])
    f.world_size = 2
    found = run_all((r, f))
    di6, di16 = only(found, "DI-6"), only(found, "DI-16")
    assert "Micro-batches without an optimizer step" in di6.title
    left = 10.0 - di6.recoverable_ms  # 10 ms exposed per step
    assert abs(di16.recoverable_ms - left * 0.5 * 0.6) < 1e-6


def test_di7_find_unused_without_unused():
    r = comm_bound()
    r.signals.ddp_forward_self_ns = 3 * 5 * MS
    f = gpu_facts(ddp=[DDPFacts(find_unused_parameters=True, unused_parameter_size=0)])
    got = only(run("DI-7", (r, f)), "DI-7")
    assert got.remedy == "ddp.find_unused_false" and got.severity == "warning" and abs(got.recoverable_ms - 3.0) < 1e-6


def test_di7_silent_when_parameters_are_unused():
    f = gpu_facts(ddp=[DDPFacts(find_unused_parameters=True, unused_parameter_size=4096)])
    assert run("DI-7", (None, f)) == []
    assert run("DI-7", (None, gpu_facts(ddp=[DDPFacts(find_unused_parameters=False)]))) == []


def test_di8_static_graph():
    f = gpu_facts(ddp=[DDPFacts(static_graph=False, can_set_static_graph=True)])
    assert only(run("DI-8", (None, f)), "DI-8").remedy == "ddp.static_graph"


def test_di8_silent_when_set():
    assert run("DI-8", (None, gpu_facts(ddp=[DDPFacts(static_graph=True, can_set_static_graph=True)]))) == []


def test_di9_gradient_as_bucket_view():
    f = cpu_facts(ddp=[DDPFacts(gradient_as_bucket_view=False, total_parameter_bytes=100_000_000)])
    got = only(run("DI-9", (None, f)), "DI-9")
    assert got.remedy == "ddp.grad_as_bucket_view" and abs(got.recoverable_ms - 20.0) < 1e-6


def test_di9_silent_when_on():
    assert run("DI-9", (None, cpu_facts(ddp=[DDPFacts(gradient_as_bucket_view=True)]))) == []


def small_buckets():
    return DDPFacts(bucket_cap_mb=1.0, num_buckets=40, total_parameter_bytes=40 * 2**20,
                    avg_backward_comm_time_ns=20e6, avg_backward_compute_comm_overlap_time_ns=0,
                    avg_backward_compute_time_ns=50e6)


def test_di10_small_bucket_cap_from_facts():
    f = cpu_facts(ddp=[small_buckets()], steps=[StepTiming(step=i, total_ms=100.0) for i in range(3)],
                  distributed_backend="gloo")
    found = run_all((None, f))
    got = only(found, "DI-10")
    assert got.remedy == "ddp.bucket_cap" and "40 gradient all-reduces" in got.title
    assert abs(got.recoverable_ms - 20.0 * 0.5 * (1 - 3 / 40)) < 1e-6
    assert claims(found) <= 20.0 + 1e-6


def test_di10_from_trace_many_tiny_all_reduces():
    r = comm_bound(collectives={"all_reduce": [2000, 2000 * 150_000, 4000]})
    assert only(run("DI-10", (r, None)), "DI-10").confidence == "low"


def test_di10_silent_with_default_buckets():
    f = cpu_facts(ddp=[DDPFacts(bucket_cap_mb=None, num_buckets=3, total_parameter_bytes=40 * 2**20)])
    assert run("DI-10", (None, f)) == []
    assert run("DI-10", (comm_bound(), None)) == []


def test_di11_large_all_reduces_suggest_compression():
    r = comm_bound(exposed=20.0, overlap=80.0, compute=20.0,
                   collectives={"all_reduce": [10, 10 * 5 * 10**6, 4 * 10**6]})
    assert only(run("DI-11", (r, None)), "DI-11").confidence == "low"


def test_di11_silent_on_small_all_reduces():
    assert run("DI-11", (comm_bound(overlap=80.0, compute=20.0), None)) == []


def test_di11_replicated_embedding():
    emb = EmbeddingFacts("item_emb", 10_000_000, 64, 2_560_000_000)
    f = gpu_facts(world_size=8, embeddings=[emb], ddp=[DDPFacts(total_parameter_bytes=3_000_000_000)])
    found = run_all((comm_bound(exposed=20.0), f))
    got = [x for x in found if x.id == "DI-11" and "item_emb" in x.title]
    assert len(got) == 1 and got[0].severity in ("warning", "critical") and got[0].recoverable_pct > 10
    assert claims(found) <= 20.0 + 1e-6


def test_di11_embedding_silent_when_sharded_or_small():
    small = EmbeddingFacts("e", 1000, 16, 64_000)
    sharded = EmbeddingFacts("e", 10_000_000, 64, 2_560_000_000, replicated=False)
    for e in (small, sharded):
        assert run("DI-11-embedding", (None, gpu_facts(world_size=8, embeddings=[e]))) == []


def test_di12_fsdp_without_backward_prefetch():
    f = gpu_facts(fsdp=[FSDPFacts(version=1, backward_prefetch="None")])
    assert only(run("DI-12", (None, f)), "DI-12").severity == "warning"


def test_di12_silent_with_prefetch():
    assert run("DI-12", (None, gpu_facts(fsdp=[FSDPFacts(version=1, backward_prefetch="BACKWARD_PRE")]))) == []


def test_di13_buffer_broadcast():
    r = comm_bound(collectives={"all_reduce": [20, 10**7, 10**5], "broadcast": [10, 2 * 5 * MS, 10**5]})
    assert abs(only(run("DI-13", (r, None)), "DI-13").recoverable_ms - 2.0) < 1e-6


def test_di13_silent_without_broadcasts():
    assert run("DI-13", (comm_bound(), None)) == []


def test_di14_nccl_transports_disabled():
    f = gpu_facts(env={"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}, distributed_backend="nccl",
                  world_size=8, cpu=CpuFacts(local_world_size=8))
    found = run_all((comm_bound(exposed=20.0), f))
    got = only(found, "DI-14")
    assert got.severity in ("warning", "critical") and abs(got.recoverable_pct - 10.0) < 0.1
    assert "NCCL_P2P_DISABLE=1" in got.title
    assert claims(found) <= 20.0 + 1e-6


def test_di14_ib_on_single_node_or_gloo_is_info():
    ib = gpu_facts(env={"NCCL_IB_DISABLE": "1"}, distributed_backend="nccl", world_size=8,
                   cpu=CpuFacts(local_world_size=8))
    assert only(run("DI-14", (None, ib)), "DI-14").severity == "info"
    gloo = cpu_facts(env={"NCCL_SHM_DISABLE": "1"}, distributed_backend="gloo")
    assert only(run("DI-14", (None, gloo)), "DI-14").severity == "info"


def test_di14_silent_on_clean_env():
    assert run("DI-14", (None, gpu_facts(env={"NCCL_DEBUG": "WARN"}, distributed_backend="nccl"))) == []


def test_the_profilers_own_inflation_of_the_window_is_not_exposed_communication():
    from torchdoctor.rules._comm import exposed_comm_ms
    from torchdoctor.rules._common import views

    from .conftest import inputs

    # The profiled window's steps take 70 ms (40% of them exposed collectives: 28 ms); unprofiled,
    # the probe timed 50 ms steps: 20 ms per step is the profiler's, not the job's.
    r = gpu_result(step_ms=70.0, comm_exposed_pct=40.0, comm_pct=40.0)
    f = gpu_facts(steps=[StepTiming(step=i, total_ms=50.0) for i in range(20)])
    (v,) = views(inputs((r, f)))
    assert v.profiler_inflation_ms == pytest.approx(20.0)
    assert exposed_comm_ms(v) == pytest.approx(8.0)
    # Without the probe's timings (a trace alone), the window's figure stands.
    (v,) = views(inputs((r, None)))
    assert exposed_comm_ms(v) == pytest.approx(28.0)


def test_the_reports_say_what_the_profilers_inflation_took_from_a_measured_wait():
    """pytorch/examples ddp: DI-5's title stated the budget-capped gain (1.2 ms) as the wait while
    its evidence showed 2.07 ms, and DI-3's 22% contradicted the table's 91% without a word."""
    # Rank 1 waits 24 ms more per step than rank 0 in a 70 ms profiled step; unprofiled, the
    # probe timed 50 ms steps, so 20 ms of the window is the profiler's and 8 ms can be claimed.
    f = [gpu_facts(rank=r, steps=[StepTiming(step=i, total_ms=50.0) for i in range(20)]) for r in (0, 1)]
    a = gpu_result(step_ms=70.0, comm_exposed_pct=6.0, comm_pct=6.0, rank=0)
    b = gpu_result(step_ms=70.0, comm_exposed_pct=40.0, comm_pct=40.0, rank=1)
    cross = CrossRank(ranks=2, step_ms_median=70.0, straggler=0, straggler_lead_ms=24.0, victims=[1],
                      per_rank=[RankWait(0, 70.0, 4.0, 0.0), RankWait(1, 70.0, 28.0, 24.0)])
    found = run_all((a, f[0]), (b, f[1]), cross=cross)
    di5 = only(found, "DI-5")
    assert "rank 1 waits 24.0 ms more per step" in di5.title and "8.0 ms of it counted as gain" in di5.title
    assert di5.recoverable_pct == pytest.approx(100 * 8.0 / 70.0, abs=0.1)
    di3 = [x for x in found if x.id == "DI-3" and 1 in x.ranks]
    text = di3[0].evidence[0].text if di3 else ""
    assert "the profiled steps expose 28.0 ms, but ran 20.0 ms longer than the unprofiled ones" in text
    assert di3[0].evidence[0].values["profiler_inflation_ms"] == 20.0


def test_fsdp2_advice_never_says_no_sync_and_ddp_advice_stays():
    """The same exposed communication, advised by how the model is sharded: FSDP2 (fully_shard,
    from the live facts) gets units, reshard and prefetch advice and set_requires_gradient_sync;
    a trace whose collectives are all-gathers and reduce-scatters is sharded too; DDP keeps no_sync()."""
    fsdp2 = gpu_facts(fsdp=[FSDPFacts(version=2, reshard_after_forward=False, units=11, unit_mb_median=8.0,
                                      mixed_precision="MixedPrecisionPolicy(param_dtype=None, reduce_dtype=None)")])
    for rid in ("DI-3", "DI-6"):
        got = only(run(rid, (accumulating(), fsdp2)), rid)
        assert "no_sync" not in got.fix.snippet, (rid, got.fix)
    di3 = only(run("DI-3", (accumulating(), fsdp2)), "DI-3").fix
    assert "set_modules_to_forward_prefetch" in di3.snippet and "(11 units, 8.0 MB median)" in di3.text
    assert "param_dtype=torch.bfloat16" in di3.snippet
    one = gpu_facts(fsdp=[FSDPFacts(version=2, units=1, unit_mb_median=80.0, mixed_precision="bf16")])
    assert "one fully_shard unit" in only(run("DI-3", (accumulating(), one)), "DI-3").fix.text
    tiny = gpu_facts(fsdp=[FSDPFacts(version=2, units=40, unit_mb_median=0.05)])
    assert "latency-bound" in only(run("DI-3", (accumulating(), tiny)), "DI-3").fix.text
    toy = gpu_facts(fsdp=[FSDPFacts(version=2, units=11, unit_mb_median=0.013, model_mb=0.27)])
    got = only(run("DI-3", (accumulating(), toy)), "DI-3").fix
    assert "on a 0.3 MB model" in got.text and "DistributedDataParallel(model)" in got.snippet
    assert "set_requires_gradient_sync" in only(run("DI-6", (accumulating(), fsdp2)), "DI-6").fix.snippet
    sharded = accumulating(collectives={"all_gather": [40, 10**6, 10**5], "reduce_scatter": [20, 6 * 10**5, 10**5]})
    assert "fully_shard" in only(run("DI-3", (sharded, None)), "DI-3").fix.snippet
    assert "no_sync" in only(run("DI-6", (accumulating(), gpu_facts(ddp=[DDPFacts()]))), "DI-6").fix.snippet
    fsdp1 = gpu_facts(fsdp=[FSDPFacts(version=1)])
    assert "BackwardPrefetch" in only(run("DI-3", (accumulating(), fsdp1)), "DI-3").fix.snippet
    # A model built in bf16 (torchtune's dtype: bf16) all-gathers 16-bit parameters already.
    bf16 = gpu_facts(fsdp=[FSDPFacts(version=2, units=11, unit_mb_median=8.0, param_dtype="bfloat16",
                                     mixed_precision="MixedPrecisionPolicy(param_dtype=None, reduce_dtype=None)")])
    got = only(run("DI-3", (accumulating(), bf16)), "DI-3").fix
    assert "MixedPrecisionPolicy" not in got.text and "param_dtype" not in got.snippet


def test_tensor_parallel_jobs_are_advised_on_their_activation_collectives():
    """pytorch/examples' tensor_parallel_example.py (parallelize_module, 2 gloo ranks): DI-3 said
    "gradient accumulation with no_sync(), bf16 gradient compression"; TP communicates activations
    inside every parallelized layer, and a model that fits on each rank is better replicated."""
    from torchdoctor.facts import TensorParallelFacts

    toy = gpu_facts(tensor_parallel=TensorParallelFacts(params=3, layers=2, model_mb=0.002, mesh="(2,)"))
    di3 = only(run("DI-3", (accumulating(), toy)), "DI-3").fix
    assert di3.text.startswith("Tensor parallelism on a 0.0 MB model: 2 parallelized layers all-reduce or all-gather")
    assert "no_sync" not in di3.text + di3.snippet and "DistributedDataParallel(model)" in di3.snippet
    big = gpu_facts(tensor_parallel=TensorParallelFacts(params=300, layers=200, model_mb=16000.0, mesh="tp=8"))
    di3 = only(run("DI-3", (accumulating(), big)), "DI-3").fix
    assert "inside one node" in di3.text and "_micro_pipeline_tp = True" in di3.snippet
    assert "enable_symm_mem_for_group(tp_mesh.get_group().group_name)" in di3.snippet  # 2.13 needs it
    # Micro-batches without an optimizer step communicate in every layer: no gradient sync to skip;
    # nor buckets, comm hooks, buffer broadcasts or overlap with backward. Each input below makes
    # its rule fire on a rank without tensor-parallel facts.
    cases = {"DI-4": comm_bound(exposed=20.0, overlap=0.0, compute=60.0), "DI-6": accumulating(),
             "DI-10": comm_bound(collectives={"all_reduce": [2000, 2000 * 150_000, 4000]}),
             "DI-11": comm_bound(exposed=20.0, overlap=80.0, compute=20.0,
                                 collectives={"all_reduce": [10, 10 * 5 * 10**6, 4 * 10**6]}),
             "DI-13": comm_bound(collectives={"all_reduce": [20, 10**7, 10**5], "broadcast": [10, 2 * 5 * MS, 10**5]})}
    for rid, r in cases.items():
        assert run(rid, (r, gpu_facts())), rid
        assert run(rid, (r, big)) == [], rid
    assert only(run("DI-6", (accumulating(), gpu_facts(ddp=[DDPFacts()]))), "DI-6")
    # DDP over a model with DTensor parameters stays DDP's advice.
    both = gpu_facts(ddp=[DDPFacts()], tensor_parallel=TensorParallelFacts(params=3, layers=2, model_mb=0.002))
    assert "no_sync" in only(run("DI-3", (accumulating(), both)), "DI-3").fix.snippet


def test_di15_prices_blocking_saves_per_step_and_names_the_straggler_s_cause():
    steps = [StepTiming(step=i, total_ms=100.0, checkpoint_ms=200.0 if i % 10 == 9 else 0.0,
                        checkpoint_saves=1 if i % 10 == 9 else 0) for i in range(40)]
    f0 = cpu_facts(rank=0, world_size=2, steps=steps)
    got = only(run("DI-15", (None, f0)), "DI-15")
    # 4 saves of 200 ms in 40 steps of 100 ms: 20 ms per step, 20% of the step.
    assert abs(got.recoverable_ms - 20.0) < 1e-6 and got.severity == "critical" and "one every 10 steps" in got.title
    assert "async_save" in got.fix.snippet and "(the save at" not in got.fix.text
    # A library that saves for the job (timm's CheckpointSaver) is named with the user's line that called it.
    f0.checkpoint_site = "timm's CheckpointSaver.save_checkpoint() at /job/train.py:1190"
    got = only(run("DI-15", (None, f0)), "DI-15")
    assert "(the save at timm's CheckpointSaver.save_checkpoint() at /job/train.py:1190)" in got.fix.text
    quiet = cpu_facts(rank=1, world_size=2, steps=[StepTiming(step=i, total_ms=100.0) for i in range(40)])
    assert run("DI-15", (None, quiet)) == []
    # Two files at each epoch's end (torchvision's reference: model_{epoch}.pth and checkpoint.pth).
    pairs = [StepTiming(step=i, total_ms=100.0, checkpoint_ms=400.0 if i % 20 == 19 else 0.0,
                        checkpoint_saves=2 if i % 20 == 19 else 0) for i in range(80)]
    got = only(run("DI-15", (None, cpu_facts(steps=pairs))), "DI-15")
    assert "8 save(s) of 200.0 ms each in 80 steps (2 every 20 steps), 20.0 ms per step" in got.title
    for i, s in enumerate(s for s in pairs if s.checkpoint_saves):  # 1, 2, 1, 2 saves: no "N every K"
        s.checkpoint_saves, s.checkpoint_ms = (1, 200.0) if i % 2 == 0 else (2, 400.0)
    got = only(run("DI-15", (None, cpu_facts(steps=pairs))), "DI-15")
    assert "6 save(s) of 200.0 ms each in 80 steps (1.5 saves at a time, every 20 steps)" in got.title

    # A save in the profiler's window counts (timm saves after every epoch of 6 steps; the window, steps
    # 5-7, held the first): 3 saves every 6 steps in 18, not 2 in the 15 steps outside the window.
    epochs = [StepTiming(step=i, total_ms=100.0, checkpoint_ms=120.0 if i % 6 == 0 and i else 0.0,
                         checkpoint_saves=1 if i % 6 == 0 and i else 0) for i in range(19)]
    windowed = cpu_facts(steps=[s for s in epochs if not 5 <= s.step < 8],
                         profiled_steps=[s for s in epochs if 5 <= s.step < 8])
    got = only(run("DI-15", (None, windowed)), "DI-15")
    assert "3 save(s) of 120.0 ms each in 19 steps (one every 6 steps), 18.9 ms per step" in got.title, got.title


def test_di16_fsdp2_resharding_with_memory_to_spare():
    """Units that reshard after forward all-gather again in backward: half the all-gather time when the
    trace names the kinds; the remedy is offered only when the unsharded parameters fit."""
    r = comm_bound(exposed=20.0, collectives={"all_gather": [40, 6 * 10**6, 10**5], "reduce_scatter": [20, 4 * 10**6, 10**5]})
    gb = 2**30

    def facts(reshard=True, peak_gb=20.0, mb=4000.0):
        f = gpu_facts(fsdp=[FSDPFacts(version=2, reshard_after_forward=reshard, units=8, unit_mb_median=mb / 8,
                                      model_mb=mb)])
        f.world_size = 8
        f.device.total_memory_bytes, f.device.max_memory_allocated_bytes = 80 * gb, int(peak_gb * gb)
        return f

    got = only(run("DI-16", (r, facts())), "DI-16")
    # 20 ms exposed of a 100 ms step; all-gathers are 60% of the communication, backward's half of them.
    assert abs(got.recoverable_ms - 20.0 * 0.5 * 0.6) < 1e-6 and got.remedy == "fsdp.keep_unsharded"
    assert "3500 MB more memory per rank" in got.title and got.confidence == "medium"
    assert run("DI-16", (r, facts(reshard=False))) == []
    assert run("DI-16", (r, facts(peak_gb=70.0))) == []  # 70 GB + 3.5 GB > 90% of 80 GB
    host = comm_bound(exposed=20.0)
    host.signals.collectives = {}  # a host-only trace: kinds unknown, a quarter of the exposed time
    got = only(run("DI-16", (host, facts())), "DI-16")
    assert abs(got.recoverable_ms - 5.0) < 1e-6 and got.confidence == "low"
    # Without live memory facts, the trace's allocator records decide.
    from torchdoctor.metrics.model import MemoryStats
    live_less = facts()
    live_less.device.max_memory_allocated_bytes = None
    r.memory = MemoryStats(device_id=0, records=10, peak_allocated=70 * gb, peak_reserved=75 * gb, floor_allocated=60 * gb,
                           cache_slack_pct=6.7, reserved_growth=0, allocs_per_step=5.0, alloc_bytes_per_step=gb,
                           total_memory=80 * gb)
    assert run("DI-16", (r, live_less)) == []
    r.memory.peak_allocated = 20 * gb
    assert only(run("DI-16", (r, live_less)), "DI-16").remedy == "fsdp.keep_unsharded"
    small = facts(mb=0.26)  # pytorch/examples' FSDP2 Transformer: 0.26 MB on 8 ranks
    assert got.title.startswith("FSDP2 all-gathers") and "for 0.23 MB more memory per rank." in only(
        run("DI-16", (host, small)), "DI-16").title


def test_di6_on_a_host_only_trace_takes_the_profilers_slowdown_out():
    """torchtune's FSDP2 recipe on CPU: the profiled step ran 8% longer than the probe's steps, and
    the reductions' host ranges with it; the claim is the same share of the unprofiled step."""
    from torchdoctor.metrics.model import Accumulation

    r = cpu_result(comm_pct=40.0, comm_exposed_pct=40.0)
    r.backend = "gloo"
    r.signals.accumulation = Accumulation(wrapper="FSDP2", steps=5, synced_steps=5, micro_batches=8.0,
                                          reductions_per_micro_batch=7, early_ns=5 * 20 * MS, kinds=["reduce-scatter"])
    f = cpu_facts(steps=[StepTiming(step=i, total_ms=80.0) for i in range(10)])
    got = only(run("DI-6", (r, f)), "DI-6")
    assert abs(got.recoverable_ms - 20.0 * 80.0 / 100.0) < 1e-6  # 20 ms in a 100 ms window step, 80 ms unprofiled
    assert "the profiled steps ran 20.0 ms longer than the unprofiled ones, so 16.0 ms is claimed" in got.evidence[1].text
    assert "16.0 ms per step" in got.title
