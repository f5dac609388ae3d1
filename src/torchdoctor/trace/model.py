"""The columnar trace model: one `RankTrace` per rank, numpy columns plus an interned string table.

Times are integer nanoseconds on the trace's own clock. Kineto writes microseconds as floats with
three decimals; we convert each `ts` and `dur` separately with rounding to the nearest ns, so a
duration is exact to the ns the trace recorded and an end never precedes its start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np


class Cat(IntEnum):
    """Normalised event category: both Kineto schemas (current and 2021) map onto these."""

    OTHER = 0
    CPU_OP = 1  # cpu_op, Operator
    USER_ANNOTATION = 2  # user_annotation (ProfilerStep#N, DataLoader, Optimizer.step#...)
    RUNTIME = 3  # cuda_runtime, Runtime (also hip* names on ROCm)
    DRIVER = 4  # cuda_driver (cuLaunchKernel from Triton)
    KERNEL = 5  # kernel, Kernel
    MEMCPY = 6  # gpu_memcpy, Memcpy
    MEMSET = 7  # gpu_memset, Memset
    SYNC = 8  # cuda_sync (Stream Sync, Context Sync, Event Sync, Stream Wait Event)
    GPU_ANNOTATION = 9  # gpu_user_annotation
    PYTHON = 10  # python_function, python


CATEGORY_NAMES: dict[str, Cat] = {
    "cpu_op": Cat.CPU_OP,
    "operator": Cat.CPU_OP,
    "user_annotation": Cat.USER_ANNOTATION,
    "cuda_runtime": Cat.RUNTIME,
    "runtime": Cat.RUNTIME,
    "hip_runtime": Cat.RUNTIME,
    "cuda_driver": Cat.DRIVER,
    "driver": Cat.DRIVER,
    "kernel": Cat.KERNEL,
    "gpu_memcpy": Cat.MEMCPY,
    "memcpy": Cat.MEMCPY,
    "gpu_memset": Cat.MEMSET,
    "memset": Cat.MEMSET,
    "cuda_sync": Cat.SYNC,
    "gpu_user_annotation": Cat.GPU_ANNOTATION,
    "python_function": Cat.PYTHON,
    "python": Cat.PYTHON,
}
# Categories that are known and deliberately not analysed (no "unknown category" warning).
IGNORED_CATEGORIES = frozenset({"Trace", "torchdoctor", "ac2g", "fwdbwd", "async_cpu_to_gpu",
                                "cpu_instant_event", "overhead", "cuda_profiler_range"})

# Categories that occupy the device (HTA's "GPU events" minus cuda_sync, which is a wait, not work).
DEVICE_WORK = (Cat.KERNEL, Cat.MEMCPY, Cat.MEMSET)
HOST_CATS = (Cat.CPU_OP, Cat.USER_ANNOTATION, Cat.RUNTIME, Cat.DRIVER, Cat.PYTHON)


@dataclass
class RankTrace:
    """All complete ('X') events of one rank's trace, sorted by start time.

    Columns (all the same length): `cat` (Cat codes), `name` (ids into `names`), `ts`/`end` (ns),
    `pid`/`tid` (ints; string ids such as "Spans" map to negative numbers), `stream`,
    `correlation`, `nbytes` (-1 when absent).
    """

    path: str
    names: list[str]
    cat: np.ndarray
    name: np.ndarray
    ts: np.ndarray
    end: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    stream: np.ndarray
    correlation: np.ndarray
    nbytes: np.ndarray
    rank: int | None = None
    rank_source: str = "order"
    world_size: int | None = None
    backend: str | None = None
    device_name: str | None = None
    device_properties: list[dict] = field(default_factory=list)
    # Problems with parts of the trace that did not stop its analysis (dropped events, ...).
    warnings: list[str] = field(default_factory=list)
    instant_events: int = 0

    def __len__(self) -> int:
        return int(self.ts.size)

    @property
    def dur(self) -> np.ndarray:
        return self.end - self.ts

    def mask(self, *cats: Cat) -> np.ndarray:
        return np.isin(self.cat, np.array([int(c) for c in cats], dtype=self.cat.dtype))

    def name_mask(self, predicate) -> np.ndarray:
        """Boolean mask of events whose name satisfies `predicate` (evaluated once per unique name)."""
        hits = np.fromiter((bool(predicate(n)) for n in self.names), dtype=bool, count=len(self.names))
        return hits[self.name] if hits.size else np.zeros(len(self), dtype=bool)

    def names_of(self, idx: np.ndarray) -> list[str]:
        return [self.names[i] for i in self.name[idx]]

    @property
    def has_device_events(self) -> bool:
        return bool(self.mask(*DEVICE_WORK).any())
