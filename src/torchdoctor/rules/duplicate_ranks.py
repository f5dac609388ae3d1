"""Distributed layer, ranks that repeat each other's work (DI-17).

A job launched on N ranks is meant to split the work N ways. Two mistakes leave every rank doing
all of it, and nothing in the step time shows them (each rank's step is as fast as a single
process's):

- **no data parallelism at all**: the processes never wrap the model in DDP/FSDP and never
  communicate. trl's SFT script under ``torchrun --nproc_per_node 2`` on a CPU machine: accelerate
  finds no accelerator and, without ``use_cpu=True``, sets up no distributed training (its
  DistributedType is NO); the Trainer then runs the whole job on each rank, 95 batches of 4 from a
  380-sample dataset on both;
- **the same batches on every rank**: DDP without a DistributedSampler averages N identical
  gradients.

Measured, not assumed: the probe keeps each rank's first finite losses with their steps
(``facts.loss_samples``: plain CPU scalars, read for free); ranks whose losses are the same at the
same steps (to LOSS_RTOL) train the same model on the same batches: N−1 of N ranks' compute
repeats the first rank's (critical), when they are data-parallel (DDP, FSDP) or never communicate:
tensor-parallel ranks, and ranks that communicate without a data-parallel wrapper (Megatron-style
model parallelism), share their loss by design. Without losses to compare (losses on a device are never read),
ranks with no DDP, FSDP or tensor-parallel wrapper and no collective in the trace or in the probe's
steps never communicate (warning: independent trainings, such as a sweep, would do the same on
purpose). What each rank's loader yields tells whether it was sharded: ``batches_per_epoch x
batch_size`` against ``dataset_len``.

Priced against the job (``per`` "job"): with the work split N ways the run would take about 1/N of
its training time at the same step time, less the all-reduce it then needs: ``job_pct`` = 100 x
(N−1)/N, an upper bound. No claim per step. Measured on trl's SFT script on 2 CPU ranks of this
2-core machine (one epoch, the Trainer's train_runtime, two runs each, alternated): 36.8 and 38.1 s
as it was (95 steps on each rank), 24.3 and 25.4 s with use_cpu=True (48 steps each, every one
paying gloo's all-reduce, the two ranks' threads sharing 2 cores): 34% less against the bound's 50%.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..facts import DataLoaderFacts
from ._common import View, finding, views
from .engine import RuleInputs, rule
from .model import Evidence, Finding, Fix

# Losses equal to this relative tolerance are the same computation (the same model, batch and kernels
# give bit-identical losses on a CPU; the tolerance only absorbs a printed round trip).
LOSS_RTOL = 1e-6
# Common steps with a loss needed to call ranks identical.
MIN_COMMON = 3
# A loader that yields at least this share of its dataset per epoch on each rank is not sharded.
UNSHARDED_SHARE = 0.9


def _same(a: Sequence[tuple[int, float]], b: Sequence[tuple[int, float]]) -> int:
    """Steps at which both ranks read a loss, when they all agree; 0 when any differs."""
    mine = dict(a)
    common = [(mine[s], x) for s, x in b if s in mine]
    if any(abs(x - y) > LOSS_RTOL * max(abs(x), abs(y), 1e-12) for x, y in common):
        return 0
    return len(common)


def _talks(v: View) -> bool:
    """The rank wraps its model for data or model parallelism, or communicated (trace or probe)."""
    f = v.f
    if f is not None and (f.ddp or f.fsdp or f.tensor_parallel is not None
                          or any(s.comm_ms > 0 for s in [*f.steps, *f.profiled_steps])):
        return True
    r = v.r
    return r is not None and (bool(r.comm_ops) or bool(r.metrics.comm_pct))


def _training_loader(v: View) -> DataLoaderFacts | None:
    """The loader the training loop drew most batches from."""
    loaders = [d for d in (v.f.dataloaders if v.f is not None else []) if d.batches]
    return max(loaders, key=lambda d: d.batches or 0, default=None)


def _unsharded(d: DataLoaderFacts | None) -> str | None:
    if d is None or not (d.batches_per_epoch and d.batch_size and d.dataset_len):
        return None
    covers = d.batches_per_epoch * d.batch_size
    if covers < UNSHARDED_SHARE * d.dataset_len:
        return None
    return (f"each rank's loader yields {d.batches_per_epoch} batches of {d.batch_size} per epoch from a "
            f"{d.dataset_len}-sample dataset: the whole dataset, not a share of it")


def _fix(wrapped: bool, trainer: str | None, accel: bool) -> Fix:
    if wrapped:
        return Fix("Give every rank its own share of the batches: a DistributedSampler for the training loader, "
                   "with set_epoch(epoch) at each epoch so that the shuffle changes.",
                   "sampler = DistributedSampler(dataset, shuffle=True)\n"
                   "loader = DataLoader(dataset, batch_size=B, sampler=sampler)\n"
                   "for epoch in range(E):\n    sampler.set_epoch(epoch)")
    if trainer == "transformers" and not accel:
        return Fix("accelerate found no accelerator and set up no distributed training: on a CPU machine the "
                   "Trainer trains in parallel only with use_cpu=True, which makes it wrap the model in DDP over "
                   "gloo and give each rank its share of the batches.",
                   "TrainingArguments(..., use_cpu=True)   # a script of its own arguments: --use_cpu True")
    return Fix("Wrap the model in DistributedDataParallel (or FSDP) after init_process_group, and give the training "
               "loader a DistributedSampler (set_epoch(epoch) each epoch). If the ranks are meant to run separate "
               "trainings (a sweep), give each its own seed and data.",
               "model = DistributedDataParallel(model)\n"
               "loader = DataLoader(dataset, batch_size=B, sampler=DistributedSampler(dataset))")


@rule("DI-17")
def ranks_repeat_each_other(inputs: RuleInputs) -> list[Finding]:
    """The ranks of a job do the same work: no data parallelism, or the same batches on every rank."""
    vs = [v for v in views(inputs) if v.f is not None]
    world = max((v.f.world_size for v in vs if v.f is not None), default=1)
    if len(vs) < 2 or world < 2:
        return []
    first = vs[0]
    assert first.f is not None
    agree = [_same(first.f.loss_samples, v.f.loss_samples) for v in vs[1:] if v.f is not None]
    talks = any(_talks(v) for v in vs)
    wrapped = any(v.f is not None and (v.f.ddp or v.f.fsdp) for v in vs)
    # Tensor-parallel ranks share their loss by design, and so may ranks that communicate without a
    # data-parallel wrapper (Megatron-style model parallelism): identical losses mean repeated work only
    # under DDP/FSDP (the same batches) or without any communication.
    model_parallel = any(v.f is not None and v.f.tensor_parallel is not None for v in vs)
    identical = (bool(agree) and min(agree) >= MIN_COMMON and not model_parallel and (wrapped or not talks))
    if not identical and talks:
        return []
    n = len(vs)
    loader = _training_loader(first)
    sharding = _unsharded(loader)
    trainer = loader.created_by if loader is not None else None
    evidence = []
    if identical:
        steps = sorted(dict(first.f.loss_samples))
        title = (f"All {n} ranks computed the same loss at every step compared ({min(agree)} steps): they train "
                 f"the same model on the same batches, so {n - 1} of the {n} ranks {'repeats' if n == 2 else 'repeat'} the "
                 "first one's work.")
        evidence.append(Evidence(
            f"Losses read by the probe at steps {steps[0]}–{steps[-1]} are identical on every rank "
            f"(rank {first.rank}: {', '.join(f'{x:.6g}' for _, x in first.f.loss_samples[:4])}...).",
            {"ranks": n, "steps_compared": min(agree)}))
    else:
        title = (f"The {n} ranks never communicate: no DDP, FSDP or tensor-parallel wrapper and no collective, so "
                 "each trains a model of its own.")
    evidence.append(Evidence(
        ("DistributedDataParallel wraps the model, so gradients are averaged, but over identical batches"
         if wrapped else "No rank wrapped its model (DDP, FSDP, tensor parallel) and none ran a collective in the "
                         "trace or in any step the probe timed")
        + (f"; {sharding}." if sharding else "."),
        {"wrapped": wrapped, "world_size": world,
         "batches_per_epoch": loader.batches_per_epoch if loader else None,
         "dataset_len": loader.dataset_len if loader else None}))
    wall = first.f.train_wall_s
    job_pct = 100.0 * (n - 1) / n
    if identical:
        evidence.append(Evidence(
            f"With the batches split {n} ways each rank does 1/{n} of the work: at most {job_pct:.0f}% of the job's "
            f"training time{f' ({wall * (n - 1) / n:.1f} s of {wall:.1f} s)' if wall else ''} comes back, less the "
            "all-reduce every step then pays.", {"job_pct_upper_bound": round(job_pct, 1)}))
    f = finding(first, "DI-17", "distributed", title, 0.0, sev="critical" if identical else "warning",
                evidence=evidence, fix=_fix(wrapped, trainer, first.accel),
                confidence="high" if identical else "medium",
                confirm=("compare the ranks' losses in their logs: the same values at the same steps"
                         if identical else "print the loss on every rank: different values mean different models"),
                source="the probe's loss samples and wrappers on every rank; the trace's collectives")
    f.ranks = sorted(v.rank for v in vs if v.rank is not None)
    if identical:
        f.job_pct, f.per = round(job_pct, 1), "job"
        f.job_s = round(wall * (n - 1) / n, 3) if wall else 0.0
    return [f]
