"""Small GPU-only pathologies, one per ``--case``, each a few seconds of training on one device.

Run each under the probe so that it records a trace (``benchmarks/gpu_check.sh`` does)::

    torchdoctor run --profile-steps 10:13 -- python3 benchmarks/gpu_pathologies.py --case cpu_module

======================  ===================================================  =================
case                    what the training step does wrong                    finding expected
======================  ===================================================  =================
cpu_module              a classifier head left on the CPU: every forward     HO-11
                        copies activations to the host and back
fp32_matmul             float32 matmuls with TF32 off (``allow_tf32=False``,  HW-1
                        precision "highest") on large layers
unpinned_copy           large batches copied host->device from pageable      DL-4
                        memory (``DataLoader(pin_memory=False)``)
item_sync               a logging helper reads ``.item()`` every step: a     HO-3
                        hidden host-device sync
unfused_adamw           AdamW on its foreach update (torch's default on      HO-18
                        CUDA) over a wide model whose step is mostly the
                        optimizer's
======================  ===================================================  =================

Every case is otherwise healthy (TF32 on, pinned batches copied with ``non_blocking=True``, the
loss summed on the device, AdamW's fused update), so each shows its own pathology first. On a CPU (``--device cpu``,
the dry run of ``gpu_check.sh``) the same code runs and the GPU-only effects are simply absent.
``--small`` shrinks every size for that dry run. The last line printed is one JSON object with
the case, the device and the mean step time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

CASES = {
    "cpu_module": "HO-11",
    "fp32_matmul": "HW-1",
    "unpinned_copy": "DL-4",
    "item_sync": "HO-3",
    "unfused_adamw": "HO-18",
}
CLASSES = 16

# (batch, input features, hidden width, hidden layers) per case: full size (H200) and --small (CPU).
SIZES = {
    "cpu_module": ((1024, 1024, 4096, 4), (32, 32, 64, 2)),
    "fp32_matmul": ((4096, 1024, 4096, 4), (32, 32, 64, 2)),
    "unpinned_copy": ((4096, 8192, 1024, 1), (32, 256, 64, 1)),
    "item_sync": ((512, 1024, 2048, 6), (32, 32, 64, 2)),
    "unfused_adamw": ((64, 4096, 4096, 6), (32, 32, 64, 2)),  # about 100 M parameters on the GPU
}
DISTINCT_BATCHES = 4  # the dataset holds this many batches; epochs repeat them


class Batches(Dataset):
    """A few pre-built (x, y) batches on the host; ``DataLoader(batch_size=None)`` yields them whole."""

    def __init__(self, batch: int, features: int, n: int = DISTINCT_BATCHES) -> None:
        g = torch.Generator().manual_seed(0)
        self.items = [
            (torch.rand(batch, features, generator=g), torch.randint(0, CLASSES, (batch,), generator=g))
            for _ in range(n)
        ]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.items[index]


class Net(nn.Module):
    """An MLP; ``head_on_cpu`` leaves its classifier head on the CPU (the cpu_module case)."""

    def __init__(self, features: int, hidden: int, layers: int) -> None:
        super().__init__()
        blocks: list[nn.Module] = [nn.Linear(features, hidden), nn.ReLU()]
        for _ in range(layers - 1):
            blocks += [nn.Linear(hidden, hidden), nn.ReLU()]
        self.body = nn.Sequential(*blocks)
        self.head = nn.Linear(hidden, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        head_device = self.head.weight.device
        if head_device != h.device:  # the forgotten module: a round trip through the host
            return self.head(h.to(head_device)).to(x.device)
        return self.head(h)


def log_accuracy(logits: torch.Tensor, labels: torch.Tensor, seen: list[float]) -> None:
    """A 'harmless' metrics helper: ``.item()`` waits for the whole step to finish on the device."""
    seen.append((logits.argmax(dim=1) == labels).float().mean().item())


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    return torch.device(name)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu_pathologies.py", description=__doc__.splitlines()[0])
    p.add_argument("--case", required=True, choices=sorted(CASES))
    p.add_argument("--steps", type=int, default=30, help="optimizer steps (default %(default)s)")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
    p.add_argument("--small", action="store_true", help="tiny sizes (the CPU dry run)")
    return p.parse_args(argv)


def train(args: argparse.Namespace) -> dict:
    case, device = args.case, pick_device(args.device)
    batch, features, hidden, layers = SIZES[case][1 if args.small else 0]
    cuda = device.type == "cuda"
    if case == "fp32_matmul":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
    else:
        torch.set_float32_matmul_precision("high")  # TF32 on tensor cores: the healthy default
    pin = cuda and case != "unpinned_copy"
    loader = DataLoader(Batches(batch, features), batch_size=None, shuffle=False, num_workers=0, pin_memory=pin)
    torch.manual_seed(0)
    model = Net(features, hidden, layers).to(device)
    if case == "cpu_module":
        model.head.to("cpu")
    # The healthy update is the fused one (CUDA, and the CPU since torch 2.4); the case keeps foreach.
    update = {"foreach": True} if case == "unfused_adamw" else {"fused": True}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **update)
    running = torch.zeros((), device=device)
    accuracy: list[float] = []
    step, t0 = 0, time.perf_counter()
    step_s: list[float] = []
    while step < args.steps:
        for x, y in loader:
            t_step = time.perf_counter()
            x = x.to(device, non_blocking=pin)
            y = y.to(device, non_blocking=pin)
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if case == "item_sync":
                log_accuracy(logits.detach(), y, accuracy)
            running += loss.detach()
            step += 1
            step_s.append(time.perf_counter() - t_step)
            if step >= args.steps:
                break
    final = running.item() / max(1, step)  # one sync at the end (and on CUDA: all work is done)
    warm = step_s[len(step_s) // 4:] or step_s
    return {
        "case": case,
        "expected_finding": CASES[case],
        "device": str(device),
        "steps": step,
        "mean_loss": round(final, 4),
        "step_ms_mean_after_warmup": round(1e3 * sum(warm) / len(warm), 3),
        "wall_s": round(time.perf_counter() - t0, 3),
    }


def main(argv: list[str] | None = None) -> int:
    result = train(parse_args(argv))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
