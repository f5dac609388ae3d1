"""Bundled data-parallel training job with switchable pathologies (``torchdoctor demo``).

Run one process per rank under torchrun (``python -m torch.distributed.run --nproc-per-node 2
-m torchdoctor.workloads.demo [--healthy | --pathologies a,b]``). gloo on CPU; NCCL when every
rank has its own GPU; gloo with CUDA tensors when two ranks share one GPU.

The dataset simulates images read from slow storage and decoded on the CPU: each sample costs a
fixed fetch latency (a sleep, as a network or object-store read) plus a small numpy decode.
Loading in the training process puts that latency, and the pathological collate's per-sample
host work, on every step; the healthy version overlaps loading with training in persistent
worker processes. The latency (112 ms per 64-sample batch) is sized above the compute of one
step, so even on a 2-core machine (where two ranks already use both cores) the fixed job runs
about 2.2x more steps/s: the workers mostly wait on "storage", they do not compete for the CPU.
Decoded pixels travel from the workers as uint8 and are scaled in the training step.

Pathologies (all on by default; ``--healthy`` turns all off):

======================== ======================================================================
main_process_loader      DataLoader(num_workers=0): fetch + decode inside the training step
no_pin_memory            pin_memory=False (only matters with a GPU)
syncing_collate          collate_fn converts every image with ``.numpy()`` and reads every
                         label with ``.item()``
loss_item_every_step     ``loss.item()`` every step (a host sync on a GPU)
find_unused_parameters   DDP(find_unused_parameters=True) with no unused parameter
small_buckets            DDP(bucket_cap_mb=0.001): one all-reduce per layer
allocator_churn          glibc malloc's default thresholds: the convolutions' activations are
                         unmapped when freed and faulted in again every step (the fixed job
                         raises the thresholds with mallopt; a no-op on other C libraries)
module_on_wrong_device   GPU only: a frozen classifier head left on the CPU
fp32_matmul              GPU only: float32 matmuls at "highest" precision (no TF32)
======================== ======================================================================
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from torchdoctor.advice.host_allocator import keep_freed_memory
from torchdoctor.workloads.pathologies import GPU_ONLY, PATHOLOGIES

IMAGE = (3, 32, 32)
CLASSES = 10
FETCH_MS = 1.75  # per sample: the simulated storage latency
DECODE_ROUNDS = 1  # per sample: numpy filter passes (CPU work)
BATCH = 64
SMALL_BUCKET_MB = 0.001
HEALTHY_WORKERS = 6  # per rank; the loader waits on storage, not on the CPU: 1.5x the rate a step consumes


class SlowDecodeDataset(Dataset):
    """Synthetic labelled images; each read waits ``fetch_ms`` then decodes with numpy."""

    def __init__(self, size: int, fetch_ms: float = FETCH_MS, decode_rounds: int = DECODE_ROUNDS) -> None:
        self.size, self.fetch_s, self.decode_rounds = size, fetch_ms / 1e3, decode_rounds
        # "Encoded" images: drawn once, so a read costs the latency and the decode, not the RNG.
        self.encoded = np.random.default_rng(0).integers(0, 256, size=(64, *IMAGE), dtype=np.uint8)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.fetch_s)  # the storage round trip
        raw = self.encoded[index % len(self.encoded)]
        img = raw.astype(np.float32) / 255.0
        for _ in range(self.decode_rounds):  # a 5-point smoothing pass, like a decoder's filter
            img[:, 1:-1, 1:-1] = (
                img[:, :-2, 1:-1]
                + img[:, 2:, 1:-1]
                + img[:, 1:-1, :-2]
                + img[:, 1:-1, 2:]
                + img[:, 1:-1, 1:-1]
            ) / 5.0
        # Decoded pixels travel as uint8 (a quarter of float32's bytes through the worker queue);
        # the training step scales them to [0, 1].
        pixels = torch.from_numpy((img * 255.0).astype(np.uint8))
        return pixels, (index * 7 + int(raw[0, 0, 0])) % CLASSES


def syncing_collate(batch: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Collate that handles the batch sample by sample through host-side values (the pathology).

    Each image goes through ``.numpy()`` and each label is read back with ``.item()`` for a class
    histogram: per-sample host conversions on the data path (on a GPU, each one on a device
    tensor would be a sync). The work itself is kept small, so that moving loading into workers,
    a runtime remedy, recovers nearly all of the step; the conversions stay visible to the probe.
    """
    images = torch.from_numpy(np.stack([img.numpy() for img, _ in batch]))
    labels = torch.tensor([label for _, label in batch])
    histogram = np.bincount([int(label.item()) for label in labels], minlength=CLASSES)
    assert histogram.sum() == len(batch)
    return images, labels


class DemoNet(nn.Module):
    """A small CNN: three convolutions and a linear classifier, ~24 K parameters.

    Convolutions give much compute for few parameters, so the gradient all-reduce stays a small
    share of the step once buckets are sized sensibly (the healthy job is compute-bound).
    """

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(IMAGE[0], 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(32, 48, 3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )  # fmt: skip
        self.head = nn.Linear(48, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.features(x)
        head_device = self.head.weight.device
        if head_device != h.device:  # the wrong-device pathology: a round trip through the host
            return self.head(h.to(head_device)).to(x.device)
        return self.head(h)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m torchdoctor.workloads.demo", description=__doc__.splitlines()[0]
    )
    p.add_argument("--healthy", action="store_true", help="turn every pathology off (the fixed job)")
    p.add_argument(
        "--pathologies", metavar="LIST", help="comma list of pathologies to turn on (default: all)"
    )
    p.add_argument("--steps", type=int, default=48, help="optimizer steps per rank (default %(default)s)")
    p.add_argument("--warmup", type=int, default=4, help="steps left out of the steps/s figure")
    p.add_argument("--result-file", metavar="FILE", help="rank 0 writes its steps/s here (JSON)")
    p.add_argument("--step-times", metavar="FILE",
                   help="rank 0 writes the wall time of every step (ms, its own clock) here (JSON)")
    return p.parse_args(argv)


def chosen(args: argparse.Namespace) -> set[str]:
    if args.healthy:
        return set()
    if args.pathologies is None:
        return set(PATHOLOGIES)
    names = {n.strip() for n in args.pathologies.split(",") if n.strip()}
    unknown = names - set(PATHOLOGIES)
    if unknown:
        raise SystemExit(
            f"unknown pathologies: {', '.join(sorted(unknown))}; known: {', '.join(PATHOLOGIES)}"
        )
    return names


def setup() -> tuple[int, int, torch.device]:
    """Initialise the process group; pick the device and backend."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus >= world:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cuda", 0) if gpus else torch.device("cpu")
        backend = "gloo"  # gloo also reduces CUDA tensors, so two ranks may share one GPU
    dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size(), device


def build_loader(
    sick: set[str], rank: int, world: int, device: torch.device, steps: int
) -> tuple[DataLoader, DistributedSampler]:
    # One epoch covers every step: no epoch-boundary refill stall, in either version.
    dataset = SlowDecodeDataset(size=BATCH * world * steps)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    in_process = "main_process_loader" in sick
    loader = DataLoader(
        dataset,
        batch_size=BATCH,
        sampler=sampler,
        num_workers=0 if in_process else HEALTHY_WORKERS,
        persistent_workers=not in_process,
        prefetch_factor=None if in_process else 4,
        pin_memory=device.type == "cuda" and "no_pin_memory" not in sick,
        collate_fn=syncing_collate if "syncing_collate" in sick else None,
        drop_last=True,
    )
    return loader, sampler


def build_model(sick: set[str], device: torch.device) -> DistributedDataParallel:
    torch.manual_seed(0)
    model = DemoNet().to(device)
    if device.type == "cuda" and "module_on_wrong_device" in sick:
        # A frozen head forgotten on the CPU: every step copies activations to the host and back.
        # DDP refuses parameters on two device types, so the frozen head is kept out of it.
        model.head.to("cpu").requires_grad_(False)
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            model, ["head.weight", "head.bias"]
        )
    if device.type == "cuda" and "fp32_matmul" not in sick:
        torch.set_float32_matmul_precision("high")  # TF32 on tensor cores
    kwargs: dict[str, Any] = {"find_unused_parameters": "find_unused_parameters" in sick}
    if "small_buckets" in sick:
        kwargs["bucket_cap_mb"] = SMALL_BUCKET_MB
    else:
        kwargs["gradient_as_bucket_view"] = True
    if device.type == "cuda":
        kwargs["device_ids"] = [device.index]
    return DistributedDataParallel(model, **kwargs)


def train(args: argparse.Namespace) -> dict[str, Any]:
    sick = chosen(args)
    rank, world, device = setup()
    if device.type != "cuda":
        sick -= GPU_ONLY  # nothing to observe on a CPU
    if "allocator_churn" not in sick:
        keep_freed_memory()  # before the loader's workers fork: they inherit it
    loader, sampler = build_loader(sick, rank, world, device, args.steps)
    ddp = build_model(sick, device)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    non_blocking = bool(loader.pin_memory)
    losses: list[float] = []
    running = torch.zeros((), device=device)
    step, epoch, t_start = 0, 0, None
    step_ms: list[float] = []
    t_prev = time.perf_counter()
    while step < args.steps:
        sampler.set_epoch(epoch)
        for images, labels in loader:
            if step == args.warmup:
                t_start = time.perf_counter()
            images = images.to(device, non_blocking=non_blocking).float().div_(255.0)
            labels = labels.to(device, non_blocking=non_blocking)
            loss = F.cross_entropy(ddp(images), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if "loss_item_every_step" in sick:
                losses.append(loss.item())
            else:
                running += loss.detach()  # read once at the end: no per-step host sync
            step += 1
            now = time.perf_counter()
            step_ms.append(round((now - t_prev) * 1e3, 3))  # batch fetch included: all the step costs
            t_prev = now
            if step >= args.steps:
                break
        epoch += 1
    elapsed = time.perf_counter() - (t_start or time.perf_counter())
    final_loss = losses[-1] if losses else running.item() / max(1, step)
    result = {
        "mode": "healthy" if not sick else "pathological",
        "pathologies": sorted(sick),
        "device": str(device),
        "world_size": world,
        "steps": step,
        "steps_per_s": round((step - args.warmup) / elapsed, 3) if elapsed > 0 else None,
        "final_loss": round(float(final_loss), 4),
        "step_ms": step_ms,
    }
    # Explicit teardown: a DDP with find_unused_parameters=True can abort at exit otherwise.
    del ddp, opt, loader
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return result if rank == 0 else {}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = train(args)
    if result:
        print(
            f"torchdoctor demo ({result['mode']}): {result['steps']} steps on {result['world_size']} ranks, "
            f"{result['steps_per_s']} steps/s after warm-up",
            flush=True,
        )
        step_ms = result.pop("step_ms")
        if args.result_file:
            with open(args.result_file, "w", encoding="utf-8") as f:
                json.dump(result, f)
        if args.step_times:
            with open(args.step_times, "w", encoding="utf-8") as f:
                json.dump(step_ms, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
