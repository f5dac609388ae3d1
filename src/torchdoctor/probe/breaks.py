"""Each graph break of the job, explained: reason, registry id and hints, the user's line.

Read at the probe's housekeeping points (summary writes), never on the training thread's hot
path, from what Dynamo already keeps: ``torch._dynamo.utils.graph_break_reasons`` (one
``GraphCompileReason`` per break met while compiling: ``reason`` text and ``user_stack``, a list
of ``FrameSummary``; cleared by ``torch._dynamo.reset()``) and the graph-break registry shipped
with torch (``torch/_dynamo/graph_break_registry.json``: ``{"GB0124": [{"Gb_type", "Explanation",
"Hints"}]}``), both private and feature-detected. A torch without the registry still gives the
reason and the line; one without the list gives nothing (the counters still count the breaks).
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any

from torchdoctor.compile.records import base_function
from torchdoctor.facts import GraphBreakFacts

_MAX_READ = 2000  # newest records read per summary write (a recompile storm repeats the same ones)
_MAX_BREAKS = 30
_GB_LINK = re.compile(r"/gb/gb(\d+)\.html")
# torch 2.13 records a data-dependent `if` under this legacy text; the registry calls it:
_LEGACY = {"generic_jump": "Data-dependent branching"}
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# The bundled jobs are the user's code when they run (`torchdoctor demo --compile`).
_WORKLOADS_DIR = _PACKAGE_DIR + "workloads" + os.sep
_registry_cache: dict[str, tuple[str, str | None, list[str]]] | None = None


def _registry(dynamo_dir: str) -> dict[str, tuple[str, str | None, list[str]]]:
    """gb_type -> (GBID, explanation, hints) from the registry file; {} when there is none.

    Templated texts (``{fn.__name__}``) are left out: the break's own message has them filled in.
    """
    global _registry_cache
    if _registry_cache is None:
        _registry_cache = {}
        try:
            with open(os.path.join(dynamo_dir, "graph_break_registry.json"), encoding="utf-8") as f:
                raw = json.load(f)
            for gb_id, variants in raw.items():
                for entry in variants:
                    text = entry.get("Explanation") or ""
                    hints = [h.strip() for h in entry.get("Hints") or [] if _plain(h)]
                    _registry_cache.setdefault(entry["Gb_type"], (gb_id, text if _plain(text) else None, hints))
        except Exception:  # no registry on this torch (or another format): ids stay unknown
            pass
    return _registry_cache


def _plain(text: str) -> bool:
    """A registry text that reads as written (not a format template or a Python expression)."""
    return bool(text) and "{" not in text and not text.startswith('"') and '" +' not in text


def parse_message(text: str) -> tuple[str, str | None, str | None, list[str]]:
    """(reason, GBID, explanation, hints) from a Dynamo graph-break message."""
    lines = [line.strip() for line in text.splitlines()]
    reason = lines[0] if lines else ""
    explanation = next((ln.removeprefix("Explanation:").strip() for ln in lines if ln.startswith("Explanation:")), None)
    hints = [ln.removeprefix("Hint:").strip() for ln in lines if ln.startswith("Hint:")]
    link = _GB_LINK.search(text)
    return reason, (f"GB{link.group(1)}" if link else None), explanation, hints


def user_frame(stack: list[Any], torch_dir: str) -> Any:
    """The innermost frame of ``stack`` in the user's code (not torch's, not torchdoctor's probe:
    its bundled jobs count as the user's)."""
    for frame in reversed(stack):
        name = str(getattr(frame, "filename", "") or "")
        own = name.startswith(_PACKAGE_DIR) and not name.startswith(_WORKLOADS_DIR)
        if name and not own and not name.startswith((torch_dir, "<")):
            return frame
    return None


def graph_breaks(utils: Any) -> list[GraphBreakFacts]:
    """One record per (reason, user line), in the order Dynamo met them; [] when unknown."""
    records = list(getattr(utils, "graph_break_reasons", None) or ())[-_MAX_READ:]
    if not records:
        return []
    dynamo_dir = os.path.dirname(getattr(utils, "__file__", "") or "")
    torch_dir = os.path.dirname(getattr(sys.modules.get("torch"), "__file__", "") or "/nonexistent") + os.sep
    registry = _registry(dynamo_dir)
    out: dict[tuple[str, str | None], GraphBreakFacts] = {}
    for record in records:
        reason, gb_id, explanation, hints = parse_message(str(getattr(record, "reason", "") or ""))
        reason = _LEGACY.get(reason.split(" ")[0], reason)
        stack = list(getattr(record, "user_stack", None) or ())
        frame = user_frame(stack, torch_dir)
        location = f"{frame.filename}:{frame.lineno}" if frame is not None else None
        key = (reason, location)
        if key in out:
            out[key].compiles += 1
            continue
        if len(out) >= _MAX_BREAKS:
            continue
        known = registry.get(reason)
        if known is not None:
            gb_id = gb_id or known[0]
            explanation = explanation or known[1]
            hints = hints or list(known[2])
        out[key] = GraphBreakFacts(
            reason=reason[:200], gb_id=gb_id, explanation=(explanation or "")[:400] or None,
            hints=[h[:300] for h in hints[:4]], location=location,
            source=(str(getattr(frame, "line", "") or "").strip()[:200] or None) if frame is not None else None,
            function=base_function(getattr(frame, "name", None)) if frame is not None else None,
            in_torch=frame is None or frame is not stack[-1],
        )
    return list(out.values())
