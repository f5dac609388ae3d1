"""session.py: what a run directory's processes contribute to the report."""

from __future__ import annotations

import json

from torchdoctor.facts import DataLoaderFacts, OptimizerFacts, RankFacts, StepTiming, evaluation_only, trains
from torchdoctor.session import analyze_paths, report_from_run_dir


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


def cpu_run(tmp_path, window_ms: list[float], steady_ms: float = 250.0, warm_up: float = 1.0, first: int = 5,
            profiled: list[StepTiming] | None = None):
    """A CPU-only run directory: ProfilerSteps 5-7 of `window_ms` in the trace, the probe's steps
    0-39 outside them at `steady_ms` (step 0 a slow start-up, steps 1-4 `warm_up` x steady)."""
    from kineto_builder import TraceBuilder

    b = TraceBuilder(device_name=None)
    ts = 0.0
    for n, ms in zip(range(first, first + 3), window_ms, strict=True):
        b.step(n, ts, ms * 1e3)
        b.dataloader(ts + 10, ms * 1e3 * 0.08)
        b.op("aten::convolution", ts + ms * 1e3 * 0.1, ms * 1e3 * 0.8)
        ts += ms * 1e3 + 1
    (tmp_path / "traces").mkdir()
    b.write(tmp_path / "traces" / "rank0.json.gz")
    steps = [StepTiming(step=i, total_ms=steady_ms * (3 if i == 0 else warm_up if i < 5 else 1),
                        dataloader_ms=0.08 * steady_ms,
                        forward_ms=0.3 * steady_ms, backward_ms=0.5 * steady_ms, optimizer_ms=0.1 * steady_ms)
             for i in range(40) if not first <= i < first + 3]
    facts = RankFacts(rank=0, pid=7, hostname="h", step_source="optimizer", steps=steps, profile_steps=[first, first + 3],
                      profiled_steps=profiled or [],
                      optimizers=[OptimizerFacts(cls="SGD")], trace_file="traces/rank0.json.gz", last_step=39,
                      dataloaders=[DataLoaderFacts(num_workers=0, call_site="train.py:10")])
    return report_from_run_dir(manifest(tmp_path, facts))


def test_a_window_that_caught_the_jobs_warm_up_is_said_with_the_steady_step(tmp_path):
    """mmengine's ResNet-50 example on 2 CPUs: its steps 5-7 (the default window) took 412 ms at the
    median while its 124 steady steps took 245.9 ms, and its steps 2-4 325 ms; the report's "step ms"
    and the ms figures read from the trace were 1.68x the job's."""
    report = cpu_run(tmp_path, [412.0, 437.5, 269.1], warm_up=1.3)
    (said,) = [w.message for w in report.warnings if "profiled steps" in w.message]
    assert said.startswith("rank 0: the profiled steps 5–7 took 412.0 ms a step (median), 1.65x the job's "
                           "steady 250.0 ms (the probe's median over 36 steps outside the window): the job was "
                           "still warming up (the steps just before it took 325.0 ms), and the profiler adds its own cost.")
    # The middle of the 32 steady steps after the window (8-39): step 24; the window's 3 steps long.
    assert said.endswith("`torchdoctor run --profile-steps 24:27` profiles steps from the middle of the run.")


def test_a_window_slowed_by_the_profiler_itself_gets_no_later_window(tmp_path):
    """torchrl's getting-started DQN: 2.1 ms steps, 4.6 ms profiled (many small ops); where the steps
    just before the window ran as the steady ones, a later window would be as slow."""
    report = cpu_run(tmp_path, [5.0, 4.6, 4.4], steady_ms=2.1)
    (said,) = [w.message for w in report.warnings if "profiled steps" in w.message]
    assert "2.19x the job's steady 2.1 ms" in said
    assert "that is the profiler's own cost on this job's steps (the steps just before it took 2.1 ms)" in said
    assert "--profile-steps" not in said


def test_a_window_as_fast_as_the_job_or_a_trace_alone_says_nothing(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    steady = cpu_run(tmp_path / "a", [273.1, 262.7, 298.4])  # profiled at steps 40-42 of the same job
    assert not [w for w in steady.warnings if "profiled steps" in w.message]
    # Just under the factor: 1.24x.
    close = cpu_run(tmp_path / "b", [310.0, 310.0, 310.0])
    assert not [w for w in close.warnings if "profiled steps" in w.message]
    # The slow window's trace without the probe's steps: nothing to compare it with.
    cpu_run(tmp_path, [412.0, 437.5, 269.1])
    alone = analyze_paths([str(tmp_path / "traces" / "rank0.json.gz")])
    assert alone.ranks and not [w for w in alone.warnings if "profiled steps" in w.message]


def test_a_slow_window_with_no_step_timed_before_it_is_not_blamed_on_the_profiler(tmp_path):
    """Profiled from step 1 (`--profile-steps 1:4`): only step 0, which is left out, came before it,
    so warm-up and the profiler's cost cannot be told apart; a later window is offered."""
    report = cpu_run(tmp_path, [412.0, 437.5, 269.1], first=1)
    (said,) = [w.message for w in report.warnings if "profiled steps" in w.message]
    assert said.startswith("rank 0: the profiled steps 1–3 took 412.0 ms a step")
    assert "the job's warm-up, or the profiler's own cost (no step just before it was timed)" in said
    assert "`torchdoctor run --profile-steps 22:25`" in said


def test_a_profiled_step_that_evaluated_and_saved_is_left_out_of_the_window_and_said(tmp_path):
    """timm's train.py, 6 steps an epoch: step 6 of the window 5-7 evaluated (1.6 s) and saved a
    checkpoint (0.25 s). Over the whole window the trace's mean step was 7x the steady one, which
    every share and DI-15's 2.5% read; the window is now the steps around it that trained only."""
    def step(n, total, inference=0.0, checkpoint=0.0):
        return StepTiming(step=n, total_ms=total, forward_ms=75.0 + inference, backward_ms=125.0, optimizer_ms=25.0,
                          dataloader_ms=20.0, inference_ms=inference, checkpoint_ms=checkpoint,
                          checkpoint_saves=1 if checkpoint else 0)

    profiled = [step(5, 250.0), step(6, 2150.0, inference=1600.0, checkpoint=250.0), step(7, 262.0)]
    report = cpu_run(tmp_path, [250.0, 2150.0, 262.0], profiled=profiled)
    (said,) = [w.message for w in report.warnings if "profiled steps" in w.message]
    assert said == ("rank 0: of the profiled steps 5–7, step 6 took 2,150 ms: an evaluation's forwards 1,600 ms, "
                    "checkpoint saves 250 ms, against a steady step of 250.0 ms (the probe's median over 36 steps). The "
                    "trace is analysed over step 5 only so that its shares describe the training step (`torchdoctor "
                    f"analyze {tmp_path} --steps 5:8` analyses them all)."), said
    (rank,) = report.ranks
    assert rank.window["steps"] == [5] and rank.window["mode"] == "steps 5:6"
    assert abs(rank.metrics["step_ms_median"] - 250.0) < 1.0
    # The save in the window counts, and its share is of the training step's 250 ms, not the window's mean.
    (di15,) = [f for f in report.findings if f.id == "DI-15"]
    assert "1 save(s) of 250.0 ms each in 40 steps" in di15.title and abs(di15.recoverable_pct - 2.5) < 0.05
    # Asked for, the whole window is analysed as before.
    again = report_from_run_dir(str(tmp_path), steps="5:8")
    assert again.ranks[0].window["steps"] == [5, 6, 7]
    (said,) = [w.message for w in again.warnings if "profiled steps" in w.message]
    assert said.endswith("The window asked for holds it, so the trace's shares describe that work with the training steps.")
    assert not [w for w in report_from_run_dir(str(tmp_path), steps="7:8").warnings if "asked for" in w.message]
    # Without the trace the analysis is not redone, and the note does not say it was.
    (tmp_path / "traces" / "rank0.json.gz").unlink()
    (said,) = [w.message for w in report_from_run_dir(str(tmp_path)).warnings if "profiled steps" in w.message]
    assert "analysed over" not in said and said.endswith("could not be analysed again without them, so its shares "
                                                         "describe that work too.")
    # The step left to analyse ran slower than the steady ones (the profiler's cost on small steps): the
    # slow-window warning names that step, not the whole window.
    (tmp_path / "slow").mkdir()
    slow = cpu_run(tmp_path / "slow", [400.0, 2150.0, 400.0],
                   profiled=[step(5, 400.0), step(6, 2150.0, inference=1600.0), step(7, 400.0)])
    (said,) = [w.message for w in slow.warnings if "took 400.0 ms a step" in w.message]
    assert said.startswith("rank 0: the analysed step 5 took 400.0 ms a step (median), 1.60x the job's steady"), said
    # A window whose every step evaluated stays, and says so.
    (tmp_path / "all").mkdir()
    every = [step(n, 2150.0, inference=1600.0) for n in (5, 6, 7)]
    whole = cpu_run(tmp_path / "all", [2150.0] * 3, profiled=every)
    (said,) = [w.message for w in whole.warnings if "profiled steps" in w.message]
    assert "Every profiled step did" in said and whole.ranks[0].window["steps"] == [5, 6, 7]


def test_a_save_on_rank_0_alone_leaves_its_step_out_of_every_ranks_window(tmp_path):
    """Rank 0 saves at step 6 and rank 1 waits for it at its next collective: both ranks are analysed
    over the same steps, or the cross-rank figures would compare other steps."""
    from kineto_builder import TraceBuilder

    (tmp_path / "traces").mkdir()
    ranks = []
    for rank in (0, 1):
        b = TraceBuilder(device_name=None)
        ts = 0.0
        for n, ms in zip((5, 6, 7), (250.0, 600.0, 255.0), strict=True):
            b.step(n, ts, ms * 1e3)
            b.op("aten::convolution", ts + 10, ms * 1e3 * 0.8)
            ts += ms * 1e3 + 1
        b.write(tmp_path / "traces" / f"rank{rank}.json.gz")
        saved = 350.0 if rank == 0 else 0.0
        profiled = [StepTiming(step=n, total_ms=ms, forward_ms=80.0, backward_ms=120.0, checkpoint_ms=saved if n == 6 else 0.0,
                               checkpoint_saves=1 if n == 6 and saved else 0)
                    for n, ms in ((5, 250.0), (6, 600.0), (7, 255.0))]
        steps = [StepTiming(step=i, total_ms=250.0, forward_ms=80.0, backward_ms=120.0) for i in range(30) if not 5 <= i < 8]
        ranks.append(RankFacts(rank=rank, world_size=2, pid=10 + rank, hostname="h", step_source="optimizer", steps=steps,
                               profile_steps=[5, 8], profiled_steps=profiled, optimizers=[OptimizerFacts(cls="SGD")],
                               trace_file=f"traces/rank{rank}.json.gz", last_step=29))
    report = report_from_run_dir(manifest(tmp_path, *ranks))
    assert [r.window["steps"] for r in report.ranks] == [[5], [5]]
    (said,) = [w.message for w in report.warnings if "profiled steps" in w.message]
    assert said.startswith("rank 0: of the profiled steps 5–7, step 6 took 600 ms: checkpoint saves 350 ms")
    assert "analysed over step 5 only, on every rank, so that" in said
