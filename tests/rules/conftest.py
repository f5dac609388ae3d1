"""Builders for rule tests: RankResult / RankFacts by hand, and the real traces analysed once."""

from __future__ import annotations

import pytest

from real_traces import TRACES
from torchdoctor.facts import DDPFacts, DeviceFacts, RankFacts
from torchdoctor.metrics.model import (
    Headline,
    IdleCause,
    NamedTime,
    RankResult,
    RuleSignals,
    StepRow,
    WindowInfo,
)
from torchdoctor.report.model import Finding
from torchdoctor.rules import REGISTRY, RankInputs, RuleInputs, diagnose, load_all
from torchdoctor.rules.engine import order, settle
from torchdoctor.session import analyze_paths

STEP_MS = 100.0
N_STEPS = 5
MS = 1_000_000  # ns


def gpu_result(busy: float = 90.0, rank: int = 0, steps: int = N_STEPS, step_ms: float = STEP_MS,
               **metrics) -> RankResult:
    """A rank with `steps` steps of `step_ms` on a CUDA device, `busy`% of the window busy."""
    head = Headline(busy_pct=busy, idle_pct=100 - busy, compute_pct=busy, comm_pct=0.0, comm_exposed_pct=0.0,
                    dataloader_pct=0.0, dataloader_exposed_pct=0.0, step_ms_median=step_ms)
    for k, v in metrics.items():
        setattr(head, k, v)
    rows = [StepRow(step=i, start_ns=int(i * step_ms * MS), dur_ms=step_ms, host_split_ms={"optimizer": 1.0})
            for i in range(steps)]
    return RankResult(
        rank=rank, file=f"rank{rank}.json", device="NVIDIA A100-SXM4-80GB", device_kind="cuda",
        window=WindowInfo(0, int(steps * step_ms * MS), list(range(steps)), "steady-state"),
        metrics=head, steps=rows, signals=RuleSignals(compute_capability="8.0"),
    )


def cpu_result(rank: int = 0, **metrics) -> RankResult:
    r = gpu_result(rank=rank)
    r.device, r.device_kind = None, "cpu"
    r.metrics = Headline(comm_pct=0.0, comm_exposed_pct=0.0, dataloader_pct=0.0, dataloader_exposed_pct=0.0,
                         step_ms_median=STEP_MS)
    for k, v in metrics.items():
        setattr(r.metrics, k, v)
    r.signals = RuleSignals()
    return r


def idle(r: RankResult, cause: str, ms_per_step: float, top: list[tuple[str, float]] = ()) -> RankResult:
    """Attribute `ms_per_step` of device idle to `cause` (keeping busy+idle consistent is the test's job)."""
    n = len(r.window.steps)
    tops = [NamedTime(name, int(ms * n * MS), n, 0) for name, ms in top]
    r.idle_causes = [c for c in r.idle_causes if c.cause != cause] + [IdleCause(cause, int(ms_per_step * n * MS), tops)]
    return r


def gpu_facts(rank: int = 0, **kw) -> RankFacts:
    kw.setdefault("device", DeviceFacts(kind="cuda", name="NVIDIA A100", capability="8.0"))
    return RankFacts(rank=rank, **kw)


def cpu_facts(rank: int = 0, **kw) -> RankFacts:
    kw.setdefault("device", DeviceFacts(kind="cpu"))
    return RankFacts(rank=rank, **kw)


def inputs(*ranks: tuple[RankResult | None, RankFacts | None], cross=None, job: dict | None = None) -> RuleInputs:
    """``job``: a live run's context (``{"command": [...]}``), as session.py passes it."""
    out = []
    for i, (r, f) in enumerate(ranks):
        rank = r.rank if r is not None else (f.rank if f is not None else i)
        out.append(RankInputs(rank, result=r, facts=f))
    return RuleInputs(ranks=out, cross=cross, run=job or {})


def run(rule_id: str, *ranks: tuple[RankResult | None, RankFacts | None], cross=None,
        job: dict | None = None) -> list[Finding]:
    """What one rule says inside the engine: the rules before it in the ledger's order run first
    and claim their share; its own findings come back as the engine grants them."""
    load_all()
    inp = inputs(*ranks, cross=cross, job=job)
    for rid in order():
        got = list(REGISTRY[rid](inp))
        for f in got:
            settle(f, inp.ledger)
        if rid == rule_id:
            return got
    raise KeyError(rule_id)


def run_all(*ranks, cross=None) -> list[Finding]:
    findings, problems = diagnose(inputs(*ranks, cross=cross))
    assert not problems, problems
    return findings


def only(findings: list[Finding], fid: str) -> Finding:
    hits = [f for f in findings if f.id == fid]
    assert len(hits) == 1, [f.id for f in findings]
    return hits[0]


def ddp_facts(**kw) -> DDPFacts:
    return DDPFacts(**kw)


_CACHE: dict[str, object] = {}


@pytest.fixture(scope="session")
def real():
    """Analyse a real trace once per session: real("v100_resnet_rank0") -> Report."""

    def get(*names: str):
        key = "+".join(names)
        if key not in _CACHE:
            _CACHE[key] = analyze_paths([str(TRACES / f"{n}.json.gz") for n in names])
        return _CACHE[key]
    return get
