"""DI-17: the ranks of a job repeat each other's work."""

from __future__ import annotations

from torchdoctor.facts import DataLoaderFacts, DDPFacts, StepTiming, TensorParallelFacts

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


def test_proper_data_parallelism_says_nothing():
    other = [(s, x * 1.01) for s, x in LOSSES]
    ddp = [DDPFacts(find_unused_parameters=False)]
    assert run("DI-17", _rank(0, ddp=ddp), _rank(1, losses=other, ddp=ddp)) == []
    # Communication seen by the probe alone (a hand-written all-reduce of the gradients) is enough too.
    talking = _rank(1, losses=other)
    talking[1].steps[3].comm_ms = 2.0
    assert run("DI-17", _rank(0), talking) == []
    # Identical losses at fewer than 3 common steps prove nothing; one rank, nothing to compare.
    assert run("DI-17", _rank(0, losses=LOSSES[:2], ddp=ddp), _rank(1, losses=LOSSES[:2], ddp=ddp)) == []
    assert run("DI-17", _rank(0, world=1)) == []
    # Tensor-parallel ranks compute the same loss by design.
    tp = TensorParallelFacts()
    assert run("DI-17", _rank(0, tensor_parallel=tp), _rank(1, tensor_parallel=tp)) == []
    # So may ranks that communicate without a data-parallel wrapper (model parallelism of their own).
    model_parallel = _rank(1)
    model_parallel[1].steps[0].comm_ms = 3.0
    assert run("DI-17", _rank(0), model_parallel) == []
