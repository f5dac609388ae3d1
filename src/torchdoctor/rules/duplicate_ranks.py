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

Measured, not assumed: the probe keeps a fingerprint of the first batches each rank's loaders hand
over (``DataLoaderFacts.batch_samples``, probe/batches.py: read on the host, so GPU jobs too) and
each rank's first finite float32/float64 losses with their steps (``facts.loss_samples``: plain CPU
scalars, read for free). Two ranks *agree* when they share at least MIN_COMMON indices whose
values vary over them (a constant loss or batch says nothing) and are the same at each
(fingerprints exactly, losses to LOSS_RTOL); they *disagree* when they share indices whose values
differ. Every rank agreeing with the first on its batches or its losses, and none disagreeing on
either, means the same model trained on the same batches: different losses over the same batches
are separate trainings (a sweep's seeds, or context parallelism splitting each batch), different
batches with the same loss a loss gathered from every rank (open_clip's ClipLoss). That is
repeated work when the ranks are data-parallel (DDP, FSDP) or never communicate: tensor-parallel
ranks, and ranks that communicate without a data-parallel wrapper (Megatron-style model
parallelism), share their batch and loss by design, and a training loader that yields each rank a
share of its dataset (``batches_per_epoch x batch_size`` against ``dataset_len``) says the batches
differ. Critical when every rank of the world reported, each loader yields the whole dataset, and
it is not FSDP known only by its batches (FSDP composes with context parallelism, whose ranks load
the same batch); a warning otherwise. Without batches or losses to compare, ranks known not to
communicate (no process group, or profiled steps without a collective on every rank; the probe
sees no communication outside DDP's logging data) train a model each (a warning: a sweep does
that on purpose).

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


def _compare(a: Sequence[tuple[int, float]], b: Sequence[tuple[int, float]], exact: bool = False
             ) -> tuple[bool, int] | None:
    """(agree, indices compared) of two ranks' samples at their common indices; None when that says
    nothing: no common index, or a value that does not vary over them (a constant loss, a first
    backward that does not depend on the batch, the same batch every time)."""
    mine = dict(a)
    common = [(mine[i], x) for i, x in b if i in mine]
    if len({x for x, _ in common}) < 2:
        return None
    tol = 0.0 if exact else LOSS_RTOL
    agree = all(x == y or abs(x - y) <= tol * max(abs(x), abs(y)) for x, y in common)
    return agree, len(common)


def _agree(results: list[tuple[bool, int] | None]) -> int:
    """Indices compared when every pair agrees on at least MIN_COMMON of them; 0 otherwise."""
    if not results or any(r is None or not r[0] for r in results):
        return 0
    least = min(r[1] for r in results if r is not None)
    return least if least >= MIN_COMMON else 0


def _disagree(results: list[tuple[bool, int] | None]) -> bool:
    return any(r is not None and not r[0] for r in results)


def _talks(v: View) -> bool:
    """The rank wraps its model for data or model parallelism, or its trace or DDP's own timings show a
    collective (the probe times communication only through DDP's logging data: a hand-written
    all-reduce shows in a profiled window alone)."""
    f = v.f
    if f is not None and (f.ddp or f.fsdp or f.tensor_parallel is not None
                          or any(s.comm_ms > 0 for s in [*f.steps, *f.profiled_steps])):
        return True
    r = v.r
    return r is not None and (bool(r.comm_ops) or bool(r.metrics.comm_pct))


def _silent(v: View) -> bool:
    """Known not to communicate: no process group at all, or a profiled window of training steps
    without any collective (absence of evidence elsewhere proves nothing: DeepSpeed's engine, a
    hand-written gradient all-reduce, local SGD are invisible to the probe between windows)."""
    if _talks(v):
        return False
    if v.f is not None and v.f.distributed_backend in (None, ""):
        return True
    return v.r is not None and bool(v.r.window.steps)


def _training_loader(v: View) -> DataLoaderFacts | None:
    """The loader the training loop drew most batches from."""
    loaders = [d for d in (v.f.dataloaders if v.f is not None else []) if d.batches]
    return max(loaders, key=lambda d: d.batches or 0, default=None)


def _coverage(d: DataLoaderFacts | None) -> float | None:
    """The share of its dataset each rank's training loader yields per epoch; None when unknown."""
    if d is None or not (d.batches_per_epoch and d.batch_size and d.dataset_len):
        return None
    return d.batches_per_epoch * d.batch_size / d.dataset_len


def _unsharded(d: DataLoaderFacts | None) -> str | None:
    share = _coverage(d)
    if d is None or share is None or share < UNSHARDED_SHARE:
        return None
    return (f"each rank's loader yields {d.batches_per_epoch} batches of {d.batch_size} per epoch from a "
            f"{d.dataset_len}-sample dataset: the whole dataset, not a share of it")


def _fix(wrapped: bool, trainer: str | None, accel: bool, loader: DataLoaderFacts | None,
         wrapper: str | None = None) -> Fix:
    iterable = loader is not None and loader.batches_per_epoch is None and loader.dataset_len is None
    stream = (" The loader's dataset is iterable (no length): it has to skip the other ranks' samples itself, "
              "e.g. yield every world_size-th sample from the rank-th on." if iterable else "")
    if wrapped and wrapper in ("lightning", "pytorch_lightning"):
        # Lightning injects a DistributedSampler itself (Trainer(use_distributed_sampler=True), the default;
        # replace_sampler_ddp before 2.0) unless the job turned that off or gave the loader a sampler of its own.
        return Fix("Lightning wraps the model but the loader gives every rank the whole dataset: let Lightning "
                   "put a DistributedSampler in (use_distributed_sampler=True, its default), or make the loader's "
                   f"own sampler a distributed one.{stream}",
                   "Trainer(..., use_distributed_sampler=True)   # the default; replace_sampler_ddp=True before 2.0")
    if wrapped:
        return Fix("Give every rank its own share of the batches: a DistributedSampler for the training loader, "
                   f"with set_epoch(epoch) at each epoch so that the shuffle changes.{stream}",
                   "sampler = DistributedSampler(dataset, shuffle=True)\n"
                   "loader = DataLoader(dataset, batch_size=B, sampler=sampler)\n"
                   "for epoch in range(E):\n    sampler.set_epoch(epoch)")
    if trainer == "transformers" and not accel:
        return Fix("accelerate found no accelerator and set up no distributed training: on a CPU machine the "
                   "Trainer trains in parallel only with use_cpu=True, which makes it wrap the model in DDP over "
                   "gloo and give each rank its share of the batches.",
                   "TrainingArguments(..., use_cpu=True)   # a script of its own arguments: --use_cpu True")
    if trainer == "accelerate" and not accel:
        return Fix("accelerate found no accelerator and set up no distributed training: on a CPU machine it runs "
                   "DDP over gloo, and shards the prepared loaders, only when told to use the CPU.",
                   "accelerator = Accelerator(cpu=True)   # or: accelerate launch --cpu ..., or ACCELERATE_USE_CPU=1")
    return Fix("Wrap the model in DistributedDataParallel (or FSDP) after init_process_group, and give the training "
               "loader a DistributedSampler (set_epoch(epoch) each epoch). If the ranks are meant to run separate "
               f"trainings (a sweep), give each its own seed and data.{stream}",
               "model = DistributedDataParallel(model)\n"
               "loader = DataLoader(dataset, batch_size=B, sampler=DistributedSampler(dataset))")


@rule("DI-17")
def ranks_repeat_each_other(inputs: RuleInputs) -> list[Finding]:
    """The ranks of a job do the same work: no data parallelism, or the same batches on every rank."""
    every = views(inputs)
    world = max((v.f.world_size for v in every if v.f is not None), default=1)
    # The ranks that train (an evaluation-only or waiting rank repeats nothing).
    vs = [v for v in every if v.f is not None and v.f.steps]
    if len(vs) < 2 or world < 2:
        return []
    first = vs[0]
    assert first.f is not None
    # The same batches (their fingerprints, read on the host: GPU jobs too), or the same losses (CPU scalars).
    mine = _training_loader(first)
    theirs = [_training_loader(v) for v in vs[1:]]
    by_batch = [_compare(mine.batch_samples, d.batch_samples, exact=True) if mine and d else None for d in theirs]
    by_loss = [_compare(first.f.loss_samples, v.f.loss_samples) for v in vs[1:] if v.f is not None]
    same_batches, same_losses = _agree(by_batch), _agree(by_loss)
    talks = any(_talks(v) for v in every)
    ddp = any(v.f is not None and v.f.ddp for v in vs)
    fsdp = any(v.f is not None and v.f.fsdp for v in vs)
    wrapped = [w for w, on in (("DistributedDataParallel", ddp), ("FSDP", fsdp)) if on]
    # Tensor-parallel ranks share their loss by design, and so may ranks that communicate without a
    # data-parallel wrapper (Megatron-style model parallelism); a loader that yields each rank its share
    # says the batches differ (module docstring).
    model_parallel = any(v.f is not None and v.f.tensor_parallel is not None for v in vs)
    loader = mine
    coverage = _coverage(loader)
    sharded = coverage is not None and coverage < UNSHARDED_SHARE
    identical = ((same_batches or same_losses) and not _disagree(by_batch) and not _disagree(by_loss)
                 and not model_parallel and not sharded and (bool(wrapped) or not talks))
    compared = any(r is not None for r in [*by_batch, *by_loss])
    silent = not compared and all(_silent(v) for v in vs) and not talks
    if not identical and not silent:
        return []
    by_batches = bool(same_batches)
    agreed = same_batches or same_losses
    n = len(vs)
    seen_all = len(every) >= world and n == world
    sharding = _unsharded(loader)
    trainer = loader.created_by if loader is not None else None
    evidence = []
    if identical:
        what = "drew the same batches" if by_batches else "computed the same loss at every step compared"
        title = (f"{'All ' if seen_all else ''}{n} ranks {what} ({agreed} "
                 f"{'batches' if by_batches else 'steps'}): they train the same model on the same batches, so "
                 f"{n - 1} of the {n} ranks {'repeats' if n == 2 else 'repeat'} the first one's work.")
        if by_batches:
            assert mine is not None
            seen = (f"{agreed} of the first batches each rank drew have the same fingerprints on every rank (a "
                    "position-weighted sum of their first host tensors' leading elements)")
        else:
            steps = sorted(dict(first.f.loss_samples))
            seen = (f"Losses read by the probe at steps {steps[0]}–{steps[-1]} are identical on every rank "
                    f"(rank {first.rank}: {', '.join(f'{x:.6g}' for _, x in first.f.loss_samples[:4])}...)")
        evidence.append(Evidence(
            seen + ("." if seen_all else f"; {n} of the job's {world} ranks reported (the others were not compared)."),
            {"ranks": n, "world_size": world, "compared": agreed, "by": "batches" if by_batches else "losses"}))
    else:
        title = (f"The {n} ranks never communicate: no DDP, FSDP or tensor-parallel wrapper and no collective, so "
                 "each trains a model of its own.")
    evidence.append(Evidence(
        (f"{' and '.join(wrapped)} wraps the model, so gradients are averaged, but over identical batches"
         if wrapped else "No rank wrapped its model (DDP, FSDP, tensor parallel) and none ran a collective "
                         + ("(no process group)" if all(v.f is not None and not v.f.distributed_backend for v in vs)
                            else "in its profiled steps" if all(v.r is not None and v.r.window.steps for v in vs)
                            else "that the probe saw"))
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
    # Critical when the loader confirms every rank reads the whole dataset and every rank reported; FSDP
    # known only by its batches may be context parallelism (its ranks load the same batch).
    critical = identical and sharding is not None and seen_all and not (fsdp and not same_losses)
    f = finding(first, "DI-17", "distributed", title, 0.0, sev="critical" if critical else "warning",
                evidence=evidence, fix=_fix(bool(wrapped), trainer, first.accel, loader, _wrapper_library(vs)),
                confidence="high" if critical else "medium",
                confirm=("print the loss (or the first batch's sum) on every rank: the same values at the same steps"
                         if identical else "print the loss on every rank: different values mean different models"),
                source="the probe's batch fingerprints, loss samples and wrappers on every rank; the trace's "
                       "collectives")
    f.ranks = sorted(v.rank for v in vs if v.rank is not None)
    if identical and wall:
        f.job_pct, f.per, f.job_s = round(job_pct, 1), "job", round(wall * (n - 1) / n, 3)
    return [f]


def _wrapper_library(vs: list[View]) -> str | None:
    """The installed package that wrapped the model in DDP/FSDP ("lightning"), if any."""
    for v in vs:
        for w in [*(v.f.ddp if v.f else []), *(v.f.fsdp if v.f else [])]:
            if getattr(w, "created_by", None):
                return w.created_by
    return None

