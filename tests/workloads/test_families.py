"""The accuracy harness's jobs (workloads.lm, workloads.mlp) and its scoring (benchmarks/accuracy.py).

The jobs run in this process through their ``main`` (one torch import for all), a few steps each;
process-wide torch settings the pathologies change are restored after every test.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torchdoctor.workloads import _jobs, lm, mlp  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
JOBS = {"lm": lm, "mlp": mlp}


def load_accuracy():
    spec = importlib.util.spec_from_file_location("accuracy", REPO / "benchmarks" / "accuracy.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["accuracy"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def torch_state():
    threads, anomaly = torch.get_num_threads(), torch.is_anomaly_enabled()
    yield
    torch.set_num_threads(threads)
    torch.autograd.set_detect_anomaly(anomaly)


@pytest.mark.parametrize("name", JOBS)
def test_job_runs_healthy(name, capsys):
    assert JOBS[name].main(["--healthy", "--steps", "4"]) == 0
    out = capsys.readouterr().out
    assert f"workloads.{name} (healthy): 4 steps" in out
    assert f"{_jobs.cpus()} thread(s)" in out  # one intra-op thread per CPU of the mask


@pytest.mark.parametrize("name", JOBS)
def test_every_pathology_is_accepted(name, capsys):
    job = JOBS[name]
    names = ",".join(job.SPEC.pathologies)
    assert job.main(["--pathologies", names, "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert f"(pathological: {','.join(sorted(job.SPEC.pathologies))}): 3 steps" in out
    assert f"{_jobs.THREAD_FACTOR * _jobs.cpus()} thread(s)" in out
    with pytest.raises(SystemExit, match="unknown pathologies: nope; known: "):
        job.main(["--pathologies", "nope", "--steps", "1"])


def test_pathologies_change_what_they_name():
    data = mlp.RecordDataset(64, seed=0)
    healthy = _jobs.build_loader(data, 8, set(), 0, mlp.syncing_collate, mlp.open_index)
    assert (healthy.num_workers, healthy.persistent_workers, healthy.prefetch_factor) == (2, True, 4)
    assert healthy.worker_init_fn is mlp.open_index
    inproc = _jobs.build_loader(data, 8, {"main_process_loader"}, 0, mlp.syncing_collate, mlp.open_index)
    assert (inproc.num_workers, inproc.persistent_workers, inproc.worker_init_fn) == (0, False, None)
    restart = _jobs.build_loader(data, 8, {"non_persistent_workers"}, 0, mlp.syncing_collate)
    assert (restart.num_workers, restart.persistent_workers) == (2, False)
    assert _jobs.build_loader(data, 8, {"syncing_collate"}, 0, mlp.syncing_collate).collate_fn is mlp.syncing_collate
    _jobs.configure_torch({"oversubscribed_threads", "anomaly_detection"}, 0)
    assert torch.get_num_threads() == _jobs.THREAD_FACTOR * _jobs.cpus() and torch.is_anomaly_enabled()
    _jobs.configure_torch(set(), 0)
    assert torch.get_num_threads() == _jobs.cpus() and not torch.is_anomaly_enabled()


def test_syncing_collates_build_the_same_batches():
    from torch.utils.data import default_collate

    text = lm.TextDataset(4, seed=1)
    samples = [text[i] for i in range(4)]
    ids, mask = samples[0]
    assert ids.shape == mask.shape == (lm.SEQ + 1,) and int(ids.max()) < lm.VOCAB
    assert torch.equal(mask, (ids != lm.PAD).float())  # padding is masked out of the loss
    records = [mlp.RecordDataset(4, seed=1)[i] for i in range(4)]
    for job, batch in ((lm, samples), (mlp, records)):
        for mine, ref in zip(job.syncing_collate(batch), default_collate(batch), strict=True):
            assert torch.equal(mine, ref)


def test_mapping_table_covers_every_job_pathology():
    acc = load_accuracy()
    for name, job in JOBS.items():
        assert acc.FAMILIES[name].pathologies == job.SPEC.pathologies
    for p, expect in acc.PATHOLOGY_TABLE.items():
        assert expect.rules, p
        if "lm" in expect.families or "mlp" in expect.families:
            assert p in _jobs.PATHOLOGIES


def test_schedule_counterbalances_brackets_singles_and_reaches_30_healthy_runs():
    acc = load_accuracy()
    fams = list(acc.FAMILIES.values())
    plan = acc.schedule(fams, repeats=2, healthy_runs=6, quick=False)
    healthy = [c for c, _ in plan if not c.injected]
    assert len(healthy) >= 30 and sum(c.load for c in healthy) == 2 * 3 + 9
    first = [c for c, r in plan if r == 0]
    second = [c for c, r in plan if r == 1]
    assert second == first[::-1]
    # ddp: 5 CPU pathologies -> healthy+load, 4 healthy, 5 singles, 10 pairs; lm: 4 -> 1 + 3 + 4 + 6; mlp
    # the same less its void pair (non_persistent_workers means nothing with main_process_loader's
    # num_workers=0).
    assert len(first) == 20 + 14 + 13
    assert not any(acc.void(c.injected, c.family) for c in first)
    assert acc.void(("main_process_loader", "non_persistent_workers"))
    # Old raw runs of a pathology that costs nothing on a CPU are not scored, alone or in a pair.
    assert acc.void(("no_pin_memory", "small_buckets"), "ddp") and acc.void(("loss_item_every_step",), "ddp")
    assert not acc.void(("small_buckets",), "ddp") and not acc.void(("no_pin_memory", "small_buckets"))
    # Every single has a healthy run of its family at most BRACKET_EVERY of the family's cases away, on both sides.
    ddp = [c for c in first if c.family == "ddp" and not c.load]
    for i, c in enumerate(ddp):
        if len(c.injected) == 1:
            before = next(j for j in range(i, -1, -1) if not ddp[j].injected)
            after = next(j for j in range(i, len(ddp)) if not ddp[j].injected)
            assert i - before <= acc.BRACKET_EVERY and after - i <= acc.BRACKET_EVERY
    quick = acc.schedule(fams[1:], repeats=1, healthy_runs=0, quick=True)
    assert len(quick) == 16 and all(len(c.injected) <= 1 for c, _ in quick)


def test_scoring_on_hand_made_runs():
    acc = load_accuracy()
    F, R = acc.FindingRec, acc.RunRec
    order = iter(range(100))

    def run(injected, rnd, step, *findings):
        return R("mlp", tuple(sorted(injected)), False, rnd, next(order), exit_code=0, step_ms=step,
                 findings=list(findings))

    dl, an, th = "main_process_loader", "anomaly_detection", "oversubscribed_threads"
    runs = [
        run((), 0, 100.0),                                                                        # 0
        run((dl,), 0, 200.0, F("DL-2", "critical", 45.0, "dataloader.workers"), F("DL-1", "info", 3.0)),
        run((an,), 0, 120.0, F("HO-8", "warning", 0.0, "debug.off")),                             # 2
        run((), 0, 110.0, F("HO-5", "warning", 6.0, "compile")),                                  # 3
        run((th,), 0, 110.0, F("HO-13", "info", 3.0, "threads.affinity")),                        # 4
        run((dl, an), 0, 250.0, F("DL-2", "critical", 48.0, "dataloader.workers")),               # 5
        R("mlp", (th, an), False, 0, next(order), exit_code=1, failed="exit code 1"),             # 6
    ]
    gains, scored = acc.score_all(runs)
    case = {r.case.label: r.case for r in runs}
    g_dl, g_an, g_th = gains[case[dl]][dl], gains[case[an]][an], gains[case[th]][th]
    # References interpolated in run order between the healthy runs 0 (100 ms) and 3 (110 ms):
    # order 1 -> 103.33, order 2 -> 106.67; order 4 has only the one before (110).
    assert g_dl.pct == pytest.approx((1 - (100 + 10 / 3) / 200) * 100)
    assert g_an.pct == pytest.approx((1 - (100 + 20 / 3) / 120) * 100)
    assert g_th.pct == pytest.approx(0.0) and g_th.pairs == 1 and not g_th.ci
    assert acc.verdict_of(g_th) == "spread" and (g_dl.lo, g_dl.hi) == pytest.approx((g_dl.pct, g_dl.pct))
    # The pair: each pathology against the single without it, nearest in order (5 vs 2, 5 vs 1).
    pair = gains[case[f"{an}+{dl}"]]
    assert pair[dl].pct == pytest.approx(52.0) and pair[an].pct == pytest.approx(20.0)

    s = [score for _, score in scored]
    assert [x.top1 if x else "failed" for x in s] == [True, True, True, False, None, True, "failed"]
    assert [len(x.raised) for x in s[:6]] == [0, 1, 1, 0, 0, 1]
    assert s[5].relevant == [an, dl] and s[5].raised == [dl]  # HO-8 not raised in the pair
    assert [x.false_warnings for x in s[:6]] == [0, 0, 0, 1, 0, 0]
    assert [(c["id"], round(c["error"], 1)) for x in s if x for c in x.calibration] == [
        ("DL-2", 3.3), ("HO-8", 11.1), ("HO-13", 3.0), ("DL-2", 4.0)]

    tally = acc.Tally()
    for r, score in scored:
        tally.add(r, score)
    assert (tally.top1_ok, tally.top1_n) == (4, 5)
    assert (tally.raised, tally.relevant) == (3, 4)
    assert (tally.healthy_warned, tally.healthy_runs, tally.false_sick, tally.failed) == (1, 2, 0, 1)
    # errors 3.0, 3.33, 4.0, 11.1: median (3.33 + 4) / 2; p90 at rank 2.7 -> 4 + 0.7 * 7.1.
    assert acc.percentile(tally.errors, 50) == pytest.approx((3.33 + 4.0) / 2)
    assert acc.percentile(tally.errors, 90) == pytest.approx(4.0 + 0.7 * 7.11)
    assert tally.row("mlp")[:7] == ["mlp", "6", "6/7", "80% (4/5)", "75% (3/4)", "1/2", "0"]


def test_gain_intervals_decide_what_is_established_and_rescoring(tmp_path):
    """With MIN_PAIRS runs or more a gain gets fix's bootstrap interval: established above 5%,
    ruled out below, undetermined across; top-1 over established gains accepts a tie."""
    acc = load_accuracy()
    F, R = acc.FindingRec, acc.RunRec
    dl, an, th = "main_process_loader", "anomaly_detection", "oversubscribed_threads"
    order = iter(range(1000))

    def run(injected, step, *findings):
        return R("lm", tuple(sorted(injected)), False, 0, next(order), exit_code=0, step_ms=step,
                 findings=list(findings))

    runs = []
    for k in range(5):
        runs.append(run((), 100.0))
        runs.append(run((dl,), 200.0 + k, F("DL-2", "critical", 50.0, "dataloader.workers")))  # ~50%: established
        runs.append(run((an,), (125.0, 95.0)[k % 2]))  # +9% median, swinging across 0: undetermined
        runs.append(run((th,), 101.0 + k % 2))  # 1-2%: ruled out
        runs.append(run((dl, th), 202.0 + k, F("HO-13", "critical", 30.0, "threads.affinity")))
    runs.append(run((), 100.0))
    runs.append(run((dl, "non_persistent_workers"), 210.0))  # a void pair: kept in the raw file, never scored
    gains, scored = acc.score_all([r for r in runs if not acc.void(r.injected)])
    g = {p: gains[acc.Case("lm", (p,))][p] for p in (dl, an, th)}
    assert all(x.ci and x.pairs == 5 for x in g.values())
    assert [acc.verdict_of(g[p]) for p in (dl, an, th)] == ["established", "undetermined", "ruled out"]
    assert g[dl].lo <= g[dl].pct <= g[dl].hi and g[an].lo < acc.MIN_GAIN_PCT < g[an].hi
    s = {(r.case.label, r.order): sc for r, sc in scored}
    an0 = s[(an, 2)]
    assert an0.relevant == [an] and an0.relevant_established == [] and an0.undetermined == [an]
    assert an0.top1 is False and an0.top1_established is None
    assert s[(dl, 1)].top1_established is True and s[(dl, 1)].raised_established == [dl]
    # The pair: HO-13 first although th adds ~1%: dl's gain is the established largest, th is ruled out.
    pair = s[(f"{dl}+{th}", 4)]
    assert pair.top1_established is False and pair.relevant_established == [dl] and pair.raised_established == []

    meta = {"command": "test", "date": "2026-12-02T00:00:00", "wall_min": 1.0, "machine": acc.machine(),
            "families": ["lm"], "repeats": 5, "healthy_runs": 0, "quick": False}
    acc.write_results(runs, meta, tmp_path / "a.md")
    raw = json.loads((tmp_path / "a.json").read_text())
    assert len(raw["runs"]) == len(runs) and [r["void"] for r in raw["runs"]].count(True) == 1
    text = (tmp_path / "a.md").read_text()
    assert "(established)" in text and "(undetermined)" in text and "(ruled out)" in text
    rescored = tmp_path / "b.md"
    assert acc.rescore(tmp_path / "a.json", rescored) == 0
    assert rescored.read_text().split("## Summary")[1] == text.split("## Summary")[1]
