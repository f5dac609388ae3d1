"""Reading one A/B run back: steady-state throughput from the probe's step timings, the losses
the recorder kept, and what the remedies did (no torch).

Throughput of a run = steps / time over its steady-state steps (the first ``warmup_steps(n)`` are
left out: worker start-up, allocator warm-up, DDP bucket rebuild), on the slowest rank (ranks of
a data-parallel job move in lockstep, so the slowest sets the pace). The mean rather than the
median step: a loader that keeps up on most steps and stalls on a few costs the job its stalls.
"""

from __future__ import annotations

import glob
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..facts import RankFacts, StepTiming, evaluation_only, trains


class _Entry(msgspec.Struct):
    facts: RankFacts | None = None


class _Manifest(msgspec.Struct):
    exit_code: int | None = None
    duration_s: float | None = None
    ranks: list[_Entry] = []


@dataclass
class Arm:
    """One run of the job in the A/B loop."""

    label: str  # "A1", "B1", "B1-ddp.bucket_cap"
    kind: str  # "baseline" | "treated" | "ablated" | "diagnosis"
    specs: list[str]
    run_dir: str
    round: int = 0  # A/B round: arms of one round ran back to back
    without: str | None = None  # the remedy left out (ablation)
    exit_code: int = 0
    wall_s: float = 0.0
    started: float | None = None  # time.time() when the run began (what it wrote itself is newer)
    other_cpu_share: float | None = None  # the job's CPUs other processes took meanwhile (quiet.py)
    steps_per_s: float | None = None
    samples_per_s: float | None = None
    steady_steps: int = 0
    peak_rss_mib: float | None = None  # the largest rank process's peak resident memory
    facts: list[RankFacts] = field(default_factory=list)
    losses: dict[int, list[float]] = field(default_factory=dict)
    applied: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # had nothing to change (the reason)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def warmup_steps(n: int) -> int:
    return 1 if n < 6 else max(2, n // 10)


def rank_rate(steps: list[StepTiming], batch_size: int | None) -> tuple[float, float | None, int] | None:
    """(steps/s, samples/s, steps counted) over the steady-state steps of one rank."""
    steady = steps[warmup_steps(len(steps)):]
    total_s = sum(s.total_ms for s in steady) / 1e3
    if not steady or total_s <= 0:
        return None
    samples = [s.samples for s in steady]
    if all(x is not None for x in samples):
        n_samples: float | None = float(sum(samples))  # type: ignore[arg-type]
    else:
        n_samples = float(batch_size * len(steady)) if batch_size else None
    return len(steady) / total_s, (n_samples / total_s if n_samples is not None else None), len(steady)


def job_rate(facts: list[RankFacts]) -> tuple[float | None, float | None, int]:
    """Job throughput: steps/s of the slowest rank; samples/s summed over the ranks. Beside processes
    that train, one that only evaluated (the Hogwild parent testing its children's model) is no
    rank of the training: its batches are neither its steps nor its samples."""
    if any(trains(f) for f in facts):
        facts = [f for f in facts if not evaluation_only(f)]
    rates = []
    for f in facts:
        batch = next((d.batch_size for d in f.dataloaders if d.batch_size), None)
        r = rank_rate(f.steps, batch)
        if r is not None:
            rates.append(r)
    if not rates:
        return None, None, 0
    samples = [r[1] for r in rates]
    total = sum(samples) if all(s is not None for s in samples) else None  # type: ignore[misc]
    return min(r[0] for r in rates), total, min(r[2] for r in rates)


def read_records(run_dir: str) -> list[dict[str, Any]]:
    """The remedies' records of an arm's processes, in the order they started (pid order)."""
    out = []
    paths = glob.glob(os.path.join(run_dir, "remedies", "pid*.json"))
    for path in sorted(paths, key=lambda p: (len(os.path.basename(p)), os.path.basename(p))):
        try:
            with open(path, encoding="utf-8") as f:
                out.append(json.load(f))
        except (OSError, ValueError):
            continue
    return out


def load(arm: Arm) -> Arm:
    """Fill ``arm`` from its run directory (run.json and the remedies' records)."""
    try:
        with open(os.path.join(arm.run_dir, "run.json"), "rb") as f:
            manifest = msgspec.json.decode(f.read(), type=_Manifest)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        manifest = _Manifest()
    arm.facts = [e.facts for e in manifest.ranks if e.facts is not None]
    arm.steps_per_s, arm.samples_per_s, arm.steady_steps = job_rate(arm.facts)
    arm.peak_rss_mib = max((f.peak_rss_mib for f in arm.facts if f.peak_rss_mib), default=None)
    unranked = 0
    for rec in read_records(arm.run_dir):
        if rec.get("losses"):
            rank = rec.get("rank")
            if rank is None:
                # Processes without a rank (Hogwild children, a script without a process group): the
                # first to start is -1, the next -2..., among those that recorded losses only, so
                # that the same process of each arm is compared, whatever else ran beside it.
                rank, unranked = -1 - unranked, unranked + 1
            arm.losses[int(rank)] = [float(x) for x in rec["losses"]]
        for entry in rec.get("applied", []):
            arm.applied.setdefault(entry["id"], []).append(entry)
        for entry in rec.get("refused", []):
            arm.refused.setdefault(entry["id"], entry["reason"])
        for entry in rec.get("skipped", []):
            arm.skipped.setdefault(entry["id"], entry["reason"])
    # A remedy applied in one process (a rank) and refused in another (e.g. the launcher) was applied.
    for rid in list(arm.refused):
        if rid in arm.applied:
            del arm.refused[rid]
    return arm


def resumed(arms: list[Arm], since: float) -> list[tuple[str, str]]:
    """(arm, path) for each file an arm loaded before its first step ended that lies where an arm of
    this `fix` saved checkpoints (a directory some arm saved into once training had begun) and that
    was modified between ``since`` (the start of `fix`) and the arm's own start: an earlier run's
    checkpoint, so the job resumed and did not start where the first arm did. Neither a file
    downloaded or prepared before training (pretrained weights, a processed dataset) nor one the arm
    wrote itself before loading it counts."""
    saved = {d for arm in arms for facts in arm.facts for d in facts.checkpoint_dirs}
    out = []
    for arm in arms:
        until = arm.started if arm.started is not None else math.inf
        paths = {f.path for facts in arm.facts for f in facts.loaded_files
                 if f.mtime is not None and since <= f.mtime < until and _inside(f.path, saved)}
        out += [(arm.label, p) for p in sorted(paths)]
    return out


def _inside(path: str, dirs: set[str]) -> bool:
    """``path`` is one of ``dirs`` (a DCP checkpoint directory) or lies below one."""
    return path in dirs or any(path.startswith(d.rstrip(os.sep) + os.sep) for d in dirs)


@dataclass
class LossDiff:
    compared: int  # steps compared (summed over ranks)
    max_abs: float
    max_rel: float
    first_step: int | None  # first step that differs
    identical: bool
    finite: int = 0  # steps compared with a finite loss in either run (NaN or inf in both show nothing)


def loss_diff(a: dict[int, list[float]], b: dict[int, list[float]]) -> LossDiff | None:
    """How far the losses of ``b`` are from ``a`` over the steps both recorded, rank by rank."""
    n, finite, max_abs, max_rel, first = 0, 0, 0.0, 0.0, None
    for rank, xs in a.items():
        ys = b.get(rank)
        if not ys:
            continue
        for step, (x, y) in enumerate(zip(xs, ys, strict=False)):  # the shorter run bounds it
            n += 1
            finite += math.isfinite(x) or math.isfinite(y)
            if same_value(x, y):
                continue
            d = abs(x - y) if math.isfinite(x) and math.isfinite(y) else math.inf
            max_abs = max(max_abs, d)
            max_rel = max(max_rel, d / max(abs(x), 1e-12))
            first = step if first is None else min(first, step)
    if n == 0:
        return None
    return LossDiff(n, max_abs, max_rel, first, first is None, finite)


def same_value(x: float, y: float) -> bool:
    """Equal, NaN against NaN included (a NaN loss reproduced is the same computation)."""
    return x == y or (math.isnan(x) and math.isnan(y))
