"""The plotly figures of the HTML report, built with plotly's Python objects (so property names are
validated) and embedded by html.py as JSON.

Every string from a trace that enters a figure goes through `pesc`: plotly interprets a subset of
HTML in labels and hover text. Every figure is bounded whatever the job size: the timeline draws
picked ranks (html_ranks), heat maps fold rows past MAX_HEATMAP_ROWS, hover targets are capped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..metrics.model import RankResult
from ..metrics.ranks import comm_wait_ms
from .html_ranks import RankView
from .html_text import fmt, pesc, short
from .labels import BUSY_COLOR, CAUSE_COLOR, CAUSE_ORDER, UNKNOWN_CAUSE_COLOR, cause_label
from .model import ABResult
from .offenders import groups

MAX_HEATMAP_ROWS = 256  # beyond this, a heat-map row stands for a group of consecutive ranks
MAX_HEATMAP_STEPS = 200
MAX_HOVER_GAPS = 300  # per timeline row: the longest gaps get a hover target
MAX_HEATMAP_TEXT_CELLS = 300  # above this the numbers no longer fit inside the cells

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
# plotly.js options of every plot on the page (embedded once as td-config).
PLOT_CONFIG = {"displaylogo": False, "responsive": True, "showLink": False,
               "modeBarButtonsToRemove": ["lasso2d", "select2d", "autoScale2d"],
               "toImageButtonOptions": {"format": "png", "scale": 2}}


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

