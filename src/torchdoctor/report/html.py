"""`--html`: one self-contained HTML report that works from file:// with no network.

Layout: verdict and headline numbers, the A/B result of `fix` (when present), the diagnosis matrix
(layers × findings, ranked, evidence in <details>), a per-rank timeline of the analysis window with
idle gaps coloured by attribution, a per-rank heat map of step time and exposed communication, and
per-rank detail (step-time breakdown per step, kernel categories, idle causes, syncs) behind a rank
selector.

Where things live: the markup is Jinja2 templates (templates/report.html.j2 and one template per
section under templates/sections/), the styles and the renderer static files (templates/static/);
html_context.py shapes the report into the plain values the templates show, html_figures.py builds
the plotly figures, html_ranks.py picks the ranks worth drawing. This module renders the page.

How it stays self-contained and small: plotly.js (~4.8 MB) is embedded once as gzip+base64
(~2 MB) and inflated in the browser with DecompressionStream (Chrome 80+, Firefox 113+, Safari
16.4+), then run as an inline script; the figures are embedded as JSON, packed like plotly.js when
they pass FIGS_INLINE_LIMIT (many ranks). A real single-rank report is ~2.1 MB. Tables are HTML so
the page reads even where the plots cannot be drawn. Every plot is bounded whatever the job size:
timeline rows, detail ranks and table rows are capped, heat maps are images.

Security: every string from a trace (kernel, op, file names) is untrusted. The templates autoescape
every value (and no template marks a trace-derived value |safe); strings inside figures are
escaped too (plotly interprets a subset of HTML in labels and hover text); and the JSON embedded in
<script> has `<`, `>`, `&` and the JS line separators written as \\u escapes so no string can close
the script element.
"""

from __future__ import annotations

import base64
import functools
import gzip
import json
import os
import re
from pathlib import Path
from typing import Any

import jinja2
import msgspec
import plotly.offline

from .. import __version__
from .html_context import Figures, page_context
from .html_figures import PLOT_CONFIG
from .html_text import script_json, short
from .model import Report

# Figure JSON above this is embedded gzip+base64 too (a 1.5 MB timeline of 12 busy ranks packs to
# ~0.4 MB); below it stays readable JSON in the page source.
FIGS_INLINE_LIMIT = 512 * 1024
PAGE_TEMPLATE = "report.html.j2"


# ---------------------------------------------------------------------------------------------
# Entry points


def write_html(report: Report, path: str | os.PathLike[str]) -> Path:
    """Write the report as one self-contained HTML file; returns the path written."""
    out = Path(path)
    out.write_text(render_html(report), encoding="utf-8")
    return out


def render_html(report: Report) -> str:
    return _render(report, Figures())


def render_html_and_figures(report: Report) -> tuple[str, dict[str, Any]]:
    """The page and, decoded, the plotly figures it embeds (for tests and for tools that restyle them)."""
    figs = Figures()
    text = _render(report, figs)
    return text, {k: msgspec.json.decode(v) for k, v in figs.json.items()}


# ---------------------------------------------------------------------------------------------
# Templates


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The templates' environment, built once. Autoescaping is on for every template (the static
    CSS and JS are read as text, never rendered); StrictUndefined makes a misspelt value an error
    instead of an empty cell."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("torchdoctor.report", "templates"),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html", "j2"), default=True),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["short"] = short
    return env


@functools.cache
def static_text(name: str) -> str:
    """A file of templates/static/ (the page's CSS and JS), inlined as is."""
    loader = environment().loader
    assert loader is not None
    return loader.get_source(environment(), f"static/{name}")[0]


def _render(report: Report, figs: Figures) -> str:
    ctx = page_context(report, figs)  # registers the figures, in page order
    figs_json = "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in figs.json.items()) + "}"
    packed = None
    if len(figs_json) > FIGS_INLINE_LIMIT:
        # Many ranks: the figure data is packed like plotly.js (base64 cannot close a tag either).
        packed = gzip_b64(figs_json.encode("utf-8"))
    return environment().get_template(PAGE_TEMPLATE).render(
        ctx,
        version=__version__,
        schema=report.schema,
        plotly_version=plotly_js_version(),
        css=static_text("report.css"),
        js=static_text("report.js"),
        figures_packed=packed,
        figures_json=None if packed else script_json(figs_json),
        config_json=script_json(json.dumps(PLOT_CONFIG)),
        plotly_gzip_b64=plotly_js_gzip_b64() if figs.json else "",
    )


# ---------------------------------------------------------------------------------------------
# plotly.js, embedded


def gzip_b64(data: bytes) -> str:
    # mtime 0: the same report always gives the same file.
    return base64.b64encode(gzip.compress(data, compresslevel=9, mtime=0)).decode("ascii")


@functools.lru_cache(maxsize=1)
def plotly_js_gzip_b64() -> str:
    """plotly.min.js (4.8 MB) gzipped and base64'd: 2 MB, inflated by the page itself."""
    return gzip_b64(plotly.offline.get_plotlyjs().encode("utf-8"))


@functools.lru_cache(maxsize=1)
def plotly_js_version() -> str:
    """The embedded plotly.js's version, read once (get_plotlyjs reads the 4.8 MB file each call)."""
    m = re.search(r"plotly\.js v([0-9][0-9A-Za-z.\-]*)", plotly.offline.get_plotlyjs()[:400])
    return m.group(1) if m else "?"


__all__ = ["render_html", "render_html_and_figures", "write_html"]
