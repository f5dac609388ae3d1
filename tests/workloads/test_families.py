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


def test_schedule_counterbalances_and_reaches_30_healthy_runs():
    acc = load_accuracy()
    fams = list(acc.FAMILIES.values())
    plan = acc.schedule(fams, repeats=2, healthy_runs=6, quick=False)
    healthy = [c for c, _ in plan if not c.injected]
    assert len(healthy) == 30 and sum(c.load for c in healthy) == 15
    first = [c for c, r in plan if r == 0]
    second = [c for c, r in plan if r == 1]
    assert second == first[::-1]
    # ddp: 6 CPU pathologies -> healthy, healthy+load, 6 singles, 15 pairs; lm: 4 -> 2 + 4 + 6; mlp the
    # same less its void pair (non_persistent_workers means nothing with main_process_loader's num_workers=0).
    assert len(first) == 23 + 12 + 11
    assert not any(acc.void(c.injected) for c in first) and acc.void(("main_process_loader", "non_persistent_workers"))
    quick = acc.schedule(fams[1:], repeats=1, healthy_runs=0, quick=True)
    assert len(quick) == 12 and all(len(c.injected) <= 1 for c, _ in quick)


def test_scoring_on_hand_made_runs():
    acc = load_accuracy()
    F, R = acc.FindingRec, acc.RunRec

    def run(injected, rnd, step, *findings):
        return R("mlp", tuple(sorted(injected)), False, rnd, 0, exit_code=0, step_ms=step, findings=list(findings))

    dl, an, th = "main_process_loader", "anomaly_detection", "oversubscribed_threads"
    runs = [
        run((), 0, 100.0),
        run((), 1, 110.0, F("HO-5", "warning", 6.0, "compile")),
        run((dl,), 0, 200.0, F("DL-2", "critical", 45.0, "dataloader.workers"), F("DL-1", "info", 3.0)),
        run((dl,), 1, 220.0, F("HO-5", "warning", 20.0, "compile"), F("DL-2", "warning", 40.0, "dataloader.workers")),
        run((an,), 0, 120.0, F("HO-8", "warning", 0.0, "debug.off")),
        run((an,), 1, 130.0),
        run((th,), 0, 106.0, F("HO-13", "info", 3.0, "threads.affinity")),
        run((th,), 1, 108.0),
        run((dl, an), 0, 250.0, F("DL-2", "critical", 48.0, "dataloader.workers")),
        R("mlp", (th, an), False, 0, 0, exit_code=1, failed="exit code 1"),
    ]
    gains, scored = acc.score_all(runs)
    case = {r.case.label: r.case for r in runs}
    g_dl, g_an, g_th = gains[case[dl]][dl], gains[case[an]][an], gains[case[th]][th]
    # healthy median 105: (210 - 105) / 210, (125 - 105) / 125, (107 - 105) / 107.
    assert (g_dl.median, g_dl.lo, g_dl.hi) == pytest.approx((50.0, 50.0, 50.0))
    assert (g_an.median, g_an.lo, g_an.hi) == pytest.approx((16.0, 20 / 130 * 100, 20 / 120 * 100))
    assert g_th.median == pytest.approx(200 / 107)
    # The pair: each pathology against the single without it (medians 125 and 210).
    pair = gains[case[f"{an}+{dl}"]]
    assert pair[dl].median == pytest.approx(50.0) and pair[an].median == pytest.approx(16.0)
    assert pair[dl].lo == pytest.approx(52.0)  # its round 0 against the single's round 0 (120)

    s = [score for _, score in scored]
    assert [x.top1 if x else "failed" for x in s] == [True, False, True, False, True, False, None, None, True, "failed"]
    assert [len(x.raised) for x in s[:9]] == [0, 0, 1, 1, 1, 0, 0, 0, 1]
    assert s[8].relevant == [an, dl] and s[8].raised == [dl]  # HO-8 not raised in the pair
    assert [x.false_warnings for x in s[:4]] == [0, 1, 0, 1]
    assert [(c["id"], c["error"]) for x in s if x for c in x.calibration] == [
        ("DL-2", 5.0), ("DL-2", 10.0), ("HO-8", 16.0), ("HO-13", round(abs(3 - 200 / 107), 2)), ("DL-2", 2.0)]

    tally = acc.Tally()
    for r, score in scored:
        tally.add(r, score)
    assert (tally.top1_ok, tally.top1_n) == (4, 7)
    assert (tally.raised, tally.relevant) == (4, 6)
    assert (tally.healthy_warned, tally.healthy_runs, tally.false_sick, tally.failed) == (1, 2, 1, 1)
    # errors 1.13, 2, 5, 10, 16: median 5; p90 at rank 3.6 -> 10 + 0.6 * 6.
    assert acc.percentile(tally.errors, 50) == 5.0
    assert acc.percentile(tally.errors, 90) == pytest.approx(13.6)
    assert tally.row("mlp")[:8] == ["mlp", "6", "9/10", "57% (4/7)", "67% (4/6)", "1/2", "1", "5.0"]


def test_established_gains_and_rescoring(tmp_path):
    acc = load_accuracy()
    F, R = acc.FindingRec, acc.RunRec
    dl, an = "main_process_loader", "anomaly_detection"

    def run(injected, rnd, step, *findings):
        return R("lm", tuple(sorted(injected)), False, rnd, 0, exit_code=0, step_ms=step, findings=list(findings))

    runs = [
        run((), 0, 100.0), run((), 1, 100.0),
        # main_process_loader: a gain in both rounds (established).
        run((dl,), 0, 200.0, F("DL-2", "critical", 50.0, "dataloader.workers")),
        run((dl,), 1, 190.0, F("DL-2", "critical", 48.0, "dataloader.workers")),
        # anomaly_detection: a median of +9% that one round contradicts (noise, not established).
        run((an,), 0, 125.0), run((an,), 1, 95.0),
        # A void pair: run, kept in the raw file, never scored.
        run((dl, "non_persistent_workers"), 0, 210.0),
    ]
    gains, scored = acc.score_all([r for r in runs if not acc.void(r.injected)])
    g_an = gains[runs[4].case][an]
    assert g_an.median >= acc.MIN_GAIN_PCT and g_an.lo < 0 and not acc.established(g_an)
    assert acc.established(gains[runs[2].case][dl])
    s = {r.case.label + str(r.round): sc for r, sc in scored}
    assert s["anomaly_detection0"].top1 is False and s["anomaly_detection0"].top1_established is None
    assert s["anomaly_detection0"].relevant == [an] and s["anomaly_detection0"].relevant_established == []
    assert s["main_process_loader0"].top1_established is True and s["main_process_loader0"].raised_established == [dl]

    meta = {"command": "test", "date": "2026-12-02T00:00:00", "wall_min": 1.0, "machine": acc.machine(),
            "families": ["lm"], "repeats": 2, "healthy_runs": 0, "quick": False}
    acc.write_results(runs, meta, tmp_path / "a.md")
    raw = json.loads((tmp_path / "a.json").read_text())
    assert len(raw["runs"]) == 7 and [r["void"] for r in raw["runs"]].count(True) == 1
    assert acc.main(["--rescore", str(tmp_path / "a.json"), "--results", str(tmp_path / "b.md")]) == 0
    text = (tmp_path / "b.md").read_text()
    assert "scored again" in text
    # lm row: recall 2 of 4 (no finding for the noisy anomaly gain); over established gains only: 2/2, 2/2.
    row = next(line for line in text.splitlines() if line.startswith("| lm |"))
    assert "| 50% (2/4) |" in row and row.rstrip(" |").endswith("100% (2/2) | 100% (2/2)")
