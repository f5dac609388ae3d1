"""metrics/rooflinesum: kinds against their roofs and MFU per rank; the console and HTML say it."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from kineto_builder import TraceBuilder
from real_traces import trace
from torchdoctor.metrics.rank import analyze_rank
from torchdoctor.report import html as H
from torchdoctor.report.console import print_report
from torchdoctor.report.html_figures import roofline_figure
from torchdoctor.report.roofline_text import roofline_lines
from torchdoctor.session import analyze_paths
from torchdoctor.trace.load import load_trace

NVJET = "nvjet_tst_128x256_64x4_1x2_h_bz_NNT"
EVIL = "<script>alert(1)</script>_gemm"


def summary_trace(device: str | None, gemm_name: str = NVJET) -> TraceBuilder:
    b = TraceBuilder(device_name=device)
    b.step(1, 0.0, 5_000.0)
    b.step(2, 5_000.0, 5_000.0)
    for t0 in (100.0, 5_100.0):  # one 4096^3 bf16 GEMM per step, 900 µs each
        b.gemm("aten::mm", t0, 40.0, [[4096, 4096], [4096, 4096]], kernel=gemm_name, kernel_at=t0 + 100,
               kernel_dur=900.0)
        # add(x, y) on 1024x4096 fp32: 2 reads + 1 write of 16 MiB in 40 µs.
        b.launching("aten::add", t0 + 1200, 10.0, "vectorized_elementwise_kernel<4, add>", t0 + 1300, 40.0,
                    dims=[[1024, 4096], [1024, 4096], []], types=["float", "float", "Scalar"])
    b.kernel("triton_poi_fused_0", 3000.0, 50.0)  # elementwise, no op with shapes: unknown bytes
    return b


def test_rows_and_mfu_by_hand(tmp_path):
    r = analyze_rank(load_trace(str(summary_trace("NVIDIA H100 80GB HBM3").write(tmp_path / "t.json"))))
    roof = r.roofline
    assert roof.device_key == "H100-SXM" and roof.mem_bw_gbs == 3350
    rows = {x.kind: x for x in roof.rows}
    g, e = rows["gemm"], rows["elementwise"]
    flops = 2 * 4096**3
    assert g.precision == "bf16" and g.flops == 2 * flops and g.known_ns == g.ns == 1_800_000
    assert g.pct_of_peak == pytest.approx(100 * (2 * flops / 1_800_000 / 1e3) / 989.4, abs=0.01)  # ≈ 15.4%
    add_bytes = 3 * 1024 * 4096 * 4
    assert e.bytes == 2 * add_bytes and e.known_ns == 80_000 and e.ns == 130_000  # the Triton kernel is unknown
    assert e.pct_of_bandwidth == pytest.approx(100 * (2 * add_bytes / 80_000) / 3350, abs=0.01)
    # MFU: 2 GEMMs' FLOPs over the 10 ms window against the bf16 peak; per step: one GEMM, 5 ms.
    assert roof.model_flops == 2 * flops and roof.flops_per_step == flops and roof.step_ns == 5e6
    assert roof.mfu_pct == pytest.approx(100 * 2 * flops / 10e6 / 1e3 / 989.4, abs=1e-3)
    assert roof.mfu_precision == "bf16" and "100%" in roof.mfu_note
    text = " ".join(roofline_lines(r))
    assert "GEMMs run at 15.4% of bf16 peak" in text and "elementwise kernels at" in text and "of bandwidth" in text
    assert "over 62% of their time" in text and "MFU 2.8%" in text, text


def test_unknown_device_says_no_roofline_plainly(tmp_path):
    rep = analyze_paths([str(summary_trace("NVIDIA RTX 6000 Ada Generation").write(tmp_path / "t.json"))])
    buf = io.StringIO()
    print_report(rep, Console(file=buf, width=300, highlight=False))
    out = buf.getvalue()
    assert "unknown device: no roofline" in out
    r = rep.ranks[0].analysis
    assert r.roofline.device_key is None and r.roofline.mfu_pct is None and r.roofline.model_flops
    assert roofline_figure(r) is None
    assert "unknown device: no roofline" in H.render_html(rep)


def test_window_without_kernels_still_says_why():
    r = analyze_rank(load_trace(trace("mi250_rocm_minitoy.json.gz")))
    assert r.kernels.device_key == "MI250" and "no kernels in the window" in r.kernels.device_note
    assert r.roofline is not None and not r.roofline.rows and "no kernels" in r.roofline.mfu_note
    assert roofline_lines(r) == ["roofline: no kernels in the window: no roofline"]


def test_a100_real_trace_summary():
    r = analyze_rank(load_trace(trace("a100_8rank_rank3.json.gz")))
    rows = {(x.kind, x.precision): x for x in r.roofline.rows}
    tf32 = rows[("gemm", "tf32")]
    assert tf32.known_ns == tf32.ns and 0 < tf32.pct_of_peak < 100
    assert 0 < rows[("elementwise", None)].pct_of_bandwidth < 100
    assert r.roofline.mfu_precision == "tf32" and 0 < r.roofline.mfu_pct < tf32.pct_of_peak
    assert "a lower bound" in r.roofline.mfu_note  # some GEMM time has no recorded shapes


def test_html_roofline_plot_is_log_log_and_escapes_names(tmp_path):
    rep = analyze_paths([str(summary_trace("NVIDIA H100 80GB HBM3", EVIL).write(tmp_path / "t.json"))])
    r = rep.ranks[0].analysis
    fig = roofline_figure(r)
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    roofs = [t for t in fig.data if t.mode == "lines"]
    assert [t.name for t in roofs] == ["bf16 roof (989.4 TFLOP/s)"]
    assert roofs[0].y[-1] == 989.4 and roofs[0].x[1] == pytest.approx(989.4e3 / 3350)  # the ridge
    points = fig.data[-1]
    assert list(points.x) == [pytest.approx(2 * 4096**3 / (3 * 4096**2 * 2), abs=0.01)]
    assert "<script>" not in json.dumps(points.customdata.tolist() if hasattr(points.customdata, "tolist")
                                        else list(points.customdata))
    page = H.render_html(rep)
    assert "<h3>Roofline</h3>" in page and "fig-roofline-" in page and "<script>alert(1)" not in page
