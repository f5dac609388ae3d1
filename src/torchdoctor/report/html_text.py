"""Text helpers of the HTML report: escaping for plotly labels and for JSON inside <script>, and
the number formats the page shows.

Markup itself is escaped by Jinja2's autoescaping (templates/); `esc` stays for callers that build
a string of HTML by hand. Plotly labels are not HTML the template sees: plotly reads a subset of
HTML in them at draw time, so they are escaped here (`pesc`) before they enter a figure.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

MAX_NAME = 140  # characters of a kernel/op name shown before eliding (full name in the tooltip)


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
