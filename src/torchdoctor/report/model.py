"""The report model: what every renderer (console, JSON, HTML) draws from.

JSON schema `torchdoctor.report/1` (see docs/json-schema.md): the top-level `Report` struct
encoded with msgspec. Fields are only ever added within version 1; a rename or a change of
meaning bumps the version.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from ..facts import RankFacts
from ..metrics.model import RankResult
from ..metrics.ranks import CrossRank

SCHEMA = "torchdoctor.report/1"
Layer = Literal["input", "host", "compile", "distributed", "hardware"]
Severity = Literal["critical", "warning", "info"]
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


class Evidence(msgspec.Struct, omit_defaults=True):
    """One piece of evidence: a sentence plus the numbers and the offending names behind it."""

    text: str
    values: dict[str, Any] = {}
    # Offending ops / kernels / steps / ranks by name, with where to find them.
    items: list[dict[str, Any]] = []


class Fix(msgspec.Struct, omit_defaults=True):
    text: str
    snippet: str = ""
    language: str = "python"  # python | shell | diff


class Finding(msgspec.Struct, omit_defaults=True):
    id: str  # catalogue id, e.g. "DL-1"
    layer: Layer
    severity: Severity
    title: str
    # Share of the step time the fix is estimated to give back (the ranking key), 0..100.
    recoverable_pct: float
    recoverable_ms: float | None = None
    evidence: list[Evidence] = []
    fix: Fix | None = None
    confidence: Literal["high", "medium", "low"] = "medium"
    # What would confirm the finding when the evidence is indirect.
    confirm: str = ""
    remedy: str | None = None
    ranks: list[int] = []
    source: str = ""  # where the threshold comes from


class ErrorEntry(msgspec.Struct):
    file: str
    message: str


class RankReport(msgspec.Struct):
    """One rank: its measured metrics plus, for live runs, the facts the probe recorded."""

    rank: int | None
    file: str
    device: str | None
    window: dict[str, Any]
    metrics: dict[str, Any]
    analysis: RankResult | None = None
    facts: RankFacts | None = None


class ABRemedy(msgspec.Struct):
    id: str
    kept: bool
    speedup: float | None = None
    reason: str = ""


class ABResult(msgspec.Struct):
    baseline_steps_per_s: float
    treated_steps_per_s: float
    speedup_median: float
    speedup_min: float
    speedup_max: float
    remedies: list[ABRemedy] = []
    details: dict[str, Any] = {}


class Report(msgspec.Struct):
    schema: str = SCHEMA
    tool: str = "torchdoctor"
    version: str = ""
    source: str = "trace"  # trace | run | fix
    ranks: list[RankReport] = []
    cross_rank: CrossRank | None = None
    findings: list[Finding] = []
    errors: list[ErrorEntry] = []
    warnings: list[ErrorEntry] = []
    healthy: bool | None = None
    run: dict[str, Any] = {}
    ab: ABResult | None = None
