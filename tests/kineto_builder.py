"""Build small Kineto (torch.profiler) traces in code, for tests.

Times are given in microseconds (floats allowed), as Kineto writes them. The builder keeps
correlation ids consistent between a launch on the host and its kernel on the device.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PID = 4242
MAIN_TID = 4242
DEVICE_PID = 0


@dataclass
class TraceBuilder:
    rank: int | None = 0
    world_size: int | None = None
    device_name: str | None = "NVIDIA A100-SXM4-80GB"
    # Other deviceProperties keys (numSms, computeMajor, totalGlobalMem...) next to the name.
    device_props: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    _corr: int = 1000

    # --- host ---------------------------------------------------------------------------
    def op(self, name: str, ts: float, dur: float, tid: int = MAIN_TID, cat: str = "cpu_op",
           dims: list | None = None, types: list[str] | None = None, concrete: list[str] | None = None) -> TraceBuilder:
        """A host op; `dims`/`types`/`concrete` are its `Input Dims` / `Input type` / `Concrete Inputs`
        (record_shapes=True; torch >= 2.1 writes scalars and int lists as text in Concrete Inputs)."""
        args: dict[str, Any] = {"External id": len(self.events)}
        if dims is not None:
            args["Input Dims"] = dims
        if types is not None:
            args["Input type"] = types
        if concrete is not None:
            args["Concrete Inputs"] = concrete
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur,
                            "args": args})
        return self

    def gemm(self, name: str, ts: float, dur: float, dims: list, dtype: str = "c10::BFloat16",
             kernel: str = "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", kernel_at: float | None = None,
             kernel_dur: float | None = None, tid: int = MAIN_TID, stream: int = 7) -> int:
        """A GEMM op with shapes that launches one kernel (Kineto's nesting: op > launch > kernel)."""
        n_tensors = len(dims) - 2 if name in ("aten::addmm", "aten::baddbmm", "aten::addbmm") else len(dims)
        types = [dtype] * n_tensors + ["Scalar"] * (len(dims) - n_tensors)
        self.op(name, ts, dur, tid=tid, dims=dims, types=types)
        corr = self.runtime("cudaLaunchKernel", ts + dur / 4, dur / 2, tid=tid)
        at = ts + dur if kernel_at is None else kernel_at
        self.kernel(kernel, at, dur if kernel_dur is None else kernel_dur, stream=stream, corr=corr)
        return corr

    def launching(self, name: str, ts: float, dur: float, kernel: str, kernel_at: float, kernel_dur: float,
                  dims: list | None = None, types: list[str] | None = None, concrete: list[str] | None = None,
                  tid: int = MAIN_TID, stream: int = 7) -> int:
        """A host op with shapes that launches one kernel (op > launch > kernel); returns the correlation."""
        self.op(name, ts, dur, tid=tid, dims=dims, types=types, concrete=concrete)
        corr = self.runtime("cudaLaunchKernel", ts + dur / 4, dur / 2, tid=tid)
        self.kernel(kernel, kernel_at, kernel_dur, stream=stream, corr=corr)
        return corr

    def annotation(self, name: str, ts: float, dur: float, tid: int = MAIN_TID) -> TraceBuilder:
        return self.op(name, ts, dur, tid, cat="user_annotation")

    def step(self, n: int, ts: float, dur: float) -> TraceBuilder:
        return self.annotation(f"ProfilerStep#{n}", ts, dur)

    def dataloader(self, ts: float, dur: float) -> TraceBuilder:
        return self.annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", ts, dur)

    def runtime(self, name: str, ts: float, dur: float, corr: int | None = None, tid: int = MAIN_TID) -> int:
        if corr is None:
            self._corr += 1
            corr = self._corr
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": PID, "tid": tid, "ts": ts,
                            "dur": dur, "args": {"correlation": corr, "cbid": 211}})
        return corr

    # --- device -------------------------------------------------------------------------
    def kernel(self, name: str, ts: float, dur: float, stream: int = 7, launch_at: float | None = None,
               launch_dur: float = 5.0, cat: str = "kernel", nbytes: int | None = None, corr: int = -1,
               blocks_per_sm: float | None = None, warps_per_sm: float | None = None,
               occupancy: float | None = None, grid: list[int] | None = None) -> int:
        """A device event; with `launch_at`, also the host launch call that queued it (else `corr`).

        `blocks_per_sm`, `warps_per_sm`, `occupancy`, `grid` are Kineto's launch-shape kernel args
        (`blocks per SM`, `warps per SM`, `est. achieved occupancy %`, `grid`), left out when None.
        """
        if launch_at is not None:
            api = {"kernel": "cudaLaunchKernel", "gpu_memcpy": "cudaMemcpyAsync",
                   "gpu_memset": "cudaMemsetAsync"}[cat]
            corr = self.runtime(api, launch_at, launch_dur)
        args: dict[str, Any] = {"device": 0, "stream": stream, "correlation": corr}
        if nbytes is not None:
            args["bytes"] = nbytes
        for key, v in (("blocks per SM", blocks_per_sm), ("warps per SM", warps_per_sm),
                       ("est. achieved occupancy %", occupancy), ("grid", grid)):
            if v is not None:
                args[key] = v
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": DEVICE_PID, "tid": stream, "ts": ts,
                            "dur": dur, "args": args})
        return corr

    def sync_event(self, name: str, ts: float, dur: float, stream: int = 7) -> TraceBuilder:
        self.events.append({"ph": "X", "cat": "cuda_sync", "name": name, "pid": DEVICE_PID, "tid": stream,
                            "ts": ts, "dur": dur, "args": {"stream": stream, "device": 0}})
        return self

    def memory(self, ts: float, nbytes: int, allocated: int, reserved: int, device_type: int = 1,
               device_id: int = 0) -> TraceBuilder:
        """A `[memory]` instant event (profile_memory=True): the allocator's totals after one
        allocation (nbytes > 0) or free (nbytes < 0)."""
        self.events.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": PID,
                            "tid": MAIN_TID, "ts": ts, "args": {"Device Type": device_type, "Device Id": device_id,
                                                                "Addr": 1 << 40, "Bytes": nbytes,
                                                                "Total Allocated": allocated,
                                                                "Total Reserved": reserved}})
        return self

    # --- output -------------------------------------------------------------------------
    def document(self, as_list: bool = False) -> Any:
        evs = [{"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "args": {"name": "python"}}]
        evs += self.events
        evs.append({"ph": "i", "s": "g", "name": "Iteration Start: PyTorch Profiler", "pid": "Traces",
                    "tid": "Trace PyTorch Profiler", "ts": 0})
        if as_list:
            return evs
        doc: dict[str, Any] = {"schemaVersion": 1}
        if self.device_name:
            doc["deviceProperties"] = [{"id": 0, "name": self.device_name, **self.device_props}]
        if self.rank is not None:
            info: dict[str, Any] = {"rank": self.rank}
            if self.world_size:
                info.update(world_size=self.world_size, backend="nccl")
            doc["distributedInfo"] = info
        doc["traceEvents"] = evs
        doc["displayTimeUnit"] = "ms"
        return doc

    def write(self, path: Path | str, as_list: bool = False, compact: bool = False) -> Path:
        path = Path(path)
        text = json.dumps(self.document(as_list), separators=(",", ":") if compact else None,
                          indent=None if compact else 1)
        if path.suffix == ".gz":
            with gzip.open(path, "wt") as f:
                f.write(text)
        else:
            path.write_text(text)
        return path
