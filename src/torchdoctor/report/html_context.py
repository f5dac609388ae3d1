"""What the HTML report's templates show: the report shaped into plain values, one entry per section.

The templates (templates/sections/) hold the markup and escape every value (Jinja2 autoescaping), so
the strings here are plain text, never HTML: kernel, op, file and rank names from a trace stay
untrusted text all the way to the page. Numbers are formatted here, once, so a template only places
them. A figure is registered in `Figures` (its JSON is embedded once in the page) and a section
refers to it by key; a figure that has nothing to draw is None and its section leaves it out.
"""

from __future__ import annotations

import os
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

from ..metrics.model import RankResult
from .html_figures import (
    ab_figure,
    heatmap_figure,
    kernels_figure,
    roofline_figure,
    spread_figure,
    steps_figure,
    timeline_figure,
)
from .html_ranks import (
    MAX_DETAIL_RANKS,
    MAX_HEATMAP_RANKS,
    MAX_TABLE_RANKS,
    MAX_TIMELINE_RANKS,
    RankView,
    device_name,
    pick_ranks,
    rank_views,
    straggler_key,
)
from .html_text import fmt, fmt_value, short
from .labels import CAUSE_COLOR, UNKNOWN_CAUSE_COLOR, cause_label, fmt_ms, job_cost, steps_label
from .model import ABResult, Evidence, Finding, Report
from .offenders import late_line
from .roofline_text import roofline_lines

Ctx = dict[str, Any]

LAYERS = ("input", "host", "compile", "distributed", "hardware")
SEVERITIES = ("critical", "warning", "info")
MAX_ITEMS = 20  # evidence items listed per evidence entry
NAME_KEYS = ("name", "op", "kernel", "file")  # evidence item columns shown as (elided) names


class Figures:
    """The page's figures by id, as plotly JSON, in the order the page shows them."""

    def __init__(self) -> None:
        self.json: dict[str, str] = {}

    def add(self, key: str, fig: go.Figure | None) -> str | None:
        """Register `fig` under `key`; the key for the template's plot slot, None if nothing to draw."""
        if fig is None:
            return None
        self.json[key] = pio.to_json(fig, validate=False, pretty=False)
        return key


def page_context(report: Report, figs: Figures) -> Ctx:
    """Every section's values. Sections a report does not have are None (the page leaves them out);
    figures are registered in page order, so the embedded JSON lists them as the page shows them."""
    views = rank_views(report)
    straggler = straggler_key(views, report.cross_rank)
    ctx: Ctx = {
        "header": header(report, views),
        "verdict": verdict(report),
        "cards": cards(report, views),
        "ab": ab_section(report.ab, figs) if report.ab is not None else None,
        "matrix": matrix(report.findings, report.healthy),
        "timeline": timeline(views, straggler, figs) if views else None,
        "ranks": ranks_section(report, views, straggler, figs) if len(views) > 1 else None,
        "detail": detail(views, straggler, figs) if views else None,
        "no_trace": not views and bool(report.ranks),
        "problems": problems(report, views),
    }
    title = "torchdoctor report"
    if views:
        title += " — " + os.path.basename(views[0].file)
    ctx["title"] = title
    return ctx


# ---------------------------------------------------------------------------------------------
# Header, verdict, cards


def header(report: Report, views: list[RankView]) -> Ctx:
    devices = sorted({device_name(v.result) for v in views})
    bits = [f"source: {report.source}", f"{len(report.ranks)} rank(s)"]
    if devices:
        bits.append(", ".join(devices[:3]) + (" …" if len(devices) > 3 else ""))
    if views:
        w = views[0].result.window
        win = f"{steps_label(w.steps)} ({w.mode})" if w.steps else w.mode
        if w.skipped_warmup:
            win += f", warm-up {', '.join(map(str, w.skipped_warmup))} skipped"
        bits.append("window: " + win)
    files = [rr.file for rr in report.ranks]
    from .console import config_line  # console imports rich: only when a page is rendered

    return {
        "bits": bits,
        "files": [{"path": f, "label": short(os.path.basename(f), 80)} for f in files[:4]],
        "more_files": max(len(files) - 4, 0),
        "run": [(k, fmt_value(v)) for k, v in list(report.run.items())[:8]] if report.run else [],
        "config_line": config_line(report.config) or None,
    }


def verdict(report: Report) -> Ctx:
    """The lead: what the tool could not see (each its own sentence, before any verdict), then the
    finding to fix first, or "healthy", or nothing."""
    spots = [{"label": "No verdict" if s.get("kind") == "no-verdict" else "Not seen", "text": s.get("text", "")}
             for s in report.blind_spots]
    top = None
    actionable = [f for f in report.findings if f.severity != "info"]
    if actionable:
        f = actionable[0]
        window = f.per == "window"  # a trace without steps: shares of the whole traced window
        gain = f"≈{f.recoverable_pct:.0f}% of {'the traced window' if window else 'step time'}"
        if f.recoverable_ms:
            gain += f", {fmt_ms(f.recoverable_ms)} ms{' in the window' if window else ' per step'}"
        elif f.job_s:  # a cost of the job (compiling, work between steps), not of the step
            gain = job_cost(f.job_s, f.job_pct, f.per)
        top = {"severity": f.severity, "title": f.title, "gain": gain, "fix": f.fix.text if f.fix else None}
    return {"blind_spots": spots, "top": top, "healthy": top is None and bool(report.healthy)}


def cards(report: Report, views: list[RankView]) -> list[Ctx]:
    rows: list[tuple[str, str, str]] = []
    if len(views) == 1:
        m = views[0].result.metrics
        rows += [("median step", fmt(m.step_ms_median, " ms", 2), ""),
                 ("device busy", fmt(m.busy_pct, "%"), ""),
                 ("device idle", fmt(m.idle_pct, "%"), "bad" if (m.idle_pct or 0) >= 20 else ""),
                 ("exposed comm", fmt(m.comm_exposed_pct, "%"), ""),
                 ("waiting for data", fmt(m.dataloader_exposed_pct, "%"), ""),
                 ("comm overlapped", fmt(m.overlap_pct, "%"), "")]
    elif views:
        c = report.cross_rank
        idle = [v.result.metrics.idle_pct for v in views if v.result.metrics.idle_pct is not None]
        rows += [("ranks", str(len(views)), ""),
                 ("median step", fmt(c.step_ms_median if c else None, " ms", 2), ""),
                 ("step skew", fmt(c.step_skew_pct if c else None, "%"),
                  "bad" if c and (c.step_skew_pct or 0) >= 10 else ""),
                 ("device idle (median rank)", fmt(sorted(idle)[len(idle) // 2] if idle else None, "%"), ""),
                 ("straggler", f"rank {c.straggler}" if c and c.straggler is not None else "none",
                  "bad" if c and c.straggler is not None else "")]
    if report.ab is not None:
        rows.append(("speedup (fix)", f"×{report.ab.speedup_median:.2f}",
                     "good" if report.ab.speedup_median > 1 else ""))
    return [{"label": k, "value": v, "cls": cls} for k, v, cls in rows]


# ---------------------------------------------------------------------------------------------
# A/B result and the diagnosis matrix


def _interval(iv: list[float] | None) -> str:
    return "–" if not iv else f"×{iv[0]:.3f}–×{iv[1]:.3f}"


def ab_section(ab: ABResult, figs: Figures) -> Ctx:
    summary = None
    if ab.pairs:
        summary = {"speedup": f"{ab.speedup_geomean or 0:.3f}", "pairs": ab.pairs, "interval": _interval(ab.interval),
                   "sign_p": fmt(ab.sign_p, "", 3), "method": ab.method}
    return {
        "fig": figs.add("fig-ab", ab_figure(ab)),
        "summary": summary,
        "remedies": [[r.id, "kept" if r.kept else "dropped", fmt(r.geomean, "×", 3), _interval(r.interval),
                      str(r.pairs), fmt(r.sign_p, "", 3), fmt(r.speedup, "×", 3), r.reason or "–"]
                     for r in ab.remedies],
        "details": [[k, fmt_value(v)] for k, v in list(ab.details.items())[:40]],
    }


def matrix(findings: list[Finding], healthy: bool | None) -> Ctx:
    return {
        "healthy": bool(healthy),
        "counts": [(layer, sum(1 for f in findings if f.layer == layer)) for layer in LAYERS],
        # The top finding starts expanded: its evidence is what a reader opens the report for.
        "findings": [finding(i, f, open_=i == 1) for i, f in enumerate(findings, 1)],
    }


def finding(i: int, f: Finding, open_: bool = False) -> Ctx:
    meta: list[tuple[str, str]] = []  # (kind, text): the template names each kind
    if f.confirm:
        meta.append(("confirm", f.confirm))
    if f.ranks:
        meta.append(("ranks", ", ".join(str(r) for r in f.ranks[:32]) + (" …" if len(f.ranks) > 32 else "")))
    if f.remedy:
        meta.append(("remedy", f.remedy))
    if f.source:
        meta.append(("source", f.source))
    gain = f"{f.recoverable_pct:.1f}%" + (f" · {fmt_ms(f.recoverable_ms)} ms" if f.recoverable_ms else "")
    if f.job_s and not f.recoverable_ms:
        gain = job_cost(f.job_s, f.job_pct, f.per, sep=" · ")
    return {
        "num": i, "open": open_, "id": f.id, "title": f.title, "severity": f.severity,
        # Only a known severity becomes part of a class name (it picks the colour).
        "sev": f.severity if f.severity in SEVERITIES else "info",
        "layers": [(layer, f.layer == layer) for layer in LAYERS],
        "bar_pct": f"{max(0.0, min(f.recoverable_pct, 100.0)):.1f}", "gain": gain, "confidence": f.confidence,
        "evidence": [evidence(e) for e in f.evidence],
        "fix": None if f.fix is None else {"text": f.fix.text, "snippet": f.fix.snippet,
                                           "language": f.fix.language},
        "meta": meta,
    }


def evidence(ev: Evidence) -> Ctx:
    keys: list[str] = []
    for it in ev.items[:MAX_ITEMS]:
        for k in it:
            if k not in keys and len(keys) < 8:
                keys.append(k)
    rows = [[{"name": str(it[k])} if k in NAME_KEYS and k in it else fmt_value(it.get(k, "")) for k in keys]
            for it in ev.items[:MAX_ITEMS]]
    # (No key may be named like a dict method: the template's `e.keys` would find the method.)
    return {"text": ev.text, "chips": [(k, fmt_value(v)) for k, v in ev.values.items()],
            "columns": keys, "rows": rows, "more": max(len(ev.items) - MAX_ITEMS, 0)}


# ---------------------------------------------------------------------------------------------
# Timeline, ranks, per-rank detail


def _shown_note(shown: int, total: int, straggler: str | None) -> Ctx | None:
    """How many ranks a bounded view shows, when it leaves some out."""
    return {"shown": shown, "total": total, "straggler": straggler is not None} if shown < total else None


def timeline(views: list[RankView], straggler: str | None, figs: Figures) -> Ctx:
    shown = pick_ranks(views, straggler, MAX_TIMELINE_RANKS)
    drawable = [v for v in shown if v.result.timeline_busy or v.result.timeline_gaps]
    fig = figs.add("fig-timeline", timeline_figure(drawable, straggler)) if drawable else None
    return {"fig": fig, "note": _shown_note(len(shown), len(views), straggler)}


def ranks_section(report: Report, views: list[RankView], straggler: str | None, figs: Figures) -> Ctx:
    c = report.cross_rank
    cross = None
    if c is not None:
        cross = {"ranks": c.ranks, "median": fmt(c.step_ms_median, " ms", 2), "skew": fmt(c.step_skew_pct, "%"),
                 "min": fmt(c.step_ms_min, " ms", 2), "max": fmt(c.step_ms_max, " ms", 2),
                 "straggler": c.straggler, "lead": fmt(c.straggler_lead_ms, " ms", 2),
                 "victims": ", ".join(map(str, c.victims[:24])) + (" …" if len(c.victims) > 24 else ""),
                 "late": late_line(c) if c.late_ranks else None}
    heat = figs.add("fig-heatmap", heatmap_figure(pick_ranks(views, straggler, MAX_HEATMAP_RANKS), straggler))
    # Past the table's rows, histograms show the spread of every rank.
    spread = figs.add("fig-spread", spread_figure(views, straggler)) if len(views) > MAX_TABLE_RANKS else None
    return {"cross": cross, "heatmap": heat, "spread": spread, "table": rank_table(views, straggler)}


def rank_table(views: list[RankView], straggler: str | None) -> Ctx:
    shown = pick_ranks(views, straggler, MAX_TABLE_RANKS)
    rows = []
    for v in shown:
        m, w = v.result.metrics, v.result.window
        rows.append([{"text": v.label, "straggler": v.key == straggler}, device_name(v.result),
                     steps_label(w.steps) if w.steps else w.mode,
                     fmt(m.step_ms_median, "", 2), fmt(m.busy_pct, "%"), fmt(m.idle_pct, "%"),
                     fmt(m.compute_pct, "%"), fmt(m.comm_pct, "%"), fmt(m.comm_exposed_pct, "%"),
                     fmt(m.dataloader_exposed_pct, "%"), fmt(m.sync_pct, "%")])
    return {"rows": rows, "note": _shown_note(len(shown), len(views), straggler)}


def detail(views: list[RankView], straggler: str | None, figs: Figures) -> Ctx:
    views = pick_ranks(views, straggler, MAX_DETAIL_RANKS)
    focus = next((v for v in views if v.key == straggler), views[0])
    select = [(v.key, v.label, v is focus) for v in views] if len(views) > 1 else None
    return {"select": select, "panels": [rank_panel(v, v is not focus, figs) for v in views]}


def rank_panel(v: RankView, hidden: bool, figs: Figures) -> Ctx:
    r = v.result
    # Registration order (kernels, steps, roofline) is the embedded JSON's order, as it always was.
    kernels_fig = figs.add(f"fig-kernels-{v.key}", kernels_figure(r))
    steps_fig = figs.add(f"fig-steps-{v.key}", steps_figure(r))
    roofline_fig = figs.add(f"fig-roofline-{v.key}", roofline_figure(r))
    lines = roofline_lines(r)
    return {"key": v.key, "label": v.label, "hidden": hidden, "steps_fig": steps_fig,
            "kernels_fig": kernels_fig, "idle": idle_rows(r), "kernels": kernel_rows(r),
            "roofline": {"lines": lines, "fig": roofline_fig} if lines else None, "syncs": syncs(r)}


def idle_rows(r: RankResult) -> list[list[Any]]:
    """What the host did while the device sat idle, per cause (ms per step, share, top host ops)."""
    steps = max(len(r.window.steps), 1)
    total = sum(c.ns for c in r.idle_causes) or 1
    rows: list[list[Any]] = []
    for c in sorted(r.idle_causes, key=lambda c: -c.ns):
        if c.ns <= 0:
            continue
        ops = [{"name": t.name, "ms": fmt_ms(t.ns / 1e6 / steps)} for t in c.top[:3]]
        rows.append([{"text": cause_label(c.cause), "swatch": CAUSE_COLOR.get(c.cause, UNKNOWN_CAUSE_COLOR)},
                     f"{c.ns / 1e6 / steps:.2f}", f"{100 * c.ns / total:.0f}%", {"ops": ops}])
    return rows


def kernel_rows(r: RankResult) -> list[list[Any]]:
    steps = max(len(r.window.steps), 1)
    return [[{"name": k.name}, k.kind, str(k.count), f"{k.total_ns / 1e6 / steps:.2f}", f"{k.mean_ns / 1e3:.1f}",
             f"{k.max_ns / 1e3:.1f}", fmt(k.achieved_tflops, "", 2), fmt(k.pct_of_peak, "%"),
             fmt(k.achieved_gbps, "", 0), fmt(k.pct_of_bandwidth, "%"), k.bound or "–"]
            for k in r.kernels.top[:15]]


def syncs(r: RankResult) -> Ctx | None:
    s = r.syncs
    if not s.sites:
        return None
    steps = max(len(r.window.steps), 1)
    rows = [[x.api, {"name": x.top_op or x.op or "–"}, x.explanation, str(x.count), f"{x.ns / 1e6 / steps:.3f}"]
            for x in s.sites]
    return {"per_step": f"{s.per_step:.1f}", "rows": rows}


# ---------------------------------------------------------------------------------------------
# Errors and warnings


def problems(report: Report, views: list[RankView]) -> Ctx:
    return {
        "errors": [(e.file, e.message) for e in report.errors[:50]],
        "warnings": [(w.file, w.message) for w in report.warnings[:50]],
        "rank_warnings": [(v.label, w) for v in views[:MAX_TABLE_RANKS] for w in v.result.warnings[:10]],
    }
