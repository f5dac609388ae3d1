"""Choosing remedies, reading runs and judging them: on hand-made facts and arms (no jobs run)."""

from __future__ import annotations

import pytest

from torchdoctor.facts import CpuFacts, DataLoaderFacts, DDPFacts, DeviceFacts, RankFacts, StepTiming
from torchdoctor.remedies.catalogue import BY_ID, REMEDIES, Spec, parse, parse_all
from torchdoctor.remedies.measure import Arm, job_rate, loss_diff
from torchdoctor.remedies.select import Choice, JobFacts, choose, finalize, workers_for
from torchdoctor.remedies.verdict import judge
from torchdoctor.report.model import Finding

REQUIRED = ["dataloader.workers", "dataloader.pin_memory", "dataloader.persistent_workers", "dataloader.prefetch",
            "ddp.find_unused_false", "ddp.static_graph", "ddp.grad_as_bucket_view", "ddp.bucket_cap",
            "optim.foreach", "optim.fused", "cudnn.benchmark", "precision.tf32", "precision.autocast",
            "debug.off", "threads.affinity", "compile", "cudagraphs"]


def test_catalogue_has_every_id_the_rules_use() -> None:
    assert sorted(BY_ID) == sorted(REQUIRED)
    for r in REMEDIES:
        assert r.answers and r.changes and r.preconditions and r.safety in ("safe", "numerics", "experimental")
    assert {r.id for r in REMEDIES if r.safety == "experimental"} == {"compile", "cudagraphs"}
    from torchdoctor.remedies import patch_data, patch_ddp, patch_flags, patch_model, patch_optim

    installed = [i for m in (patch_data, patch_ddp, patch_flags, patch_model, patch_optim) for i in m.IDS]
    assert sorted(installed) == sorted(REQUIRED)  # every remedy has exactly one installer


def test_parse_values_and_unknown_ids() -> None:
    assert parse("dataloader.workers=3") == (Spec("dataloader.workers", "3"), "")
    spec, why = parse("dataloader.worker")
    assert spec is None and "did you mean dataloader.workers" in why
    assert "takes no value" in parse("debug.off=1")[1]
    assert "positive int" in parse("dataloader.workers=0")[1]
    specs, refused = parse_all(["optim.foreach", "nope", "optim.foreach=1", ""])
    assert [str(s) for s in specs] == ["optim.foreach"] and list(refused) == ["nope", "optim.foreach=1"]


def rank(step_ms: float, wait_ms: float, cpu_pct: float, n: int = 20, **kw: object) -> RankFacts:
    steps = [StepTiming(step=i, total_ms=step_ms, dataloader_ms=wait_ms, samples=32) for i in range(n)]
    return RankFacts(cpu=CpuFacts(affinity=[0, 1], local_world_size=2, main_process_cpu_pct=cpu_pct),
                     steps=steps, dataloaders=[DataLoaderFacts(num_workers=0, batch_size=32)], **kw)  # type: ignore[arg-type]


def test_workers_follow_the_kind_of_loading() -> None:
    # CPU-bound loading: PL's CPUs // local ranks - 1, at least 1.
    assert workers_for(JobFacts([rank(140, 95, 95)]))[0] == 1
    # Latency-bound (idle while waiting): enough workers to hide the wait, up to the CPUs in the mask.
    n, why = workers_for(JobFacts([rank(140, 95, 20)]))
    assert n == 2 and "latency-bound" in why


def finding(fid: str, remedy: str, severity: str = "warning") -> Finding:
    return Finding(id=fid, layer="input", severity=severity, title="t", recoverable_pct=1.0, remedy=remedy)  # type: ignore[arg-type]


def test_choose_by_class_with_followers_and_preconditions() -> None:
    findings = [finding("DL-2", "dataloader.workers"), finding("DI-7", "ddp.find_unused_false"),
                finding("DL-4", "dataloader.pin_memory"), finding("HW-1", "precision.tf32"),
                finding("CG-1", "compile")]
    safe = choose(findings, "safe")
    assert [c.spec.id for c in safe] == ["dataloader.workers", "dataloader.pin_memory", "ddp.find_unused_false",
                                         "dataloader.persistent_workers", "dataloader.prefetch"]
    assert "precision.tf32" in [c.spec.id for c in choose(findings, "numerics")]
    jf = JobFacts([rank(140, 95, 20, ddp=[DDPFacts(find_unused_parameters=True, unused_parameter_size=4096)])])
    kept, refused = finalize(safe, jf)
    assert [str(c.spec) for c in kept] == ["dataloader.workers=2", "dataloader.persistent_workers",
                                           "dataloader.prefetch"]
    assert "needs an accelerator" in refused["dataloader.pin_memory"]
    assert "4096 bytes of unused parameters" in refused["ddp.find_unused_false"]
    _, refused = finalize([Choice(Spec("dataloader.workers", "64"), "asked for")], jf)
    assert "beyond the 2 CPU(s)" in refused["dataloader.workers"]
    gpu = JobFacts([rank(10, 1, 50, device=DeviceFacts(kind="cuda"))])
    assert not finalize([Choice(Spec("dataloader.pin_memory"), "")], gpu)[1]


def arm(label: str, kind: str, rate: float, losses: list[float], k: int, specs: list[str] | None = None,
        without: str | None = None, exit_code: int = 0) -> Arm:
    a = Arm(label, kind, specs or [], f"/runs/{label}", without=without, exit_code=exit_code, round=k)
    a.steps_per_s, a.losses = rate, {0: losses}
    if kind != "baseline":
        for s in a.specs:
            a.applied[s.split("=")[0]] = [{"id": s, "target": "DataLoader", "site": None, "set": {}, "was": {}}]
    return a


SAME = [2.3, 2.2, 2.1]


def test_faster_and_identical_is_kept() -> None:
    specs = [Spec("dataloader.workers", "2")]
    arms = [arm("A1", "baseline", 10, SAME, 1), arm("B1", "treated", 30, SAME, 1, ["dataloader.workers=2"]),
            arm("A2", "baseline", 10.5, SAME, 2), arm("B2", "treated", 29, SAME, 2, ["dataloader.workers=2"])]
    out = judge(arms, specs, {})
    assert out.ab.speedup_min == pytest.approx(29 / 10.5, rel=1e-3) and out.ab.speedup_max == 3.0
    assert out.loss.status == "identical"
    assert out.verdicts[0].status == "kept" and out.ab.remedies[0].kept


def test_slower_beyond_noise_is_rejected_within_noise_kept() -> None:
    spec = [Spec("ddp.bucket_cap", "0.001")]
    slow = [arm("A1", "baseline", 10, SAME, 1), arm("B1", "treated", 6, SAME, 1, ["ddp.bucket_cap=0.001"]),
            arm("A2", "baseline", 10.2, SAME, 2), arm("B2", "treated", 6.1, SAME, 2, ["ddp.bucket_cap=0.001"])]
    v = judge(slow, spec, {}).verdicts[0]
    assert v.status == "rejected" and "slower" in v.reason
    flat = [arm("A1", "baseline", 10, SAME, 1), arm("B1", "treated", 9.9, SAME, 1, ["ddp.bucket_cap=0.001"])]
    assert judge(flat, spec, {}).verdicts[0].status == "kept"


def test_changed_losses_reject_safe_and_numerics_has_a_tolerance() -> None:
    moved = [2.3, 2.21, 2.1]
    safe = [arm("A1", "baseline", 10, SAME, 1), arm("B1", "treated", 20, moved, 1, ["optim.foreach"]),
            arm("A2", "baseline", 10, SAME, 2), arm("B2", "treated", 20, moved, 2, ["optim.foreach"])]
    out = judge(safe, [Spec("optim.foreach")], {})
    assert out.loss.status == "changed" and out.verdicts[0].status == "rejected"
    num = [arm("A1", "baseline", 10, SAME, 1), arm("B1", "treated", 20, moved, 1, ["optim.fused"])]
    assert judge(num, [Spec("optim.fused")], {}).verdicts[0].status == "kept"
    far = [arm("A1", "baseline", 10, SAME, 1), arm("B1", "treated", 20, [2.3, 3.0, 2.1], 1, ["optim.fused"])]
    assert judge(far, [Spec("optim.fused")], {}).verdicts[0].status == "rejected"


def test_a_baseline_that_does_not_reproduce_makes_the_check_inconclusive() -> None:
    arms = [arm("A1", "baseline", 10, SAME, 1), arm("B1", "treated", 20, [2.3, 2.205, 2.1], 1, ["optim.foreach"]),
            arm("A2", "baseline", 10, [2.3, 2.21, 2.1], 2), arm("B2", "treated", 20, SAME, 2, ["optim.foreach"])]
    out = judge(arms, [Spec("optim.foreach")], {})
    assert out.loss.status == "inconclusive" and out.verdicts[0].status == "kept"


def test_leave_one_out_blames_the_slow_remedy_only() -> None:
    s = ["dataloader.workers=2", "ddp.bucket_cap=0.001"]
    arms = [arm("A1", "baseline", 10, SAME, 1), arm("B1", "treated", 20, SAME, 1, s),
            arm("C1-w", "ablated", 10, SAME, 1, s[1:], without="dataloader.workers"),
            arm("C1-b", "ablated", 30, SAME, 1, s[:1], without="ddp.bucket_cap")]
    v = {x.spec.id: x for x in judge(arms, [parse(t)[0] for t in s], {}).verdicts}  # type: ignore[misc]
    assert v["dataloader.workers"].status == "kept" and v["dataloader.workers"].speedup == 2.0
    assert v["ddp.bucket_cap"].status == "rejected" and "faster without it" in v["ddp.bucket_cap"].reason


def test_refused_and_noop_and_failed() -> None:
    specs = [Spec("dataloader.pin_memory"), Spec("debug.off"), Spec("optim.foreach")]
    arms = [arm("A1", "baseline", 10, SAME, 1), arm("B1", "treated", 10, SAME, 1, ["optim.foreach"])]
    arms[1].specs = ["debug.off", "optim.foreach"]
    out = judge(arms, specs, {"dataloader.pin_memory": "needs an accelerator"})
    status = {v.spec.id: v.status for v in out.verdicts}
    assert status == {"dataloader.pin_memory": "refused", "debug.off": "no-op", "optim.foreach": "kept"}
    arms[1].exit_code = 1
    assert judge(arms, [Spec("optim.foreach")], {}).verdicts[0].status == "rejected"


def test_rates_use_the_slowest_rank_after_warm_up() -> None:
    fast = RankFacts(rank=0, steps=[StepTiming(step=i, total_ms=500 if i < 2 else 100, samples=8) for i in range(10)])
    slow = RankFacts(rank=1, steps=[StepTiming(step=i, total_ms=200, samples=8) for i in range(10)])
    steps_s, samples_s, n = job_rate([fast, slow])
    assert steps_s == pytest.approx(5.0) and samples_s == pytest.approx(80 + 40) and n == 8
    d = loss_diff({0: [1.0, 2.0], 1: [3.0]}, {0: [1.0, 2.5], 1: [3.0]})
    assert d is not None and d.first_step == 1 and d.max_abs == 0.5 and not d.identical
