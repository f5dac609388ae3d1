"""Memory layer: what the caching allocator holds beyond the tensors (HW-18).

Reads the trace's allocator records (metrics/memory.py, profile_memory=True). HW-5 (batch room),
HW-6 (memory at capacity) and HW-7 (driver allocations in steady state) stay in rules/hardware.py.
"""

from __future__ import annotations

from ..metrics.model import MemoryStats
from ._common import View, finding, per_rank
from .engine import RuleInputs, rule
from .model import Evidence, Finding, Fix

# Reserved memory no tensor uses at the peak, as a share of the reserved peak (proposed: a third
# of the cache idle is the point where expandable segments commonly give memory back).
SLACK_PCT = 30.0
# Below this share of the device the slack costs nothing: there is room to spare anyway.
PRESSURE = 0.5
# At this share the next allocation may fail and flush the cache (hardware.MEMORY_FULL).
FULL = 0.9


def live_memory(v: View) -> MemoryStats | None:
    """The probe's allocator peaks as MemoryStats (records = 0), when the trace has no records."""
    d = v.f.device if v.f is not None else None
    if d is None or not d.max_memory_reserved_bytes or not d.max_memory_allocated_bytes:
        return None
    res, alloc = d.max_memory_reserved_bytes, d.max_memory_allocated_bytes
    return MemoryStats(device_id=0, records=0, peak_allocated=alloc, peak_reserved=res, floor_allocated=0,
                       cache_slack_pct=round(100.0 * max(0, res - alloc) / res, 2), reserved_growth=0,
                       allocs_per_step=0.0, alloc_bytes_per_step=0, total_memory=d.total_memory_bytes)


def _where(m: MemoryStats) -> str:
    return (f"{m.records} allocator records in the window on device {m.device_id}" if m.records
            else "torch.cuda memory stats over the run")


def _detail(m: MemoryStats) -> str:
    if not m.records:
        return ""
    grew = (f"; the reserved total grew by {m.reserved_growth / 2**20:.0f} MiB inside the window (cudaMalloc)"
            if m.reserved_growth > 0 else "")
    return f", floor {m.floor_allocated / 2**30:.2f} GiB, {m.allocs_per_step:g} allocations per step{grew}"


@rule("HW-18")
def allocator_slack(inputs: RuleInputs) -> list[Finding]:
    """The caching allocator reserves much more than the tensors use at their peak (fragmentation).

    From the trace's allocator records, or the live run's max_memory_reserved / max_memory_allocated
    when the trace has none. PyTorch memory docs: expandable_segments "can help when ... allocation sizes change", avoiding
    fragmentation. Trace: cache_slack_pct >= SLACK_PCT with the reserved peak >= PRESSURE of the
    device. No time claimed: the memory is room for a larger batch or fewer cache flushes (HW-5,
    HW-6, HW-7 price those). Warning at FULL of the device, info below.
    """
    def one(v: View) -> Finding | None:
        m = v.r.memory if v.r is not None else None
        if m is None:
            m = live_memory(v)
        if m is None or not m.total_memory or m.cache_slack_pct < SLACK_PCT:
            return None
        share = m.peak_reserved / m.total_memory
        if share < PRESSURE:
            return None
        slack = (m.peak_reserved - m.peak_allocated) / 2**30
        return finding(
            v, "HW-18", "hardware",
            f"The allocator reserves {m.peak_reserved / 2**30:.1f} GiB ({share:.0%} of the device) but the tensors "
            f"peak at {m.peak_allocated / 2**30:.1f} GiB: {slack:.1f} GiB ({m.cache_slack_pct:.0f}%) is cache and "
            "fragmentation.", 0.0, sev="warning" if share >= FULL else "info",
            evidence=[Evidence(
                _where(m) + ": reserved peak " f"{m.peak_reserved / 2**30:.2f} GiB, allocated peak "
                f"{m.peak_allocated / 2**30:.2f} GiB" + _detail(m) + ".",
                {"peak_reserved": m.peak_reserved, "peak_allocated": m.peak_allocated,
                 "cache_slack_pct": m.cache_slack_pct, "reserved_share": round(share, 3),
                 "reserved_growth": m.reserved_growth, "total_memory": m.total_memory})],
            fix=Fix("Let the allocator grow segments instead of reserving new ones of each size.",
                    "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "shell"),
            confidence="medium", remedy="memory.expandable_segments",
            confirm="torch.cuda.memory_stats()['inactive_split_bytes.all.peak'] measures the fragmented part",
            source="PyTorch CUDA memory management docs (expandable_segments); proposed thresholds")
    return per_rank(inputs, one)
