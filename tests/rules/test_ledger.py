"""The claims ledger: budgets, grants in priority order, caps, user configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

from real_traces import TRACES
from torchdoctor.facts import DataLoaderFacts, StepTiming
from torchdoctor.rules import REGISTRY, RuleConfig, engine
from torchdoctor.rules.__main__ import table
from torchdoctor.rules._common import finding, per_rank
from torchdoctor.rules.ledger import Ledger, chain

from .conftest import cpu_facts, gpu_result, idle, inputs, only, run_all

DOCS = Path(__file__).resolve().parents[2] / "docs" / "claims_ledger.md"


class _V:  # the least a ledger needs of a View: its rank and its budgets' sizes
    def __init__(self, rank, step_ms):
        self.rank, self.step_ms = rank, step_ms


def test_grants_are_capped_by_the_budget_and_every_parent(monkeypatch):
    from torchdoctor.rules import ledger as lg

    sizes = {"step": 100.0, "idle": 30.0, "data.wait": 20.0}
    monkeypatch.setattr(lg, "CAPACITY", {b: (lambda v, b=b: sizes.get(b, 0.0)) for b in lg.PARENT})
    led = Ledger()
    led.see(_V(0, 100.0))
    assert chain("data.wait") == ["data.wait", "idle", "step"]
    assert led.grant("A", 0, "data.wait", 15.0) == 15.0
    assert led.left(0, "data.wait") == 5.0
    assert led.grant("B", 0, "data.wait", 15.0) == 5.0  # what A left
    assert led.left(0, "idle") == 10.0  # idle = 30, 20 of it granted through data.wait
    assert led.grant("C", 0, "idle", 50.0) == 10.0
    assert led.grant("D", 0, "step", 90.0) == 70.0  # the step caps everything: 100 - 30
    assert led.claimed(0, "step") == 100.0
    assert led.by_rule(0, "idle") == {"A": 15.0, "B": 5.0, "C": 10.0}
    # Another rank has its own budgets.
    led.see(_V(1, 100.0))
    assert led.left(1, "data.wait") == 20.0


def _loader_facts(wait_ms: float, step_ms: float, n: int = 20):
    steps = [StepTiming(step=i, total_ms=step_ms, dataloader_ms=wait_ms) for i in range(n)]
    return cpu_facts(steps=steps, dataloaders=[DataLoaderFacts(num_workers=0, batch_size=8)])


def test_a_new_rule_takes_its_share_and_the_generic_one_shrinks_without_being_edited():
    """Register a measured claim on the data wait: DL-1/DL-2 give way with no change to them."""
    f = _loader_facts(wait_ms=60.0, step_ms=100.0)
    before = {x.id: x.recoverable_ms for x in run_all((None, f))}
    assert before.get("DL-2", 0) + before.get("DL-1", 0) == pytest.approx(60.0, abs=0.01)

    @engine.rule("XX-1", priority=engine.MEASURED, budgets=("data.wait",))
    def measured_share(inputs_):
        return per_rank(inputs_, lambda v: finding(v, "XX-1", "input", "test claim", 25.0, budget="data.wait"))

    try:
        after = {x.id: x.recoverable_ms for x in run_all((None, f))}
    finally:
        del REGISTRY["XX-1"], engine.PRIORITY["XX-1"], engine.BUDGETS["XX-1"]
    assert after["XX-1"] == 25.0
    # The wait is still claimed exactly once: 25 by the new rule, 35 by the loader rules.
    assert after.get("DL-2", 0) + after.get("DL-1", 0) == pytest.approx(35.0, abs=0.01)


def test_a_claim_beyond_the_budget_is_trimmed_and_says_so():
    @engine.rule("XX-2", priority=engine.GENERIC, budgets=("step",))
    def greedy(inputs_):
        return per_rank(inputs_, lambda v: finding(v, "XX-2", "host", "greedy", 500.0))

    try:
        findings = run_all((None, _loader_facts(60.0, 100.0)))
    finally:
        del REGISTRY["XX-2"], engine.PRIORITY["XX-2"], engine.BUDGETS["XX-2"]
    got = only(findings, "XX-2")
    # The loader rules claimed the 60 ms wait first; 40 ms of the 100 ms step are left.
    assert got.recoverable_ms == pytest.approx(40.0, abs=0.01) and got.recoverable_pct == pytest.approx(40.0)
    assert got.claims[0].asked_ms == 500.0 and got.severity == "critical"
    assert "Claims ledger: granted 40 of the 500" in got.evidence[-1].text
    assert sum(f.recoverable_pct for f in findings) == pytest.approx(100.0, abs=0.01)


def test_an_undeclared_budget_is_refused_and_reported():
    @engine.rule("XX-3", priority=engine.DERIVED, budgets=("step",))
    def sneaky(inputs_):
        return per_rank(inputs_, lambda v: finding(v, "XX-3", "input", "sneaky", 10.0, budget="data.wait"))

    try:
        findings, problems = engine.run_rules(inputs((None, _loader_facts(60.0, 100.0))))
    finally:
        del REGISTRY["XX-3"], engine.PRIORITY["XX-3"], engine.BUDGETS["XX-3"]
    assert any("XX-3 claimed undeclared budget(s) data.wait" in p for p in problems)
    assert all(f.id != "XX-3" for f in findings)  # 0 granted, under the noise floor: dropped


def test_host_bound_claims_what_the_specific_rules_leave():
    r = gpu_result(busy=40.0)
    idle(r, "host_ops", 60.0, [("aten::foo", 60.0)])
    r.signals.zero_grad_fills_per_step = 10
    idle(r, "optimizer", 0.0)
    ho5 = only(run_all((r, None)), "HO-5")
    assert ho5.recoverable_ms == pytest.approx(60.0, abs=0.01)
    assert ho5.claims[0].budget == "idle.host" and ho5.claims[0].granted_ms == pytest.approx(60.0, abs=0.01)


@pytest.mark.parametrize("name", ["a100_8rank_rank3", "v100_resnet_rank0", "a100_alexnet_sync", "a100_16rank_rank0"])
def test_granted_claims_never_exceed_the_step_on_real_traces(real, name):
    assert (TRACES / f"{name}.json.gz").exists()
    report = real(name)
    per_rank_total: dict[int | None, float] = {}
    for f in report.findings:
        for c in f.claims:
            per_rank_total[c.rank] = per_rank_total.get(c.rank, 0.0) + c.granted_ms
    step = {r.rank: (r.analysis.window.end_ns - r.analysis.window.start_ns) / 1e6 / max(len(r.analysis.window.steps), 1)
            for r in report.ranks if r.analysis is not None}
    for rank, total in per_rank_total.items():
        assert total <= step[rank] + 1e-6
    assert sum(f.recoverable_pct for f in report.findings) <= 100.0 + 1e-6


def test_ignore_skips_a_rule_and_thresholds_move_the_ladder():
    f = _loader_facts(wait_ms=60.0, step_ms=100.0)
    base = {x.id: x for x in run_all((None, f))}
    assert "DL-2" in base and base["DL-2"].severity == "critical"
    findings, _ = engine.run_rules(inputs((None, f)), RuleConfig(ignore=frozenset({"DL-2"})))
    ids = {x.id: x for x in findings}
    assert "DL-2" not in ids
    # DL-1 is not edited, yet it now gets the whole wait: nobody else claims it.
    assert ids["DL-1"].recoverable_ms == pytest.approx(60.0, abs=0.01)
    findings, _ = engine.run_rules(inputs((None, f)), RuleConfig(thresholds={"DL-2": {"crit_pct": 99.0},
                                                                            "*": {"min_pct": 50.0}}))
    ids = {x.id: x for x in findings}
    assert ids["DL-2"].severity == "warning" and ids["DL-2"].ladder == [5.0, 99.0]
    assert all(x.recoverable_pct >= 50.0 for x in findings if x.ladder)


def test_natural_order_and_tiers():
    assert engine.natural("HO-2") < engine.natural("HO-11")
    order = engine.order()
    assert order.index("HO-11") < order.index("HO-3") < order.index("HO-5") < order.index("HO-1")
    assert order.index("DL-2") < order.index("DL-1") and order.index("DI-5") < order.index("DI-4") < order.index("DI-3")


def test_the_ledger_doc_is_current():
    assert DOCS.read_text(encoding="utf-8") == table(), "regenerate: python -m torchdoctor.rules > docs/claims_ledger.md"
