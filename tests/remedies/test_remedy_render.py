"""The diagnosis' estimate shown next to what `fix` measured (remedies/render.py)."""

from __future__ import annotations

import pytest

from torchdoctor.fixer import estimates_of
from torchdoctor.remedies.render import estimate_vs_measured, gain_pct
from torchdoctor.remedies.verdict import LossCheck, Outcome
from torchdoctor.report.model import ABRemedy, ABResult
from torchdoctor.rules.model import Evidence, Finding


def finding(fid: str, pct: float, remedy: str | None) -> Finding:
    return Finding(id=fid, layer="input", severity="warning", title=fid, recoverable_pct=pct, remedy=remedy)


def test_estimates_sum_per_remedy_and_cap_at_the_step():
    got = estimates_of([finding("DL-2", 41.4, "dataloader.workers"), finding("DL-1", 8.0, "dataloader.workers"),
                        finding("HO-3", 9.0, None), finding("DI-7", 70.0, "ddp.find_unused_false"),
                        finding("DI-9", 45.0, "ddp.find_unused_false")])
    assert got == {"dataloader.workers": 49.4, "ddp.find_unused_false": 100.0}


def test_no_workers_is_estimated_with_what_the_workers_cost_elsewhere():
    """skorch's README example: DL-1 claimed 14.0% for num_workers=0, `fix` measured 70.7%; the workers'
    restarts (DL-6) and CPU contention (HO-14) go with them."""
    dl1 = finding("DL-1", 14.0, "dataloader.workers")
    dl1.evidence = [Evidence("e", {"advised_workers": 0})]
    got = estimates_of([dl1, finding("DL-6", 29.2, "dataloader.persistent_workers"), finding("HO-14", 30.5, None),
                        finding("HO-3", 9.0, None)])
    assert got == {"dataloader.workers": 14.0, "dataloader.persistent_workers": 29.2, "dataloader.workers=0": 73.7}
    # DL-6 advising no workers itself is counted once.
    dl6 = finding("DL-6", 29.2, "dataloader.workers")
    dl6.evidence = [Evidence("e", {"advised_workers": 0})]
    assert estimates_of([dl1, dl6, finding("HO-14", 30.5, None)])["dataloader.workers=0"] == 73.7
    assert "dataloader.workers=0" not in estimates_of([finding("DL-2", 41.4, "dataloader.workers"),
                                                      finding("DL-6", 29.2, "dataloader.persistent_workers")])


def test_gain_is_the_share_of_the_baseline_step_given_back():
    assert gain_pct(2.0) == 50.0 and gain_pct(1.25) == 20.0 and gain_pct(0.8) == -25.0 and gain_pct(None) is None


def outcome(remedies: list[ABRemedy], geomean: float = 1.6, interval=(1.5, 1.7)) -> Outcome:
    ab = ABResult(1.0, geomean, geomean, geomean, geomean, remedies=remedies, speedup_geomean=geomean,
                  interval=list(interval), pairs=3)
    return Outcome(ab, [], LossCheck("identical", ""), 0.05)


def test_estimate_next_to_measured_for_the_set_and_each_remedy():
    loo = "treated / treated without it, per round (leave-one-out)"
    o = outcome([ABRemedy("dataloader.workers=3", True, geomean=1.5, interval=[1.4, 1.6], pairs=3, method=loo),
                 ABRemedy("debug.off", True, geomean=1.07, interval=[0.98, 1.1], pairs=3, method=loo),
                 ABRemedy("optim.fused", False, reason="refused: no accelerator")])
    got = estimate_vs_measured(o, {"dataloader.workers": 30.0, "debug.off": 8.0, "optim.fused": 12.0})
    # The remedy ran with its value ("=3"); the finding named its id. The refused remedy ran in no
    # arm: not in the set's estimate.
    assert got["estimated_pct"] == 38.0
    assert got["measured_pct"] == 37.5 and got["measured_interval_pct"] == [33.3, 41.2]
    assert got["per_remedy"] == [
        {"id": "dataloader.workers=3", "estimated_pct": 30.0, "measured_pct": 33.3,
         "measured_interval_pct": [28.6, 37.5]},
        {"id": "debug.off", "estimated_pct": 8.0, "measured_pct": 6.5, "measured_interval_pct": [-2.0, 9.1]},
    ]


def test_no_comparison_without_a_diagnosis_or_a_speed_up():
    assert estimate_vs_measured(outcome([ABRemedy("debug.off", True, geomean=1.1)]), None) is None
    o = outcome([ABRemedy("debug.off", True, geomean=1.1)])
    o.ab.speedup_geomean = None
    assert estimate_vs_measured(o, {"debug.off": 5.0}) is None


def test_claims_in_ms_next_to_the_time_per_step_the_a_b_took_off():
    """trl's SFT script without checkpointing: x1.23 [1.16, 1.30] is 18.7% of the baseline's 527.7 ms step
    (1.895 steps/s); HW-19 claimed 113.7 ms, 23.1% of the 492 ms profiled step (the A/B's steps also
    carry the evaluations and saves between them)."""
    o = outcome([ABRemedy("memory.no_checkpoint", True, geomean=1.23, method="treated / baseline, per round")],
                geomean=1.23, interval=(1.16, 1.30))
    o.ab.baseline_steps_per_s = 1.895
    got = estimate_vs_measured(o, {"memory.no_checkpoint": 23.1}, {"memory.no_checkpoint": 113.7})
    assert got["estimated_ms"] == 113.7 and got["estimated_pct"] == 23.1
    assert got["measured_ms"] == 98.7 and got["measured_ms_interval"] == [72.8, 121.8]
    # Without the claims' ms (an older run directory's findings, or none for this remedy): no ms to compare.
    assert estimate_vs_measured(o, {"memory.no_checkpoint": 23.1})["estimated_ms"] is None
    assert estimate_vs_measured(o, {"memory.no_checkpoint": 23.1}, {"debug.off": 1.0})["estimated_ms"] is None


def test_without_ablation_only_the_set_is_compared():
    set_method = "treated / baseline, per round"
    got = estimate_vs_measured(outcome([ABRemedy("debug.off", True, geomean=1.6, method=set_method)]),
                               {"debug.off": 30.0})
    assert got["per_remedy"] == [] and got["estimated_pct"] == pytest.approx(30.0)


def test_each_arm_keeps_its_largest_rank_s_peak_memory_and_the_details_their_medians(tmp_path):
    import json
    from types import SimpleNamespace

    from torchdoctor.remedies.measure import Arm, load
    from torchdoctor.remedies.render import _details

    arms = []
    for label, kind, peaks in (("A1", "baseline", [590.0, 410.0]), ("B1", "treated", [930.0, 400.0]),
                               ("B2", "treated", [880.0, None]), ("A2", "baseline", [578.0, 420.0])):
        run = tmp_path / label
        run.mkdir()
        ranks = [{"facts": {"rank": r, **({"peak_rss_mib": p} if p else {}),
                            "steps": [{"step": i, "total_ms": 10.0} for i in range(8)]}} for r, p in enumerate(peaks)]
        (run / "run.json").write_text(json.dumps({"exit_code": 0, "ranks": ranks}))
        arms.append(load(Arm(label, kind, [], str(run))))
    assert [a.peak_rss_mib for a in arms] == [590.0, 930.0, 880.0, 578.0]
    opts = SimpleNamespace(apply="safe", ablate=False, steps=None, rtol=0.05)
    d = _details(outcome([]), arms, [], {}, [], opts, str(tmp_path), None)
    # A job without a DataLoader (no samples/s) still gets them.
    assert d["baseline_peak_rss_mib"] == 584.0 and d["treated_peak_rss_mib"] == 905.0


def test_nothing_applied_is_no_test_of_the_claims():
    """litgpt's pretrain: the worker remedy was a no-op (an IterableDataset), so both arms ran the same job; the
    x1.05 between them was their run-to-run difference, and 'the findings claimed 0.0%, the A/B gave back 4.8%'
    compared nothing."""
    from torchdoctor.remedies.catalogue import Spec
    from torchdoctor.remedies.render import same_job
    from torchdoctor.remedies.verdict import Verdict

    o = outcome([ABRemedy("dataloader.workers=1", False, reason="no-op: nothing to change: the dataset is an "
                          "IterableDataset")], geomean=1.05, interval=(1.0, 1.1))
    assert estimate_vs_measured(o, {"dataloader.workers": 9.4}) is None
    o.verdicts = [Verdict(Spec("dataloader.workers", "1"), "no-op", reason="nothing to change")]
    assert same_job(o)
    o.verdicts.append(Verdict(Spec("debug.off"), "kept", reason="faster"))
    assert not same_job(o)
