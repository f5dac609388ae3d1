"""A tiny Kineto (torch.profiler) trace writer for rule tests: events by hand, times in µs."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


class Trace:
    """Build a Kineto JSON trace. Host events on pid 1 / tid 1; device work on pid 0 / stream 7."""

    def __init__(self, device: bool = True, backend: str | None = None, world_size: int | None = None,
                 rank: int = 0, cc: tuple[int, int] = (8, 0)) -> None:
        self.events: list[dict] = []
        self.device = device
        self.corr = 1000
        self.header: dict = {}
        if backend:
            self.header["distributedInfo"] = {"backend": backend, "rank": rank, "world_size": world_size or 2}
        if device:
            self.header["deviceProperties"] = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "computeMajor": cc[0],
                                                "computeMinor": cc[1], "numSms": 108,
                                                "totalGlobalMem": 85_000_000_000}]

    def host(self, name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 1) -> Trace:
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur})
        return self

    def step(self, n: int, ts: float, dur: float) -> Trace:
        return self.host(f"ProfilerStep#{n}", ts, dur, cat="user_annotation")

    def kernel(self, name: str, launch_ts: float, ts: float, dur: float, stream: int = 7,
               api: str = "cudaLaunchKernel", api_dur: float = 5.0, cat: str = "kernel",
               nbytes: int | None = None) -> Trace:
        """A device event and the runtime call that launched it (joined by correlation id)."""
        self.corr += 1
        args = {"stream": stream, "correlation": self.corr}
        if nbytes is not None:
            args["bytes"] = nbytes
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": api, "pid": 1, "tid": 1,
                            "ts": launch_ts, "dur": api_dur, "args": {"correlation": self.corr}})
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
                            "args": args})
        return self

    def write(self, path: Path) -> str:
        doc = dict(self.header, traceEvents=sorted(self.events, key=lambda e: e["ts"]))
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt") as f:
            json.dump(doc, f)
        return str(path)
