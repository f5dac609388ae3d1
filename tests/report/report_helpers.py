"""Helpers for the report tests: real traces, hand-made findings, a hostile trace, and a
headless-Chromium driver. (A uniquely named module, not conftest: test files import from it.)"""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import msgspec

from real_traces import trace  # noqa: F401  (re-exported for the report tests)
from torchdoctor.report.model import ABRemedy, ABResult, Evidence, Finding, Fix

XSS = "<script>alert(1)</script>"
# Would mark the page if any of it ran: the tests look for the marker in the DOM.
XSS_MARK = "<img src=x onerror=\"document.body.setAttribute('data-pwned','1')\">"
XSS_CLOSE = "</script><script>document.body.setAttribute('data-pwned','2')</script>"


def sample_findings(extra: str = "") -> list[Finding]:
    """Findings like the rules engine emits, one per layer; `extra` is appended to untrusted fields."""
    return [
        Finding(
            id="DL-1", layer="input", severity="critical", title="The GPU waits for the DataLoader" + extra,
            recoverable_pct=23.4, recoverable_ms=18.2, confidence="high",
            evidence=[Evidence("The device sat idle 18.2 ms per step while the host waited in "
                               "enumerate(DataLoader)" + extra,
                               values={"idle_ms_per_step": 18.2, "num_workers": 0},
                               items=[{"name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
                                       + extra, "ms_per_step": 18.2, "first_ts_ns": 1661203462751585000}])],
            fix=Fix("Load batches in background worker processes and pin host memory.",
                    "loader = DataLoader(ds, batch_size=64, num_workers=8, pin_memory=True,\n"
                    "                    persistent_workers=True)"),
            confirm="Rerun with num_workers=8: data wait should drop below 1 ms per step.",
            remedy="dataloader-workers", source="HTA idle-time breakdown"),
        Finding(id="SYNC-1", layer="host", severity="warning", title="Host-device syncs in the step: .item()",
                recoverable_pct=6.1, recoverable_ms=4.7, confidence="medium",
                evidence=[Evidence("60 cudaStreamSynchronize calls per step from aten::item",
                                   items=[{"op": "aten::item", "count": 18}, {"op": "aten::to", "count": 36}])],
                fix=Fix("Keep the loss on the device; log it every N steps.")),
        Finding(id="DIST-2", layer="distributed", severity="warning", title="Rank 3 is a straggler",
                recoverable_pct=4.2, confidence="medium", ranks=[0, 1, 2],
                evidence=[Evidence("Ranks 0–2 wait up to 12 ms per step for rank 3 in all_reduce")]),
        Finding(id="HW-3", layer="hardware", severity="info", title="Many tiny kernels (launch bound)",
                recoverable_pct=1.5, confidence="low",
                evidence=[Evidence("35% of kernels run shorter than their launch call")],
                fix=Fix("Fuse with torch.compile(mode='reduce-overhead') or CUDA graphs.")),
    ]


def sample_ab() -> ABResult:
    return ABResult(baseline_steps_per_s=11.2, treated_steps_per_s=14.6, speedup_median=1.30,
                    speedup_min=1.24, speedup_max=1.37,
                    remedies=[ABRemedy("dataloader-workers", True, 1.27, "data wait 18 ms → 0.4 ms"),
                              ABRemedy("pin-memory", True, 1.03, ""),
                              ABRemedy("cudnn-benchmark", False, 0.99, "no gain beyond noise")],
                    details={"repeats": 5, "steps_per_run": 50, "noise_pct": 2.1})


def hostile_trace(path: Path, kernel_names: list[str], steps: int = 4, t0_us: str = "1000000") -> Path:
    """A small but complete Kineto trace (steps, a DataLoader wait, launches, kernels) whose kernel
    and op names are the given (hostile) strings. `t0_us` is written digit for digit, so epoch
    timestamps with ns decimals ("1712195495519689.047") can be tested."""
    ev: list[dict] = []
    t0, corr = Decimal(t0_us), 1
    host = {"pid": 4242, "tid": 4242}
    for s in range(steps):
        start = t0 + s * 10_000
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s + 1}", "ts": start,
                   "dur": 10_000, **host})
        ev.append({"ph": "X", "cat": "user_annotation", "name": "enumerate(DataLoader)#" + kernel_names[0],
                   "ts": start + 10, "dur": 2_000, **host})
        for k, name in enumerate(kernel_names):
            launch = start + 2_100 + k * 1_500
            ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::" + name, "ts": launch - 5, "dur": 30, **host})
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": launch, "dur": 8,
                       "args": {"correlation": corr}, **host})
            ev.append({"ph": "X", "cat": "kernel", "name": name, "ts": launch + 20, "dur": 1_200, "pid": 0,
                       "tid": 7, "args": {"stream": 7, "correlation": corr, "device": 0}})
            corr += 1
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1, "backend": "nccl"},
           "deviceProperties": [{"id": 0, "name": "Test GPU " + kernel_names[0]}], "traceEvents": ev}
    data = msgspec.json.Encoder(decimal_format="number").encode(doc)
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


# -------------------------------------------------------------------------------------------------
# Headless Chromium

CONSOLE = re.compile(r":CONSOLE[:(]")


def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class Page:
    dom: str
    console: list[str]  # every console message / uncaught error the page logged


def _flags(tmp: Path) -> list[str]:
    # No sandbox: CI runs as root in a container. Virtual time lets the page's async work (inflating
    # plotly.js, drawing) finish before the DOM is dumped or the screenshot is taken. A profile of its own
    # for every run: a second Chromium on the profile the first one's children still hold waited on its
    # lock until the 180 s timeout (test_multi_rank_in_chromium, a screenshot right after a DOM dump).
    profile = tempfile.mkdtemp(prefix="chromium-profile-", dir=tmp)
    return ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-extensions", "--no-first-run", "--hide-scrollbars", "--mute-audio",
            f"--user-data-dir={profile}", "--virtual-time-budget=30000",
            "--enable-logging=stderr", "--v=0"]


def load_page(exe: str, html_path: Path, tmp: Path) -> Page:
    """Open the file in headless Chromium; return the DOM after the scripts ran and the console log."""
    proc = subprocess.run([exe, *_flags(tmp), "--dump-dom", html_path.resolve().as_uri()],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    console = [line for line in proc.stderr.splitlines() if CONSOLE.search(line)]
    return Page(proc.stdout, console)


def screenshot(exe: str, html_path: Path, png: Path, tmp: Path, size: str = "1400,2400") -> Path:
    proc = subprocess.run([exe, *_flags(tmp), f"--window-size={size}", f"--screenshot={png}",
                           html_path.resolve().as_uri()], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0 and png.exists() and png.stat().st_size > 10_000, proc.stderr[-3000:]
    return png
