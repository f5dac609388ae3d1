"""The profiler window's trace leaves the training thread: a detached child compresses and analyses
it, and the wrapper settles what no child finished (probe/postprocess.py)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

from kineto_builder import TraceBuilder
from torchdoctor.probe import output, postprocess


def raw_trace(run_dir, rank: int = 0) -> str:
    b = TraceBuilder(rank=rank)
    for s in range(3):
        b.step(s, 1000.0 * s, 1000.0)
        b.kernel("ampere_sgemm_128x64_nn", 1000.0 * s + 100, 250, launch_at=1000.0 * s + 50)
    raw, _gz, _pending, _analysis = postprocess.paths(str(run_dir), rank)
    os.makedirs(os.path.dirname(raw), exist_ok=True)
    b.write(raw)
    return raw


def own_summary(run_dir, rank: int = 0) -> None:
    facts = {"rank": rank, "pid": 1, "trace_file": f"traces/rank{rank}.json.gz"}
    output.write_json(os.path.join(run_dir, "ranks", f"rank{rank}.json"), {"facts": facts, "analysis": None})


def assert_settled(run_dir, rank: int = 0) -> dict:
    raw, gz, pending, analysis = postprocess.paths(str(run_dir), rank)
    assert not os.path.exists(raw) and not os.path.exists(pending)
    with gzip.open(gz, "rt") as f:
        assert json.load(f)["traceEvents"]
    result = postprocess.read_analysis(str(run_dir), rank)
    assert result is not None and result["metrics"]["busy_pct"] == 25.0
    return result


def test_child_compresses_and_analyses_and_the_merge_attaches_it(tmp_path):
    raw_trace(tmp_path)
    own_summary(tmp_path)
    assert postprocess.start(str(tmp_path), 0)
    postprocess.settle(str(tmp_path))
    assert_settled(tmp_path)
    (payload,) = output.read_payloads(str(tmp_path))
    assert payload["analysis"]["metrics"]["busy_pct"] == 25.0
    assert not os.path.exists(tmp_path / "traces" / "rank0.postprocess.log")  # no error, no log


def test_wrapper_finishes_a_trace_whose_child_never_ran_or_died(tmp_path):
    raw_trace(tmp_path, 0)
    raw_trace(tmp_path, 1)
    # Rank 1's child died: its pending marker names a process that is gone.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _raw, _gz, pending, _a = postprocess.paths(str(tmp_path), 1)
    with open(pending, "w") as f:
        f.write(str(dead.pid))
    postprocess.settle(str(tmp_path), timeout_s=5)
    assert_settled(tmp_path, 0)
    assert_settled(tmp_path, 1)


def test_a_stuck_child_is_killed_at_the_deadline_and_its_work_taken_over(tmp_path):
    raw_trace(tmp_path)
    stuck = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    _raw, _gz, pending, _a = postprocess.paths(str(tmp_path), 0)
    with open(pending, "w") as f:
        f.write(str(stuck.pid))
    postprocess.settle(str(tmp_path), timeout_s=0.5)
    assert stuck.wait(timeout=10) != 0  # killed
    assert_settled(tmp_path)


def test_the_child_runs_apart_from_the_job(tmp_path, monkeypatch):
    """Not probed (no run directory in its environment), in its own session (the job's Ctrl-C does
    not reach it), and able to import torchdoctor wherever the job found it."""
    raw_trace(tmp_path)
    monkeypatch.setenv("TORCHDOCTOR_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("TORCHDOCTOR_REMEDIES", "dataloader.workers")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    seen = {}
    real = subprocess.Popen

    def spy(cmd, **kw):
        seen.update(kw, cmd=cmd)
        return real(cmd, **kw)

    monkeypatch.setattr(postprocess.subprocess, "Popen", spy)
    assert postprocess.start(str(tmp_path), 0)
    # Lowered by the job as soon as it exists, before its interpreter starts and imports: the
    # child's own lowering came after them, and they slowed the job's next step 6x on 2 CPUs.
    _raw, _gz, pending, _a = postprocess.paths(str(tmp_path), 0)
    with open(pending) as f:
        pid = int(f.read())
    assert os.getpriority(os.PRIO_PROCESS, pid) == 19
    if hasattr(os, "SCHED_IDLE"):
        assert os.sched_getscheduler(pid) == os.SCHED_IDLE
    env = seen["env"]
    assert "TORCHDOCTOR_RUN_DIR" not in env and "TORCHDOCTOR_REMEDIES" not in env
    assert seen["start_new_session"] is True
    import torchdoctor

    assert env["PYTHONPATH"].split(os.pathsep)[0] == os.path.dirname(os.path.dirname(torchdoctor.__file__))
    postprocess.settle(str(tmp_path))
    assert_settled(tmp_path)


def test_a_discarded_window_takes_its_working_child_and_files_with_it(tmp_path):
    """Steps renumbered after a window was handed off: its child is killed and nothing it made
    stays behind, so the next window's trace and analysis cannot be mixed with it."""
    raw, gz, pending, analysis = postprocess.paths(str(tmp_path), 0)
    raw_trace(tmp_path)
    # A process that took a dead child's pid is left alone: only one running this module is killed.
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with open(pending, "w") as f:
        f.write(str(stranger.pid))
    postprocess.discard(str(tmp_path), 0)
    assert stranger.poll() is None
    stranger.kill()
    stranger.wait()
    raw_trace(tmp_path)
    sleep = "import time; time.sleep(60)"
    working = subprocess.Popen([sys.executable, "-c", sleep, "torchdoctor.probe.postprocess"])
    with open(pending, "w") as f:
        f.write(str(working.pid))
    os.makedirs(os.path.dirname(analysis))
    for path in (gz, analysis, gz + ".tmp123"):
        with open(path, "w") as f:
            f.write("{}")
    postprocess.discard(str(tmp_path), 0)
    assert working.wait(timeout=10) == -9
    assert os.listdir(tmp_path / "traces") == [] and not os.path.exists(analysis)


def test_the_merge_prefers_the_childs_analysis_to_a_copy_the_rank_embedded(tmp_path):
    """A rank embeds the analysis it last read; the file on this machine is newer and wins."""
    raw_trace(tmp_path)
    facts = {"rank": 0, "pid": 1, "trace_file": "traces/rank0.json.gz"}
    stale = {"metrics": {"busy_pct": 99.0}}
    output.write_json(os.path.join(tmp_path, "ranks", "rank0.json"), {"facts": facts, "analysis": stale})
    (payload,) = output.read_payloads(str(tmp_path))
    assert payload["analysis"] == stale  # no analysis file: the embedded copy is all there is
    assert postprocess.start(str(tmp_path), 0)
    postprocess.settle(str(tmp_path))
    (payload,) = output.read_payloads(str(tmp_path))
    assert payload["analysis"]["metrics"]["busy_pct"] == 25.0


def test_processes_sharing_a_rank_keep_their_own_trace_and_analysis(tmp_path):
    """Without a process group every process is rank 0 (Hogwild children, an evaluating parent): the
    first to claim the rank's trace slot keeps the plain name, the others get their pid in theirs, and
    each process's facts get the analysis of its own trace, settled by the wrapper."""
    run = str(tmp_path)
    assert output.claim_trace_slot(run, 0, 101) == "rank0"
    assert output.claim_trace_slot(run, 0, 101) == "rank0"  # a restarted window keeps its slot
    assert output.claim_trace_slot(run, 0, 202) == "rank0.pid202"
    assert output.claim_trace_slot(run, 1, 202) == "rank1"
    for slot, pid, busy_steps in (("rank0", 101, 1), ("rank0.pid202", 202, 3)):
        b = TraceBuilder(rank=0)
        for s in range(3):
            b.step(s, 1000.0 * s, 1000.0)
            if s < busy_steps:
                b.kernel("ampere_sgemm_128x64_nn", 1000.0 * s + 100, 250, launch_at=1000.0 * s + 50)
        raw, _gz, _pending, _analysis = postprocess.paths(run, slot)
        os.makedirs(os.path.dirname(raw), exist_ok=True)
        b.write(raw)
        facts = {"rank": 0, "pid": pid, "trace_file": f"traces/{slot}.json.gz"}
        output.write_json(output.own_path(run, 0, pid), {"facts": facts, "analysis": None})
    postprocess.settle(run)  # no child ran: the wrapper compresses and analyses both raw traces
    assert sorted(os.listdir(tmp_path / "traces")) == ["rank0.json.gz", "rank0.owner", "rank0.pid202.json.gz",
                                                       "rank1.owner"]
    got = {p["facts"]["pid"]: p["analysis"]["metrics"]["busy_pct"] for p in output.read_payloads(run)}
    assert got == {101: 8.333, 202: 25.0}  # one busy step of three, against three of three
    output.clear(run)
    assert not os.listdir(tmp_path / "traces")


def test_a_trace_slot_is_read_back_from_a_trace_file_name():
    assert output.trace_slot("traces/rank3.json.gz") == "rank3"
    assert output.trace_slot("traces/rank0.pid4242.json.gz") == "rank0.pid4242"
    assert output.trace_slot("traces/other.json.gz") is None and output.trace_slot("") is None
