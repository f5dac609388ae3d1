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


# kineto's tb_plugin samples: ResNet-50 on CIFAR-10 (batch 32) on a DGX Station V100, the same
# script with num_workers=0 and num_workers=4; and the first samples, recorded by torch 1.8.
W0, W4, W0_TORCH18 = ("tbplugin_resnet50_workers0.json.gz", "tbplugin_resnet50_workers4.json.gz",
                      "tbplugin_resnet50_workers0_torch18.json.gz")


def _median_step_ms(path: str) -> float:
    durs = sorted(e["dur"] for e in events(path) if e["name"].startswith("ProfilerStep#"))
    mid = len(durs) // 2
    return (durs[mid - 1] + durs[mid]) / 2e3 if len(durs) % 2 == 0 else durs[mid] / 1e3


def test_workers_estimate_against_the_run_with_workers():
    # The A/B the samples were recorded for: 4 workers took the median step from 176.27 to
    # 126.55 ms. DL-2 on the num_workers=0 trace predicts the wait it hides; the host's own work
    # grew by about 8 ms per step with 4 workers beside it, which no trace of the first run shows.
    before, after = _median_step_ms(public(W0)), _median_step_ms(public(W4))
    assert (before, after) == pytest.approx((176.27, 126.55), abs=0.01)
    report = analyze_paths([public(W0)])
    dl2 = next(f for f in report.findings if f.id == "DL-2")
    assert dl2.severity == "critical" and report.findings[0].id == "DL-2"
    assert 1.0 <= dl2.recoverable_ms / (before - after) <= 1.25
    r = report.ranks[0].analysis
    assert (r.device, r.kernels.device_key) == ("Tesla V100-DGXS-32GB", "V100-SXM2")  # a DGX Station's V100


def test_pageable_copies_that_stall_the_step_are_priced():
    # With 4 workers the batch's pageable copy waits for the queue each step, and in the first
    # step of the window stalls 40 ms with the device idle: the time pinning takes off the step.
    path = public(W4)
    copies = [e for e in events(path) if e["name"] == "cudaMemcpyAsync" and e["dur"] > 1000]
    assert [round(e["dur"] / 1e3, 1) for e in copies] == [40.0, 3.1, 3.1, 3.1, 3.9, 3.0]
    report = analyze_paths([path])
    dl4 = next(f for f in report.findings if f.id == "DL-4")
    blocked = dl4.evidence[1].values["host_blocked_ms"]
    assert blocked == pytest.approx(sum(e["dur"] for e in copies) / 1e3 / 6, abs=0.05)
    assert 5.0 < dl4.evidence[1].values["idle_ms"] < blocked and dl4.recoverable_ms > 6.5
    ho5 = next(f for f in report.findings if f.id == "HO-5")
    assert "aten::to " not in ho5.title  # the copy is DL-4's, not the host-bound rule's lead


def test_torch18_nested_ops_count_once():
    # torch 1.8 records the autograd layer's op around the kernel's op of the same name
    # (aten::zero_ inside aten::zero_): ResNet-50's 161 gradients read as 322 fills.
    path = public(W0_TORCH18)
    evs = events(path)
    zero_grads = [e for e in evs if e["name"].startswith("Optimizer.zero_grad#")]
    fills = []
    for z in zero_grads:
        inner = sorted((e for e in evs if e["name"] == "aten::zero_" and e["tid"] == z["tid"]
                        and z["ts"] <= e["ts"] and e["ts"] + e["dur"] <= z["ts"] + z["dur"]),
                       key=lambda e: (e["ts"], -e["dur"]))
        reach, outer = -1.0, 0
        for e in inner:
            if e["ts"] + e["dur"] > reach:
                outer, reach = outer + 1, e["ts"] + e["dur"]
        fills.append((len(inner), outer))
    assert set(fills) == {(322, 161)}
    r = analyze_paths([path]).ranks[0].analysis
    assert r.signals.zero_grad_fills_per_step == 161 and r.signals.optimizer_ops_per_step == 484
    assert r.signals.optimizer_impl == "single_tensor"


def test_gemms_without_a_launching_op_get_their_precision_from_the_kernel_name():
    path = public("tracelens_h100_qwen05b_chat.json.gz")
    evs = events(path)
    launched = {e["args"].get("correlation") for e in evs if e["cat"] == "cuda_runtime"}
    gemms = [e for e in evs if e["cat"] == "kernel" and e["name"].startswith("sm90_xmma_gemm_bf16bf16_")]
    orphans = sum(e["dur"] for e in gemms if e["args"].get("correlation") not in launched)
    assert orphans / sum(e["dur"] for e in gemms) == pytest.approx(0.308, abs=0.001)  # no op, no dtype
    c = analyze_paths([path]).ranks[0].analysis.choice
    assert "" not in c.gemm_ns and c.precision.shares["bf16"] == 100.0
    # An H100 has FP8; these GEMMs (hidden size 1024) are below the size where it pays.
    assert c.precision.recommended == "keep"
    assert c.precision.why.startswith("no bf16 GEMM with recorded shapes has M, N and K of 2048 or more")


def test_blackwell_moe_gemms_are_read_from_their_names():
    path = public("tracelens_b200_vllm_moe.json.gz")
    evs = events(path)
    us = {p: sum(e["dur"] for e in evs if e["cat"] == "kernel" and e["name"].startswith(p))
          for p in ("bmm_MxE4m3_", "bmm_Bfloat16_")}
    r = analyze_paths([path]).ranks[0].analysis
    assert r.device == "NVIDIA B200" and identify(r.device).device.key == "B200"
    c = r.choice
    # bmm_<out>_<A><B>: MXFP4 x MXFP8, whatever the output type, runs at the FP8 rate.
    assert c.gemm_ns["fp8"] == pytest.approx(1e3 * (us["bmm_MxE4m3_"] + us["bmm_Bfloat16_"]), abs=len(evs))
    assert c.gemm_ns[""] / sum(c.gemm_ns.values()) < 0.05  # cuBLASLt's nvjet names carry no type
    assert c.precision.recommended == "keep" and c.precision.dominant == "fp8"
