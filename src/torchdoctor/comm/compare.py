"""The job's own collectives placed on the benchmark's curve (`torchdoctor comm --compare PATH`).

From a trace (or run directory) of the job: each collective kind's mean message size and mean
time per call (``analysis.collectives``: device rows with NCCL, ``record_param_comms`` with gloo),
its algbw, and the benchmark's algbw for the same op at that size (log-log interpolation between
the measured sizes; clamped to the measured range). A call slower than the fabric does at its
size spends the difference waiting: for a late peer, for compute kernels sharing the device, or
on a transport the environment disabled. No torch import.
"""

from __future__ import annotations

import math
from typing import Any

# torch's recorded collective names -> the benchmark's op, and whether the recorded (input)
# bytes are per rank and must be multiplied by the group size to match nccl-tests' size.
OPS = {
    "allreduce": ("all_reduce", False), "all_reduce": ("all_reduce", False),
    "_allgather_base": ("all_gather", True), "allgather": ("all_gather", True),
    "all_gather_into_tensor": ("all_gather", True), "allgather_into_tensor_coalesced": ("all_gather", True),
    "_reduce_scatter_base": ("reduce_scatter", False), "reduce_scatter": ("reduce_scatter", False),
    "reduce_scatter_tensor": ("reduce_scatter", False), "reduce_scatter_tensor_coalesced": ("reduce_scatter", False),
    "alltoall_base": ("all_to_all", False), "all_to_all": ("all_to_all", False), "alltoall": ("all_to_all", False),
    "broadcast": ("broadcast", False),
}


def fabric_algbw(bench: dict[str, Any], op: str, nbytes: float) -> float | None:
    """The benchmark's algbw (GB/s) for ``op`` at ``nbytes``, interpolated in log-log; None without data."""
    pts = sorted((r["bytes"], r["algbw_gbps"]) for r in bench.get("collectives", [])
                 if r.get("op") == op and r.get("algbw_gbps", 0) > 0)
    if not pts or nbytes <= 0:
        return None
    if nbytes <= pts[0][0]:
        return pts[0][1]
    if nbytes >= pts[-1][0]:
        return pts[-1][1]
    for (s0, b0), (s1, b1) in zip(pts, pts[1:], strict=False):
        if s0 <= nbytes <= s1:
            t = (math.log(nbytes) - math.log(s0)) / (math.log(s1) - math.log(s0))
            return math.exp(math.log(b0) + t * (math.log(b1) - math.log(b0)))
    return None


def place(report: dict[str, Any], bench: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (rank, collective kind) the benchmark covers: size, time, algbw, the fabric's."""
    rows = []
    for rank in report.get("ranks", []):
        analysis = rank.get("analysis") or {}
        coll = analysis.get("collectives") or {}
        world = analysis.get("world_size") or bench.get("world_size") or 1
        for k in coll.get("kinds", []):
            op, per_rank = OPS.get(k.get("name", ""), (None, False))
            if op is None or k.get("bytes", -1) <= 0 or not k.get("calls") or not k.get("time_ns"):
                continue
            size = k["bytes"] / k["calls"] * (world if per_rank else 1)
            seconds = k["time_ns"] / k["calls"] / 1e9
            job = size / seconds / 1e9
            fabric = fabric_algbw(bench, op, size)
            rows.append({"rank": rank.get("rank"), "collective": k["name"], "op": op, "calls": k["calls"],
                         "bytes": int(size), "time_us": round(seconds * 1e6, 2), "algbw_gbps": round(job, 4),
                         "fabric_algbw_gbps": round(fabric, 4) if fabric else None,
                         "pct_of_fabric": round(100 * job / fabric, 1) if fabric else None})
    return rows


def sentence(row: dict[str, Any], human) -> str:
    """ "rank 0: your 4 MiB all_reduce calls reach 31% of what this fabric does at 4 MiB (...)"."""
    if row["pct_of_fabric"] is None:
        return (f"rank {row['rank']}: {human(row['bytes'])} {row['op']} calls: {row['algbw_gbps']:.3f} GB/s algbw "
                "(no benchmark data for this op)")
    head = (f"rank {row['rank']}: your {human(row['bytes'])} {row['op']} calls ({row['calls']} in the window, "
            f"{row['time_us']:,.0f} µs each) reach {row['pct_of_fabric']:.0f}% of what this fabric does at that size "
            f"({row['algbw_gbps']:.3f} of {row['fabric_algbw_gbps']:.3f} GB/s algbw)")
    if row["pct_of_fabric"] < 50:
        head += ": the rest is waiting (a late peer, compute kernels sharing the device, a disabled transport)"
    return head
