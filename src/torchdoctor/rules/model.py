"""The finding model: what a rule says, with the evidence and the claim behind it.

The rules produce findings; the report (report/model.py) carries and renders them. Every field
here is part of the JSON schema ``torchdoctor.report/1`` (docs/json-schema.md): fields are only
ever added within version 1.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

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
    language: str = "python"  # python | shell | diff | yaml


class Claim(msgspec.Struct, omit_defaults=True):
    """Time per step a finding claims from one budget of the claims ledger (rules/ledger.py).

    ``asked_ms`` is what the rule computed; ``granted_ms`` what the engine granted after the
    claims of higher-priority rules on the same budget (and on its parents, up to the step).
    """

    budget: str
    asked_ms: float
    granted_ms: float = 0.0
    rank: int | None = None


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
    # The claims behind recoverable_ms, as granted by the engine's ledger.
    claims: list[Claim] = []
    # [warn, crit] shares of the step (%) the severity was read from; absent when the rule set it.
    ladder: list[float] | None = None
    # One-off costs of the job (compiling): seconds of its wall time, and their share of the job's
    # wall time since its first training activity. Never a share of the step: such findings claim
    # nothing from the step's budget (recoverable_pct 0) and say their cost here.
    job_s: float | None = None
    job_pct: float | None = None
    # What recoverable_ms and recoverable_pct are per: a step, or ("window") the whole traced window
    # of a trace without steps (no ProfilerStep and none inferred), or ("job") nothing per step: a
    # cost that recurs over the run outside the steps (work between steps, HO-16), in job_s/job_pct.
    per: Literal["step", "window", "job"] = "step"
