"""Shared pieces of the bundled single-process CPU jobs (``workloads.lm``, ``workloads.mlp``).

Both jobs train a small model on a map-style dataset whose every read costs a fixed latency (a
sleep, as a tokenizer service, network or object-store round trip) plus a little CPU work, and
switch real field problems on and off with ``--pathologies a,b`` / ``--healthy``:

========================= =====================================================================
main_process_loader       DataLoader(num_workers=0): every sample's latency and decode run
                          inside the step (healthy: HEALTHY_WORKERS persistent workers,
                          prefetch_factor=PREFETCH)
syncing_collate           collate_fn rebuilds the batch element by element through ``.item()``,
                          ``.tolist()`` and ``.numpy()`` (healthy: default_collate, one stack)
non_persistent_workers    DataLoader(persistent_workers=False) with short epochs: the workers
                          and their start-up (``worker_init_fn``) are redone every epoch
oversubscribed_threads    ``torch.set_num_threads(THREAD_FACTOR x CPUs)``, as torch does in a
                          container that hides the host's cores from it (healthy: one thread per
                          CPU in the affinity mask)
anomaly_detection         ``torch.autograd.set_detect_anomaly(True)`` left on after debugging
========================= =====================================================================

Each job declares which of them it offers (``JobSpec.pathologies``). Everything is seeded, so a
run computes the same losses every time.

Every variant, healthy or not, raises glibc malloc's thresholds at start-up (advice/host_allocator):
with glibc's defaults some runs of these jobs fell into per-step page faults (HO-15 warned on 13 of
66 runs of the 12-04 accuracy matrix, 3 healthy mlp runs among them, at 6-13% of the step), which
are the demo's ``allocator_churn`` pathology and not one these jobs measure.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from torchdoctor.advice.host_allocator import keep_freed_memory

PATHOLOGIES = {
    "main_process_loader": "DataLoader(num_workers=0): the per-sample latency runs inside the step",
    "syncing_collate": "collate_fn converts the batch element by element (.item()/.tolist()/.numpy())",
    "non_persistent_workers": "DataLoader(persistent_workers=False) with short epochs: workers restart",
    "oversubscribed_threads": "torch.set_num_threads(4 x CPUs): intra-op threads fight for the cores",
    "anomaly_detection": "torch.autograd.set_detect_anomaly(True) left on",
}
HEALTHY_WORKERS = 2  # the loader waits on its latency, not on the CPU: two suffice on 2 cores
PREFETCH = 4  # batches per worker in flight
THREAD_FACTOR = 4  # oversubscribed_threads: threads per CPU


@dataclass(frozen=True)
class JobSpec:
    """What one job offers: its name, pathologies and default size."""

    prog: str
    description: str
    pathologies: tuple[str, ...]
    default_steps: int


def cpus() -> int:
    """CPUs this process may run on (its affinity mask)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def parse_args(spec: JobSpec, argv: list[str] | None = None,
               extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """The common options of a bundled job; ``extra`` adds the job's own."""
    p = argparse.ArgumentParser(prog=spec.prog, description=spec.description)
    if extra is not None:
        extra(p)
    p.add_argument("--healthy", action="store_true", help="turn every pathology off (the fixed job)")
    p.add_argument("--pathologies", metavar="LIST",
                   help=f"comma list to turn on (default: all): {', '.join(spec.pathologies)}")
    p.add_argument("--steps", type=int, default=spec.default_steps,
                   help="optimizer steps (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data, the model and the shuffle")
    return p.parse_args(argv)


def chosen(spec: JobSpec, args: argparse.Namespace) -> set[str]:
    """The pathologies to inject; an unknown name stops the job with a one-line error."""
    if args.healthy:
        return set()
    if args.pathologies is None:
        return set(spec.pathologies)
    names = {n.strip() for n in args.pathologies.split(",") if n.strip()}
    unknown = names - set(spec.pathologies)
    if unknown:
        raise SystemExit(f"{spec.prog}: unknown pathologies: {', '.join(sorted(unknown))}; "
                         f"known: {', '.join(spec.pathologies)}")
    return names


def configure_torch(sick: set[str], seed: int) -> None:
    """Seeds, intra-op threads and anomaly mode, as the pathologies ask; freed memory kept (module
    docstring)."""
    keep_freed_memory()
    torch.manual_seed(seed)
    per_cpu = THREAD_FACTOR if "oversubscribed_threads" in sick else 1
    torch.set_num_threads(per_cpu * cpus())
    torch.autograd.set_detect_anomaly("anomaly_detection" in sick)


def build_loader(dataset: Dataset, batch: int, sick: set[str], seed: int,
                 syncing_collate: Callable[[list[Any]], Any],
                 worker_init: Callable[[int], None] | None = None) -> DataLoader:
    """The job's DataLoader: shuffled with a seeded generator; the pathologies change how it loads."""
    in_process = "main_process_loader" in sick
    return DataLoader(
        dataset,
        batch_size=batch,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
        num_workers=0 if in_process else HEALTHY_WORKERS,
        persistent_workers=not in_process and "non_persistent_workers" not in sick,
        prefetch_factor=None if in_process else PREFETCH,
        collate_fn=syncing_collate if "syncing_collate" in sick else None,
        worker_init_fn=None if in_process else worker_init,
        drop_last=True,
    )


@dataclass
class Result:
    """What a job reports: steps run, mean loss, and the wall time of every step (ms, batch wait included)."""

    steps: int
    mean_loss: float
    step_ms: list[float]

    def steady_ms(self) -> float:
        """Mean step after the first tenth (at least 2 steps): worker start-up and warm-up left out."""
        steady = self.step_ms[max(2, len(self.step_ms) // 10):] or self.step_ms
        return sum(steady) / max(1, len(steady))


def train(model: torch.nn.Module, loader: DataLoader, opt: torch.optim.Optimizer,
          loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor], steps: int) -> Result:
    """Run ``steps`` optimizer steps over as many epochs as needed."""
    running = torch.zeros(())
    step, step_ms = 0, []
    t_prev = time.perf_counter()
    while step < steps:
        for batch in loader:
            loss = loss_fn(model, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            running += loss.detach()  # read once at the end: no per-step host read
            step += 1
            now = time.perf_counter()
            step_ms.append((now - t_prev) * 1e3)
            t_prev = now
            if step >= steps:
                break
    return Result(step, float(running.item()) / max(1, step), step_ms)


def report(spec: JobSpec, sick: set[str], result: Result) -> None:
    mode = "healthy" if not sick else "pathological: " + ",".join(sorted(sick))
    print(f"{spec.prog} ({mode}): {result.steps} steps, {result.steady_ms():.1f} ms per step after warm-up, "
          f"mean loss {result.mean_loss:.4f}, {torch.get_num_threads()} thread(s)", flush=True)
