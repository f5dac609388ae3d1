"""Record a small CPU Kineto trace of a tiny training loop with the torch this runs under.

One rank in a single-process gloo group: a 2-layer MLP, SGD, and an all_reduce of every gradient
(so record_param_comms / gloo collective events exist), profiled with activities=[CPU],
record_shapes=True and a wait=1, warmup=1, active=3 schedule (ProfilerStep#2..#4 are recorded).
Writes torch-<version>-cpu.json.gz beside this file (gzip mtime 0).

    python tests/data/kineto_versions/record.py [--out PATH]
"""

from __future__ import annotations

import argparse
import gzip
import os
import socket
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    version = torch.__version__.split("+")[0]
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name(f"torch-{version}-cpu.json.gz"))
    out = ap.parse_args().out

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [(torch.randn(16, 32), torch.randn(16, 8)) for _ in range(5)]

    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                     schedule=schedule(wait=1, warmup=1, active=3),
                     on_trace_ready=lambda p: p.export_chrome_trace(str(raw))) as prof:
            for x, y in batches:
                loss = nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                for p in model.parameters():
                    dist.all_reduce(p.grad)
                opt.step()
                prof.step()
        out.write_bytes(gzip.compress(raw.read_bytes(), mtime=0))
    dist.destroy_process_group()
    print(f"{out}: {out.stat().st_size} bytes, torch {torch.__version__}")


if __name__ == "__main__":
    main()
