"""The matrix on the real traces in tests/data/hta: plausibility, not snapshots."""

from __future__ import annotations

import gzip
import json

import pytest

from torchdoctor.metrics.gemm import MATRIX_INPUTS
from torchdoctor.session import analyze_paths

from .conftest import TRACES

ALL = sorted(p.name.split(".")[0] for p in TRACES.glob("*.json.gz"))
IDLE_LAYERS = ("input", "host")


def top(report, n=3):
    return [f for f in report.findings if f.recoverable_pct > 0][:n]


@pytest.mark.parametrize("name", ALL)
def test_every_trace_diagnoses_cleanly(real, name):
    rep = real(name)
    assert not [w for w in rep.warnings if "rule" in w.message and "failed" in w.message]
    shares = [f.recoverable_pct for f in rep.findings]
    assert all(0.0 <= s <= 100.0 for s in shares)
    # Findings split the step between them: together they never give back more than the step.
    assert sum(shares) <= 100.0 + 1e-6
    # The order of action: warning+ findings by share, then the info ones by share.
    acted = [f.recoverable_pct for f in rep.findings if f.severity != "info"]
    said = [f.recoverable_pct for f in rep.findings if f.severity == "info"]
    assert shares == sorted(acted, reverse=True) + sorted(said, reverse=True)
    for f in rep.findings:
        assert f.title and f.evidence is not None and f.source


@pytest.mark.parametrize("name", ALL)
def test_kernel_choice_advisors_stay_silent_without_cause(real, name):
    # None of these traces runs SDPA, hand-written norms/GELU, bf16 on a V100, or bf16 GEMMs an
    # FP8 / 2:4 kernel could take (they are fp32 models): HW-13..HW-17 must not fire.
    rep = real(name)
    assert not [f.id for f in rep.findings if f.id in ("HW-13", "HW-14", "HW-15", "HW-16", "HW-17")]


def test_healthy_resnet_raises_no_warning(real):
    rep = real("v100_resnet_rank0")
    assert rep.healthy is True
    assert not [f for f in rep.findings if f.severity != "info"]


def idle_claims(rep) -> float:
    return sum(f.recoverable_pct for f in rep.findings if f.layer in IDLE_LAYERS)


@pytest.mark.parametrize("name", ["a100_16rank_rank0", "a100_2rank_rank0_nccl", "sampled_128rank_rank0"])
def test_idle_time_is_accounted_for_without_double_counting(real, name):
    rep = real(name)
    idle = rep.ranks[0].analysis.metrics.idle_pct
    assert idle > 50
    claimed = idle_claims(rep)
    assert 0.85 * idle <= claimed <= idle + 0.5


def test_a100_16rank_top_findings(real):
    rep = real("a100_16rank_rank0")
    ids = [f.id for f in top(rep)]
    assert ids[:2] == ["HO-3", "HO-5"]  # the blocking .cpu() in sparse_data_dist, then the rest of the host
    ho3 = rep.findings[0]
    assert ho3.severity == "critical" and "sparse_data_dist" in ho3.title and 35 < ho3.recoverable_pct < 50
    assert sum(f.recoverable_pct for f in top(rep, 2)) > 0.9 * rep.ranks[0].analysis.metrics.idle_pct


def test_v100_memory_all_reduce_exposed_after_backward(real):
    rep = real("v100_2rank_rank1_memory")
    ids = {f.id for f in rep.findings}
    assert {"DI-4", "DI-10", "HO-9", "HO-10"} <= ids
    comm = rep.ranks[0].analysis.metrics.comm_exposed_pct
    assert sum(f.recoverable_pct for f in rep.findings if f.layer == "distributed") <= comm + 0.5
    di4 = next(f for f in rep.findings if f.id == "DI-4")
    assert "gradient all-reduce" in di4.title


def test_cpu_only_gloo_trace(real):
    rep = real("cpu_only_rank34")
    di3 = next(f for f in rep.findings if f.id == "DI-3")
    assert di3.severity == "critical" and "inside collectives" in di3.title
    assert di3.recoverable_pct < rep.ranks[0].analysis.metrics.comm_exposed_pct  # not all of it is avoidable


def test_traces_without_device_work_in_window_say_so(real):
    rep = real("mi250_rocm_minitoy")
    assert [f.id for f in rep.findings] == ["HO-1"]
    # Nothing wrong in the window, but no device activity in it either: no "healthy" verdict.
    assert rep.healthy is None and [s["kind"] for s in rep.blind_spots] == ["no-verdict"]
    assert "no device activity inside the analysed window" in rep.blind_spots[0]["text"]


def test_two_ranks_together(real):
    rep = real("sampled_128rank_rank0", "sampled_128rank_rank1")
    assert rep.cross_rank is not None and len(rep.ranks) == 2
    assert all(f.ranks for f in rep.findings)


# --- HW-2 (fp16/bf16 GEMM shapes) and HW-4 (SM fill) -------------------------------------------------
# Numbers below were checked against an independent pure-json count over the same window
# (leaf GEMM ops by nesting on their thread, kernels by correlation; a Python sweep of blocks per SM).

WITH_SHAPES = ["a100_16rank_rank0", "a100_8rank_rank3", "v100_2rank_rank1_diff", "sampled_128rank_rank0",
               "sampled_128rank_rank1"]


@pytest.mark.parametrize("name", WITH_SHAPES)
def test_hw2_silent_on_the_real_fp32_matmuls(real, name):
    # These traces record shapes, and their fp32 GEMMs include odd dims (a100_8rank_rank3:
    # addmm [1024, 1705] x [1705, 512]); fp32 is HW-1's domain, so HW-2 sees no candidate.
    rep = real(name)
    g = rep.ranks[0].analysis.signals.misaligned_gemms
    assert g is not None and (g.half_gemms, g.count) == (0, 0)
    assert "HW-2" not in {f.id for f in rep.findings}


@pytest.fixture(scope="module")
def bf16_twin(tmp_path_factory):
    """a100_8rank_rank3 with its GEMM ops' fp32 `Input type` rewritten to bf16 (same shapes, same kernels)."""
    with gzip.open(TRACES / "a100_8rank_rank3.json.gz", "rt") as f:
        doc = json.load(f)
    for e in doc["traceEvents"]:
        args = e.get("args") or {}
        if e.get("name") in MATRIX_INPUTS and "Input type" in args:
            args["Input type"] = ["c10::BFloat16" if t == "float" else t for t in args["Input type"]]
    path = tmp_path_factory.mktemp("bf16") / "a100_8rank_rank3_bf16.json"
    path.write_text(json.dumps(doc))
    return analyze_paths([str(path)])


def test_hw2_on_a_bf16_twin_of_a_real_trace(bf16_twin):
    g = bf16_twin.ranks[0].analysis.signals.misaligned_gemms
    assert (g.half_gemms, g.count, g.time_source) == (1776, 672, "device")
    assert g.device_ns == 53_605_000
    top = g.sites[0]
    assert (top.op, top.shapes, top.count, top.device_ns) == ("aten::bmm", "[[1024,647,96],[1024,96,30]]", 12,
                                                               5_648_000)
    assert top.misaligned == ["M", "N"]
    hw2 = next(f for f in bf16_twin.findings if f.id == "HW-2")
    # 53.6 ms / 6 steps = 8.9 ms per step; 1/4 of it x busy share 0.835 = 1.87 ms of a 77.5 ms step.
    assert hw2.severity == "info" and 2.3 < hw2.recoverable_pct < 2.5
    assert hw2.title.startswith("112 fp16/bf16 matmuls per step have M/K/N not a multiple of 8")


def test_hw4_numbers_on_a100_8rank_rank3(real):
    rep = real("a100_8rank_rank3")
    r = rep.ranks[0].analysis
    f = r.signals.sm_fill
    assert f.kernel_ns == 283_278_000 and f.underfilled_ns == 54_506_000
    # 4.0 ms per step: 6.2% of busy time. NCCL's blocks hold SMs while they run beside compute
    # kernels (28.65 ms empty when they were left out of the fill, as TBP counts every kernel).
    assert f.sm_idle_ns == 23_891_037
    assert f.sm_efficiency_pct == 91.51 and f.occupancy_pct == 47.61
    top = f.top[0]
    assert top.name.startswith("void at::native::reduce_kernel<128, 4,") and top.count == 540
    assert top.idle_ns == 4_905_861
    # Most of the empty SM-time is in pointwise/reduction kernels, which CG-1 prices (fusion); the
    # GEMMs' share, 1/4 of it x busy share, stays under 0.5% of the step: HW-4 does not speak.
    assert "CG-1" in {x.id for x in rep.findings}
    assert "HW-4" not in {x.id for x in rep.findings}


# NCCL kernels running beside compute count as filling their SMs (89.63 and 97.46 before they did).
@pytest.mark.parametrize(("name", "efficiency"), [("v100_resnet_rank0", 98.01), ("a100_16rank_rank0", 89.66),
                                                  ("sampled_128rank_rank0", 97.69)])
def test_hw4_silent_where_compute_kernels_fill_the_sms(real, name, efficiency):
    rep = real(name)
    assert rep.ranks[0].analysis.signals.sm_fill.sm_efficiency_pct == efficiency
    assert "HW-4" not in {x.id for x in rep.findings}


def test_hw4_no_launch_args_on_rocm(real):
    assert real("mi250_rocm_minitoy").ranks[0].analysis.signals.sm_fill is None
