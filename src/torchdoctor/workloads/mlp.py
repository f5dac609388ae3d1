"""Bundled single-process MLP job on tabular records, with switchable pathologies (no DDP).

``python -m torchdoctor.workloads.mlp [--healthy | --pathologies a,b] [--steps N] [--seed S]``

Every record read waits FETCH_MS (the storage round trip) and parses its bytes with numpy; a
worker opens its record index once at start-up (WORKER_INIT_MS, ``worker_init_fn``), as a
worker that connects to a store or maps a shard index does. An epoch is EPOCH_BATCHES batches,
so epochs are short and the workers' start-up recurs when they are not persistent. (Even
persistent workers refill their queue at every epoch start, a first-batch wait that only longer
epochs remove: EPOCH_BATCHES keeps it near 3% of the step, below the point where a hand-tuned job
would change its sampler.) The model is a residual MLP (LayerNorm, GELU) trained with AdamW on
cross-entropy.

Measured gains on 2 cores: benchmarks/results/accuracy.md (the mlp rows).

Pathologies (all on by default, ``--healthy`` turns all off; see ``_jobs``):
main_process_loader, non_persistent_workers, oversubscribed_threads, anomaly_detection.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from torchdoctor.workloads import _jobs

FEATURES = 256
CLASSES = 10
HIDDEN = 512
BLOCKS = 4
BATCH = 64
FETCH_MS = 0.4  # per record: 25.6 ms per batch in the training process; two workers keep up
WORKER_INIT_MS = 300.0  # per worker start: open the record index (connect to the store, map the shard)
EPOCH_BATCHES = 32

SPEC = _jobs.JobSpec(
    prog="python -m torchdoctor.workloads.mlp",
    description=__doc__.splitlines()[0],
    pathologies=("main_process_loader", "non_persistent_workers", "oversubscribed_threads", "anomaly_detection"),
    default_steps=240,
)


class RecordDataset(Dataset):
    """Labelled float records stored as bytes; a read waits FETCH_MS, then parses and normalises."""

    def __init__(self, size: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.size = size
        self.raw = [rng.standard_normal(FEATURES).astype(np.float32).tobytes() for _ in range(size)]
        self.labels = rng.integers(0, CLASSES, size=size)
        self.fetch_s = FETCH_MS / 1e3

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.fetch_s)  # the storage round trip
        x = np.frombuffer(self.raw[index], dtype=np.float32)
        x = (x - x.mean()) / (x.std() + 1e-6)
        return torch.from_numpy(x.copy()), int(self.labels[index])


def open_index(_worker_id: int) -> None:
    """worker_init_fn: the per-worker start-up cost (opening the record index)."""
    time.sleep(WORKER_INIT_MS / 1e3)


def syncing_collate(batch: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample collate through host values (``.numpy()`` per record, ``.item()`` per label)."""
    rows = np.stack([x.numpy() for x, _ in batch])
    labels = torch.tensor([label for _, label in batch])
    return torch.from_numpy(rows), torch.tensor([int(y.item()) for y in labels])


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(HIDDEN)
        self.up = nn.Linear(HIDDEN, 2 * HIDDEN)
        self.down = nn.Linear(2 * HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class ResidualMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(FEATURES, HIDDEN)
        self.blocks = nn.Sequential(*(Block() for _ in range(BLOCKS)))
        self.out = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.blocks(self.inp(x)))


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


def main(argv: list[str] | None = None) -> int:
    args = _jobs.parse_args(SPEC, argv)
    sick = _jobs.chosen(SPEC, args)
    _jobs.configure_torch(sick, args.seed)
    dataset = RecordDataset(BATCH * EPOCH_BATCHES, args.seed)
    loader = _jobs.build_loader(dataset, BATCH, sick, args.seed, syncing_collate, open_index)
    model = ResidualMLP()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    _jobs.report(SPEC, sick, _jobs.train(model, loader, opt, loss_fn, args.steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
