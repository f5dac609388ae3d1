"""The rules engine: a registry of small functions that turn evidence into findings.

A rule is a function `(inputs: RuleInputs) -> Iterable[Finding]` registered with `@rule`.
It reads metrics from traces (`RankResult`) and/or facts from live runs (`RankFacts`); either
may be absent and a rule must then stay silent or lower its confidence. Rules never raise into
the report: a failing rule is recorded as a warning and the others still run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..facts import RankFacts
from ..metrics.model import RankResult
from ..metrics.ranks import CrossRank
from ..report.model import SEVERITY_ORDER, Finding


@dataclass
class RankInputs:
    rank: int | None
    result: RankResult | None = None
    facts: RankFacts | None = None


@dataclass
class RuleInputs:
    ranks: list[RankInputs]
    cross: CrossRank | None = None
    # Run-level context (command, exit code) for live runs.
    run: dict = field(default_factory=dict)

    @property
    def results(self) -> list[RankResult]:
        return [r.result for r in self.ranks if r.result is not None]

    @property
    def facts(self) -> list[RankFacts]:
        return [r.facts for r in self.ranks if r.facts is not None]


RuleFn = Callable[[RuleInputs], Iterable[Finding]]
REGISTRY: dict[str, RuleFn] = {}


def rule(rule_id: str) -> Callable[[RuleFn], RuleFn]:
    def register(fn: RuleFn) -> RuleFn:
        REGISTRY[rule_id] = fn
        return fn

    return register


def run_rules(inputs: RuleInputs) -> tuple[list[Finding], list[str]]:
    """Run every registered rule; return findings ranked (recoverable time first) and rule errors."""
    findings: list[Finding] = []
    problems: list[str] = []
    for rule_id, fn in REGISTRY.items():
        try:
            findings.extend(fn(inputs))
        except Exception as e:  # a broken rule must not take the report down
            problems.append(f"rule {rule_id} failed: {type(e).__name__}: {e}")
    findings.sort(key=lambda f: (-f.recoverable_pct, SEVERITY_ORDER[f.severity], f.id))
    return findings, problems
