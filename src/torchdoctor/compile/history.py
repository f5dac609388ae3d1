"""Why a run missed caches an earlier run filled: the previous run beside it in the same cache
directory, and what changed between the two (fingerprint fields, captured graphs). No torch.

Runs of one job sit side by side (``td-runs/<stamp>``); each compiling run records its caches in
``caches/rank{R}.json`` (probe/compile_cache.py). When this run's FX graph lookups all missed while
an earlier run wrote to the same cache directory, the caches were there: something in their keys
changed, or the graphs did, and that is what the report names (CG-8).
"""

from __future__ import annotations

import json
import os
from typing import Any

from . import fingerprint
from .cachepack import RUN_CACHES


def record(run_dir: str) -> tuple[dict[str, Any], float] | None:
    """The first rank's compile-cache record of a run and its modification time; None without one."""
    folder = os.path.join(run_dir, RUN_CACHES)
    try:
        names = sorted(n for n in os.listdir(folder) if n.startswith("rank") and n.endswith(".json"))
        path = os.path.join(folder, names[0])
        with open(path, encoding="utf-8") as f:
            got = json.load(f)
        return (got, os.path.getmtime(path)) if isinstance(got, dict) else None
    except (OSError, IndexError, ValueError):
        return None


def previous_run(run_dir: str) -> tuple[str, dict[str, Any]] | None:
    """The latest run beside `run_dir`, older than it, that compiled into the same cache directory."""
    mine = record(run_dir)
    if mine is None or not mine[0].get("cache_dir"):
        return None
    here = os.path.abspath(run_dir)
    parent = os.path.dirname(here)
    best: tuple[float, str, dict[str, Any]] | None = None
    try:
        siblings = os.listdir(parent)
    except OSError:
        return None
    for name in siblings:
        other = os.path.join(parent, name)
        if other == here or not os.path.isdir(other):
            continue
        got = record(other)
        if got is None or got[1] >= mine[1] or got[0].get("cache_dir") != mine[0]["cache_dir"]:
            continue
        if best is None or got[1] > best[0]:
            best = (got[1], other, got[0])
    return (best[1], best[2]) if best is not None else None


def explain_misses(run_dir: str) -> dict[str, Any] | None:
    """When every FX graph lookup of this run missed and an earlier run compiled into the same cache
    directory: that run, the fingerprint fields that changed (each with the caches it invalidates)
    and what the graphs say. None otherwise."""
    mine = record(run_dir)
    if mine is None:
        return None
    counts = mine[0].get("counters") or {}
    if not counts.get("fx_graph.miss") or counts.get("fx_graph.hit"):
        return None
    prev = previous_run(run_dir)
    if prev is None:
        return None
    other, theirs = prev
    changed = [d for d in fingerprint.diff(theirs.get("fingerprint") or {}, mine[0].get("fingerprint") or {})
               if fingerprint.invalidates(d[0])]
    ga = [g.get("hash") for g in theirs.get("graphs") or []]
    gb = [g.get("hash") for g in mine[0].get("graphs") or []]
    graphs = None if not ga or not gb else ("same" if ga == gb else "changed")
    return {"previous": other, "changed": [fingerprint.explain(d) for d in changed],
            "fields": [d[0] for d in changed], "graphs": graphs, "cache_dir": mine[0]["cache_dir"]}
