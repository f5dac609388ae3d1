"""`torchdoctor fix` end to end on a tiny synthetic training job (real torch, real processes).

Each test runs the job a few times (a few seconds each); a verdict that keeps or rejects on speed
needs 3 rounds (the interval's minimum), the others run 1; together about 3 minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

JOB = r'''"""Tiny synthetic training job for the fix tests (written to a temp dir by the tests)."""
import argparse
import os
import socket
import time

import torch
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
p.add_argument("--sleep-ms", type=float, default=0.0)
p.add_argument("--step-sleep-ms", type=float, default=0.0)
p.add_argument("--ranks", type=int, default=1)
p.add_argument("--layers", type=int, default=2)
p.add_argument("--bucket-cap", type=float, default=None)
p.add_argument("--random-aug", action="store_true")
p.add_argument("--resume", default=None, help="load DIR/ckpt.pt when it exists, save it at the end")
args = p.parse_args()
WIDTH = 32


class Data(Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        if args.sleep_ms:
            time.sleep(args.sleep_ms / 1000)  # simulated storage latency
        x = torch.randn(WIDTH, generator=torch.Generator().manual_seed(i))
        if args.random_aug:  # draws from the process's global RNG: differs inside workers
            x = x + 0.5 * torch.randn(WIDTH)
        return x, i % 10


def main(rank=0):
    if args.ranks > 1:
        # Ranks come from mp.spawn, whose children default to spawning: fork the loader's workers.
        torch.multiprocessing.set_start_method("fork", force=True)
        torch.distributed.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.manual_seed(0)
    layers = [torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()) for _ in range(args.layers)]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(WIDTH, 10))
    if args.ranks > 1:
        kw = {} if args.bucket_cap is None else {"bucket_cap_mb": args.bucket_cap}
        model = torch.nn.parallel.DistributedDataParallel(model, **kw)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ckpt = os.path.join(args.resume, "ckpt.pt") if args.resume else None
    if ckpt and os.path.exists(ckpt):
        model.load_state_dict(torch.load(ckpt))
    data = Data()
    sampler = torch.utils.data.distributed.DistributedSampler(data, args.ranks, rank, seed=0) if args.ranks > 1 else None
    loader = DataLoader(data, batch_size=16, shuffle=sampler is None, sampler=sampler,
                        generator=torch.Generator().manual_seed(0))
    step = 0
    while step < args.steps:
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if args.step_sleep_ms:
                time.sleep(args.step_sleep_ms / 1000)  # simulated work besides the loading, CPU idle
            step += 1
            if step == args.steps:
                break
    if ckpt:
        torch.save(model.state_dict(), ckpt)
    if rank == 0:
        print(f"job done: {step} steps", flush=True)


if __name__ == "__main__":
    if args.ranks > 1:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.multiprocessing.spawn(main, nprocs=args.ranks)
    else:
        main()
'''


def job(tmp_path: Path) -> Path:
    path = tmp_path / "job.py"
    path.write_text(JOB)
    return path


def torchdoctor(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR_")}
    full.update({"OMP_NUM_THREADS": "1", **(env or {})})
    return subprocess.run([sys.executable, "-m", "torchdoctor.cli", *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=300)


def report(path: Path) -> dict:
    return json.loads(path.read_text())


def verdicts(rep: dict) -> dict[str, tuple[bool, str]]:
    return {r["id"]: (r["kept"], r["reason"]) for r in rep["ab"]["remedies"]}


def test_impossible_remedies_are_refused_at_run_time_and_the_job_runs(tmp_path: Path) -> None:
    """Straight through the bootstrap (TORCHDOCTOR_REMEDIES), no fix loop: the job decides itself."""
    script = job(tmp_path)
    asked = "dataloader.workers=64,dataloader.pin_memory,cudagraphs,no.such.remedy,optim.foreach"
    res = torchdoctor("run", "--out", "run", "--profile-steps", "off", "-q", "--", sys.executable, str(script),
                      "--steps", "6", cwd=tmp_path, env={"TORCHDOCTOR_REMEDIES": asked})
    assert res.returncode == 0, res.stderr
    assert "job done: 6 steps" in res.stdout  # the job's own output passes through
    assert "remedy no.such.remedy refused: unknown remedy id" in res.stderr
    assert "remedy dataloader.workers refused: num_workers=64 is beyond 4 per CPU" in res.stderr
    records = [json.loads(p.read_text()) for p in (tmp_path / "run" / "remedies").glob("pid*.json")]
    refused = {r["id"]: r["reason"] for rec in records for r in rec["refused"]}
    applied = {a["id"] for rec in records for a in rec["applied"]}
    assert {"dataloader.workers", "no.such.remedy"} <= set(refused) and applied == {"optim.foreach"}
    import torch

    if not torch.cuda.is_available():
        assert "no accelerator" in refused["dataloader.pin_memory"]
        assert "CUDA graphs" in refused["cudagraphs"]


def test_fix_safe_picks_workers_from_the_diagnosis_and_proves_them(tmp_path: Path) -> None:
    """Latency-bound loading (24 ms of sleeps per batch) next to 45 ms of other idle work per step:
    ceil(wait / rest) = 1 worker hides the wait, and N + 1 = 2 (within the CPUs) is measured too.
    The wait is about half the rest of the step, so that sleep overshoot on a loaded machine (16
    short sleeps per batch against one long one per step) cannot tip the ratio past 1."""
    script = job(tmp_path)
    res = torchdoctor("fix", "--apply", "safe", "--repeats", "3", "--steps", "12", "--out", "fx", "--json",
                      "fix.json", "--", sys.executable, str(script), "--sleep-ms", "1.5", "--step-sleep-ms", "45",
                      cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    rep = report(tmp_path / "fix.json")
    assert rep["source"] == "fix" and any(f["id"] == "DL-2" for f in rep["findings"])
    ab = rep["ab"]
    v = verdicts(rep)
    workers = next(k for k in v if k.startswith("dataloader.workers="))
    assert v[workers][0] and v["dataloader.persistent_workers"][0] and v["dataloader.prefetch"][0], v
    # About 75 ms -> 55 ms per step (measured 1.36-1.45x): established, every pair faster.
    assert ab["pairs"] == 3 and ab["interval"][0] > 1.2 and ab["speedup_geomean"] > 1.25, ab
    assert ab["sign_p"] == 0.25 and ab["treated_steps_per_s"] > ab["baseline_steps_per_s"]
    entry = next(r for r in ab["remedies"] if r["id"] == workers)
    assert entry["interval"] == ab["interval"] and entry["pairs"] == 3
    assert ab["details"]["loss_check"]["status"] == "identical"
    # Counterbalanced rounds, the N+1 variant within each: A B V, V B A, A B V.
    labels = [a["label"] for a in ab["details"]["arms"]]
    assert labels == ["A1", "B1", "V1", "V2", "B2", "A2", "A3", "B3", "V3"], labels
    w = ab["details"]["workers"]
    n = w["measured"][0]
    assert w["advised"] == n == 1 and w["measured"] == [1, 2] and w["pairs"] == 3
    # N+1 replaces N only when its gain over N is established (interval above 1).
    assert w["kept"] == (2 if w["interval"][0] > 1 else 1) and workers == f"dataloader.workers={w['kept']}"
    change = ab["details"]["code_changes"][0]
    added = [line for line in change["text"].splitlines() if line.startswith("+ ")]
    assert change["language"] == "diff"
    assert re.search(rf"num_workers={w['kept']}, prefetch_factor=4\)$", added[0]), added
    # 12 steps are one epoch's part: the loader was never iterated again, so persistent workers changed
    # nothing measured there and are left out of the change, with the reason.
    (idle,) = [c for c in ab["details"]["code_changes"] if c["where"] == "left out"]
    assert idle["remedies"] == ["dataloader.persistent_workers"] and "not iterated a second time" in idle["text"]
    assert "speed-up x" in res.stdout and "to make the kept remedies permanent" in res.stdout
    assert (script.read_text()) == JOB  # the user's file is never edited


def test_a_remedy_that_slows_the_job_is_rejected(tmp_path: Path) -> None:
    """2 DDP ranks; a tiny bucket cap makes one all-reduce per parameter tensor. (Each remedy's
    own share, --ablate, is judged the same way: tests/remedies/test_remedy_verdict.py.)"""
    script = job(tmp_path)
    res = torchdoctor("fix", "--apply", "ddp.bucket_cap=0.0001", "--repeats", "3", "--steps", "12", "--out", "fx",
                      "--json", "fix.json", "--", sys.executable, str(script), "--ranks", "2", "--layers", "24",
                      cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    rep = report(tmp_path / "fix.json")
    kept, why = verdicts(rep)["ddp.bucket_cap=0.0001"]
    assert not kept and "the job is slower" in why, why
    assert rep["ab"]["pairs"] == 3 and rep["ab"]["interval"][1] < 1 and rep["ab"]["speedup_max"] < 0.8
    assert [a["label"] for a in rep["ab"]["details"]["arms"]] == ["A1", "B1", "B2", "A2", "A3", "B3"]


def test_a_safe_remedy_that_changes_the_losses_is_rejected(tmp_path: Path) -> None:
    """The dataset draws from the global RNG in __getitem__: in a worker it draws other numbers."""
    script = job(tmp_path)
    res = torchdoctor("fix", "--apply", "dataloader.workers=1", "--repeats", "1", "--steps", "8", "--out", "fx",
                      "--json", "fix.json", "--", sys.executable, str(script), "--random-aug", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    rep = report(tmp_path / "fix.json")
    kept, why = verdicts(rep)["dataloader.workers=1"]
    assert not kept and "learns differently" in why
    assert rep["ab"]["details"]["loss_check"]["status"] == "changed"


def test_arms_that_resume_from_an_earlier_arms_checkpoint_are_not_compared(tmp_path: Path) -> None:
    """The job resumes from ckpt.pt when it finds one (pytorch/examples' FSDP2 example does): A1
    trains from scratch, B1 from where A1 stopped, so the losses differ whatever the remedy does."""
    script = job(tmp_path)
    # The job's own step count: fix's --steps would end each run before its save.
    res = torchdoctor("fix", "--apply", "optim.foreach", "--repeats", "1", "--out", "fx", "--json", "fix.json",
                      "--", sys.executable, str(script), "--steps", "8", "--resume", str(tmp_path), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    details = report(tmp_path / "fix.json")["ab"]["details"]
    assert details["resumed"] == [{"arm": "B1", "path": str(tmp_path / "ckpt.pt")}]
    check = details["loss_check"]
    assert check["status"] == "inconclusive" and check["text"].startswith(f"arm B1 resumed from {tmp_path / 'ckpt.pt'}")
    assert "warning: arm B1 loaded " in res.stdout and "rm -rf DIR && exec COMMAND" in res.stdout


def test_runs_measured_while_other_processes_take_the_cpus_are_named(tmp_path: Path) -> None:
    """One spinning process per CPU of the job's for the whole fix: both runs share their CPUs."""
    hog = "import time\nend = time.time() + 120\nwhile time.time() < end:\n    pass\n"
    hogs = [subprocess.Popen([sys.executable, "-c", hog]) for _ in os.sched_getaffinity(0)]
    try:
        script = job(tmp_path)
        res = torchdoctor("fix", "--apply", "optim.foreach", "--repeats", "1", "--steps", "8", "--out", "fx",
                          "--json", "fix.json", "--", sys.executable, str(script), cwd=tmp_path)
    finally:
        for p in hogs:
            p.kill()
            p.wait()
    assert res.returncode == 0, res.stderr
    shares = {a["label"]: a["other_cpu_share"] for a in report(tmp_path / "fix.json")["ab"]["details"]["arms"]}
    assert set(shares) == {"A1", "B1"} and all(s > 0.3 for s in shares.values()), shares
    assert "warning: other processes took more than 10% of the job's CPUs during runs A1 (" in res.stdout
    assert "(busy machine: others took " in res.stderr


def test_impossible_requests_to_fix_are_refused_and_the_job_still_runs(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the refusals of a CPU-only machine")
    script = job(tmp_path)
    res = torchdoctor("fix", "--apply", "dataloader.workers=64,cudagraphs,dataloader.pin_memory,bogus",
                      "--steps", "4", "--out", "fx", "--json", "fix.json", "--", sys.executable, str(script),
                      cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "fx" / "A1" / "job.log").exists()  # it ran; its output went to its log
    v = verdicts(report(tmp_path / "fix.json"))
    assert not any(kept for kept, _ in v.values())
    assert f"beyond 4 per CPU of the {len(os.sched_getaffinity(0))} CPU(s)" in v["dataloader.workers=64"][1]
    assert "needs an accelerator" in v["cudagraphs"][1] and "needs an accelerator" in v["dataloader.pin_memory"][1]
    assert "unknown remedy id 'bogus'" in v["bogus"][1]
    assert sorted(p.name for p in (tmp_path / "fx").iterdir()) == ["A1"]  # ran once, as it is


def test_numerics_remedy_within_tolerance(tmp_path: Path) -> None:
    script = job(tmp_path)
    res = torchdoctor("fix", "--apply", "precision.autocast", "--repeats", "1", "--steps", "8", "--out", "fx",
                      "--json", "fix.json", "--", sys.executable, str(script), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    rep = report(tmp_path / "fix.json")
    # bfloat16 moves the losses (deterministic CPU kernels, fixed seeds) but well within 5% per step.
    check = rep["ab"]["details"]["loss_check"]
    assert check["status"] == "within tolerance" and "max |delta| 0 " not in check["text"], check
    # One round is one pair: no interval, so whatever the speed, no gain is established.
    kept, why = verdicts(rep)["precision.autocast"]
    assert not kept and why.startswith("rejected: no established gain: x") and "not established" in why, why
    assert rep["ab"]["pairs"] == 1 and rep["ab"]["interval"] is None


def test_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    from torchdoctor.cli import build_parser, main

    assert main(["fix", "--apply", "safe"]) == 2
    assert "give the command after --" in capsys.readouterr().err
    args = build_parser().parse_args(["demo", "--fix", "--apply", "numerics", "-k", "3", "--ablate", "--steps", "20"])
    assert (args.fix, args.apply, args.repeats, args.ablate, args.steps) == (True, "numerics", 3, True, 20)
    args = build_parser().parse_args(["fix", "--steps", "5", "--", "python", "train.py", "--steps", "9"])
    assert args.fix_steps == 5 and args.command == ["--", "python", "train.py", "--steps", "9"]


def test_a_remedy_asked_for_without_a_value_takes_the_diagnosis_advice(tmp_path: Path) -> None:
    """`fix --from RUN --apply threads.affinity`: the value is HO-13's advice for the run (1 thread per
    process for two Hogwild children with 2 threads each on 2 CPUs), not the remedy's default of
    CPUs // LOCAL_WORLD_SIZE (2 // 1 without torchrun: a no-op)."""
    import msgspec

    from torchdoctor.facts import CpuFacts, OptimizerFacts, RankFacts, StepTiming
    from torchdoctor.fixer import FixOptions, _what_to_try

    steps = [StepTiming(step=i, total_ms=100.0, forward_ms=40.0, backward_ms=50.0, optimizer_ms=5.0)
             for i in range(20)]
    child = RankFacts(rank=0, hostname="h", step_source="optimizer", steps=steps, optimizers=[OptimizerFacts(cls="SGD")],
                      cpu=CpuFacts(affinity=[0, 1], torch_num_threads=2))
    ranks = [{"facts": msgspec.to_builtins(child) | {"pid": pid}, "analysis": None} for pid in (11, 12)]
    (tmp_path / "run.json").write_text(json.dumps({"schema": "torchdoctor.run/1", "command": ["python", "main.py"],
                                                   "exit_code": 0, "duration_s": 5.0, "ranks": ranks}))
    got = _what_to_try(["python", "main.py"], FixOptions(apply="threads.affinity", from_run=str(tmp_path)),
                       str(tmp_path / "fix"))
    assert [str(c.spec) for c in got.choices] == ["threads.affinity=1"]
    given = _what_to_try(["python", "main.py"], FixOptions(apply="threads.affinity=2", from_run=str(tmp_path)),
                         str(tmp_path / "fix"))
    assert [str(c.spec) for c in given.choices] == ["threads.affinity=2"]  # a value given is kept


def test_workers_asked_for_without_a_value_take_the_diagnosis_s_zero(tmp_path: Path, monkeypatch) -> None:
    """litgpt's pretrain: DL-6 advised num_workers=0 (a batch costs less to make than to receive); `fix --from RUN
    --apply dataloader.workers` ran with its own count (1), which the IterableDataset refused: nothing measured."""
    from torchdoctor.fixer import FixOptions, _what_to_try
    from torchdoctor.report.model import Report
    from torchdoctor.rules.model import Evidence, Finding

    dl6 = Finding(id="DL-6", layer="input", severity="warning", title="t", recoverable_pct=9.4,
                  remedy="dataloader.workers", evidence=[Evidence("e", {"advised_workers": 0})])
    monkeypatch.setattr("torchdoctor.session.report_from_run_dir", lambda _: Report(findings=[dl6]))
    got = _what_to_try(["litgpt", "pretrain"], FixOptions(apply="dataloader.workers", from_run=str(tmp_path)),
                       str(tmp_path / "fix"))
    assert [str(c.spec) for c in got.choices] == ["dataloader.workers=0"]
