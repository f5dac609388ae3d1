"""Input-layer rules (DL-1..DL-7): each fires on its evidence and stays silent without it."""

from __future__ import annotations

import pytest
from msgspec.structs import replace as msgspec_replace

from torchdoctor.facts import CpuFacts, DataLoaderFacts, StepTiming
from torchdoctor.metrics.model import CopySite, MemcpyRow

from .conftest import cpu_facts, cpu_result, gpu_facts, gpu_result, idle, only, run, run_all


def loader(**kw) -> DataLoaderFacts:
    return DataLoaderFacts(**kw)


def input_bound(wait_pct: float, busy: float | None = None):
    r = gpu_result(busy=busy if busy is not None else 100 - wait_pct, dataloader_pct=wait_pct,
                   dataloader_exposed_pct=wait_pct)
    for s in r.steps:
        s.dataloader_exposed_ms = s.dataloader_ms = wait_pct
    return idle(r, "dataloader", wait_pct, [("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", wait_pct)])


def test_dl2_fires_on_num_workers_zero_fact():
    f = gpu_facts(dataloaders=[loader(num_workers=0, pin_memory=True)], cpu=CpuFacts(affinity=list(range(8))))
    got = only(run("DL-2", (input_bound(30.0), f)), "DL-2")
    assert got.remedy == "dataloader.workers" and got.severity == "critical"
    assert 29.0 <= got.recoverable_pct <= 30.0  # 7 workers hide the whole 30 ms behind 70 ms of compute
    assert "num_workers=7" in got.fix.snippet and "pin_memory=True" in got.fix.snippet


def test_dl2_fires_on_single_process_iterator_in_trace():
    r = input_bound(10.0)
    r.signals.dataloader_iter = "_SingleProcessDataLoaderIter"
    got = only(run("DL-2", (r, None)), "DL-2")
    assert got.confirm  # indirect: the settings were not read


def test_dl2_silent_with_workers():
    f = gpu_facts(dataloaders=[loader(num_workers=4)])
    assert run("DL-2", (input_bound(30.0), f)) == []


def test_dl1_generic_input_bound_when_settings_unknown():
    got = only(run("DL-1", (input_bound(20.0), None)), "DL-1")
    assert got.severity == "critical" and abs(got.recoverable_pct - 20.0) < 0.1
    assert "torchdoctor run" in got.confirm


def test_dl1_silent_without_data_wait():
    assert run("DL-1", (input_bound(0.2), None)) == []


def test_dl1_and_dl2_split_the_wait_without_double_counting():
    # 2 CPUs, 2 local ranks: one worker; loading (80 ms) is slower than compute (20 ms).
    f = gpu_facts(dataloaders=[loader(num_workers=0)], cpu=CpuFacts(affinity=[0, 1], local_world_size=2))
    found = run_all((input_bound(80.0), f))
    dl1, dl2 = only(found, "DL-1"), only(found, "DL-2")
    assert abs(dl1.recoverable_pct + dl2.recoverable_pct - 80.0) < 0.1
    assert dl2.recoverable_pct < dl1.recoverable_pct  # one worker only hides 20 ms


def test_dl1_on_cpu_trace_uses_host_dataloader_time():
    r = cpu_result(dataloader_pct=25.0, dataloader_exposed_pct=25.0)
    got = only(run("DL-1", (r, None)), "DL-1")
    assert abs(got.recoverable_pct - 25.0) < 0.1


def bursty_facts(waits):
    return gpu_facts(dataloaders=[loader(num_workers=4, prefetch_factor=2)],
                     steps=[StepTiming(step=i, total_ms=100.0, dataloader_ms=w) for i, w in enumerate(waits)])


def test_dl7_bursty_loader_owns_the_bursts():
    waits = [0.0, 0.0, 0.0, 40.0, 50.0] * 2  # the probe timed 10 steps; the trace window holds 5
    r = input_bound(18.0)
    for s, w in zip(r.steps, waits[:5], strict=True):
        s.dataloader_exposed_ms = w
    found = run_all((r, bursty_facts(waits)))
    dl7 = only(found, "DL-7")
    assert dl7.remedy == "dataloader.prefetch" and "prefetch_factor=4" in dl7.fix.snippet
    assert abs(dl7.recoverable_pct - 18.0) < 0.1
    assert not [x for x in found if x.id == "DL-1"]  # the typical wait is 0: nothing left for DL-1


def test_dl7_silent_on_steady_waits_or_too_few_steps():
    assert run("DL-7", (input_bound(10.0), bursty_facts([10.0] * 10))) == []
    assert run("DL-7", (input_bound(10.0), bursty_facts([0.0, 0.0, 40.0]))) == []


def test_dl7_leaves_a_loader_that_never_keeps_up_to_dl1():
    # Most steps wait (median 30 ms of 100) with bursts on top: a deeper queue would drain anyway.
    waits = [30.0, 30.0, 30.0, 80.0, 90.0] * 2
    r = input_bound(48.0)
    for s, w in zip(r.steps, waits[:5], strict=True):
        s.dataloader_exposed_ms = w
    found = run_all((r, bursty_facts(waits)))
    assert not [x for x in found if x.id == "DL-7"]
    assert abs(only(found, "DL-1").recoverable_pct - 48.0) < 0.1  # the whole wait, claimed once


def test_dl3_too_many_workers():
    f = cpu_facts(dataloaders=[loader(num_workers=16)], cpu=CpuFacts(affinity=[0, 1, 2, 3]))
    got = only(run("DL-3", (None, f)), "DL-3")
    assert got.severity == "warning" and got.recoverable_pct == 0.0


def test_dl2_advises_more_workers_for_latency_bound_loading():
    # 2 CPUs, 2 ranks: PL's formula says 1 worker. But the training process used 40% of a core while
    # it waited 60 of 100 ms for data: loading waits on storage, so 2 workers (60 / 40, rounded up).
    steps = [StepTiming(step=i, total_ms=100.0, dataloader_ms=60.0) for i in range(12)]
    cpu = CpuFacts(affinity=[0, 1], local_world_size=2, main_process_cpu_pct=40.0)
    f = cpu_facts(dataloaders=[loader(num_workers=0)], cpu=cpu, steps=steps)
    got = only(run("DL-2", (None, f)), "DL-2")
    assert "num_workers=2" in got.fix.snippet and "latency-bound" in got.fix.text
    busy = msgspec_replace(cpu, main_process_cpu_pct=95.0)  # CPU-bound loading: the formula holds
    got = only(run("DL-2", (None, cpu_facts(dataloaders=[loader(num_workers=0)], cpu=busy, steps=steps))), "DL-2")
    assert "num_workers=1" in got.fix.snippet
    assert "pin_memory" not in got.fix.snippet  # a CPU-only job: pinning only warns
    # The same idle share spent blocked in collectives (a DDP rank waiting for its peers) is not
    # a slow store: the loading is CPU-bound and PL's formula holds.
    blocked = [StepTiming(step=i, total_ms=100.0, dataloader_ms=60.0, comm_ms=40.0) for i in range(12)]
    got = only(run("DL-2", (None, cpu_facts(dataloaders=[loader(num_workers=0)], cpu=cpu, steps=blocked))), "DL-2")
    assert "num_workers=1" in got.fix.snippet and "CPU-bound" in got.fix.text
    # DDP's comm time is only read on the iterations it samples (1-10, then 2 in every 100): the
    # steps between read 0, and a median over all of them said nothing was blocked.
    sampled = [StepTiming(step=i, total_ms=100.0, dataloader_ms=60.0, comm_ms=40.0 if i < 12 else 0.0)
               for i in range(60)]
    got = only(run("DL-2", (None, cpu_facts(dataloaders=[loader(num_workers=0)], cpu=cpu, steps=sampled))), "DL-2")
    assert "num_workers=1" in got.fix.snippet and "CPU-bound" in got.fix.text


def test_dl2_claims_nothing_when_no_cpu_is_free_for_a_worker():
    # A CPU-only job whose torch threads hold both CPUs, loading CPU-bound: a worker takes its core
    # from the training's compute (a Lightning job on 2 CPUs: claimed 42%, `fix` measured x0.62).
    steps = [StepTiming(step=i, total_ms=10.0, dataloader_ms=4.0) for i in range(12)]
    cpu = CpuFacts(affinity=[0, 1], local_world_size=1, main_process_cpu_pct=180.0, torch_num_threads=2)
    f = cpu_facts(dataloaders=[loader(num_workers=0)], cpu=cpu, steps=steps)
    found = run_all((None, f))
    dl2, dl1 = only(found, "DL-2"), only(found, "DL-1")
    assert dl2.recoverable_ms == 0.0 and dl2.severity == "info"
    assert "no CPU is free for a worker" in dl2.title and "torch.set_num_threads(1)" in dl2.fix.snippet
    assert "no CPU is free for loader workers" in dl1.title and abs(dl1.recoverable_ms - 4.0) < 0.01
    # No device to move the work to: the per-sample overhead is what a CPU-only job can cut.
    assert "index whole batches" in dl1.fix.text and "GPU" not in dl1.fix.text
    # One torch thread leaves a CPU free: the worker's gain is claimed as before.
    one = msgspec_replace(cpu, torch_num_threads=1)
    dl2 = only(run("DL-2", (None, cpu_facts(dataloaders=[loader(num_workers=0)], cpu=one, steps=steps))), "DL-2")
    assert dl2.recoverable_ms > 0 and "could hide" in dl2.title


def test_dl3_silent_when_workers_wait_on_io():
    # 2 workers x 2 ranks on 2 CPUs, but the rank's workers use 30% of a core together.
    cpu = CpuFacts(affinity=[0, 1], local_world_size=2, dataloader_workers_cpu_pct=30.0)
    assert run("DL-3", (None, cpu_facts(dataloaders=[loader(num_workers=2)], cpu=cpu))) == []
    busy = CpuFacts(affinity=[0, 1], local_world_size=2, dataloader_workers_cpu_pct=190.0)
    assert only(run("DL-3", (None, cpu_facts(dataloaders=[loader(num_workers=2)], cpu=busy))), "DL-3").severity == "info"


def test_dl3_silent_within_cpus():
    f = cpu_facts(dataloaders=[loader(num_workers=2)], cpu=CpuFacts(affinity=list(range(8))))
    assert run("DL-3", (None, f)) == []


def test_dl4_pageable_copies_in_trace():
    r = gpu_result()
    r.kernels.memcpy = [MemcpyRow("HtoD", "pageable", 50, 40 * 5 * 1_000_000, 10**9)]
    got = only(run("DL-4", (r, None)), "DL-4")
    assert got.severity in ("warning", "critical") and abs(got.recoverable_pct - 20.0) < 0.1
    assert got.remedy == "dataloader.pin_memory"


def test_dl4_prices_the_stall_of_pageable_copies_and_ho5_leads_with_another_op():
    # kineto's tb_plugin V100 sample with 4 workers: the batch's pageable copy stalls with the
    # device idle (7.6 ms per step); the host-bound rule named that aten::to as its lead op.
    r = gpu_result(busy=70.0)
    n = len(r.window.steps)
    r.kernels.memcpy = [MemcpyRow("HtoD", "pageable", n, 2 * n * 1_000_000, 19 * n * 10**6)]
    r.signals.blocking_copies = [CopySite("cudaMemcpyAsync", "HtoD", "pageable", "aten::copy_", "", n,
                                          14 * n * 1_000_000, 7 * n * 1_000_000, 19 * n * 10**6, 5_000_000)]
    idle(r, "host_ops", 30.0, [("aten::to", 7.5), ("aten::copy_", 7.4), ("aten::conv2d", 5.0)])
    found = run_all((r, None))
    dl4, ho5 = only(found, "DL-4"), only(found, "HO-5")
    assert abs(dl4.recoverable_pct - 8.0) < 0.1  # the 7 ms stall and half of the 2 ms copy
    assert dl4.evidence[1].values == {"host_blocked_ms": 14.0, "idle_ms": 7.0}
    assert "began at +5.0 ms" in dl4.evidence[1].text
    assert "runs aten::conv2d and other host work" in ho5.title and abs(ho5.recoverable_pct - 23.0) < 0.1


def test_dl4_fact_without_trace_is_info():
    f = gpu_facts(dataloaders=[loader(num_workers=2, pin_memory=False)])
    got = only(run("DL-4", (None, f)), "DL-4")
    assert got.severity == "info" and got.confirm


def test_dl4_silent_on_cpu_training():
    f = cpu_facts(dataloaders=[loader(num_workers=0, pin_memory=False)])
    assert run("DL-4", (cpu_result(), f)) == []


def test_dl5_blocking_pinned_copies():
    r = gpu_result()
    r.signals.blocking_copies = [CopySite("cudaMemcpyAsync", "HtoD", "pinned", "aten::copy_", "", 5,
                                          5 * 12_000_000, 5 * 10_000_000, 10**6, 0)]
    idle(r, "host_ops", 10.0)  # the host sat in those copies: host-op idle, claimed by DL-5 first
    got = only(run("DL-5", (r, None)), "DL-5")
    assert abs(got.recoverable_pct - 10.0) < 0.1


def test_dl5_silent_without_blocking_copies():
    assert run("DL-5", (gpu_result(), None)) == []


def test_dl6_workers_restarted_each_epoch():
    f = gpu_facts(dataloaders=[loader(num_workers=4, persistent_workers=False, dataset_len=1000, batch_size=10)],
                  steps=[StepTiming(step=i, total_ms=100.0) for i in range(5)])
    got = only(run("DL-6", (None, f)), "DL-6")
    assert got.remedy == "dataloader.persistent_workers"
    assert abs(got.recoverable_ms - 4.0) < 1e-6  # 0.1 s x 4 workers / 100 steps


def test_dl6_advises_no_workers_when_they_cost_more_than_they_give():
    """skorch's README example: DL-6 said 'keep the workers alive' beside DL-1's 'num_workers=0'."""
    d = loader(num_workers=4, persistent_workers=False, dataset_len=1000, batch_size=10, ready_wait_ms_mean=1.5,
               worker_dataset_ms_mean=0.25, worker_collate_ms_mean=0.62)
    got = only(run("DL-6", (None, gpu_facts(dataloaders=[d], steps=[StepTiming(step=i, total_ms=100.0)
                                                                      for i in range(5)]))), "DL-6")
    assert got.remedy == "dataloader.workers" and got.evidence[0].values["advised_workers"] == 0
    assert "num_workers=0" in got.fix.snippet and "870 µs" in got.fix.text and "1.5 ms" in got.fix.text
    assert abs(got.recoverable_ms - 4.0) < 1e-6  # the restarts it prices are the same
    # Within the noise of a sub-millisecond batch (0.05 ms to receive, 0.04 ms to make): persistent workers.
    d = msgspec_replace(d, ready_wait_ms_mean=0.05, worker_dataset_ms_mean=0.02, worker_collate_ms_mean=0.02)
    got = only(run("DL-6", (None, gpu_facts(dataloaders=[d], steps=[StepTiming(step=i, total_ms=100.0)
                                                                      for i in range(5)]))), "DL-6")
    assert got.remedy == "dataloader.persistent_workers"


def test_dl6_silent_with_persistent_workers():
    f = gpu_facts(dataloaders=[loader(num_workers=4, persistent_workers=True)])
    assert run("DL-6", (None, f)) == []


def workers_facts(wait: float, unready: float, ready_share: float) -> object:
    steps = [StepTiming(step=i, total_ms=100.0, dataloader_ms=wait, dataloader_unready_ms=unready) for i in range(12)]
    dl = loader(num_workers=2, prefetch_factor=4, ready_share=ready_share, ready_wait_ms_mean=wait)
    return cpu_facts(dataloaders=[dl], steps=steps, cpu=CpuFacts(affinity=[0, 1], local_world_size=2))


def test_dl1_tells_the_handoff_of_ready_batches_from_a_slow_loader():
    # Every batch was ready: the 8 ms per step is the handoff, which more workers do not remove.
    found = run_all((None, workers_facts(8.0, 0.0, 1.0)))
    dl1 = only(found, "DL-1")
    assert dl1.severity == "info" and dl1.recoverable_pct == 0.0 and "100% of batches were ready" in dl1.title
    assert dl1.evidence[0].values["handoff_ms"] == 8.0
    assert not [f for f in found if f.id == "DL-7"]
    # Same wait, but no batch was ready: the loader cannot keep up.
    dl1 = only(run_all((None, workers_facts(8.0, 8.0, 0.0))), "DL-1")
    assert dl1.severity == "warning" and abs(dl1.recoverable_pct - 8.0) < 0.1 and "cannot keep up" in dl1.title


def test_dl1_says_when_workers_cost_more_than_loading_in_the_training_process():
    """skorch's README example with two workers: a worker makes a batch of in-memory rows in 873 µs,
    receiving it takes the training thread 1.5 ms; num_workers=0 ran x3.4 faster under `fix`."""
    def facts(dataset_ms: float, collate_ms: float) -> object:
        f = workers_facts(8.0, 0.0, 1.0)
        f.dataloaders[0] = msgspec_replace(f.dataloaders[0], worker_dataset_ms_mean=dataset_ms,
                                           worker_collate_ms_mean=collate_ms)
        return f

    dl1 = only(run_all((None, facts(1.0, 2.0))), "DL-1")
    assert dl1.severity == "warning" and dl1.remedy == "dataloader.workers"
    assert abs(dl1.recoverable_ms - 5.0) < 1e-6  # (8 - 3) ms per batch, one batch a step
    assert dl1.evidence[0].values["advised_workers"] == 0 and "num_workers=0" in dl1.fix.snippet
    assert "making one takes a worker 3.0 ms" in dl1.title
    # A worker slower than the handoff: the workers earn their keep, the handoff stays info.
    dl1 = only(run_all((None, facts(6.0, 4.0))), "DL-1")
    assert dl1.severity == "info" and dl1.recoverable_pct == 0.0 and dl1.remedy is None


def test_dl1_handoff_below_five_percent_is_not_reported():
    assert [f for f in run_all((None, workers_facts(3.0, 0.0, 1.0))) if f.id == "DL-1"] == []


def epoch_steps(n: int, every: int, step_ms: float, start_ms: float, start_wait: float,
                unready_at_starts: bool = True, start_iter: float = 0.0) -> list[StepTiming]:
    """`n` steady steps of `step_ms`; every `every`-th starts an epoch and takes `start_ms`, of
    which `start_iter` creates the loader's iterator and `start_wait` waits for the first batch
    (not ready); other steps wait 1 ms for ready batches."""
    out = []
    for i in range(n):
        start = i % every == every - 1
        out.append(StepTiming(step=i, total_ms=start_ms if start else step_ms,
                              dataloader_ms=start_wait if start else 1.0,
                              dataloader_unready_ms=start_wait if start and unready_at_starts else 0.0,
                              loader_iter_ms=start_iter if start else 0.0, epoch_starts=int(start)))
    return out


def test_dl6_prices_the_timed_epoch_starts_and_claims_their_wait_once():
    # 40 steps of 50 ms, 4 epoch starts of 350 ms: 100 ms creating the iterator (the workers start),
    # 150 ms waiting for the first batch, 50 ms evaluating (not the loader's). The loader's part,
    # 4 x (100 + 149) over a total of 36 x 50 + 4 x 350 = 3200 ms -> 31.125% of the average step.
    steps = epoch_steps(40, 10, 50.0, 350.0, 150.0, start_iter=100.0)
    f = cpu_facts(dataloaders=[loader(num_workers=2, persistent_workers=False, dataset_len=640, batch_size=64)],
                  steps=steps)
    got = only(run("DL-6", (None, f)), "DL-6")
    assert got.severity == "critical" and got.remedy == "dataloader.persistent_workers"
    assert got.recoverable_pct == pytest.approx(31.125, abs=0.01)
    assert "spends 249.0 ms restarting them (their start-up, the wait for its first batch, the model slowed " \
           "while they start), every 10 steps" in got.title
    assert got.evidence[0].values["excess_ms_per_epoch"] == 300.0
    claims = {c.budget: c.asked_ms for c in got.claims}
    assert claims["data.wait"] == pytest.approx(4 * 149.0 / 3200 * 50.0)  # waits above the 1 ms median
    # DL-1 (generic) then finds nothing of that wait left to call input-bound.
    assert not [x for x in run_all((None, f)) if x.id == "DL-1" and x.severity != "info"]


def test_dl6_counts_the_model_slowed_after_the_fork_but_not_an_evaluation():
    """Lightning Fabric's pattern on 2 CPUs: in each epoch's first step the forward and backward took 31 ms
    against 4.4 (3,241 page faults: the training process copies the pages it writes after forking its
    workers); DL-6 claimed 20.5% without it and `fix` measured 42.0% [37.0%, 46.7%]. Forwards without
    autograd in that step (an evaluation between epochs) stay the job's own work."""
    def run_with(forward: float, inference: float, faults: int = 3241) -> float:
        steps = epoch_steps(40, 10, 50.0, 350.0, 150.0, start_iter=100.0)
        for s in steps:
            s.forward_ms, s.backward_ms = (forward, 20.0) if s.epoch_starts else (10.0, 20.0)
            s.inference_ms = inference if s.epoch_starts else 0.0
            s.minor_faults = faults if s.epoch_starts else 8
        f = cpu_facts(dataloaders=[loader(num_workers=2, persistent_workers=False, dataset_len=640, batch_size=64)],
                      steps=steps)
        return only(run("DL-6", (None, f)), "DL-6").evidence[0].values["loader_ms_per_epoch"]

    assert run_with(10.0, 0.0) == 249.0  # the model as fast as in any step: iterator and wait only
    assert run_with(40.0, 0.0) == 279.0  # 30 ms more forward after the fork
    assert run_with(40.0, 30.0) == 249.0  # those 30 ms were an evaluation's forwards
    assert run_with(40.0, 0.0, faults=12) == 249.0  # no sign of a fork: an evaluation with autograd on


def test_dl6_counts_a_ranks_epoch_in_its_own_batches():
    """pytorch/examples minGPT-ddp on 2 ranks: 4,903 samples in batches of 32 are 77 steps per rank
    under a DistributedSampler, not 153 (the whole dataset's); the one later epoch starts at step 77."""
    steps = [StepTiming(step=i, total_ms=1600.0 if i == 77 else 260.0, epoch_starts=int(i == 77),
                        loader_iter_ms=80.0 if i == 77 else 0.0) for i in range(154)]
    dl = loader(num_workers=2, persistent_workers=False, dataset_len=4903, batch_size=32, batches_per_epoch=77)
    got = only(run("DL-6", (None, cpu_facts(dataloaders=[dl], steps=steps))), "DL-6")
    assert "every 77 steps; 1 such start(s) in this run" in got.title
    # Without the loader's length (an old run directory), the start's own step number says it.
    dl.batches_per_epoch = None
    got = only(run("DL-6", (None, cpu_facts(dataloaders=[dl], steps=steps))), "DL-6")
    assert "every 77 steps" in got.title


def test_dl6_is_about_the_training_loop_s_loader():
    """pytorch/ignite's cifar10: the training loader persistent (auto_dataloader at main.py:211), the
    evaluation loader not (main.py:215). DL-6 had priced the evaluation loader with the training
    loop's epoch starts ("every 4 steps", its length) and named line 211."""
    steps = epoch_steps(64, 32, 50.0, 400.0, 150.0, start_iter=100.0)
    train = loader(num_workers=1, persistent_workers=True, batches_per_epoch=32, batches=128,
                   created_by="ignite", library_call="auto_dataloader", library_caller="main.py:211")
    evaluate = loader(num_workers=1, persistent_workers=False, batches_per_epoch=4, batches=8,
                      created_by="ignite", library_call="auto_dataloader", library_caller="main.py:215")
    f = cpu_facts(dataloaders=[train, evaluate], steps=steps)
    assert run("DL-6", (None, f)) == []
    # Its workers restarted: DL-6 about it, at its own line.
    train.persistent_workers = False
    got = only(run("DL-6", (None, f)), "DL-6")
    assert "every 32 steps" in got.title and "main.py:211" in got.fix.text
    # Two loaders drawn from alike (zip of two training loaders): both are the training loop's.
    train.batches = evaluate.batches = 128
    got = only(run("DL-6", (None, f)), "DL-6")
    assert "main.py:211" in got.fix.text
    train.persistent_workers = True
    assert "main.py:215" in only(run("DL-6", (None, f)), "DL-6").fix.text
    # One loader not counted (drawn from on another thread): no narrowing, as without counts.
    train.batches, evaluate.batches = None, 8
    assert "main.py:215" in only(run("DL-6", (None, f)), "DL-6").fix.text
    # The evaluation loader alone restarting, the training one persistent, in an older run
    # directory without batch counts: every loader with restarting workers is a candidate, as before.
    train.persistent_workers, train.batches, evaluate.batches = True, None, None
    got = only(run("DL-6", (None, f)), "DL-6")
    assert "main.py:215" in got.fix.text


def test_dl6_without_a_timed_epoch_start_assumes_and_says_so():
    f = cpu_facts(dataloaders=[loader(num_workers=2, persistent_workers=False, dataset_len=6400, batch_size=64)],
                  steps=[StepTiming(step=i, total_ms=50.0) for i in range(40)])
    got = only(run("DL-6", (None, f)), "DL-6")
    assert got.severity == "info" and got.confidence == "low" and got.confirm
    assert got.recoverable_ms == pytest.approx(2.0)  # 0.1 s x 2 workers / 100 steps per epoch


def test_dl1_names_an_epoch_start_refill_and_offers_no_worker_remedy():
    # Persistent workers that keep up inside an epoch: the unready wait is all at epoch starts.
    steps = epoch_steps(40, 5, 50.0, 90.0, 40.0)
    f = cpu_facts(dataloaders=[loader(num_workers=2, persistent_workers=True, ready_share=0.9)], steps=steps,
                  cpu=CpuFacts(affinity=[0, 1]))
    got = only(run("DL-1", (None, f)), "DL-1")
    assert "start of each epoch (every ~5 steps" in got.title and got.remedy is None
    assert "sampler" in got.fix.snippet
    # The workers are already persistent (timm's create_loader keeps them): not advised again.
    assert "already kept alive" in got.fix.text and "keep the workers alive" not in got.fix.text
    assert run("DL-6", (None, f)) == []
    f.dataloaders[0].persistent_workers = False
    got = only(run("DL-1", (None, f)), "DL-1")
    assert "keep the workers alive (persistent_workers=True)" in got.fix.text
    # fastai's loaders start new workers every epoch whatever they are told (the probe leaves it unknown).
    f.dataloaders[0].persistent_workers = None
    got = only(run("DL-1", (None, f)), "DL-1")
    assert "start of each epoch" in got.title and "persistent_workers" not in got.fix.text + got.fix.snippet
    assert got.fix.text.startswith("Make epochs longer") and got.fix.text.endswith("cheaper.")
    assert "sampler" not in got.fix.snippet  # fastai's DataLoader takes none


def test_dl1_keeps_the_cannot_keep_up_reading_when_waits_are_spread():
    steps = [StepTiming(step=i, total_ms=60.0, dataloader_ms=10.0, dataloader_unready_ms=10.0,
                        epoch_starts=int(i % 10 == 9)) for i in range(40)]
    f = cpu_facts(dataloaders=[loader(num_workers=2, persistent_workers=True)], steps=steps,
                  cpu=CpuFacts(affinity=list(range(8))))
    got = only(run("DL-1", (None, f)), "DL-1")
    assert "cannot keep up on average" in got.title and got.remedy == "dataloader.workers"
    assert "persistent_workers=True" in got.fix.snippet
    # A loader that cannot keep its workers (fastai's): more workers, nothing about keeping them.
    f.dataloaders[0].persistent_workers = None
    got = only(run("DL-1", (None, f)), "DL-1")
    assert "cannot keep up on average" in got.title and got.fix.text.startswith("Add DataLoader workers")
    assert "persistent_workers" not in got.fix.text + got.fix.snippet


def test_dl1_advises_no_more_workers_than_the_host_allows():
    """denoising-diffusion-pytorch's Trainer runs cpu_count() workers, 2 on 2 CPUs: DL-1 said "Add
    DataLoader workers (up to CPUs // local ranks - 1)", which is 1, and fix would have set that."""
    steps = [StepTiming(step=i, total_ms=60.0, dataloader_ms=10.0, dataloader_unready_ms=10.0,
                        epoch_starts=int(i % 10 == 9)) for i in range(40)]
    f = cpu_facts(dataloaders=[loader(num_workers=2, persistent_workers=False)], steps=steps,
                  cpu=CpuFacts(affinity=[0, 1]))
    got = only(run("DL-1", (None, f)), "DL-1")
    assert "cannot keep up on average" in got.title and got.remedy is None
    assert got.fix.text.startswith("Make each batch cheaper to produce")
    assert "2 workers are already at least the 1 advised (CPUs // local ranks - 1 = 2 // 1 - 1)" in got.fix.text
    assert got.fix.text.endswith("keep them alive (persistent_workers=True).")
    assert got.fix.snippet == "DataLoader(dataset, num_workers=2, persistent_workers=True)"


def test_dl1_on_a_trace_without_steps_prices_the_whole_window(tmp_path):
    """No ProfilerStep, and DataLoader boundaries too irregular to be steps (waits of 30 and 2 ms in
    turn): the wait is still found, as time in the traced window (a public ResNet trace, 46% of its
    window waiting for the loader, had no DL-1 at all and was diagnosed host-bound)."""
    from kineto_builder import TraceBuilder
    from torchdoctor.session import analyze_paths

    b, t = TraceBuilder(), 0.0
    for i in range(10):
        wait = 30_000.0 if i % 2 == 0 else 2_000.0
        b.dataloader(t, wait)
        t += wait
        b.kernel("ampere_sgemm_128x64_nn", t + 100.0, 5_000.0, launch_at=t + 10.0)
        t += 6_000.0
    report = analyze_paths([str(b.write(tmp_path / "rank0.json"))])
    r = report.ranks[0].analysis
    assert r is not None and not r.window.steps
    window_ms = (r.window.end_ns - r.window.start_ns) / 1e6
    waited = r.metrics.dataloader_exposed_pct / 100 * window_ms
    assert waited == pytest.approx(4 * 30.0 + 5 * 2.0, abs=0.5)  # the waits after the first kernel
    # Single-process loading: DL-2 claims what workers would hide, DL-1 the rest; together, every wait.
    dl = [only(report.findings, "DL-1"), only(report.findings, "DL-2")]
    assert all(f.per == "window" and "the traced window waits" in f.title for f in dl)
    assert sum(f.recoverable_ms for f in dl) == pytest.approx(waited, abs=0.5)
    assert dl[0].recoverable_pct == pytest.approx(100 * dl[0].recoverable_ms / window_ms, abs=0.1)


def test_dl6_silent_when_an_epoch_is_far_longer_than_a_restart():
    """karpathy/minGPT's Trainer: RandomSampler(replacement=True, num_samples=10**10), one iterator for the
    whole job; DL-6 said 'restarted at every epoch' at 0.0%."""
    steps = [StepTiming(step=i, total_ms=100.0) for i in range(5)]
    huge = loader(num_workers=4, persistent_workers=False, dataset_len=10**10, batch_size=16)
    assert run("DL-6", (None, gpu_facts(dataloaders=[huge], steps=steps))) == []
    # 4,000 steps an epoch: 0.1 ms of restart per 100 ms step, the threshold itself.
    edge = loader(num_workers=4, persistent_workers=False, dataset_len=40_000, batch_size=10)
    assert abs(only(run("DL-6", (None, gpu_facts(dataloaders=[edge], steps=steps))), "DL-6").recoverable_ms - 0.1) < 1e-9
