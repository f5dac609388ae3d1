"""A multi-rank data-parallel job built in code: every rank computes, then all-reduces; one straggler
computes longer, so it arrives last and waits least inside the all-reduce while its peers wait for it."""

from __future__ import annotations

from pathlib import Path

from kineto_builder import TraceBuilder

STEP_US = 10_000.0
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def rank_trace(rank: int, world: int, straggler: int | None, steps: int = 4, seq: bool = False) -> TraceBuilder:
    b = TraceBuilder(rank=rank, world_size=world)
    slow = rank == straggler
    jitter = (rank % 7) * 20.0  # small, even spread between the other ranks
    for n in range(steps):
        t0 = n * STEP_US
        b.step(n + 1, t0, STEP_US)
        compute = (8_600.0 if slow else 6_000.0) + jitter
        b.kernel("ampere_sgemm_128x64_nn", t0 + 100, compute, launch_at=t0 + 50)
        # Everyone leaves the all-reduce together, when the straggler has arrived.
        end = t0 + 100 + 8_600.0 + 7 * 20.0 + 500.0
        start = t0 + 100 + compute
        b.kernel(ALLREDUCE, start, end - start, stream=13, launch_at=start - 40)
        if seq:  # the metadata Kineto (2026) copies onto the collective's device row
            b.events[-1]["args"].update({"Collective name": "allreduce", "dtype": "Float", "In msg nelems": 1 << 20,
                                         "Out msg nelems": 1 << 20, "Group size": world,
                                         "Process Group Name": "0", "Seq": n})
    return b


def write_job(folder: Path, world: int, straggler: int | None = 2, gz: bool = False, seq: bool = False) -> list[Path]:
    """`seq`: the all-reduce rows carry torch's collective metadata (sequence numbers) for matching."""
    folder.mkdir(parents=True, exist_ok=True)
    suffix = ".json.gz" if gz else ".json"
    return [rank_trace(r, world, straggler, seq=seq).write(folder / f"rank{r}{suffix}", compact=True)
            for r in range(world)]
