"""The columnar trace model: one `RankTrace` per rank, numpy columns plus an interned string table.

Times are integer nanoseconds on the trace's own clock. Kineto writes microseconds as floats with
three decimals; we convert each `ts` and `dur` separately with rounding to the nearest ns, so a
duration is exact to the ns the trace recorded and an end never precedes its start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from functools import cached_property

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

# GEMM host ops (their `Input Dims` / `Input type` give M, N, K: metrics/gemm.py, metrics/opwork.py).
SHAPE_OPS = frozenset({"aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::addbmm",
                       "aten::matmul", "aten::linear"})
# Convolution ops: their `Concrete Inputs` (stride, padding, dilation, groups as text) are kept too.
CONV_OPS = frozenset({"aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution", "aten::_convolution",
                      "aten::cudnn_convolution", "aten::miopen_convolution", "aten::cudnn_convolution_relu",
                      "aten::cudnn_convolution_add_relu"})
# Scaled-dot-product attention: the composite op and the backend it dispatched to (metrics/choice.py
# reads their shapes, and is_causal / dropout_p from Concrete Inputs).
SDPA_BACKEND_OPS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_fused_attention_overrideable": "fused",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_attention_math_for_mps": "math",
}
SDPA_OPS = frozenset({"aten::scaled_dot_product_attention", *SDPA_BACKEND_OPS})
# Ops whose Concrete Inputs the decoder keeps (other ops' would split the shape interning).
CONCRETE_OPS = CONV_OPS | SDPA_OPS
# aten ops that launch no kernel (views, allocation, metadata): the most frequent ops of a
# record_shapes trace; their shapes are skipped unparsed (they are most of its args by volume).
NO_KERNEL_OPS = frozenset({
    "aten::as_strided", "aten::view", "aten::t", "aten::transpose", "aten::empty", "aten::empty_strided",
    "aten::empty_like", "aten::reshape", "aten::_reshape_alias", "aten::detach", "aten::detach_",
    "aten::slice", "aten::narrow", "aten::expand", "aten::expand_as", "aten::select", "aten::unsqueeze",
    "aten::squeeze", "aten::permute", "aten::result_type", "aten::resize_", "aten::alias", "aten::_unsafe_view",
    "aten::unbind", "aten::split", "aten::chunk", "aten::record_stream", "aten::lift_fresh", "aten::numpy_T",
    "aten::flatten", "aten::unflatten", "aten::view_as", "aten::set_", "aten::stride", "aten::size",
    "aten::is_nonzero", "aten::broadcast_tensors", "aten::split_with_sizes", "aten::movedim", "aten::_to_copy",
    "aten::to", "aten::contiguous", "aten::clone", "aten::zeros", "aten::ones", "aten::full",
})


def keeps_shapes(name: str) -> bool:
    """Whether the decoder keeps this host op's recorded shapes: GEMMs, convolutions, and aten ops
    that may launch an elementwise/reduction kernel (metrics/opwork.py sizes their tensors).
    Composite ops (`to`, `clone`, `zeros`) are left out: the op that launches is nested in them."""
    return name in SHAPE_OPS or name in CONV_OPS or (name.startswith("aten::") and name not in NO_KERNEL_OPS)


# Categories that occupy the device (HTA's "GPU events" minus cuda_sync, which is a wait, not work).
DEVICE_WORK = (Cat.KERNEL, Cat.MEMCPY, Cat.MEMSET)
HOST_CATS = (Cat.CPU_OP, Cat.USER_ANNOTATION, Cat.RUNTIME, Cat.DRIVER, Cat.PYTHON)


@dataclass
class RankTrace:
    """All complete ('X') events of one rank's trace, sorted by start time.

    Columns (all the same length): `cat` (Cat codes), `name` (ids into `names`), `ts`/`end` (ns),
    `pid`/`tid` (ints; string ids such as "Spans" map to negative numbers), `stream`,
    `correlation`, `nbytes` (-1 when absent).

    Sparse columns, for the few events that carry them (sorted event indices + values):
    `launch_idx` with `launch_blocks` / `launch_warps` / `launch_occupancy`, Kineto's kernel args
    `blocks per SM`, `warps per SM`, `est. achieved occupancy %` (float32, NaN when that one is
    absent) and `launch_grid` (blocks in the grid, kept only where `blocks per SM` is absent);
    `shape_idx` with `shape_ids`, for host ops `keeps_shapes` accepts recorded with record_shapes,
    ids into `shapes` = (Input Dims, Input type, Concrete Inputs) as compact JSON text (Concrete
    Inputs for CONCRETE_OPS only, else b""); `coll_idx` with `coll_ids` and
    `coll_seq`, for events that name a collective (record_param_comms ops and, in 2026 Kineto, the
    device rows linked to them): ids into `colls` = (collective name, dtype, in nelems, out nelems,
    group size, process group name) and the call's sequence number in its group (-1 when absent). `launch_of` / `shape_of` look
    them up for given events; `blocks_per_sm`, `warps_per_sm`, `occupancy` (NaN when absent) and
    `shape` (-1 when absent) are the dense columns, built on first use.
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
    launch_idx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    launch_blocks: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    launch_warps: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    launch_occupancy: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    launch_grid: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    shape_idx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    shape_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    shapes: list[tuple[bytes, bytes, bytes]] = field(default_factory=list)
    coll_idx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    coll_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    coll_seq: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    colls: list[tuple[str, str, int, int, int, str]] = field(default_factory=list)
    rank: int | None = None
    rank_source: str = "order"
    world_size: int | None = None
    backend: str | None = None
    device_name: str | None = None
    device_properties: list[dict] = field(default_factory=list)
    # The device allocator's `[memory]` records (profile_memory=True), sorted by time: rows of
    # (ts ns, bytes (+ allocated, - freed), total allocated, total reserved, device id) as int64.
    memory: np.ndarray = field(default_factory=lambda: np.zeros((0, 5), np.int64))
    # Problems with parts of the trace that did not stop its analysis (dropped events, ...).
    warnings: list[str] = field(default_factory=list)
    instant_events: int = 0
    # Complete events per category name as the file wrote it (the sight checks read them).
    categories: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.ts.size)

    @property
    def dur(self) -> np.ndarray:
        return self.end - self.ts

    def mask(self, *cats: Cat) -> np.ndarray:
        # One comparison per category: several times faster than np.isin on millions of events.
        out = self.cat == int(cats[0]) if cats else np.zeros(len(self), bool)
        for c in cats[1:]:
            out |= self.cat == int(c)
        return out

    def name_mask(self, predicate) -> np.ndarray:
        """Boolean mask of events whose name satisfies `predicate` (evaluated once per unique name)."""
        hits = np.fromiter((bool(predicate(n)) for n in self.names), dtype=bool, count=len(self.names))
        if not hits.any():  # most predicates name a few ops a trace may not have
            return np.zeros(len(self), dtype=bool)
        # take, not hits[self.name]: a third of the time on millions of events (no fancy-index iterator).
        return hits.take(self.name)

    def names_of(self, idx: np.ndarray) -> list[str]:
        return [self.names[i] for i in self.name[idx]]

    @property
    def has_device_events(self) -> bool:
        return bool(self.mask(*DEVICE_WORK).any())

    def launch_of(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(blocks per SM, warps per SM, est. achieved occupancy %) of events `idx` (float32, NaN if absent)."""
        at, hit = _find(self.launch_idx, idx)

        def pick(col: np.ndarray) -> np.ndarray:
            if not col.size:
                return np.full(at.size, np.nan, np.float32)
            return np.where(hit, col[at], np.nan).astype(np.float32)

        return pick(self.launch_blocks), pick(self.launch_warps), pick(self.launch_occupancy)

    def grid_of(self, idx: np.ndarray) -> np.ndarray:
        """Blocks in the launch grid of events `idx` (float32), NaN where absent or where Kineto's
        `blocks per SM` is known (the grid is only kept to stand in for it)."""
        at, hit = _find(self.launch_idx, idx)
        if not self.launch_grid.size:
            return np.full(at.size, np.nan, np.float32)
        return np.where(hit, self.launch_grid[at], np.nan).astype(np.float32)

    def shape_of(self, idx: np.ndarray) -> np.ndarray:
        """Ids into `shapes` of events `idx`, -1 where no shape was recorded (or kept)."""
        at, hit = _find(self.shape_idx, idx)
        if not self.shape_ids.size:
            return np.full(at.size, -1, np.int32)
        return np.where(hit, self.shape_ids[at], -1).astype(np.int32)

    @cached_property
    def blocks_per_sm(self) -> np.ndarray:
        return self._dense(self.launch_idx, self.launch_blocks, np.nan, np.float32)

    @cached_property
    def warps_per_sm(self) -> np.ndarray:
        return self._dense(self.launch_idx, self.launch_warps, np.nan, np.float32)

    @cached_property
    def occupancy(self) -> np.ndarray:
        return self._dense(self.launch_idx, self.launch_occupancy, np.nan, np.float32)

    @cached_property
    def shape(self) -> np.ndarray:
        return self._dense(self.shape_idx, self.shape_ids, -1, np.int32)

    def _dense(self, idx: np.ndarray, vals: np.ndarray, missing: float, dtype: type) -> np.ndarray:
        out = np.full(len(self), missing, dtype)
        out[idx] = vals
        return out


def _find(sorted_idx: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each of `idx` sits in `sorted_idx`, and whether it is there."""
    idx = np.asarray(idx, np.int64)
    if sorted_idx.size == 0:
        return np.zeros(idx.size, np.int64), np.zeros(idx.size, bool)
    at = np.clip(np.searchsorted(sorted_idx, idx), 0, sorted_idx.size - 1)
    return at, sorted_idx[at] == idx
