"""The collective benchmark of one rank: ``python -m torchdoctor.comm.bench --out FILE ...``.

Run under torchrun (or any launcher that sets RANK/WORLD_SIZE/MASTER_*). Every op at every size:
WARMUP untimed calls, then as many timed calls as fill MIN_SECONDS (at least MIN_REPEATS, at most
MAX_REPEATS; the count agreed by all ranks), each after a barrier and followed by a device
synchronize, its time the slowest rank's (a MAX all-reduce of the per-call times, outside the
timing); the median is reported. Rank 0 writes the
JSON. An op the backend lacks is skipped with the reason; every collective has the process
group's timeout, so a dead rank ends the benchmark instead of hanging it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

from torchdoctor.comm.bandwidth import OPS, bus_factor, sizes

WARMUP = 2
MIN_REPEATS = 5
MAX_REPEATS = 50
MIN_SECONDS = 0.05
# Fault injection for tests: this rank exits after its first op (a rank dying mid-benchmark).
DIE_ENV = "TORCHDOCTOR_COMM_DIE_RANK"


def _call(op: str, n: int, numel: int, device: torch.device):
    """A closure running ``op`` once on buffers of ``numel`` bytes (uint8 would not reduce: float32)."""
    elems = max(1, numel // 4)
    if op == "all_reduce":
        t = torch.ones(elems, device=device)
        return lambda: dist.all_reduce(t)
    if op == "broadcast":
        t = torch.ones(elems, device=device)
        return lambda: dist.broadcast(t, src=0)
    per = max(1, elems // n)  # all-gather: size is the output; reduce-scatter / all-to-all: the input
    if op == "all_gather":
        inp, out = torch.ones(per, device=device), torch.empty(per * n, device=device)
        return lambda: dist.all_gather_into_tensor(out, inp)
    if op == "reduce_scatter":
        inp, out = torch.ones(per * n, device=device), torch.empty(per, device=device)
        return lambda: dist.reduce_scatter_tensor(out, inp)
    if op == "all_to_all":
        inp, out = torch.ones(per * n, device=device), torch.empty(per * n, device=device)
        return lambda: dist.all_to_all_single(out, inp)
    raise ValueError(op)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(op: str, nbytes: int, device: torch.device) -> float:
    """Median seconds of one call, the slowest rank's."""
    n = dist.get_world_size()
    run = _call(op, n, nbytes, device)
    for _ in range(WARMUP):
        run()
    _sync(device)
    # Every rank must make the same number of calls: the count comes from the slowest rank's
    # time of one call, agreed on with a MAX all-reduce.
    t0 = time.perf_counter()
    run()
    _sync(device)
    one = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(one, op=dist.ReduceOp.MAX)
    reps = int(min(MAX_REPEATS, max(MIN_REPEATS, MIN_SECONDS / max(float(one[0]), 1e-9))))
    times: list[float] = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        run()
        _sync(device)
        times.append(time.perf_counter() - t0)
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return float(statistics.median(slowest.tolist()))


def host_copy_gbps(nbytes: int = 1 << 28) -> float:
    """The host's memory-copy bandwidth (GB/s): the CPU fabric's peak for gloo on one host."""
    a = torch.empty(nbytes // 4)
    b = torch.empty_like(a)
    b.copy_(a)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        b.copy_(a)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m torchdoctor.comm.bench")
    p.add_argument("--out", required=True)
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--min-bytes", type=int, default=8)
    p.add_argument("--max-bytes", type=int, default=64 << 20)
    p.add_argument("--timeout", type=float, default=60.0)
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=args.timeout))
    n, rank = dist.get_world_size(), dist.get_rank()
    rows, skipped = [], {}
    for op in [o for o in args.ops.split(",") if o]:
        if op not in OPS:
            skipped[op] = "unknown op"
            continue
        for nbytes in sizes(args.min_bytes, args.max_bytes):
            try:
                seconds = measure(op, nbytes, device)
            except (RuntimeError, NotImplementedError, ValueError) as exc:
                if "timed out" in str(exc).lower() or "connection" in str(exc).lower():
                    raise
                skipped[op] = f"{dist.get_backend()} cannot run it: {str(exc).splitlines()[0][:160]}"
                break
            algbw = nbytes / seconds / 1e9
            if os.environ.get(DIE_ENV) == str(rank):
                os._exit(9)
            rows.append({"op": op, "bytes": nbytes, "time_us": round(seconds * 1e6, 2), "algbw_gbps": round(algbw, 4),
                         "busbw_gbps": round(algbw * bus_factor(op, n), 4)})
    peak = None if cuda else host_copy_gbps()
    if rank == 0:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"backend": dist.get_backend(), "world_size": n, "device": torch.cuda.get_device_name(device)
                       if cuda else "cpu", "collectives": rows, "skipped": skipped,
                       "peak": {"gbps": round(peak, 2), "source": "host memory copy (torch, 256 MB)"} if peak else None},
                      f, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
