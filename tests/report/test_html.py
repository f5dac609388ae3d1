"""The HTML report: structure and escaping (no browser), then drawn for real in headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import jinja2
import msgspec
from report_helpers import (
    XSS,
    XSS_CLOSE,
    XSS_MARK,
    hostile_trace,
    load_page,
    sample_ab,
    sample_findings,
    screenshot,
    trace,
)

from torchdoctor.cli import main
from torchdoctor.metrics.ranks import cross_rank
from torchdoctor.report import html as H
from torchdoctor.report import html_figures, html_ranks, html_text
from torchdoctor.report.labels import cause_label
from torchdoctor.report.model import ErrorEntry, RankReport, Report
from torchdoctor.session import analyze_paths

SCRIPT_TAGS = re.compile(r"<script\b[^>]*>", re.IGNORECASE)


def with_findings(rep: Report, ab: bool = False, extra: str = "") -> Report:
    return msgspec.structs.replace(rep, findings=sample_findings(extra), ab=sample_ab() if ab else None,
                                   source="fix" if ab else rep.source)


def many_ranks(rep: Report, n: int) -> Report:
    """`n` ranks cloned from one real rank, rank n//3 made a straggler (it waits least in comm)."""
    a = rep.ranks[0].analysis
    assert a is not None
    ranks = []
    for i in range(n):
        f = 0.2 if i == n // 3 else 1.0 + (i % 7) / 20
        steps = [msgspec.structs.replace(s, comm_ms=(s.comm_ms or 0) * f, comm_exposed_ms=(s.comm_exposed_ms or 0) * f,
                                         dur_ms=s.dur_ms * (1 + (i % 5) / 100)) for s in a.steps]
        m = msgspec.structs.replace(a.metrics, idle_pct=(a.metrics.idle_pct or 0) + (i % 11))
        r = msgspec.structs.replace(a, rank=i, steps=steps, metrics=m)
        ranks.append(RankReport(rank=i, file=f"rank{i}.json.gz", device=a.device, window={}, metrics={},
                                analysis=r))
    return msgspec.structs.replace(rep, ranks=ranks, cross_rank=cross_rank([r.analysis for r in ranks]))


def embedded_figures(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="td-figures">(.*?)</script>', page, re.S)
    assert m, "figures are embedded as plain JSON for small reports"
    return json.loads(m.group(1))


# ---------------------------------------------------------------------------------------------
# Without a browser


def test_script_json_cannot_close_the_script_element():
    text = json.dumps({"k": "</script><script>alert(1)</script><!-- & \u2028"})
    safe = html_text.script_json(text)
    assert "<" not in safe and ">" not in safe and "&" not in safe and "\u2028" not in safe
    assert json.loads(safe) == json.loads(text)


def test_real_trace_page_is_self_contained_and_small(real_report: Report, tmp_path: Path):
    out = H.write_html(with_findings(real_report, ab=True), tmp_path / "r.html")
    page = out.read_text(encoding="utf-8")
    size = out.stat().st_size
    # plotly.js packed (~2.0 MB) plus this trace's figures; the raw plotly.min.js alone is 4.8 MB.
    assert size < 2_600_000, size
    # No network: nothing is fetched (no src/href to anything but in-page anchors).
    assert not re.search(r'\s(?:src|href)\s*=\s*["\']?(?:https?:)?//', page)
    assert "DecompressionStream" in page
    for section in ("Diagnosis matrix", "Timeline of the analysis window", "Step-time breakdown per step",
                    "Kernel categories", "Before / after", "Top kernels by device time"):
        assert section in page, section
    figs = embedded_figures(page)
    assert {"fig-timeline", "fig-ab"} <= set(figs)
    assert any(k.startswith("fig-steps-") for k in figs) and any(k.startswith("fig-kernels-") for k in figs)
    # The timeline colours gaps by cause: one filled trace per cause present in the data.
    r = real_report.ranks[0].analysis
    causes = {g[2] for g in r.timeline_gaps}
    names = {t.get("name") for t in figs["fig-timeline"]["data"] if t.get("fill") == "toself"}
    assert {f"idle: {cause_label(c)}" for c in causes} <= names
    # Every finding is in the matrix with its evidence behind <details>.
    assert page.count('<details class="finding') == 4
    assert "DL-1" in page and "enumerate(DataLoader)" in page


def test_timeline_bands_cover_exactly_the_intervals():
    xs, ys = html_figures._bands([(0, 2_000_000), (5_000_000, 6_500_000)], y=3, half=0.4)
    assert xs == [0.0, 2.0, 5.0, 6.5, 0.0]
    assert ys == [2.6, 3.4, 2.6, 3.4, 3.4]


def test_thousands_of_ranks_stay_bounded(real_report: Report):
    rep = many_ranks(real_report, 1500)
    page, figs = H.render_html_and_figures(rep)
    # The timeline draws at most MAX_TIMELINE_RANKS rows, and the straggler is one of them.
    rows = figs["fig-timeline"]["layout"]["yaxis"]["ticktext"]
    assert len(rows) == html_ranks.MAX_TIMELINE_RANKS
    assert any("straggler" in t and "rank 500" in t for t in rows)
    # The heat map has every rank, a row per group of 6 consecutive ranks (1500 / 256 rows, rounded
    # up); the straggler's group is marked and light in exposed comm (its least).
    heat = figs["fig-heatmap"]["data"]
    assert len(heat[0]["y"]) == 250 and heat[0]["y"][0] == "rank 0–5"
    marked = [i for i, y in enumerate(heat[0]["y"]) if "straggler" in y]
    assert marked == [500 // 6] and heat[0]["y"][83] == "rank 498–503 ◀ straggler"
    assert heat[1]["z"][83] == [round(min(c), 3) for c in zip(*(
        [s.comm_exposed_ms for s in rr.analysis.steps] for rr in rep.ranks[498:504]), strict=True)]
    # Histograms show all ranks; detail panels and table rows are the worst ranks, straggler first.
    assert len(figs["fig-spread"]["data"][0]["x"]) == 1500
    assert page.count('class="rank-panel"') == html_ranks.MAX_DETAIL_RANKS
    assert "Showing 64 of 1500 ranks: the straggler and those with the most device idle time" in page
    # Large figure data is packed like plotly.js, and the page stays a few MB.
    assert 'id="td-figures" data-encoding="gzip+base64"' in page
    assert len(page) < 5_000_000


def test_hostile_names_are_escaped_in_the_markup(tmp_path: Path):
    names = [XSS, XSS_MARK, XSS_CLOSE]
    rep = analyze_paths([str(hostile_trace(tmp_path / "evil<b>.json", names))])
    assert rep.ranks, rep.errors
    assert {k.name for k in rep.ranks[0].analysis.kernels.top} >= set(names)
    page = H.render_html(with_findings(rep, extra=XSS))
    # Our own script elements only: td-figures, td-config, td-plotly and the renderer.
    assert len(SCRIPT_TAGS.findall(page)) == 4
    assert XSS not in page and XSS_MARK not in page and "<img" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    figs = embedded_figures(page)  # the JSON survived the \u escaping
    assert figs


TEMPLATE_PAYLOAD = "<script>alert(1)</script>{{ 7*7 }}{% raw %}"


def test_templates_autoescape_untrusted_text(tmp_path: Path):
    # A kernel name and the finding's title, evidence and file names carry markup and template syntax:
    # the page shows both as text (escaped markup; the template syntax literally, never evaluated).
    rep = analyze_paths([str(hostile_trace(tmp_path / "evil.json", [TEMPLATE_PAYLOAD]))])
    assert rep.ranks, rep.errors
    rep = msgspec.structs.replace(with_findings(rep, extra=TEMPLATE_PAYLOAD),
                                  errors=[ErrorEntry(TEMPLATE_PAYLOAD, TEMPLATE_PAYLOAD)])
    page = H.render_html(rep)
    assert "<script>alert" not in page and len(SCRIPT_TAGS.findall(page)) == 4
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;{{ 7*7 }}{% raw %}"
    assert "The GPU waits for the DataLoader" + escaped in page  # finding title (verdict and matrix)
    assert "enumerate(DataLoader)" + escaped in page  # evidence text
    m = re.search(r"<h3>Top kernels by device time</h3>(.*?)</table>", page, re.S)
    assert m and escaped in m.group(1)  # the kernel's name cell
    assert "&lt;/script&gt;49" not in page
    m = re.search(r'<ul class="problems">(.*?)</ul>', page, re.S)
    assert m and m.group(1).count(escaped) == 2  # an error's file and message


def test_every_template_parses_and_only_our_own_text_is_marked_safe():
    env = H.environment()
    names = env.list_templates()
    assert {"report.html.j2", "macros.html.j2", "sections/matrix.html.j2", "static/report.css",
            "static/report.js"} <= set(names)
    assert env.undefined is jinja2.StrictUndefined
    safe = set()
    for name in (n for n in names if n.endswith(".j2")):
        env.get_template(name)  # raises on a syntax error
        assert env.autoescape(name) is True, name
        source = env.loader.get_source(env, name)[0]
        safe |= set(re.findall(r"([\w.]+)\s*\|\s*safe\b", source))
    # |safe only on what our code produced: the static CSS/JS and the JSON that script_json escaped.
    assert safe == {"css", "js", "figures_json", "config_json"}, safe
    # The static files are inlined into <style>/<script>: nothing in them may close the element.
    assert "</style" not in H.static_text("report.css").lower()
    assert "</script" not in H.static_text("report.js").lower()


def test_page_is_one_self_contained_file(real_report: Report):
    page = H.render_html(with_findings(real_report))
    assert not re.search(r"<link\b", page, re.I)
    assert not re.search(r"<script\b[^>]*\bsrc\s*=", page, re.I)
    assert not re.search(r'\s(?:src|href)\s*=\s*["\']?(?:https?:)?//', page)
    # The stylesheet and the renderer are inlined whole, plotly.js packed in the page.
    assert f"<style>{H.static_text('report.css')}</style>" in page
    assert f"<script>{H.static_text('report.js')}</script>" in page
    assert re.search(r'id="td-plotly" data-encoding="gzip\+base64">[A-Za-z0-9+/=]{1000000,}</script>', page)


def test_reports_without_plots_still_render(tmp_path: Path):
    # CPU-only trace: no device timeline, host breakdown only.
    rep = analyze_paths([trace("cpu_only_rank34.json.gz")])
    page = H.render_html(rep)
    assert "CPU-only trace" in page and "Host thread" in page
    # A report with nothing analysed (e.g. every input failed) still gives a page, and no plotly.
    page = H.render_html(Report(errors=[ErrorEntry("bad.json", "not JSON <b>")]))
    assert 'id="td-plotly" data-encoding="gzip+base64"></script>' in page
    assert "not JSON &lt;b&gt;" in page
    # A live run whose ranks reported facts but no trace: findings, no plots.
    facts_only = Report(source="run", ranks=[RankReport(0, "run/rank0", None, {}, {})],
                        findings=sample_findings(), run={"command": "python train.py", "exit_code": 0})
    page = H.render_html(facts_only)
    assert "no profiler trace was" in page and "DL-1" in page and "python train.py" in page


def test_cli_writes_html_and_annotated_trace(tmp_path: Path):
    html_out, ann_out = tmp_path / "r.html", tmp_path / "a.json.gz"
    code = main(["analyze", trace("a100_8rank_rank3.json.gz"), "-q", "--html", str(html_out),
                 "--annotated-trace", str(ann_out)])
    assert code == 0
    assert html_out.stat().st_size > 1_000_000 and ann_out.stat().st_size > 1_000_000


# ---------------------------------------------------------------------------------------------
# In headless Chromium


def keep_screenshot(png: Path) -> None:
    """Screenshots live in pytest's tmp dir; TORCHDOCTOR_SCREENSHOTS=DIR also keeps a copy there."""
    where = os.environ.get("TORCHDOCTOR_SCREENSHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        shutil.copy(png, Path(where) / png.name)


def assert_drawn(page, expected_plots: int) -> None:
    assert page.console == [], "console messages / uncaught errors:\n" + "\n".join(page.console)
    m = re.search(r'<html[^>]*data-td-status="(\w+)"', page.dom)
    assert m and m.group(1) == "ok", page.dom[:600]
    drawn = int(re.search(r'data-td-plots="(\d+)"', page.dom).group(1))
    assert drawn == expected_plots
    # plotly draws two .main-svg layers per plot; the timeline's bands are filled paths.
    assert page.dom.count('class="main-svg"') >= 2 * expected_plots
    assert "js-fill" in page.dom


def test_real_trace_in_chromium(chromium: str, real_report: Report, tmp_path: Path):
    out = H.write_html(with_findings(real_report, ab=True), tmp_path / "a100_rank3.html")
    page = load_page(chromium, out, tmp_path)
    # A/B, timeline, steps, kernels and roofline (an A100: a known device) of the one rank.
    assert_drawn(page, 5)
    assert 'id="fig-timeline"' in page.dom and "rank 3" in page.dom and 'id="fig-roofline-' in page.dom
    png = screenshot(chromium, out, tmp_path / "a100_rank3.png", tmp_path, size="1400,2900")
    keep_screenshot(png)


def test_multi_rank_in_chromium(chromium: str, multi_report: Report, tmp_path: Path):
    out = H.write_html(with_findings(multi_report), tmp_path / "multi.html")
    page = load_page(chromium, out, tmp_path)
    # Timeline, heat map, and the focused rank's steps and kernels (other ranks draw on selection).
    assert_drawn(page, 4)
    assert "straggler" in page.dom and 'id="td-rank"' in page.dom
    png = screenshot(chromium, out, tmp_path / "multi_rank.png", tmp_path, size="1400,2900")
    keep_screenshot(png)


def test_many_ranks_packed_figures_in_chromium(chromium: str, real_report: Report, tmp_path: Path):
    out = H.write_html(many_ranks(real_report, 600), tmp_path / "many.html")
    assert 'data-encoding="gzip+base64">' in out.read_text()
    # timeline, heat map, histograms of all ranks (over 64), the focused rank's steps, kernels, roofline
    assert_drawn(load_page(chromium, out, tmp_path), 6)


def test_script_in_kernel_name_renders_as_text(chromium: str, tmp_path: Path):
    names = [XSS, XSS_MARK, XSS_CLOSE]
    rep = analyze_paths([str(hostile_trace(tmp_path / "evil.json", names))])
    out = H.write_html(with_findings(rep, extra=XSS), tmp_path / "evil.html")
    page = load_page(chromium, out, tmp_path)
    assert_drawn(page, 3)  # timeline, steps, kernels
    # Nothing ran: the payloads would have marked <body> or added elements.
    assert "data-pwned" not in page.dom.split("<body", 1)[1].split(">", 1)[0]
    assert "alert(1)</script>" not in page.dom
    # Our four script elements plus the one that runs plotly.js; none from the trace.
    assert len(SCRIPT_TAGS.findall(page.dom)) == 5
    # The kernel name is shown as text in the top-kernels table (the DOM serialiser escapes text).
    m = re.search(r"<h3>Top kernels by device time</h3>(.*?)</table>", page.dom, re.S)
    assert m and "&lt;script&gt;alert(1)&lt;/script&gt;" in m.group(1)
    assert "&lt;img src=x onerror=" in m.group(1)
    # ... and in the finding's title and evidence.
    assert page.dom.count("The GPU waits for the DataLoader&lt;script&gt;alert(1)&lt;/script&gt;") >= 1


def test_console_shows_the_worst_ranks_and_the_spread_of_all(real_report: Report):
    import io

    from rich.console import Console

    from torchdoctor.report.console import MAX_RANK_ROWS, print_report

    rep = many_ranks(real_report, 1500)
    out = io.StringIO()
    print_report(rep, Console(file=out, width=200))
    text = out.getvalue()
    rows = [line for line in text.splitlines() if line.strip().startswith("│") and "NVIDIA" in line]
    assert len(rows) == MAX_RANK_ROWS
    assert "500 (straggler)" in text
    # The ranks shown are the straggler and the most idle (i % 11 == 10 adds the most idle here).
    shown = [int(line.split("│")[1].split()[0]) for line in rows]
    assert all(r == 500 or r % 11 == 10 for r in shown)
    assert "Across all 1500 ranks (median / p90 / max): step" in text
    assert "straggler: rank 500" in text
