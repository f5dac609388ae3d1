"""`--html`: one self-contained HTML report that works from file:// with no network.

Layout: verdict and headline numbers, the A/B result of `fix` (when present), the diagnosis matrix
(layers × findings, ranked, evidence in <details>), a per-rank timeline of the analysis window with
idle gaps coloured by attribution, a per-rank heat map of step time and exposed communication, and
per-rank detail (step-time breakdown per step, kernel categories, idle causes, syncs) behind a rank
selector.

How it stays self-contained and small: plotly.js (~4.8 MB) is embedded once as gzip+base64
(~2 MB) and inflated in the browser with DecompressionStream (Chrome 80+, Firefox 113+, Safari
16.4+), then run as an inline script; the figures are built here with plotly's Python objects (so
property names are validated) and embedded as JSON, packed like plotly.js when they pass
FIGS_INLINE_LIMIT (many ranks). A real single-rank report is ~2.1 MB. Tables are rendered here as
HTML so the page reads even where the plots cannot be drawn. Every plot is bounded whatever the
job size: timeline rows, detail ranks and table rows are capped, heat maps are images.

Security: every string from a trace (kernel, op, file names) is untrusted. HTML text goes through
html.escape; strings inside figures are escaped too (plotly interprets a subset of HTML in labels
and hover text); and the JSON embedded in <script> has `<`, `>`, `&` and the JS line separators
written as \\u escapes so no string can close the script element.
"""

from __future__ import annotations

import base64
import functools
import gzip
import html
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import plotly.graph_objects as go
import plotly.io as pio
import plotly.offline
from plotly.subplots import make_subplots

from .. import __version__
from ..metrics.model import RankResult
from ..metrics.ranks import CrossRank, comm_wait_ms
from .labels import BUSY_COLOR, CAUSE_COLOR, CAUSE_ORDER, UNKNOWN_CAUSE_COLOR, cause_label, fmt_ms
from .model import ABResult, Evidence, Finding, RankReport, Report
from .offenders import groups, late_line, worst
from .roofline_text import roofline_lines

LAYERS = ("input", "host", "compile", "distributed", "hardware")
# Bounds that keep the page light whatever the job size (thousands of ranks, long windows).
MAX_TIMELINE_RANKS = 12  # rows in the timeline (each carries up to ~4000 intervals)
MAX_DETAIL_RANKS = 16  # ranks offered in the per-rank detail selector
MAX_HEATMAP_RANKS = 4096  # ranks in the heat map
MAX_HEATMAP_ROWS = 256  # beyond this, a heat-map row stands for a group of consecutive ranks
MAX_HEATMAP_STEPS = 200
MAX_TABLE_RANKS = 64
MAX_HOVER_GAPS = 300  # per timeline row: the longest gaps get a hover target
MAX_HEATMAP_TEXT_CELLS = 300  # above this the numbers no longer fit inside the cells
MAX_ITEMS = 20  # evidence items listed per evidence entry
# Figure JSON above this is embedded gzip+base64 too (a 1.5 MB timeline of 12 busy ranks packs to
# ~0.4 MB); below it stays readable JSON in the page source.
FIGS_INLINE_LIMIT = 512 * 1024
MAX_NAME = 140  # characters of a kernel/op name shown before eliding (full name in the tooltip)

SEVERITY_COLOR = {"critical": "#C62828", "warning": "#E08A00", "info": "#1E6FB8"}
DEVICE_PARTS = (  # stacked per step; the four add up to the step's duration
    ("compute", "busy: compute (+ overlapped comm)", "#009E73"),
    ("comm_exposed", "busy: exposed comm", "#0072B2"),
    ("data_idle", "idle: data wait", CAUSE_COLOR["dataloader"]),
    ("other_idle", "idle: other", CAUSE_COLOR["untraced"]),
)
HOST_COLOR = {"data": "#E69F00", "forward": "#4C78A8", "backward": "#54A24B", "optimizer": "#CC79A7",
              "comm": "#0072B2", "other": "#BAB0AC"}
KIND_COLOR = {"gemm": "#4C78A8", "conv": "#72B7B2", "attention": "#B279A2", "elementwise": "#54A24B",
              "reduction": "#EECA3B", "norm": "#9D755D", "comm": "#0072B2", "memcpy": "#F58518",
              "memset": "#E45756", "other": "#BAB0AC"}
FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"
PLOT_CONFIG = {"displaylogo": False, "responsive": True, "showLink": False,
               "modeBarButtonsToRemove": ["lasso2d", "select2d", "autoScale2d"],
               "toImageButtonOptions": {"format": "png", "scale": 2}}


# ---------------------------------------------------------------------------------------------
# Escaping


def esc(value: object) -> str:
    """Text for HTML (element content and quoted attributes)."""
    return html.escape(str(value), quote=True)


def pesc(value: object) -> str:
    """Text for a plotly label or hover text: plotly reads a subset of HTML there (<b>, <a href>),
    and decodes &lt; &gt; &amp;, so escaping shows untrusted names literally."""
    return html.escape(str(value), quote=False)


_SCRIPT_UNSAFE = re.compile("[<>&\u2028\u2029]")


def script_json(text: str) -> str:
    """JSON text made safe inside <script>: no `</script>` or `<!--` can form; U+2028/9 escaped
    for older JS parsers. Only string contents can hold these characters, where \\uXXXX is valid."""
    return _SCRIPT_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def short(name: str, n: int = MAX_NAME) -> str:
    return name if len(name) <= n else name[: n - 1] + "…"


# ---------------------------------------------------------------------------------------------
# Entry points


def write_html(report: Report, path: str | os.PathLike[str]) -> Path:
    """Write the report as one self-contained HTML file; returns the path written."""
    out = Path(path)
    out.write_text(render_html(report), encoding="utf-8")
    return out


def render_html(report: Report) -> str:
    page = _Page(report)
    return page.render()


def gzip_b64(data: bytes) -> str:
    # mtime 0: the same report always gives the same file.
    return base64.b64encode(gzip.compress(data, compresslevel=9, mtime=0)).decode("ascii")


@functools.lru_cache(maxsize=1)
def plotly_js_gzip_b64() -> str:
    """plotly.min.js (4.8 MB) gzipped and base64'd: 2 MB, inflated by the page itself."""
    return gzip_b64(plotly.offline.get_plotlyjs().encode("utf-8"))


def plotly_js_version() -> str:
    m = re.search(r"plotly\.js v([0-9][0-9A-Za-z.\-]*)", plotly.offline.get_plotlyjs()[:400])
    return m.group(1) if m else "?"


# ---------------------------------------------------------------------------------------------
# Ranks


@dataclass
class RankView:
    """One analysed rank as the page shows it: a stable key, a unique label, its numbers."""

    key: str
    label: str
    rank: int | None
    result: RankResult
    report: RankReport


def rank_views(report: Report) -> list[RankView]:
    rows = [rr for rr in report.ranks if rr.analysis is not None]
    counts: dict[int | None, int] = {}
    for rr in rows:
        counts[rr.rank] = counts.get(rr.rank, 0) + 1
    views = []
    for i, rr in enumerate(rows):
        assert rr.analysis is not None
        label = f"rank {rr.rank}" if rr.rank is not None else f"trace {i}"
        if counts[rr.rank] > 1:
            # Two traces claiming one rank are reported separately (session.assign_ranks): name both.
            label += f" · {short(os.path.basename(rr.file), 40)}"
        views.append(RankView(f"r{i}", label, rr.rank, rr.analysis, rr))
    return views


def straggler_key(views: list[RankView], cross: CrossRank | None) -> str | None:
    """The view of the straggler rank. CrossRank names it by rank number; when two traces claim that
    number (reported separately), the one that waits least in collectives is the one it meant."""
    if cross is None or cross.straggler is None:
        return None
    cands = [v for v in views if v.rank == cross.straggler]
    if not cands:
        return None

    def wait(v: RankView) -> float:
        w = comm_wait_ms(v.result)
        return float("inf") if w is None else w

    return min(cands, key=wait).key


def device_name(r: RankResult) -> str:
    if r.device:
        return r.device
    # Device activity without deviceProperties (older Kineto): say what kind, not "CPU only".
    return "CPU only" if r.device_kind == "cpu" else f"{r.device_kind.upper()} device (unnamed)"


def pick_ranks(views: list[RankView], straggler: str | None, cap: int) -> list[RankView]:
    """At most `cap` ranks worth drawing: the straggler, then the ranks with most device idle time
    (then longest step), shown in rank order. With thousands of ranks a row each would be unreadable
    and heavy; these are the rows a reader looks for."""
    first = next((i for i, v in enumerate(views) if v.key == straggler), None)
    return [views[i] for i in worst([v.result for v in views], cap, first)]


# ---------------------------------------------------------------------------------------------
# Figures


def base_layout(height: int, **kw: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "template": "none",  # plotly's default template adds ~8 KB of JSON per figure
        "height": height,
        "font": {"family": FONT, "size": 12, "color": "#1f2933"},
        "paper_bgcolor": "rgba(0,0,0,0)",
        "plot_bgcolor": "#ffffff",
        "margin": {"l": 70, "r": 20, "t": 36, "b": 46},
        "hoverlabel": {"font": {"family": FONT, "size": 12}, "align": "left"},
        "legend": {"orientation": "h", "yanchor": "bottom", "y": 1.02, "xanchor": "left", "x": 0,
                   "font": {"size": 11}},
        "modebar": {"bgcolor": "rgba(255,255,255,0.85)", "color": "#9AA5B1", "activecolor": "#1f2933"},
    }
    layout.update(kw)
    return layout


def style_axes(fig: go.Figure) -> None:
    fig.update_xaxes(showgrid=True, gridcolor="#E6EAEE", zeroline=False, linecolor="#9AA5B1",
                     ticks="outside", tickcolor="#9AA5B1", automargin=True)
    fig.update_yaxes(showgrid=True, gridcolor="#E6EAEE", zeroline=False, linecolor="#9AA5B1",
                     automargin=True)


def _bands(pairs: Sequence[Sequence[int]], y: float, half: float) -> tuple[list[float], list[float]]:
    """(start_ns, end_ns) intervals → one closed step-shaped polygon (x in ms) for row `y`.

    Drawn with line shape "hv" and fill "toself", the points (s, top) (e, base) per interval trace
    the rectangles' tops and walk back along the base, so a whole row of up to ~4000 intervals is
    ONE svg path (a rect or a line segment each would be thousands of DOM nodes per row, and
    plotly splits a line at every gap into its own path)."""
    top, base = y - half, y + half
    xs: list[float] = []
    ys: list[float] = []
    for p in pairs:
        xs += [round(p[0] / 1e6, 3), round(p[1] / 1e6, 3)]  # µs: Kineto's own resolution
        ys += [top, base]
    if xs:
        xs.append(xs[0])  # back along the base to the first start; the fill closes the first side
        ys.append(base)
    return xs, ys


def timeline_figure(views: list[RankView], straggler: str | None) -> go.Figure:
    n = len(views)
    pitch = 40 if n > 1 else 64
    half = 0.36 if n > 1 else 0.3  # half the bar thickness of a row, in row units
    band: dict[str, Any] = {"mode": "lines", "fill": "toself", "line": {"width": 0, "shape": "hv"},
                            "hoverinfo": "skip"}
    fig = go.Figure()
    legend_done: set[str] = set()

    def legend_once(group: str) -> bool:
        first = group not in legend_done
        legend_done.add(group)
        return first

    x_max = max((v.result.window.end_ns - v.result.window.start_ns) / 1e6 for v in views)
    for y, v in enumerate(views):
        r = v.result
        bx, by = _bands(r.timeline_busy, y, half)
        fig.add_scatter(x=bx, y=by, name="device busy", fillcolor=BUSY_COLOR, legendgroup="busy",
                        showlegend=legend_once("busy"), **band)
        by_cause: dict[str, list[tuple[int, int, str]]] = {}
        for g in r.timeline_gaps:
            by_cause.setdefault(g[2], []).append(g)
        # Hover targets only for the longest gaps: enough to inspect, bounded in size.
        longest = sorted(r.timeline_gaps, key=lambda g: g[0] - g[1])[:MAX_HOVER_GAPS]
        hover_by_cause: dict[str, list[tuple[int, int, str]]] = {}
        for g in longest:
            hover_by_cause.setdefault(g[2], []).append(g)
        ordered = [c for c in CAUSE_ORDER if c in by_cause] + sorted(c for c in by_cause if c not in CAUSE_ORDER)
        for cause in ordered:
            color = CAUSE_COLOR.get(cause, UNKNOWN_CAUSE_COLOR)
            name = f"idle: {pesc(cause_label(cause))}"
            gx, gy = _bands(by_cause[cause], y, half)
            fig.add_scatter(x=gx, y=gy, name=name, fillcolor=color, legendgroup=cause,
                            showlegend=legend_once(cause), **band)
            hov = hover_by_cause.get(cause, [])
            if hov:
                fig.add_scatter(
                    x=[round((g[0] + g[1]) / 2e6, 4) for g in hov], y=[y] * len(hov), mode="markers",
                    marker={"size": 16, "opacity": 0, "color": color}, legendgroup=cause,
                    showlegend=False, name=name,
                    customdata=[[round((g[1] - g[0]) / 1e6, 4), round(g[0] / 1e6, 4)] for g in hov],
                    hovertemplate=(f"<b>idle %{{customdata[0]:.3f}} ms</b>: {pesc(cause_label(cause))}"
                                   f"<br>from %{{customdata[1]:.3f}} ms<extra>{pesc(v.label)}</extra>"))
        # Step boundaries as short ticks across the row.
        xs: list[float | None] = []
        ys: list[float | None] = []
        for s in r.steps:
            x = round((s.start_ns - r.window.start_ns) / 1e6, 4)
            xs += [x, x, None]
            ys += [y - 0.45, y + 0.45, None]
        if xs:
            fig.add_scatter(x=xs, y=ys, mode="lines", name="step start", legendgroup="steps",
                            showlegend=legend_once("steps"), line={"color": "#1f2933", "width": 1.2},
                            hoverinfo="skip")
        # Step numbers above the first row, for the steps wide enough to hold their label.
        labelled = [s for s in r.steps if s.dur_ms >= x_max / 24] if y == 0 else []
        if labelled:
            fig.add_scatter(
                x=[round((s.start_ns - r.window.start_ns) / 1e6 + s.dur_ms / 2, 4) for s in labelled],
                y=[-0.62] * len(labelled), mode="text", text=[f"step {s.step}" for s in labelled],
                textfont={"size": 10, "color": "#52606D"}, showlegend=False, hoverinfo="skip")
    ticks = [pesc(v.label) + (" ◀ straggler" if v.key == straggler else "") for v in views]
    fig.update_layout(**base_layout(110 + pitch * n, hovermode="closest",
                                    margin={"l": 90, "r": 20, "t": 40, "b": 46}))
    style_axes(fig)
    fig.update_xaxes(title_text="ms since the start of the analysis window", range=[0, x_max or 1])
    fig.update_yaxes(tickvals=list(range(n)), ticktext=ticks, range=[n - 0.5, -0.85], showgrid=False,
                     fixedrange=True, ticks="")
    return fig


def _device_parts(r: RankResult) -> dict[str, list[float | None]] | None:
    if not r.steps or all(s.busy_ms is None for s in r.steps):
        return None
    parts: dict[str, list[float | None]] = {k: [] for k, _, _ in DEVICE_PARTS}
    for s in r.steps:
        if s.busy_ms is None or s.idle_ms is None:
            for k in parts:
                parts[k].append(None)
            continue
        exposed = s.comm_exposed_ms or 0.0
        data = min(s.dataloader_exposed_ms, s.idle_ms)
        parts["compute"].append(round(max(s.busy_ms - exposed, 0.0), 4))
        parts["comm_exposed"].append(round(exposed, 4))
        parts["data_idle"].append(round(data, 4))
        parts["other_idle"].append(round(max(s.idle_ms - data, 0.0), 4))
    return parts


def steps_figure(r: RankResult) -> go.Figure | None:
    if not r.steps:
        return None
    x = [str(s.step) for s in r.steps]
    dev = _device_parts(r)
    host_keys = [k for k in HOST_COLOR if any(s.host_split_ms.get(k) for s in r.steps)]
    host_keys += sorted({k for s in r.steps for k in s.host_split_ms} - set(HOST_COLOR))
    cols = (1 if dev else 0) + (1 if host_keys else 0)
    if not cols:
        return None
    titles = []
    if dev:
        titles.append("<b>Device</b>: busy vs idle in each step")
    if host_keys:
        titles.append("<b>Host thread</b>: what the CPU did in each step")
    fig = make_subplots(rows=1, cols=cols, subplot_titles=titles, shared_yaxes=True,
                        horizontal_spacing=0.06)
    col = 1
    if dev:
        for key, name, color in DEVICE_PARTS:
            fig.add_bar(x=x, y=dev[key], name=name, marker_color=color, legend="legend", row=1, col=col,
                        hovertemplate=f"step %{{x}}<br>{name}: %{{y:.2f}} ms<extra></extra>")
        col += 1
    for k in host_keys:
        fig.add_bar(x=x, y=[round(s.host_split_ms.get(k, 0.0), 4) for s in r.steps], name=pesc(k),
                    marker_color=HOST_COLOR.get(k, "#888888"), legend="legend2" if dev else "legend",
                    row=1, col=col,
                    hovertemplate=f"step %{{x}}<br>{pesc(k)}: %{{y:.2f}} ms<extra></extra>")
    # One legend under each subplot (plotly ≥ 5.15 / plotly.js ≥ 2.22 support several legends).
    legends: dict[str, Any] = {}
    for i in range(cols):
        dom = fig.layout[f"xaxis{'' if i == 0 else i + 1}"].domain
        legends["legend" if i == 0 else f"legend{i + 1}"] = {
            "orientation": "h", "x": dom[0], "xanchor": "left", "y": -0.2, "yanchor": "top",
            "font": {"size": 11}, "traceorder": "normal"}
        # Subplot titles left-aligned over their own subplot.
        fig.layout.annotations[i].update(x=dom[0], xanchor="left", font_size=12)
    fig.update_layout(**base_layout(380, barmode="stack", bargap=0.25,
                                    margin={"l": 60, "r": 20, "t": 34, "b": 100}, **legends))
    style_axes(fig)
    fig.update_xaxes(title_text=None, type="category")
    fig.update_yaxes(title_text="ms", row=1, col=1)
    return fig


def kernels_figure(r: RankResult) -> go.Figure | None:
    kinds = [k for k in r.kernels.by_kind if k.ns > 0]
    if not kinds:
        return None
    steps = max(len(r.window.steps), 1)
    kinds.sort(key=lambda k: k.ns)  # plotly draws the first bar at the bottom
    fig = go.Figure(go.Bar(
        y=[pesc(k.kind) for k in kinds], x=[round(k.ns / 1e6 / steps, 4) for k in kinds], orientation="h",
        marker_color=[KIND_COLOR.get(k.kind, "#888888") for k in kinds],
        text=[f"{k.pct_of_busy:.1f}% of busy" for k in kinds], textposition="auto",
        customdata=[[k.count, round(k.count / steps, 1)] for k in kinds],
        hovertemplate="%{y}: %{x:.2f} ms/step<br>%{text}<br>%{customdata[0]} kernels "
                      "(%{customdata[1]}/step)<extra></extra>"))
    fig.update_layout(**base_layout(60 + 34 * len(kinds), showlegend=False,
                                    margin={"l": 100, "r": 20, "t": 10, "b": 46}))
    style_axes(fig)
    fig.update_xaxes(title_text="device time per step (ms); kinds overlap on concurrent streams")
    fig.update_yaxes(showgrid=False)
    return fig


def roofline_figure(r: RankResult) -> go.Figure | None:
    """Log-log roofline: the top kernels with known FLOPs and bytes (intensity, achieved TFLOP/s)
    under the device's roofs min(peak, bandwidth x intensity) of the precisions they ran in."""
    roof = r.roofline
    pts = [k for k in r.kernels.top if k.intensity and k.achieved_tflops]
    if roof is None or roof.device_key is None or not roof.mem_bw_gbs or not pts:
        return None
    bw = roof.mem_bw_gbs
    precs = sorted({x.precision for x in roof.rows if x.precision and x.precision in roof.peak_tflops})
    ridges = [roof.peak_tflops[p] * 1e3 / bw for p in precs]
    xs = [k.intensity for k in pts]
    lo, hi = min([*xs, *ridges]) / 4, max([*xs, *ridges]) * 4
    fig = go.Figure()
    for p, ridge in zip(precs, ridges, strict=True):
        peak = roof.peak_tflops[p]
        fig.add_trace(go.Scatter(x=[lo, ridge, hi], y=[bw * lo / 1e3, peak, peak], mode="lines",
                                 line={"width": 1.5, "dash": "dot"}, name=pesc(f"{p} roof ({peak:g} TFLOP/s)"),
                                 hovertemplate=pesc(f"{p}: {peak:g} TFLOP/s, {bw:g} GB/s, ridge {ridge:.0f} FLOP/B")
                                 + "<extra></extra>"))
    fig.add_trace(go.Scatter(
        x=xs, y=[k.achieved_tflops for k in pts], mode="markers", name="top kernels",
        marker={"size": [max(6.0, min(22.0, 6 + 16 * k.total_ns / max(p.total_ns for p in pts))) for k in pts],
                "color": [KIND_COLOR.get(k.kind, "#888888") for k in pts], "line": {"width": 1, "color": "#1f2933"}},
        customdata=[[pesc(short(k.name, 90)), pesc(k.kind), fmt(k.pct_of_peak, "%"), pesc(k.bound or "?")]
                    for k in pts],
        hovertemplate="%{customdata[0]}<br>%{customdata[1]}: %{y:.3g} TFLOP/s at %{x:.3g} FLOP/B"
                      "<br>%{customdata[2]} of peak, %{customdata[3]}-bound<extra></extra>"))
    fig.update_layout(**base_layout(360, margin={"l": 70, "r": 20, "t": 40, "b": 50}))
    style_axes(fig)
    fig.update_xaxes(type="log", title_text="arithmetic intensity (FLOP per byte)")
    fig.update_yaxes(type="log", title_text="achieved TFLOP/s")
    return fig


def _grouped(views: list[RankView], straggler: str | None, steps: list[int]
             ) -> tuple[list[str], list[list[float | None]], list[list[float | None]], int | None]:
    """Heat-map rows: one per rank, or beyond MAX_HEATMAP_ROWS one per group of consecutive ranks
    (step time: the group's slowest rank; exposed comm: its least, so a straggler's row stays light).
    -> (labels, step ms, exposed comm ms, the straggler's row)."""
    col = {s: i for i, s in enumerate(steps)}
    dur: list[list[float | None]] = [[None] * len(steps) for _ in views]
    comm: list[list[float | None]] = [[None] * len(steps) for _ in views]
    for i, v in enumerate(views):
        for s in v.result.steps:
            if s.step not in col:
                continue
            j = col[s.step]
            dur[i][j] = round(s.dur_ms, 3)
            c = s.comm_exposed_ms if s.comm_exposed_ms is not None else s.host_split_ms.get("comm")
            comm[i][j] = None if c is None else round(c, 3)
    at = next((i for i, v in enumerate(views) if v.key == straggler), None)
    if len(views) <= MAX_HEATMAP_ROWS:
        labels = [pesc(v.label) + (" ◀ straggler" if v.key == straggler else "") for v in views]
        return labels, dur, comm, at

    def fold(rows: list[list[float | None]], g: range, pick) -> list[float | None]:
        cells = [[r[j] for r in (rows[i] for i in g) if r[j] is not None] for j in range(len(steps))]
        return [pick(c) if c else None for c in cells]

    parts = groups(len(views), MAX_HEATMAP_ROWS)
    labels = [f"{pesc(views[g[0]].label)}–{views[g[-1]].rank if views[g[-1]].rank is not None else g[-1]}"
              + (" ◀ straggler" if at is not None and at in g else "") for g in parts]
    row = next((k for k, g in enumerate(parts) if at is not None and at in g), None)
    return labels, [fold(dur, g, max) for g in parts], [fold(comm, g, min) for g in parts], row


def heatmap_figure(views: list[RankView], straggler: str | None) -> go.Figure | None:
    """Ranks × steps of step time and exposed communication: a straggler is the row that waits
    least (light in exposed comm) while its peers' rows are dark. Past MAX_HEATMAP_ROWS ranks a row
    stands for a group of consecutive ranks."""
    if len(views) < 2:
        return None
    steps = sorted({s.step for v in views for s in v.result.steps})[-MAX_HEATMAP_STEPS:]
    if not steps:
        return None
    labels, dur, comm, row = _grouped(views, straggler, steps)
    grouped = len(labels) < len(views)
    n = len(labels)
    x = [str(s) for s in steps]
    titles = (("<b>Step time</b> (ms, slowest rank of each group)", "<b>Exposed communication</b> (ms per step, "
               "least of each group)") if grouped else
              ("<b>Step time</b> (ms)", "<b>Exposed communication</b> (ms per step)"))
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.12, subplot_titles=titles)
    show_text = n * len(steps) <= MAX_HEATMAP_TEXT_CELLS
    # White cell borders only while cells are several px tall/wide: with hundreds of rows a 1 px
    # gap would be wider than the row and erase the map.
    gap_y = 1 if n <= 64 else 0
    gap_x = 1 if len(steps) <= 64 else 0
    for c, (z, scale, bar_x) in enumerate(((dur, "YlOrRd", 0.44), (comm, "Blues", 1.0)), start=1):
        fig.add_heatmap(z=z, x=x, y=labels, colorscale=scale, row=1, col=c, xgap=gap_x, ygap=gap_y,
                        colorbar={"x": bar_x, "len": 0.9, "thickness": 12, "title": {"text": "ms"}},
                        texttemplate="%{z:.1f}" if show_text else None, textfont={"size": 10},
                        hovertemplate="%{y}, step %{x}: %{z:.2f} ms<extra></extra>", hoverongaps=False)
    fig.update_layout(**base_layout(min(110 + 26 * n, 760), margin={"l": 90, "r": 20, "t": 40, "b": 46}))
    if row is not None:
        # Outline the straggler's row in both maps: with many rows its tick label is thinned away,
        # the outline stays visible however thin the row.
        for xref in ("x domain", "x2 domain"):
            fig.add_shape(type="rect", xref=xref, yref="y", x0=0, x1=1, y0=row - 0.5, y1=row + 0.5,
                          line={"color": "#1f2933", "width": 2}, fillcolor="rgba(0,0,0,0)")
    fig.update_xaxes(title_text="step", type="category", showgrid=False)
    fig.update_yaxes(autorange="reversed", showgrid=False, type="category", automargin=True)
    fig.update_annotations(font_size=12)
    return fig


def spread_figure(views: list[RankView], straggler: str | None) -> go.Figure | None:
    """Histograms over all ranks of the median step time and of exposed communication per step: the
    shape of thousands of ranks in two plots (a straggler is the lone bar at the low end of the wait)."""
    steps = [v.result.metrics.step_ms_median for v in views if v.result.metrics.step_ms_median is not None]
    waits = [w for w in (comm_wait_ms(v.result) for v in views) if w is not None]
    if len(steps) < 2:
        return None
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=("<b>Median step time</b> (ms), ranks", "<b>Time in collectives</b> "
                                        "(ms per step), ranks"))
    fig.add_histogram(x=steps, nbinsx=60, marker_color="#e8590c", row=1, col=1, name="step",
                      hovertemplate="%{x} ms: %{y} ranks<extra></extra>")
    if waits:
        fig.add_histogram(x=waits, nbinsx=60, marker_color="#1c7ed6", row=1, col=2, name="collectives",
                          hovertemplate="%{x} ms: %{y} ranks<extra></extra>")
    fig.update_layout(**base_layout(300, showlegend=False, margin={"l": 50, "r": 20, "t": 40, "b": 40}))
    fig.update_yaxes(title_text="ranks")
    fig.update_annotations(font_size=12)
    return fig


def ab_figure(ab: ABResult) -> go.Figure:
    """Before/after throughput with the spread of the repeated measurements, and per-remedy gains
    (geometric mean of the pair ratios, with its bootstrap interval as the error bar)."""
    rem = ab.remedies
    cols = 2 if rem else 1
    fig = make_subplots(rows=1, cols=cols, horizontal_spacing=0.12,
                        subplot_titles=("<b>Throughput</b> before / after (steps/s)",
                                        "<b>Per remedy</b> speedup (×)")[:cols])
    base = ab.baseline_steps_per_s
    treated = ab.treated_steps_per_s
    lo, hi = base * ab.speedup_min, base * ab.speedup_max
    fig.add_bar(x=["baseline"], y=[round(base, 4)], marker_color="#9AA5B1", row=1, col=1, showlegend=False,
                hovertemplate="baseline: %{y:.3f} steps/s<extra></extra>")
    fig.add_bar(x=["with fixes"], y=[round(treated, 4)], marker_color="#009E73", row=1, col=1,
                showlegend=False,
                error_y={"type": "data", "symmetric": False, "array": [round(max(hi - treated, 0), 4)],
                         "arrayminus": [round(max(treated - lo, 0), 4)], "color": "#1f2933",
                         "thickness": 1.5, "width": 10},
                text=[f"×{ab.speedup_median:.2f}<br>({ab.speedup_min:.2f}–{ab.speedup_max:.2f})"],
                textposition="inside", insidetextanchor="middle", textfont={"color": "white", "size": 13},
                hovertemplate=("with fixes: %{y:.3f} steps/s<br>"
                               f"speedup ×{ab.speedup_median:.3f} (min ×{ab.speedup_min:.3f}, "
                               f"max ×{ab.speedup_max:.3f})<extra></extra>"))
    if rem:
        ys = [(r.geomean if r.geomean is not None else r.speedup) or 0 for r in rem]
        fig.add_bar(x=[pesc(r.id) for r in rem], y=ys,
                    error_y={"type": "data", "symmetric": False, "color": "#1f2933", "thickness": 1.5,
                             "array": [round(r.interval[1] - y, 4) if r.interval else 0
                                       for r, y in zip(rem, ys, strict=True)],
                             "arrayminus": [round(y - r.interval[0], 4) if r.interval else 0
                                            for r, y in zip(rem, ys, strict=True)]},
                    marker_color=["#009E73" if r.kept else "#C4CDD5" for r in rem], row=1, col=2,
                    showlegend=False, text=["kept" if r.kept else "dropped" for r in rem],
                    textposition="auto", customdata=[pesc(short(r.reason, 200)) or "–" for r in rem],
                    hovertemplate="%{x}: ×%{y:.3f} (%{text})<br>%{customdata}<extra></extra>")
        fig.add_hline(y=1.0, line_dash="dot", line_color="#52606D", row=1, col=2)
    fig.update_layout(**base_layout(340, margin={"l": 60, "r": 20, "t": 50, "b": 46}))
    style_axes(fig)
    fig.update_yaxes(rangemode="tozero")
    fig.update_annotations(font_size=12)
    return fig


# ---------------------------------------------------------------------------------------------
# HTML pieces


def fmt(v: float | None, unit: str = "", digits: int = 1) -> str:
    return "–" if v is None else f"{v:.{digits}f}{unit}"


def fmt_value(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        # Readable at any magnitude: 12,854 · 178.8 · 0.315 · 2.5e-05 (no 1.285e+04).
        a = abs(v)
        if a >= 1000:
            return f"{v:,.0f}"
        return f"{v:.4g}" if a >= 1e-3 or a == 0 else f"{v:.2g}"
    if isinstance(v, (dict, list, tuple)):
        return short(json.dumps(v, default=str, ensure_ascii=False), 200)
    return short(str(v), 200)


def _table(head: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "", align: str = "") -> str:
    """Cells are already-escaped HTML. `align`: one letter per column: l(eft), r(ight, numbers),
    n(ame: takes the spare width, long names elided with an ellipsis)."""

    def a(i: int) -> str:
        kind = align[i] if i < len(align) else "l"
        return {"r": ' class="r"', "n": ' class="nm"'}.get(kind, "")

    th = "".join(f"<th{a(i)}>{h}</th>" for i, h in enumerate(head))
    body = "".join("<tr>" + "".join(f"<td{a(i)}>{c}</td>" for i, c in enumerate(row)) + "</tr>"
                   for row in rows)
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def _name_cell(name: str, n: int = MAX_NAME) -> str:
    """A (possibly huge, untrusted) kernel/op name: escaped, elided, full text in the tooltip."""
    return f'<code class="name" title="{esc(short(name, 2000))}">{esc(short(name, n))}</code>'


def evidence_html(ev: Evidence) -> str:
    parts = [f'<p class="ev-text">{esc(ev.text)}</p>']
    if ev.values:
        chips = "".join(f'<span class="chip"><b>{esc(k)}</b> {esc(fmt_value(v))}</span>'
                        for k, v in ev.values.items())
        parts.append(f'<div class="chips">{chips}</div>')
    if ev.items:
        keys: list[str] = []
        for it in ev.items[:MAX_ITEMS]:
            for k in it:
                if k not in keys and len(keys) < 8:
                    keys.append(k)
        rows = []
        for it in ev.items[:MAX_ITEMS]:
            rows.append([_name_cell(str(it[k])) if k in ("name", "op", "kernel", "file") and k in it
                         else esc(fmt_value(it.get(k, ""))) for k in keys])
        parts.append(_table([esc(k) for k in keys], rows, "items"))
        if len(ev.items) > MAX_ITEMS:
            parts.append(f'<p class="muted">… and {len(ev.items) - MAX_ITEMS} more</p>')
    return '<li class="evidence">' + "".join(parts) + "</li>"


def finding_html(i: int, f: Finding, open_: bool = False) -> str:
    sev = f.severity if f.severity in SEVERITY_COLOR else "info"
    cells = "".join(
        f'<span class="lc{" on" if f.layer == layer else ""}" title="{esc(layer)}">'
        f'{"●" if f.layer == layer else ""}</span>' for layer in LAYERS)
    pct = max(0.0, min(f.recoverable_pct, 100.0))
    gain = f"{f.recoverable_pct:.1f}%" + (f" · {fmt_ms(f.recoverable_ms)} ms" if f.recoverable_ms else "")
    summary = (f'<summary class="mrow"><span class="num">{i}</span>'
               f'<span class="ftitle"><span class="badge {sev}">{esc(f.severity)}</span>'
               f'<code class="fid">{esc(f.id)}</code> {esc(f.title)}</span>{cells}'
               f'<span class="gain"><span class="gbar"><span style="width:{pct:.1f}%"></span></span>'
               f"{esc(gain)}</span>"
               f'<span class="conf conf-{esc(f.confidence)}">{esc(f.confidence)}</span></summary>')
    body = []
    if f.evidence:
        body.append('<h4>Evidence</h4><ul class="evlist">' + "".join(evidence_html(e) for e in f.evidence)
                    + "</ul>")
    if f.fix is not None:
        body.append(f'<h4>Fix</h4><p>{esc(f.fix.text)}</p>')
        if f.fix.snippet:
            body.append(f'<pre class="snippet"><code class="language-{esc(f.fix.language)}">'
                        f"{esc(f.fix.snippet)}</code></pre>")
    meta = []
    if f.confirm:
        meta.append(f"<b>To confirm:</b> {esc(f.confirm)}")
    if f.ranks:
        shown = ", ".join(str(r) for r in f.ranks[:32]) + (" …" if len(f.ranks) > 32 else "")
        meta.append(f"<b>Ranks:</b> {esc(shown)}")
    if f.remedy:
        meta.append(f"<b>Automatic remedy:</b> <code>{esc(f.remedy)}</code> (torchdoctor fix)")
    if f.source:
        meta.append(f"<b>Threshold source:</b> {esc(f.source)}")
    if meta:
        body.append('<p class="meta">' + " &nbsp;·&nbsp; ".join(meta) + "</p>")
    return (f'<details class="finding sev-{sev}"{" open" if open_ else ""}>{summary}<div class="fbody">{"".join(body)}</div>'
            "</details>")


def matrix_html(findings: list[Finding], healthy: bool | None = True) -> str:
    if not findings and not healthy:  # the lead says what was not seen
        return '<p class="muted">No findings in what was recorded.</p>'
    if not findings:
        return ('<div class="ok-panel">No findings: nothing in this run points to lost accelerator time.'
                "</div>")
    counts = {layer: sum(1 for f in findings if f.layer == layer) for layer in LAYERS}
    head = ('<div class="mrow mhead"><span class="num">#</span><span class="ftitle">finding</span>'
            + "".join(f'<span class="lc">{esc(layer)}<small>{counts[layer]}</small></span>' for layer in LAYERS)
            + '<span class="gain">recoverable (of step)</span><span class="conf">confidence</span></div>')
    # The top finding starts expanded: its evidence is what a reader opens the report for.
    rows = "".join(finding_html(i, f, open_=i == 1) for i, f in enumerate(findings, 1))
    return f'<div class="matrix">{head}{rows}</div>'


def verdict_html(report: Report) -> str:
    # What the tool could not see leads, each its own sentence, before any verdict.
    spots = "".join(f'<div class="verdict sev-warning"><div class="vlabel">'
                    f'{"No verdict" if s.get("kind") == "no-verdict" else "Not seen"}</div>'
                    f'<div class="vtitle">{esc(s.get("text", ""))}</div></div>' for s in report.blind_spots)
    return spots + _verdict_html(report)


def _verdict_html(report: Report) -> str:
    actionable = [f for f in report.findings if f.severity != "info"]
    if actionable:
        top = actionable[0]
        gain = f"≈{top.recoverable_pct:.0f}% of step time"
        if top.recoverable_ms:
            gain += f", {fmt_ms(top.recoverable_ms)} ms per step"
        fix = f'<p class="vfix">{esc(top.fix.text)}</p>' if top.fix else ""
        return (f'<div class="verdict sev-{esc(top.severity)}"><div class="vlabel">Fix first</div>'
                f'<div class="vtitle">{esc(top.title)} <span class="muted">({esc(gain)})</span></div>{fix}</div>')
    if report.healthy:
        return ('<div class="verdict healthy"><div class="vlabel">Healthy</div>'
                '<div class="vtitle">No warning-level findings: nothing here points to lost accelerator time.'
                "</div></div>")
    return ""


def cards_html(report: Report, views: list[RankView]) -> str:
    cards: list[tuple[str, str, str]] = []
    if len(views) == 1:
        m = views[0].result.metrics
        cards += [("median step", fmt(m.step_ms_median, " ms", 2), ""),
                  ("device busy", fmt(m.busy_pct, "%"), ""),
                  ("device idle", fmt(m.idle_pct, "%"), "bad" if (m.idle_pct or 0) >= 20 else ""),
                  ("exposed comm", fmt(m.comm_exposed_pct, "%"), ""),
                  ("waiting for data", fmt(m.dataloader_exposed_pct, "%"), ""),
                  ("comm overlapped", fmt(m.overlap_pct, "%"), "")]
    elif views:
        c = report.cross_rank
        idle = [v.result.metrics.idle_pct for v in views if v.result.metrics.idle_pct is not None]
        cards += [("ranks", str(len(views)), ""),
                  ("median step", fmt(c.step_ms_median if c else None, " ms", 2), ""),
                  ("step skew", fmt(c.step_skew_pct if c else None, "%"),
                   "bad" if c and (c.step_skew_pct or 0) >= 10 else ""),
                  ("device idle (median rank)", fmt(sorted(idle)[len(idle) // 2] if idle else None, "%"), ""),
                  ("straggler", f"rank {c.straggler}" if c and c.straggler is not None else "none",
                   "bad" if c and c.straggler is not None else "")]
    if report.ab is not None:
        cards.append(("speedup (fix)", f"×{report.ab.speedup_median:.2f}",
                      "good" if report.ab.speedup_median > 1 else ""))
    return '<div class="cards">' + "".join(
        f'<div class="card {cls}"><div class="cv">{esc(v)}</div><div class="cl">{esc(k)}</div></div>'
        for k, v, cls in cards) + "</div>"


def rank_table_html(views: list[RankView], straggler: str | None) -> str:
    rows = []
    shown = pick_ranks(views, straggler, MAX_TABLE_RANKS)
    for v in shown:
        m, w = v.result.metrics, v.result.window
        win = f"steps {w.steps[0]}–{w.steps[-1]}" if w.steps else w.mode
        tag = ' <span class="badge critical">straggler</span>' if v.key == straggler else ""
        rows.append([esc(v.label) + tag, esc(device_name(v.result)), esc(win),
                     fmt(m.step_ms_median, "", 2), fmt(m.busy_pct, "%"), fmt(m.idle_pct, "%"),
                     fmt(m.compute_pct, "%"), fmt(m.comm_pct, "%"), fmt(m.comm_exposed_pct, "%"),
                     fmt(m.dataloader_exposed_pct, "%"), fmt(m.sync_pct, "%")])
    more = (f'<p class="muted">Showing {len(shown)} of {len(views)} ranks: '
            f"{'the straggler and ' if straggler is not None else ''}those with the most device idle time; "
            "every rank is in the heat map, the histograms and --json.</p>" if len(shown) < len(views) else "")
    return _table(["rank", "device", "window", "step ms", "busy", "idle", "compute", "comm", "exposed comm",
                   "data wait", "sync"], rows, "ranks", "lllrrrrrrrr") + more


def idle_table_html(r: RankResult) -> str:
    steps = max(len(r.window.steps), 1)
    total = sum(c.ns for c in r.idle_causes) or 1
    rows = []
    for c in sorted(r.idle_causes, key=lambda c: -c.ns):
        if c.ns <= 0:
            continue
        color = CAUSE_COLOR.get(c.cause, UNKNOWN_CAUSE_COLOR)
        tops = "".join(f'<div class="op">{_name_cell(t.name)}<span class="muted">{fmt_ms(t.ns / 1e6 / steps)} ms'
                       "</span></div>" for t in c.top[:3])
        rows.append([f'<span class="nowrap"><span class="swatch" style="background:{color}"></span>'
                     f"{esc(cause_label(c.cause))}</span>",
                     f"{c.ns / 1e6 / steps:.2f}", f"{100 * c.ns / total:.0f}%", tops])
    if not rows:
        return ""
    return ("<h3>What the host did while the device sat idle</h3>"
            + _table(["cause", "ms/step", "share", "top host ops meanwhile"], rows, "idle", "lrrn"))


def kernels_table_html(r: RankResult) -> str:
    steps = max(len(r.window.steps), 1)
    rows = [[_name_cell(k.name), esc(k.kind), str(k.count), f"{k.total_ns / 1e6 / steps:.2f}",
             f"{k.mean_ns / 1e3:.1f}", f"{k.max_ns / 1e3:.1f}", fmt(k.achieved_tflops, "", 2), fmt(k.pct_of_peak, "%"),
             fmt(k.achieved_gbps, "", 0), fmt(k.pct_of_bandwidth, "%"), esc(k.bound or "–")]
            for k in r.kernels.top[:15]]
    if not rows:
        return ""
    return ("<h3>Top kernels by device time</h3>"
            + _table(["kernel", "kind", "count", "ms/step", "mean µs", "max µs", "TFLOP/s", "% peak", "GB/s",
                      "% bw", "bound"], rows, "kernels", "nlrrrrrrrrl"))


def roofline_html(r: RankResult, fig_html: str) -> str:
    """The rank's roofline sentences and plot (an unknown device says so plainly)."""
    lines = roofline_lines(r)
    if not lines:
        return ""
    return ("<h3>Roofline</h3>" + "".join(f"<p>{esc(x)}</p>" for x in lines) + fig_html)


def syncs_table_html(r: RankResult) -> str:
    s = r.syncs
    if not s.sites:
        return ""
    steps = max(len(r.window.steps), 1)
    rows = [[esc(x.api), _name_cell(x.top_op or x.op or "–"), esc(x.explanation), str(x.count),
             f"{x.ns / 1e6 / steps:.3f}"] for x in s.sites]
    return (f"<h3>Host–device syncs <span class=\"muted\">({s.per_step:.1f} per step)</span></h3>"
            + _table(["API", "called from", "typical cause", "count", "ms/step"], rows, "syncs", "lnlrr"))


def _ab_interval(iv: list[float] | None) -> str:
    return "–" if not iv else f"×{iv[0]:.3f}–×{iv[1]:.3f}"


def ab_details_html(ab: ABResult) -> str:
    rows = [[esc(r.id), "kept" if r.kept else "dropped", fmt(r.geomean, "×", 3), _ab_interval(r.interval),
             str(r.pairs), fmt(r.sign_p, "", 3), fmt(r.speedup, "×", 3), esc(r.reason or "–")]
            for r in ab.remedies]
    parts = []
    if ab.pairs:
        parts.append(f"<p>Speed-up ×{ab.speedup_geomean or 0:.3f} (geometric mean over {ab.pairs} pairs), "
                     f"interval {_ab_interval(ab.interval)}, sign test p {fmt(ab.sign_p, '', 3)}: "
                     f"{esc(ab.method)}.</p>")
    if rows:
        parts.append(_table(["remedy", "verdict", "geo-mean", "interval", "pairs", "sign p", "median",
                             "reason"], rows, "remedies", "llrrrrrl"))
    if ab.details:
        parts.append(_table(["detail", "value"],
                            [[esc(k), esc(fmt_value(v))] for k, v in list(ab.details.items())[:40]],
                            "kv"))
    return "".join(parts)


def header_html(report: Report, views: list[RankView]) -> str:
    files = [rr.file for rr in report.ranks]
    devices = sorted({device_name(v.result) for v in views})
    bits = [f"source: {esc(report.source)}", f"{len(report.ranks)} rank(s)"]
    if devices:
        bits.append(esc(", ".join(devices[:3]) + (" …" if len(devices) > 3 else "")))
    if views:
        w = views[0].result.window
        win = f"steps {w.steps[0]}–{w.steps[-1]} ({w.mode})" if w.steps else w.mode
        if w.skipped_warmup:
            win += f", warm-up {', '.join(map(str, w.skipped_warmup))} skipped"
        bits.append("window: " + esc(win))
    file_line = ""
    if files:
        shown = ", ".join(f'<code title="{esc(f)}">{esc(short(os.path.basename(f), 80))}</code>'
                          for f in files[:4])
        file_line = f'<div class="files">{shown}{" and " + str(len(files) - 4) + " more" if len(files) > 4 else ""}</div>'
    run = ""
    if report.run:
        run = '<div class="files">' + " · ".join(
            f"<b>{esc(k)}</b> {esc(fmt_value(v))}" for k, v in list(report.run.items())[:8]) + "</div>"
    from .console import config_line

    line = config_line(report.config)
    config = f'<div class="files">{esc(line)}</div>' if line else ""
    return (f'<header><div class="brand">torchdoctor <span class="muted">report</span></div>'
            f'<div class="sub">{" · ".join(bits)}</div>{file_line}{run}{config}</header>')


def problems_html(report: Report, views: list[RankView]) -> str:
    items = [f'<li class="err"><b>error</b> {esc(e.file)}: {esc(e.message)}</li>' for e in report.errors[:50]]
    items += [f"<li><b>warning</b> {esc(w.file)}: {esc(w.message)}</li>" for w in report.warnings[:50]]
    for v in views[:MAX_TABLE_RANKS]:
        items += [f"<li><b>{esc(v.label)}</b>: {esc(w)}</li>" for w in v.result.warnings[:10]]
    if not items:
        return ""
    return f'<section><h2>Errors and warnings</h2><ul class="problems">{"".join(items)}</ul></section>'


# ---------------------------------------------------------------------------------------------
# The page


class _Page:
    def __init__(self, report: Report) -> None:
        self.report = report
        self.views = rank_views(report)
        self.straggler = straggler_key(self.views, report.cross_rank)
        self.figs: dict[str, str] = {}  # figure id → plotly JSON

    def fig(self, key: str, fig: go.Figure | None, cls: str = "") -> str:
        if fig is None:
            return ""
        self.figs[key] = pio.to_json(fig, validate=False, pretty=False)
        return f'<div class="plot {cls}" id="{esc(key)}" data-fig="{esc(key)}"></div>'

    def render(self) -> str:
        rep, views = self.report, self.views
        sections = [header_html(rep, views), verdict_html(rep), cards_html(rep, views)]
        if rep.ab is not None:
            sections.append('<section><h2>Before / after <span class="muted">torchdoctor fix, '
                            "median of repeated runs; whiskers: min–max</span></h2>"
                            + self.fig("fig-ab", ab_figure(rep.ab)) + ab_details_html(rep.ab) + "</section>")
        sections.append('<section><h2>Diagnosis matrix <span class="muted">ranked by the share of step time '
                        "the fix gives back; click a row for its evidence</span></h2>"
                        + matrix_html(rep.findings, rep.healthy) + "</section>")
        if views:
            sections.append(self.timeline_section())
            if len(views) > 1:
                sections.append(self.ranks_section())
            sections.append(self.detail_section())
        elif rep.ranks:
            sections.append('<section><p class="muted">The ranks reported facts but no profiler trace was '
                            "analysed: no timeline to draw.</p></section>")
        sections.append(problems_html(rep, views))
        return self.document("".join(sections))

    def timeline_section(self) -> str:
        shown = pick_ranks(self.views, self.straggler, MAX_TIMELINE_RANKS)
        drawable = [v for v in shown if v.result.timeline_busy or v.result.timeline_gaps]
        note = ""
        if len(shown) < len(self.views):
            note = (f'<p class="muted">Showing {len(shown)} of {len(self.views)} ranks: '
                    f"{'the straggler and ' if self.straggler is not None else ''}"
                    "those with the most device idle time.</p>")
        if not drawable:
            return ('<section><h2>Timeline</h2><p class="muted">No device activity in the analysed window '
                    "(CPU-only trace): see the host breakdown below.</p></section>")
        return ('<section><h2>Timeline of the analysis window <span class="muted">device busy (grey) and idle '
                "gaps coloured by what the host was doing meanwhile; drag to zoom, double-click to reset"
                "</span></h2>" + note + self.fig("fig-timeline", timeline_figure(drawable, self.straggler))
                + "</section>")

    def ranks_section(self) -> str:
        c = self.report.cross_rank
        views = pick_ranks(self.views, self.straggler, MAX_HEATMAP_RANKS)
        text = ""
        if c is not None:
            text = (f"<p>{c.ranks} ranks: median step {fmt(c.step_ms_median, ' ms', 2)}, skew "
                    f"{fmt(c.step_skew_pct, '%')} (min {fmt(c.step_ms_min, ' ms', 2)}, max "
                    f"{fmt(c.step_ms_max, ' ms', 2)}).")
            if c.straggler is not None:
                victims = ", ".join(map(str, c.victims[:24])) + (" …" if len(c.victims) > 24 else "")
                text += (f" <b>Straggler: rank {c.straggler}</b> — it waits least inside collectives; "
                         f"the others wait up to {fmt(c.straggler_lead_ms, ' ms', 2)} per step longer for it"
                         + (f" (ranks {esc(victims)})" if victims else "") + ".")
            text += "</p>"
            if c.late_ranks:
                text += f"<p>{esc(late_line(c))}</p>"
        return ('<section><h2>Ranks <span class="muted">a straggler shows as the row with little exposed '
                "communication while its peers wait</span></h2>" + text
                + self.fig("fig-heatmap", heatmap_figure(views, self.straggler))
                + (self.fig("fig-spread", spread_figure(self.views, self.straggler))
                   if len(self.views) > MAX_TABLE_RANKS else "")
                + rank_table_html(self.views, self.straggler) + "</section>")

    def detail_section(self) -> str:
        views = pick_ranks(self.views, self.straggler, MAX_DETAIL_RANKS)
        focus = next((v for v in views if v.key == self.straggler), views[0])
        select = ""
        if len(views) > 1:
            opts = "".join(f'<option value="{esc(v.key)}"{" selected" if v is focus else ""}>{esc(v.label)}'
                           "</option>" for v in views)
            select = f'<label class="rank-select">rank <select id="td-rank">{opts}</select></label>'
        panels = []
        for v in views:
            r = v.result
            kfig = self.fig(f"fig-kernels-{v.key}", kernels_figure(r))
            panels.append(
                f'<div class="rank-panel" data-rank="{esc(v.key)}"{"" if v is focus else " hidden"}>'
                f'<h3>Step-time breakdown per step <span class="muted">{esc(v.label)}</span></h3>'
                + (self.fig(f"fig-steps-{v.key}", steps_figure(r)) or '<p class="muted">No steps.</p>')
                + '<div class="two"><div>'
                + (f"<h3>Kernel categories <span class=\"muted\">device time per step</span></h3>{kfig}"
                   if kfig else "")
                + "</div><div>" + idle_table_html(r) + "</div></div>"
                + kernels_table_html(r)
                + roofline_html(r, self.fig(f"fig-roofline-{v.key}", roofline_figure(r)))
                + syncs_table_html(r) + "</div>")
        return (f'<section><h2>Per-rank detail {select}</h2>' + "".join(panels) + "</section>")

    def document(self, body: str) -> str:
        figs = "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in self.figs.items()) + "}"
        if len(figs) > FIGS_INLINE_LIMIT:
            # Many ranks: the figure data is packed like plotly.js (base64 cannot close a tag either).
            figs_tag = ('<script type="application/octet-stream" id="td-figures" data-encoding="gzip+base64">'
                        + gzip_b64(figs.encode("utf-8")) + "</script>")
        else:
            figs_tag = f'<script type="application/json" id="td-figures">{script_json(figs)}</script>'
        config = script_json(json.dumps(PLOT_CONFIG))
        title = "torchdoctor report"
        if self.views:
            title += " — " + os.path.basename(self.views[0].report.file)
        return (
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<meta name=\"generator\" content=\"torchdoctor {esc(__version__)}\">"
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
            '<div id="td-banner" class="banner" hidden></div>'
            '<noscript><div class="banner">The plots need JavaScript; the tables below do not.</div></noscript>'
            f'<main>{body}<footer>torchdoctor {esc(__version__)} · schema {esc(self.report.schema)} · '
            f"plots by plotly.js {esc(plotly_js_version())}, embedded: this file needs no network.</footer></main>"
            f"{figs_tag}"
            f'<script type="application/json" id="td-config">{config}</script>'
            f'<script type="application/octet-stream" id="td-plotly" data-encoding="gzip+base64">'
            f"{plotly_js_gzip_b64() if self.figs else ''}</script>"
            f"<script>{JS}</script></body></html>\n"
        )


# Rendering script. Figures in hidden rank panels are drawn when first shown: plotly sizes a plot
# from its container, which has no width while hidden. `data-td-status` on <html> tells tests (and
# curious users) whether every plot was drawn.
JS = r"""
(function () {
  "use strict";
  var root = document.documentElement, errors = [];
  window.addEventListener("error", function (e) { errors.push(String(e.message || e)); });
  window.addEventListener("unhandledrejection", function (e) { errors.push(String(e.reason)); });
  function banner(msg) { var b = document.getElementById("td-banner"); b.textContent = msg; b.hidden = false; }
  async function inflate(el) {
    var b64 = el.textContent.trim();
    var bin = atob(b64), bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return await new Response(stream).text();
  }
  async function main() {
    var figsEl = document.getElementById("td-figures");
    var config = JSON.parse(document.getElementById("td-config").textContent);
    var drawn = 0;
    if (!figsEl.dataset.encoding && figsEl.textContent === "{}") {
      root.dataset.tdPlots = "0"; root.dataset.tdStatus = "ok"; return;
    }
    if (typeof DecompressionStream === "undefined") {
      throw new Error("this browser cannot unpack the embedded plotly.js (needs DecompressionStream: " +
                      "Chrome 80+, Firefox 113+, Safari 16.4+)");
    }
    var figs = JSON.parse(figsEl.dataset.encoding ? await inflate(figsEl) : figsEl.textContent);
    var code = await inflate(document.getElementById("td-plotly"));
    var s = document.createElement("script");
    s.textContent = code;
    document.head.appendChild(s);
    async function draw(div) {
      if (div.dataset.drawn) return;
      var f = figs[div.dataset.fig];
      div.dataset.drawn = "1";
      await Plotly.newPlot(div, f.data, f.layout || {}, config);
      drawn += 1;
    }
    var divs = document.querySelectorAll("[data-fig]");
    for (var i = 0; i < divs.length; i++) {
      if (divs[i].closest("[hidden]")) continue;
      await draw(divs[i]);
    }
    var sel = document.getElementById("td-rank");
    if (sel) sel.addEventListener("change", async function () {
      var panels = document.querySelectorAll(".rank-panel");
      for (var j = 0; j < panels.length; j++) panels[j].hidden = panels[j].dataset.rank !== sel.value;
      var shown = document.querySelectorAll('.rank-panel[data-rank="' + sel.value + '"] [data-fig]');
      for (var k = 0; k < shown.length; k++) { await draw(shown[k]); Plotly.Plots.resize(shown[k]); }
      root.dataset.tdPlots = String(drawn);
    });
    root.dataset.tdPlots = String(drawn);
    root.dataset.tdStatus = errors.length ? "error" : "ok";
    if (errors.length) root.dataset.tdErrors = errors.join(" | ");
  }
  main().catch(function (e) {
    root.dataset.tdStatus = "error";
    root.dataset.tdErrors = String(e && e.message || e);
    banner("Plots could not be drawn: " + (e && e.message || e));
  });
})();
"""

CSS = """
:root{--fg:#1f2933;--muted:#616E7C;--line:#E4E7EB;--bg:#F5F7FA;--card:#fff;--crit:#C62828;--warn:#E08A00;
--info:#1E6FB8;--ok:#2E7D32;--accent:#0072B2}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,
'Helvetica Neue',Arial,sans-serif}
main{max-width:1360px;margin:0 auto;padding:20px 24px 40px}
header{padding:4px 0 12px}
.brand{font-size:24px;font-weight:700;letter-spacing:-.01em}
.sub{color:var(--muted);margin-top:2px}
.files{color:var(--muted);font-size:12px;margin-top:4px;overflow-wrap:anywhere}
code{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
.muted{color:var(--muted);font-weight:400}
section{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:16px 20px;margin:16px 0;
box-shadow:0 1px 2px rgba(31,41,51,.04)}
h2{font-size:17px;margin:0 0 10px}
h2 .muted{font-size:13px;margin-left:6px}
h3{font-size:14px;margin:16px 0 6px}
h4{font-size:13px;margin:10px 0 4px;color:var(--muted);text-transform:uppercase;letter-spacing:.04em}
.banner{background:#FFF4E5;border:1px solid #F5C26B;padding:10px 16px;margin:12px auto;max-width:1360px}
.verdict{border-radius:10px;padding:14px 20px;background:#fff;border:1px solid var(--line);
border-left:6px solid var(--info)}
.verdict.sev-critical{border-left-color:var(--crit)}.verdict.sev-warning{border-left-color:var(--warn)}
.verdict.healthy{border-left-color:var(--ok)}
.vlabel{font-size:12px;text-transform:uppercase;letter-spacing:.06em;color:var(--muted);font-weight:600}
.vtitle{font-size:18px;font-weight:600;margin-top:2px}
.vfix{margin:6px 0 0}
.cards{display:flex;gap:12px;flex-wrap:wrap;margin-top:16px}
.card{flex:1 1 150px;background:#fff;border:1px solid var(--line);border-radius:10px;padding:10px 14px}
.card .cv{font-size:22px;font-weight:650;font-variant-numeric:tabular-nums}
.card .cl{color:var(--muted);font-size:12px}
.card.bad .cv{color:var(--crit)}.card.good .cv{color:var(--ok)}
.ok-panel{background:#EDF7EE;border:1px solid #B7DFBA;border-radius:8px;padding:12px 16px;color:#1B5E20}
.matrix{border:1px solid var(--line);border-radius:8px;overflow:hidden}
.mrow{display:grid;grid-template-columns:34px minmax(260px,1fr) repeat(5,84px) 215px 86px;align-items:center;
gap:0;padding:8px 10px;border-top:1px solid var(--line);cursor:pointer;list-style:none}
.mrow::-webkit-details-marker{display:none}
.mhead{background:#F8FAFC;font-size:12px;color:var(--muted);font-weight:600;border-top:0;cursor:default}
.mhead .lc{text-transform:capitalize;font-size:11px}
.mhead small{display:block;font-weight:400}
.finding[open]>.mrow{background:#F8FAFC}
.mrow:hover{background:#F5F8FB}
.num{color:var(--muted);font-variant-numeric:tabular-nums}
.ftitle{padding-right:10px}
.fid{background:#EEF2F6;border-radius:4px;padding:1px 5px;margin-right:6px}
.lc{text-align:center;color:transparent;font-size:15px}
.mhead .lc{color:var(--muted)}
.lc.on{color:var(--info)}
.sev-critical .lc.on{color:var(--crit)}.sev-warning .lc.on{color:var(--warn)}
.gain{font-variant-numeric:tabular-nums;font-size:13px;white-space:nowrap}
.gbar{display:inline-block;width:70px;height:8px;background:#EEF2F6;border-radius:4px;margin-right:8px;
vertical-align:middle;overflow:hidden}
.gbar span{display:block;height:100%;background:var(--accent)}
.sev-critical .gbar span{background:var(--crit)}.sev-warning .gbar span{background:var(--warn)}
.conf{font-size:12px;color:var(--muted)}
.badge{display:inline-block;font-size:11px;font-weight:600;border-radius:10px;padding:1px 8px;margin-right:6px;
text-transform:uppercase;letter-spacing:.03em;background:#E3EEF9;color:var(--info)}
.badge.critical{background:#FDECEC;color:var(--crit)}.badge.warning{background:#FFF3E0;color:#A35F00}
.fbody{padding:4px 20px 14px 44px;background:#FBFCFD;border-top:1px dashed var(--line)}
.evlist{margin:0;padding-left:18px}
.evidence{margin:6px 0}
.ev-text{margin:0 0 4px}
.chips{display:flex;flex-wrap:wrap;gap:6px;margin:4px 0}
.chip{background:#EEF2F6;border-radius:6px;padding:1px 8px;font-size:12px;font-variant-numeric:tabular-nums}
.snippet{background:#1f2933;color:#F5F7FA;border-radius:6px;padding:10px 12px;overflow:auto}
.snippet code{color:inherit}
.meta{color:var(--muted);font-size:13px}
table{border-collapse:collapse;width:100%;margin:6px 0;font-size:13px}
th,td{padding:5px 8px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
th{font-size:12px;color:var(--muted);font-weight:600;background:#F8FAFC}
td.r,th.r{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.nowrap{white-space:nowrap}
table.items{font-size:12px;width:auto}
code.name{display:inline-block;max-width:100%;overflow:hidden;text-overflow:ellipsis;white-space:nowrap;
vertical-align:bottom}
td.nm{max-width:0;width:60%}
td.nm code.name{display:block}
.op{display:flex;gap:8px;align-items:baseline}
td.nm .op code.name{flex:1 1 auto;min-width:0}
.op .muted{white-space:nowrap;font-size:12px}
.swatch{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:6px}
.two{display:grid;grid-template-columns:1fr 1fr;gap:24px}
@media (max-width:1000px){.two{grid-template-columns:1fr}.mrow{grid-template-columns:28px 1fr repeat(5,44px) 120px 60px}}
.rank-select{font-size:13px;font-weight:400;margin-left:12px;color:var(--muted)}
.rank-select select{font:inherit;padding:2px 6px;margin-left:4px}
.problems{margin:0;padding-left:18px;font-size:13px;color:var(--muted)}
.problems .err{color:var(--crit)}
.plot{width:100%}
footer{color:var(--muted);font-size:12px;text-align:center;margin-top:20px}
"""


def render_html_and_figures(report: Report) -> tuple[str, dict[str, Any]]:
    """The page and, decoded, the plotly figures it embeds (for tests and for tools that restyle them)."""
    page = _Page(report)
    text = page.render()
    return text, {k: msgspec.json.decode(v) for k, v in page.figs.items()}


__all__ = ["render_html", "render_html_and_figures", "script_json", "write_html"]
