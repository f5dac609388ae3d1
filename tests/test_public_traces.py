"""Public traces from outside HTA (tests/data/public, see its README): the defects each one exposed
stay fixed. Expected figures come from the JSON itself (a few lines of `json`, in each test)."""

from __future__ import annotations

import gzip
import json

import pytest

from real_traces import PUBLIC, trace
from torchdoctor.hardware.devices import identify
from torchdoctor.session import analyze_paths
from torchdoctor.trace.load import load_trace


def public(name: str) -> str:
    return trace(name, PUBLIC)


def events(path: str) -> list[dict]:
    return [e for e in json.load(gzip.open(path))["traceEvents"] if e.get("ph") == "X"]


def test_rocm_trace_keeps_its_device_despite_a_string_typed_arg():
    path = public("tracelens_mi300_bert_small.json.gz")
    evs = events(path)
    assert [e["name"] for e in evs if isinstance(e["args"].get("bytes"), str)] == ["hipMemcpyWithStream"]
    tr = load_trace(path)
    assert tr.device_name == "AMD Instinct MI300X VF"  # from deviceProperties, after traceEvents
    assert identify(tr.device_name, tr.device_properties[0]).device.key == "MI300X"
    assert len(tr) == len(evs)  # the badly typed event is kept, its bad arg read as absent


def _exposed_loader_wait(path: str) -> tuple[float, float]:
    """(window ms, DataLoader ms while no kernel, copy or memset runs), window = first to last device event."""
    evs = events(path)
    dev = sorted((e["ts"], e["ts"] + e["dur"]) for e in evs if e["cat"] in ("kernel", "gpu_memcpy", "gpu_memset"))
    lo, hi = dev[0][0], max(b for _, b in dev)
    busy: list[list[float]] = []
    for a, b in dev:
        if busy and a <= busy[-1][1]:
            busy[-1][1] = max(busy[-1][1], b)
        else:
            busy.append([a, b])
    wait = 0.0
    for e in evs:
        if e["name"].startswith("enumerate(DataLoader)"):
            a, b = max(e["ts"], lo), min(e["ts"] + e["dur"], hi)
            if b > a:
                wait += (b - a) - sum(max(0.0, min(b, y) - max(a, x)) for x, y in busy)
    return (hi - lo) / 1e3, wait / 1e3


def test_input_bound_trace_without_steps_is_diagnosed_input_bound():
    path = public("param_resnet_kineto.json.gz")
    window_ms, wait_ms = _exposed_loader_wait(path)
    assert wait_ms / window_ms == pytest.approx(0.459, abs=0.001)
    report = analyze_paths([path])
    r = report.ranks[0].analysis
    assert r is not None and not r.window.steps
    assert r.window.mode == ("whole trace (no ProfilerStep; Optimizer.step, DataLoader, backward boundaries "
                             "found, but too irregular to be steps)")
    assert (r.window.end_ns - r.window.start_ns) / 1e6 == pytest.approx(window_ms, abs=0.01)
    top = [f for f in report.findings if f.severity != "info"][0]
    assert top.id == "DL-1" and top.per == "window"  # was HO-5 (host-bound), DL-1 absent
    assert top.recoverable_ms == pytest.approx(wait_ms, abs=0.1)
