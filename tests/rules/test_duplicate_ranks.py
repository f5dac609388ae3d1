"""DI-17: the ranks of a job repeat each other's work."""

from __future__ import annotations

from torchdoctor.facts import DataLoaderFacts, DDPFacts, FSDPFacts, StepTiming, TensorParallelFacts

from .conftest import cpu_facts, cpu_result, only, run, run_all

LOSSES = [(1, 8.346250534057617), (2, 8.301437377929688), (3, 8.372706413269043), (4, 8.352306365966797)]


def _rank(rank: int, losses=LOSSES, world: int = 2, **kw):
    kw.setdefault("dataloaders", [DataLoaderFacts(batches=30, batches_per_epoch=95, batch_size=4, dataset_len=380,
                                                  created_by="transformers")])
    f = cpu_facts(rank, world_size=world, loss_samples=list(losses), train_wall_s=13.0,
                  steps=[StepTiming(step=i, total_ms=400.0) for i in range(12)], **kw)
    return cpu_result(rank), f


def test_trl_under_torchrun_on_a_cpu_without_use_cpu():
    """trl's sft.py under torchrun --nproc_per_node 2 (accelerate's DistributedType NO): both ranks read the
    same 8 losses, and each loader yields the whole 380-sample dataset."""
    f = only(run("DI-17", _rank(0), _rank(1)), "DI-17")
    assert f.severity == "critical" and f.per == "job" and f.job_pct == 50.0 and f.job_s == 6.5
    assert f.title.startswith("All 2 ranks computed the same loss at every step compared (4 steps)")
    assert "1 of the 2 ranks repeats" in f.title and f.ranks == [0, 1]
    assert "95 batches of 4 per epoch from a 380-sample dataset: the whole dataset" in f.evidence[1].text
    assert "use_cpu=True" in f.fix.snippet
    # A critical cost of half the job is what to fix first, before any share of the step.
    top = run_all(_rank(0), _rank(1))[0]
    assert top.id == "DI-17"


def test_ddp_over_the_same_batches_needs_a_distributed_sampler():
    ddp = [DDPFacts(find_unused_parameters=False)]
    f = only(run("DI-17", _rank(0, ddp=ddp), _rank(1, ddp=ddp)), "DI-17")
    assert f.severity == "critical" and "DistributedSampler" in f.fix.snippet
    assert f.evidence[1].text.startswith("DistributedDataParallel wraps the model")


def test_ranks_that_never_communicate_without_losses_to_compare():
    own = [DataLoaderFacts(batches=30, batches_per_epoch=95, batch_size=4, dataset_len=380)]  # the job's own loop
    f = only(run("DI-17", _rank(0, losses=[], dataloaders=own), _rank(1, losses=[], dataloaders=own)), "DI-17")
    assert f.severity == "warning" and f.per == "step" and not f.job_pct
    assert f.title.startswith("The 2 ranks never communicate") and "DistributedDataParallel" in f.fix.snippet
    assert "(no process group)" in f.evidence[0].text
    # With a process group and no profiled window, nothing shows the absence of communication (DeepSpeed's
    # engine or a hand-written all-reduce are invisible to the probe between windows).
    grouped = [_rank(r, losses=[], dataloaders=own, distributed_backend="gloo") for r in (0, 1)]
    for r, _ in grouped:
        r.window.steps = []
    assert run("DI-17", *grouped) == []
    # Losses compared and different: separate trainings (a sweep), not repeated work.
    assert run("DI-17", _rank(0, dataloaders=own), _rank(1, dataloaders=own,
                                                          losses=[(s, x + 1.0) for s, x in LOSSES])) == []


def test_proper_data_parallelism_says_nothing():
    other = [(s, x * 1.01) for s, x in LOSSES]
    ddp = [DDPFacts(find_unused_parameters=False)]
    assert run("DI-17", _rank(0, ddp=ddp), _rank(1, losses=other, ddp=ddp)) == []
    # Communication DDP's own timings saw is enough too.
    talking = _rank(1, losses=other)
    talking[1].steps[3].comm_ms = 2.0
    assert run("DI-17", _rank(0), talking) == []
    # Identical losses at fewer than 3 common steps prove nothing; one rank, nothing to compare.
    assert run("DI-17", _rank(0, losses=LOSSES[:2], ddp=ddp), _rank(1, losses=LOSSES[:2], ddp=ddp)) == []
    assert run("DI-17", _rank(0, world=1)) == []
    # A loss gathered from every rank (open_clip's ClipLoss) is the same on all of them under DDP with a
    # DistributedSampler: the loader's share says the batches differ.
    sharded = [DataLoaderFacts(batches=30, batches_per_epoch=48, batch_size=4, dataset_len=380)]
    assert run("DI-17", _rank(0, ddp=ddp, dataloaders=sharded), _rank(1, ddp=ddp, dataloaders=sharded)) == []
    # A loss that does not move (0 in a GRPO group without advantage) says nothing of the batches.
    flat = [(s, 2.5) for s, _ in LOSSES]
    assert run("DI-17", _rank(0, losses=flat, ddp=ddp), _rank(1, losses=flat, ddp=ddp)) == []
    # Tensor-parallel ranks compute the same loss by design.
    tp = TensorParallelFacts()
    assert run("DI-17", _rank(0, tensor_parallel=tp), _rank(1, tensor_parallel=tp)) == []
    # So may ranks that communicate without a data-parallel wrapper (model parallelism of their own).
    model_parallel = _rank(1)
    model_parallel[1].steps[0].comm_ms = 3.0
    assert run("DI-17", _rank(0), model_parallel) == []


def test_ranks_that_did_not_report_or_do_not_train():
    # 2 of 4 ranks reported: a warning that says so, priced on what was compared.
    f = only(run("DI-17", _rank(0, world=4), _rank(1, world=4)), "DI-17")
    assert f.severity == "warning" and "2 of the job's 4 ranks reported" in f.evidence[0].text
    assert f.title.startswith("2 ranks computed the same loss")
    # An evaluation-only rank (no training step) is not a rank that repeats the work.
    idle = _rank(1)
    idle[1].steps = []
    assert run("DI-17", _rank(0), idle) == []



def test_a_loop_of_its_own_under_accelerate_on_a_cpu_is_told_to_use_the_cpu():
    prepared = [DataLoaderFacts(batches=30, batches_per_epoch=95, batch_size=4, dataset_len=380, created_by="accelerate")]
    f = only(run("DI-17", _rank(0, dataloaders=prepared), _rank(1, dataloaders=prepared)), "DI-17")
    assert "Accelerator(cpu=True)" in f.fix.snippet and "ACCELERATE_USE_CPU=1" in f.fix.snippet


def test_the_same_batches_on_a_gpu_job_whose_losses_are_never_read():
    """DDP over a plain DataLoader on GPUs: the loss lives on the device (never read), but the batches'
    host fingerprints are the same on both ranks."""
    fps = [(i, 1000.0 + 7 * i) for i in range(1, 9)]
    loader = [DataLoaderFacts(batches=30, batches_per_epoch=32, batch_size=16, dataset_len=512, batch_samples=fps)]
    ddp = [DDPFacts(find_unused_parameters=False)]
    ranks = [_rank(r, losses=[], ddp=ddp, dataloaders=loader) for r in (0, 1)]
    f = only(run("DI-17", *ranks), "DI-17")
    assert f.severity == "critical" and f.title.startswith("All 2 ranks drew the same batches (8 batches)")
    assert f.evidence[0].text.startswith("8 of the first batches each rank drew have the same fingerprints")
    # Different batches overrule equal losses (a loss gathered from every rank, without a loader length to go by).
    other = [DataLoaderFacts(batches=30, batch_samples=[(i, x + 1.0) for i, x in fps])]
    mine = [DataLoaderFacts(batches=30, batch_samples=fps)]
    assert run("DI-17", _rank(0, ddp=ddp, dataloaders=mine), _rank(1, ddp=ddp, dataloaders=other)) == []


def test_lightning_is_told_to_let_it_put_the_sampler_in():
    """Lightning's BoringModel under Trainer(strategy="ddp", devices=2, use_distributed_sampler=False)."""
    ddp = [DDPFacts(find_unused_parameters=False, created_by="lightning")]
    own = [DataLoaderFacts(batches=60, batches_per_epoch=200, batch_size=32, dataset_len=6400)]
    f = only(run("DI-17", _rank(0, ddp=ddp, dataloaders=own), _rank(1, ddp=ddp, dataloaders=own)), "DI-17")
    assert "use_distributed_sampler=True" in f.fix.snippet and f.severity == "critical"


def test_the_same_batches_with_other_losses_or_under_fsdp_alone():
    fps = [(i, 1000.0 + 7 * i) for i in range(1, 9)]
    loader = [DataLoaderFacts(batches=30, batches_per_epoch=32, batch_size=16, dataset_len=512, batch_samples=fps)]
    # A sweep: the same batches, another seed each, so other losses: separate trainings, not repeated work.
    other = [(s, x + 0.5) for s, x in LOSSES]
    assert run("DI-17", _rank(0, dataloaders=loader), _rank(1, dataloaders=loader, losses=other)) == []
    # The same batch every time says nothing (a loader over one batch, a constant input).
    flat = [DataLoaderFacts(batches=30, batch_samples=[(i, 5.0) for i in range(1, 9)])]
    ddp = [DDPFacts(find_unused_parameters=False)]
    assert run("DI-17", _rank(0, losses=[], ddp=ddp, dataloaders=flat), _rank(1, losses=[], ddp=ddp,
                                                                             dataloaders=flat)) == []
    # FSDP known only by its batches may be context parallelism (its ranks load the same batch): a warning.
    fsdp = [FSDPFacts(version=2)]
    f = only(run("DI-17", *[_rank(r, losses=[], fsdp=fsdp, dataloaders=loader) for r in (0, 1)]), "DI-17")
    assert f.severity == "warning" and f.evidence[1].text.startswith("FSDP wraps the model")

