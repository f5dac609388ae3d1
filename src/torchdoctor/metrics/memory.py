"""Device memory over the window from the allocator's `[memory]` records (profile_memory=True).

Each record is the caching allocator's state right after one allocation or free of one device:
Total Allocated (bytes held by tensors) and Total Reserved (bytes the allocator holds from the
driver, tensors plus its cache). A rank drives one device: with records of several, the device
with most records is used (`device_id`).

- peak_allocated / peak_reserved: the largest of each over the window's records.
- floor_allocated: the smallest Total Allocated in the window (weights, gradients, optimizer state:
  what stays between steps); peak_allocated - floor_allocated is what a step allocates on top
  (activations and temporaries), the part that grows with the batch.
- cache_slack_pct: 100 x (peak_reserved - peak_allocated) / peak_reserved: reserved memory the
  tensors did not use even at their peak (cached free blocks and fragmentation).
- reserved_growth: Total Reserved at the window's last record minus at its first: > 0 means the
  allocator took memory from the driver (cudaMalloc) inside the window.
- allocs_per_step, alloc_bytes_per_step: allocations (Bytes > 0) and their bytes per window step.
- total_memory: the device's memory (deviceProperties totalGlobalMem; None when absent).
- batch_scale: how many times larger the per-step part could grow before the peak reaches
  BATCH_FILL of the device: 1 + (BATCH_FILL x total_memory - peak_allocated) / (peak_allocated -
  floor_allocated). An estimate (activations grow about linearly with the batch); None without
  total memory or without a per-step part.
"""

from __future__ import annotations

import numpy as np

from .context import Context
from .model import MemoryStats

# A batch is sized to leave this share of the device for fragmentation and spikes.
BATCH_FILL = 0.9


def memory_stats(ctx: Context) -> MemoryStats | None:
    """MemoryStats over the window (module docstring); None without device `[memory]` records in it."""
    tr, w = ctx.tr, ctx.win
    m = tr.memory
    if m.shape[0] == 0:
        return None
    m = m[(m[:, 0] >= w.start) & (m[:, 0] <= w.end)]
    if m.shape[0] == 0:
        return None
    devs, counts = np.unique(m[:, 4], return_counts=True)
    dev = int(devs[np.argmax(counts)])
    m = m[m[:, 4] == dev]
    steps = max(len(w.steps), 1)
    peak_alloc, peak_res, floor = int(m[:, 2].max()), int(m[:, 3].max()), int(m[:, 2].min())
    total = _total_memory(tr.device_properties)
    out = MemoryStats(
        device_id=dev, records=int(m.shape[0]), peak_allocated=peak_alloc, peak_reserved=peak_res,
        floor_allocated=floor,
        cache_slack_pct=round(100.0 * (peak_res - peak_alloc) / peak_res, 2) if peak_res else 0.0,
        reserved_growth=int(m[-1, 3] - m[0, 3]),
        allocs_per_step=round(float((m[:, 1] > 0).sum()) / steps, 2),
        alloc_bytes_per_step=int(m[m[:, 1] > 0, 1].sum() // steps), total_memory=total)
    if total and peak_alloc > floor:
        out.batch_scale = round(1.0 + (BATCH_FILL * total - peak_alloc) / (peak_alloc - floor), 2)
    return out


def _total_memory(props: list[dict]) -> int | None:
    v = props[0].get("totalGlobalMem") if props else None
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None
