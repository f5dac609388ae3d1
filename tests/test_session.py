"""session.py: what a run directory's processes contribute to the report."""

from __future__ import annotations

import json

from torchdoctor.facts import DataLoaderFacts, OptimizerFacts, RankFacts, StepTiming, evaluation_only, trains
from torchdoctor.session import report_from_run_dir


def training(pid: int) -> RankFacts:
    steps = [StepTiming(step=i, total_ms=100.0, dataloader_ms=60.0, forward_ms=15.0, backward_ms=20.0,
                        optimizer_ms=5.0) for i in range(20)]
    return RankFacts(rank=0, pid=pid, hostname="h", step_source="optimizer", steps=steps,
                     optimizers=[OptimizerFacts(cls="SGD")],
                     dataloaders=[DataLoaderFacts(num_workers=0, call_site="train.py:10")])


def evaluating(pid: int, inference: float = 7.0) -> RankFacts:
    steps = [StepTiming(step=i, total_ms=37.0, dataloader_ms=30.0, forward_ms=7.0, inference_ms=inference)
             for i in range(30)]
    return RankFacts(rank=0, pid=pid, hostname="h", step_source="dataloader", steps=steps,
                     dataloaders=[DataLoaderFacts(num_workers=0, call_site="train.py:20")])


def test_a_process_that_only_evaluated_is_told_from_one_that_trains():
    assert evaluation_only(evaluating(1)) and not trains(evaluating(1))
    assert trains(training(2)) and not evaluation_only(training(2))
    # Forwards with autograd in a loop without an optimizer: not an evaluation (a hand-written update).
    assert not evaluation_only(evaluating(3, inference=0.0))
    assert not evaluation_only(None)


def manifest(tmp_path, *facts: RankFacts) -> str:
    import msgspec

    ranks = [{"facts": msgspec.to_builtins(f), "analysis": None} for f in facts]
    (tmp_path / "run.json").write_text(json.dumps({"schema": "torchdoctor.run/1", "command": ["python", "main.py"],
                                                   "exit_code": 0, "duration_s": 10.0, "ranks": ranks}))
    return str(tmp_path)


def test_beside_training_processes_an_evaluating_one_is_left_out_and_said(tmp_path):
    """The Hogwild example: two children train, their parent then tests the model. The parent's test
    loader (train.py:20) must not speak for the job: DL-2 names the training loader."""
    report = report_from_run_dir(manifest(tmp_path, training(11), training(12), evaluating(10)))
    assert [(r.rank, r.facts.pid) for r in report.ranks] == [(0, 11), (1, 12)]
    assert any("process 12 as rank 1" in w.message for w in report.warnings)
    (note,) = [w.message for w in report.warnings if "only evaluated" in w.message]
    assert note.startswith("process 10 (rank 0) only evaluated: 30 steps (DataLoader batches)")
    dl2 = [f for f in report.findings if f.id == "DL-2"]
    assert dl2 and "train.py:10" in dl2[0].fix.text and "train.py:20" not in dl2[0].fix.text


def test_a_job_that_only_evaluates_is_still_diagnosed(tmp_path):
    report = report_from_run_dir(manifest(tmp_path, evaluating(10)))
    assert [r.facts.pid for r in report.ranks] == [10]
    assert not any("only evaluated" in w.message for w in report.warnings)
