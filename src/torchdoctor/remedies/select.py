"""Which remedies to try, and with which values: from a diagnosis, checked on the run's facts (no torch).

``--apply safe`` takes every ``safe`` remedy some finding named (``Finding.remedy``), plus the
remedies that follow one of them (``Remedy.follows``: persistent workers once there are workers);
``--apply numerics`` adds the ``numerics`` class; experimental remedies are only applied by id.
Every candidate then passes the preconditions the facts can decide (an accelerator, unused
parameters, static graph, CPUs); the job re-checks them itself at run time.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ..advice.checkpointing import memory_full
from ..advice.workers import WORKERS_PER_CPU_CAP, advise_workers, training_busy_pct
from ..facts import RankFacts, sampled_comm_median
from ..rules.model import Finding
from .catalogue import BY_ID, REMEDIES, SAFETY_RANK, Spec


@dataclass
class Choice:
    spec: Spec
    why: str  # what picked it: findings, "asked for", "follows ..."


@dataclass
class JobFacts:
    """What the preconditions need, from the facts of one run (all ranks)."""

    ranks: list[RankFacts]

    @property
    def first(self) -> RankFacts | None:
        return self.ranks[0] if self.ranks else None

    @property
    def cpus(self) -> int:
        f = self.first
        return (len(f.cpu.affinity) or f.cpu.logical_cpus or 1) if f else 1

    @property
    def local_ranks(self) -> int:
        f = self.first
        if f is None:
            return 1
        if f.cpu.local_world_size:
            return f.cpu.local_world_size
        return max(1, sum(1 for r in self.ranks if r.hostname == f.hostname))

    @property
    def accelerator(self) -> bool:
        return any(r.device.kind not in ("cpu", "") for r in self.ranks)

    @property
    def cuda(self) -> bool:
        return any(r.device.kind == "cuda" for r in self.ranks)

    def median(self, attr: str) -> float | None:
        vals = [getattr(s, attr) for r in self.ranks for s in r.steps[2:]]
        return statistics.median(vals) if vals else None


def workers_for(jf: JobFacts) -> tuple[int, str]:
    """Workers per DataLoader for this job, and why that many (advice.workers.advise_workers)."""
    f = jf.first
    busy = training_busy_pct(f.steps[2:], f.cpu.main_process_cpu_pct) if f else None
    return advise_workers(jf.cpus, jf.local_ranks, jf.median("total_ms"), jf.median("dataloader_ms"), busy,
                          blocked_ms=sampled_comm_median([s for r in jf.ranks for s in r.steps[2:]]))


def precondition(spec: Spec, jf: JobFacts, specs: list[Spec]) -> str | None:
    """Why the facts rule ``spec`` out for this job, or None."""
    r, f = spec.remedy, jf.first
    if f is None:
        return None  # nothing known: the job checks at run time
    if r.gpu_only and not jf.accelerator:
        return f"needs an accelerator; this job trains on {f.device.kind}"
    if r.id == "cudagraphs" and not jf.cuda:
        return "CUDA graphs need an NVIDIA GPU"
    loaders = [d for rf in jf.ranks for d in rf.dataloaders]
    ddps = [d for rf in jf.ranks for d in rf.ddp]
    if r.target == "DataLoader" and not loaders:
        return "the job creates no DataLoader it iterates over"
    if r.target == "DistributedDataParallel" and not ddps:
        return "the job uses no DistributedDataParallel"
    if r.target == "optimizer" and not any(rf.optimizers for rf in jf.ranks):
        return "the job steps no torch.optim optimizer"
    ids = {s.id for s in specs}
    if r.id == "dataloader.workers" and spec.value and int(spec.value) > WORKERS_PER_CPU_CAP * jf.cpus:
        return (f"num_workers={spec.value} per rank is beyond {WORKERS_PER_CPU_CAP} per CPU of the {jf.cpus} "
                f"CPU(s) of the affinity mask ({jf.local_ranks} local rank(s))")
    if r.id in ("dataloader.persistent_workers", "dataloader.prefetch") and "dataloader.workers" not in ids \
            and not any(d.num_workers for d in loaders):
        return "the DataLoader has no worker processes (num_workers=0)"
    if r.id == "ddp.find_unused_false":
        unused = max((d.unused_parameter_size or 0 for d in ddps), default=0)
        if unused:
            return f"DDP saw {unused} bytes of unused parameters: with find_unused_parameters=False it would fail"
    if r.id == "ddp.static_graph" and any(d.can_set_static_graph is False for d in ddps):
        return "DDP reports the graph is not static (can_set_static_graph=False)"
    if r.id == "memory.no_checkpoint":
        full = max((share for rf in jf.ranks if (share := memory_full(rf.device.max_memory_allocated_bytes,
                                                                     rf.device.total_memory_bytes))), default=None)
        if full is not None:
            return (f"the device's peak was {full:.0%} of its memory: the activations checkpointing drops may not "
                    "fit, and an arm out of memory would end the A/B of every remedy tried with it (`--apply "
                    "memory.no_checkpoint` tries it alone)")
    return None


# The evidence value that carries a finding's advice for its remedy's value.
ADVISED_VALUE = {"dataloader.workers": "advised_workers", "threads.affinity": "advised_threads"}


def choose(findings: list[Finding], level: str) -> list[Choice]:
    """The remedies of class <= ``level`` that the findings name, with their followers."""
    fired: dict[str, list[Finding]] = {}
    for f in findings:
        if f.remedy in BY_ID:
            fired.setdefault(f.remedy, []).append(f)
    rank = SAFETY_RANK[level]
    out: list[Choice] = []
    for r in REMEDIES:
        if SAFETY_RANK[r.safety] > rank or r.safety == "experimental":
            continue
        if r.id in fired:
            fs = fired[r.id]
            # The finding's own advice is the value (DL-2's worker count, HO-13's threads per process):
            # advice and remedy agree.
            key = ADVISED_VALUE.get(r.id, "")
            value = next((str(e.values[key]) for f in fs for e in f.evidence if key in e.values), None)
            out.append(Choice(Spec(r.id, value), ", ".join(sorted({f"{f.id} ({f.severity})" for f in fs}))))
    # A follower needs what it follows to exist: after num_workers=0 (DL-1: a batch costs less to make
    # than to receive) there are no workers to keep alive or prefetch with, whoever asked for them.
    if any(c.spec.id == "dataloader.workers" and c.spec.value == "0" for c in out):
        out = [c for c in out if BY_ID[c.spec.id].follows != "dataloader.workers"]
    present = {c.spec.id for c in out}
    chosen = {c.spec.id for c in out if c.spec.value != "0"}
    for r in REMEDIES:
        if r.follows in chosen and r.id not in present and SAFETY_RANK[r.safety] <= rank:
            out.append(Choice(Spec(r.id), f"follows {r.follows} ({'/'.join(r.answers)} fires once it is applied)"))
    return out


def finalize(choices: list[Choice], jf: JobFacts) -> tuple[list[Choice], dict[str, str]]:
    """Fill in values from the facts and drop what the preconditions rule out."""
    specs = [c.spec for c in choices]
    kept: list[Choice] = []
    refused: dict[str, str] = {}
    for c in choices:
        why = precondition(c.spec, jf, specs)
        if why:
            refused[c.spec.id] = why
            continue
        if c.spec.id == "dataloader.workers" and not c.spec.value and jf.first is not None:
            n, how = workers_for(jf)
            c = Choice(Spec(c.spec.id, str(n)), f"{c.why}; {n} = {how}")
        kept.append(c)
    # Followers of a refused remedy have nothing to follow.
    ids = {c.spec.id for c in kept}
    for c in list(kept):
        follows = c.spec.remedy.follows
        if follows and follows not in ids and c.why.startswith("follows"):
            kept.remove(c)
            refused[c.spec.id] = f"follows {follows}, which is not applied"
    return kept, refused
