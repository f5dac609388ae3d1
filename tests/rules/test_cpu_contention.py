"""HO-14: the training thread's measured run-queue delay, apportioned among who holds the CPUs."""

from __future__ import annotations

import msgspec
import pytest

from torchdoctor.facts import CpuFacts, DataLoaderFacts, DeviceFacts, StepTiming

from .conftest import cpu_facts, only, run


def steps(n=20, total=100.0, delay=20.0, thread_cpu=70.0):
    return [StepTiming(step=i, total_ms=total, thread_cpu_ms=thread_cpu, run_delay_ms=delay) for i in range(n)]


def rank(r, delay=20.0, main=100.0, workers=0.0, busy=200.0, host="h", mask=(0, 1), threads=1):
    return cpu_facts(rank=r, hostname=host, steps=steps(delay=delay),
                     cpu=CpuFacts(affinity=list(mask), main_process_cpu_pct=main, dataloader_workers_cpu_pct=workers,
                                  affinity_cpus_busy_pct=busy, local_world_size=2, torch_num_threads=threads))


def test_workers_holding_the_cores_are_claimed_in_proportion_to_their_cpu_time():
    # Two one-thread ranks on 2 CPUs (each has its core), main processes 80% of a core, workers 60%
    # each, the CPUs busy 300%: competitors of rank 0 = workers 120 + other processes 300 - 280 = 20.
    a, b = rank(0, main=80.0, workers=60.0, busy=300.0), rank(1, main=80.0, workers=60.0, busy=300.0)
    got = only(run("HO-14", (None, a), (None, b)), "HO-14")
    assert got.recoverable_ms == pytest.approx(20.0 * 120 / 140, abs=1e-3)
    # 17% of the step: info (an upper bound, warned from 20%), low confidence, with what confirms it.
    assert got.severity == "info" and got.confidence == "low" and "DataLoader workers" in got.title
    assert "A/B" in got.confirm
    assert "nice" in got.fix.snippet
    split = got.evidence[0].values["delay_split_ms"]
    assert split["other ranks on this host"] == 0.0 and split["this process's other threads"] == 0.0


def test_the_workers_fix_follows_where_their_time_goes():
    # timm on 2 CPUs: 4 workers spend 77.5 of 80.5 ms per batch decoding and augmenting images, 3 ms in
    # its fast_collate: the advice is about the reads and transforms, not a vectorised collate.
    f = rank(0, delay=30.0, main=80.0, workers=150.0, busy=230.0)
    f.dataloaders = [DataLoaderFacts(num_workers=4, batch_size=16, worker_batches=40, worker_dataset_ms_mean=77.5,
                                     worker_collate_ms_mean=3.0, collate_fn="timm.data.loader.fast_collate")]
    got = only(run("HO-14", (None, f)), "HO-14")
    assert "reads and transforms take 96%" in got.fix.text and "collate" not in got.fix.text
    assert "77.5 ms in the dataset's reads" in got.evidence[-1].text
    f.dataloaders[0].worker_collate_ms_mean, f.dataloaders[0].worker_dataset_ms_mean = 60.0, 20.0
    got = only(run("HO-14", (None, f)), "HO-14")
    assert "collate_fn takes 75%" in got.fix.text and ".item()" in got.fix.text
    # torch's default_collate converts nothing: the advice is whole batches per __getitem__.
    f.dataloaders[0].collate_fn = "torch.utils.data._utils.collate.default_collate"
    got = only(run("HO-14", (None, f)), "HO-14")
    assert "stacking one small sample at a time" in got.fix.text and ".item()" not in got.fix.text


def test_workers_that_cost_more_than_they_give_are_told_to_go():
    """skorch's README example with two workers: a batch takes a worker 873 µs to make and the training
    thread 1.5 ms to receive (DL-1): no workers at all, rather than cheaper or nicer ones."""
    f = rank(0, delay=30.0, main=80.0, workers=150.0, busy=230.0)
    f.dataloaders = [DataLoaderFacts(num_workers=2, batch_size=128, worker_batches=1250, worker_dataset_ms_mean=0.245,
                                     worker_collate_ms_mean=0.628, ready_wait_ms_mean=1.5)]
    got = only(run("HO-14", (None, f)), "HO-14")
    assert got.fix.text.startswith("Load in the training process: num_workers=0") and "873 µs" in got.fix.text
    assert "dataloader.workers=0" in got.confirm
    assert got.fix.snippet == "DataLoader(dataset, batch_size=..., num_workers=0)"


def test_the_jobs_own_threads_compete_only_when_they_outnumber_the_cpus():
    # Two threads per rank x 2 ranks on 2 CPUs: own threads (80 - 70 = 10), the other rank (80),
    # workers (120) and other processes (20) all compete.
    a = rank(0, main=80.0, workers=60.0, busy=300.0, threads=2)
    b = rank(1, main=80.0, workers=60.0, busy=300.0, threads=2)
    got = only(run("HO-14", (None, a), (None, b)), "HO-14")
    assert got.recoverable_ms == pytest.approx(20.0 * 120 / 230, abs=1e-3)
    assert got.evidence[0].values["delay_split_ms"]["other ranks on this host"] == pytest.approx(20 * 80 / 230, abs=1e-3)


def test_workers_taking_a_large_share_warn():
    got = only(run("HO-14", (None, rank(0, delay=30.0, main=80.0, workers=150.0, busy=230.0))), "HO-14")
    assert got.severity == "warning" and got.recoverable_ms == pytest.approx(30.0, abs=1e-3)


def test_another_process_holding_the_cores_is_said_but_not_claimed():
    # One rank, no workers: the training thread runs 70% of a core, its process 75%; the CPUs were
    # busy 175% of a core: 100% by someone else.
    f = rank(0, main=75.0, busy=175.0)
    got = only(run("HO-14", (None, f)), "HO-14")
    assert got.severity == "info" and got.recoverable_ms == 0.0
    assert "other processes" in got.title and "dedicated cores" in got.fix.text


def test_the_jobs_own_child_processes_are_the_jobs_not_other_processes():
    """nnU-Net's 2d training on 2 CPUs: its batchgenerators augmenter runs 2 processes of its own (not
    DataLoader workers); the training thread waited 29.9 ms a step and HO-14 said "other processes
    (steal included) hold the CPUs: run it on dedicated cores, or measure it when the machine is quiet"."""
    f = rank(0, delay=30.0, main=150.0, busy=200.0, threads=2)
    f.cpu.child_processes_cpu_pct = 45.0
    got = only(run("HO-14", (None, f)), "HO-14")
    assert "the job's other child processes hold the 2 CPU(s)" in got.title
    assert "nnUNet_n_proc_DA" in got.fix.text and "dedicated cores" not in got.fix.text
    split = got.evidence[0].values["delay_split_ms"]
    # Busy 200 = main 150 + children 45 + 5 by others: the delay is apportioned 45 : 5.
    assert split["the job's other child processes"] == pytest.approx(30.0 * 45 / 50, abs=1e-3)
    assert split["other processes (steal included)"] == pytest.approx(30.0 * 5 / 50, abs=1e-3)
    assert got.recoverable_ms == 0.0  # said, not claimed: fewer of them may starve the steps


def test_silent_below_the_scheduler_jitter_and_without_counters():
    assert run("HO-14", (None, rank(0, delay=1.0, workers=100.0))) == []
    f = rank(0, workers=100.0)
    f.steps = [StepTiming(step=i, total_ms=100.0) for i in range(20)]  # no schedstat (not Linux)
    assert run("HO-14", (None, f)) == []


def test_ranks_on_other_hosts_or_disjoint_cpus_are_not_competitors():
    a = rank(0, main=80.0, workers=60.0, mask=(0, 1), threads=3)  # oversubscribed: ranks that share count
    far = rank(1, main=80.0, host="other")  # no workers: nothing to claim, rank 0 speaks
    apart = rank(2, main=80.0, mask=(2, 3))
    got = only(run("HO-14", (None, a), (None, far), (None, apart)), "HO-14")
    held = got.evidence[0].values["holders_pct_of_core"]
    assert held["other ranks on this host"] == 0.0 and held["this process's other threads"] == 10.0


def converting(cpu_ms=9.0, worker_cpu_ms=12.0, syncs=2080.0, collate_ms=20.0, dataset_ms=30.0):
    return DataLoaderFacts(num_workers=2, collate_fn="train.pad_collate", worker_pids=[11, 12], worker_batches=80,
                           worker_dataset_ms_mean=dataset_ms, worker_collate_ms_mean=collate_ms,
                           worker_collate_cpu_ms_mean=cpu_ms, worker_cpu_ms_mean=worker_cpu_ms,
                           worker_collate_syncs_per_batch=syncs)


def test_a_converting_collate_measured_in_the_workers_is_the_excess_and_warns():
    # One rank, 2 intra-op threads on 2 CPUs (they cover every CPU): each ms a worker's collate holds a
    # CPU is taken from a training thread, so the claim is the collate's CPU time per batch, 9 ms of a
    # 100 ms step, above the workers' share of the training thread's delay (10 ms x 120/220: workers
    # 120% of a core, other processes 300 - 200 = 100%).
    f = rank(0, delay=10.0, main=80.0, workers=120.0, busy=300.0, threads=2)
    f.dataloaders = [converting()]
    got = only(run("HO-14", (None, f)), "HO-14")
    assert got.recoverable_ms == pytest.approx(9.0, abs=1e-3)
    assert got.severity == "warning" and got.confidence == "medium"  # the excess is known: the usual ladder
    assert "train.pad_collate" in got.title and "2080" in got.title and "torch.stack" in got.fix.snippet
    inside = got.evidence[-1]
    assert inside.values["threads_cover_cpus"] is True and "30.0 ms in the dataset's reads" in inside.text


def test_with_fewer_threads_than_cpus_the_training_threads_delay_bounds_the_collate():
    # One thread on 4 CPUs: the workers' part of the delay (20 x 120/220 ms) times the collate's
    # share of the workers' CPU (9 of 12 ms).
    f = rank(0, delay=20.0, main=80.0, workers=120.0, busy=300.0, mask=(0, 1, 2, 3), threads=1)
    f.dataloaders = [converting()]
    got = only(run("HO-14", (None, f)), "HO-14")
    assert got.recoverable_ms == pytest.approx(20.0 * 120 / 220 * 9 / 12, abs=1e-3)
    assert got.evidence[-1].values["threads_cover_cpus"] is False


def test_a_collate_without_conversions_keeps_the_upper_bound_reading():
    f = rank(0, delay=10.0, main=80.0, workers=120.0, busy=300.0, threads=2)
    f.dataloaders = [converting(syncs=0.0)]
    got = only(run("HO-14", (None, f)), "HO-14")
    assert got.severity == "info" and got.confidence == "low"  # necessary work cannot be told from excess
    assert got.recoverable_ms == pytest.approx(10.0 * 120 / 220, abs=1e-3)


def test_a_converting_collate_is_priced_by_its_cpu_only_where_it_can_give_the_cpu_back():
    base = rank(0, delay=10.0, main=80.0, workers=120.0, busy=300.0, threads=2)
    # One .item() per batch (a padding collate's lengths.max()) with 32 samples: not element by
    # element, the upper-bound reading stays.
    padding = msgspec.structs.replace(base, dataloaders=[msgspec.structs.replace(converting(syncs=1.0), batch_size=32)])
    got = only(run("HO-14", (None, padding)), "HO-14")
    assert got.confidence == "low" and got.recoverable_ms == pytest.approx(10.0 * 120 / 220, abs=1e-3)
    # A loader that falls behind (the step waits 20 ms for batches not produced yet) sets the pace:
    # HO-14 keeps the upper-bound reading (HO-3 claims the collate's share of the wait).
    behind = msgspec.structs.replace(base, dataloaders=[converting()],
                                     steps=[msgspec.structs.replace(s, dataloader_ms=20.0, dataloader_unready_ms=20.0)
                                            for s in base.steps])
    got = only(run("HO-14", (None, behind)), "HO-14")
    assert got.confidence == "low" and "collate_fn" not in got.title
    # On an accelerator the training thread's delay bounds it: 10 x 120/220 x 9/12 ms.
    gpu = msgspec.structs.replace(base, dataloaders=[converting()], device=DeviceFacts(kind="cuda", name="H100"))
    got = only(run("HO-14", (None, gpu)), "HO-14")
    assert got.recoverable_ms == pytest.approx(10.0 * 120 / 220 * 9 / 12, abs=1e-3)
    assert got.evidence[-1].values["threads_cover_cpus"] is True  # covered, but the device's job
