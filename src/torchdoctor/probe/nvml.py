"""Optional NVML sampling of the rank's GPU (``pynvml`` from nvidia-ml-py; never required).

A daemon thread reads utilization and memory once per second. Without NVML, or without a CUDA
device, nothing is sampled and the device facts keep ``None``: numbers are never invented.
"""

from __future__ import annotations

import os
import threading
from typing import Any


class NvmlSampler:
    """Samples one GPU in the background until the process ends."""

    def __init__(self, nvml: Any, handle: Any, period_s: float = 1.0) -> None:
        self._nvml, self._handle, self._period = nvml, handle, period_s
        self._util: list[float] = []
        self._mem_max = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="torchdoctor-nvml", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            try:
                self._util.append(float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu))
                self._mem_max = max(self._mem_max, int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used))
            except Exception:  # the GPU went away or NVML broke: stop quietly, keep what we have
                return

    def readings(self) -> tuple[float | None, int | None]:
        """(mean utilization %, max memory used bytes), None when nothing was sampled."""
        util = self._util[:]
        if not util:
            return None, None
        return round(sum(util) / len(util), 1), self._mem_max or None


def start(torch: Any) -> NvmlSampler | None:
    """A sampler for the current CUDA device, or None when NVML or CUDA is not there."""
    if not torch.cuda.is_available() or getattr(torch.version, "hip", None):
        return None
    try:
        import pynvml
    except ImportError:
        return None
    pynvml.nvmlInit()
    index = torch.cuda.current_device()
    uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "")
    if uuid:
        # torch prints the bare UUID; NVML wants the "GPU-" prefix.
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    else:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        ids = [int(x) for x in visible.split(",") if x.strip().isdigit()]
        handle = pynvml.nvmlDeviceGetHandleByIndex(ids[index] if index < len(ids) else index)
    return NvmlSampler(pynvml, handle)
