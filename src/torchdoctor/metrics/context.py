"""Per-rank arrays every metric needs, computed once: masks, kernel kinds, interval sets.

The context is derived data only; metrics stay pure functions of (trace, window, context).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..trace.model import DEVICE_WORK, HOST_CATS, Cat, RankTrace
from . import intervals as iv
from .classify import (
    BLOCKING_COPY_APIS,
    SYNC_APIS,
    KernelKind,
    is_backward,
    is_comm_host,
    is_dataloader,
    is_optimizer,
    kernel_kind,
)
from .steps import Window


@dataclass
class Context:
    tr: RankTrace
    win: Window

    # --- event masks ---------------------------------------------------------------------
    @cached_property
    def in_window(self) -> np.ndarray:
        """Events overlapping the window (zero-length events inside it count)."""
        tr, w = self.tr, self.win
        return (tr.end >= w.start) & (tr.ts <= w.end)

    @cached_property
    def device_work(self) -> np.ndarray:
        return self.tr.mask(*DEVICE_WORK)

    @cached_property
    def host(self) -> np.ndarray:
        # Host events of real processes: named pseudo-processes ("Spans") are profiler bookkeeping.
        return self.tr.mask(*HOST_CATS) & (self.tr.pid >= 0)

    @cached_property
    def kind(self) -> np.ndarray:
        """KernelKind per event (-1 for non-device events); memcpy/memset by category."""
        tr = self.tr
        by_name = np.fromiter((kernel_kind(n) for n in tr.names), np.int8, len(tr.names))
        out = np.full(len(tr), -1, np.int8)
        k = tr.mask(Cat.KERNEL)
        out[k] = by_name[tr.name[k]] if by_name.size else -1
        out[tr.mask(Cat.MEMCPY)] = KernelKind.MEMCPY
        out[tr.mask(Cat.MEMSET)] = KernelKind.MEMSET
        return out

    def host_named(self, predicate) -> np.ndarray:
        return self.host & self.tr.name_mask(predicate)

    @cached_property
    def main_pid(self) -> int | None:
        host = self.host
        if not host.any():
            return None
        steps = host & self.tr.name_mask(lambda n: n.startswith("ProfilerStep#"))
        pool = self.tr.pid[steps] if steps.any() else self.tr.pid[host]
        vals, counts = np.unique(pool, return_counts=True)
        return int(vals[np.argmax(counts)])

    @cached_property
    def main_tid(self) -> int | None:
        host = self.host
        if not host.any():
            return None
        steps = host & self.tr.name_mask(lambda n: n.startswith("ProfilerStep#"))
        pool = self.tr.tid[steps] if steps.any() else self.tr.tid[host & self.tr.mask(Cat.CPU_OP)]
        if pool.size == 0:
            pool = self.tr.tid[host]
        vals, counts = np.unique(pool, return_counts=True)
        return int(vals[np.argmax(counts)])

    # --- interval sets clipped to the window ---------------------------------------------
    def clipped_union(self, mask: np.ndarray) -> iv.Intervals:
        m = mask & self.in_window
        return iv.clip(iv.union(self.tr.ts[m], self.tr.end[m]), self.win.start, self.win.end)

    @cached_property
    def work_by_correlation(self) -> tuple[np.ndarray, np.ndarray]:
        """(sorted correlation ids, device ns of each) of the device work other than collectives:
        what a launch inside a region put on the device (metrics/device.launched_device_ns)."""
        tr = self.tr
        work = np.flatnonzero(self.device_work & (tr.correlation >= 0) & (self.kind != KernelKind.COMM))
        corr, inv = np.unique(tr.correlation[work], return_inverse=True)
        per = np.zeros(corr.size, np.int64)
        np.add.at(per, inv, tr.end[work] - tr.ts[work])
        return corr, per

    @cached_property
    def busy(self) -> iv.Intervals:
        return self.clipped_union(self.device_work)

    @cached_property
    def comm(self) -> iv.Intervals:
        return self.clipped_union(self.kind == KernelKind.COMM)

    @cached_property
    def compute(self) -> iv.Intervals:
        k = self.tr.mask(Cat.KERNEL) & (self.kind != KernelKind.COMM)
        return self.clipped_union(k)

    @cached_property
    def memory(self) -> iv.Intervals:
        return self.clipped_union(self.tr.mask(Cat.MEMCPY, Cat.MEMSET))

    @cached_property
    def idle(self) -> iv.Intervals:
        return iv.complement(self.busy, self.win.start, self.win.end)

    @cached_property
    def dataloader_mask(self) -> np.ndarray:
        return self.host_named(is_dataloader)

    @cached_property
    def dataloader(self) -> iv.Intervals:
        return self.clipped_union(self.dataloader_mask)

    @cached_property
    def sync_mask(self) -> np.ndarray:
        apis = SYNC_APIS | BLOCKING_COPY_APIS
        return self.tr.mask(Cat.RUNTIME, Cat.DRIVER) & self.tr.name_mask(apis.__contains__)

    @cached_property
    def sync(self) -> iv.Intervals:
        return self.clipped_union(self.sync_mask)

    @cached_property
    def optimizer_mask(self) -> np.ndarray:
        return self.host_named(is_optimizer)

    @cached_property
    def comm_host_mask(self) -> np.ndarray:
        return self.host_named(is_comm_host)

    @cached_property
    def backward_mask(self) -> np.ndarray:
        return self.host_named(is_backward)

    @property
    def has_device(self) -> bool:
        return bool(self.device_work.any())
