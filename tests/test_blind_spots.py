"""Blind spots said out loud: the report never calls a run healthy when the tool saw nothing.

Trace cases use traces built in code (tests/kineto_builder.py); live cases run real jobs under
`torchdoctor run` (each deterministic: the job ends itself at a known step).
"""

from __future__ import annotations

import io
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys

import pytest
from rich.console import Console

from kineto_builder import DEVICE_PID, TraceBuilder
from probe.livejob import PY, facts_of, load_run, run, run_wrapped, script
from torchdoctor import runner
from torchdoctor.cli import EXIT_BLIND, EXIT_OK, main
from torchdoctor.facts import SUMMARY_STEPS_KEPT
from torchdoctor.probe import core, output
from torchdoctor.report.console import print_report
from torchdoctor.report.html import render_html
from torchdoctor.session import analyze_paths, report_from_run_dir, trace_sight
from torchdoctor.trace.load import load_trace


def host_steps(b: TraceBuilder, n: int = 4, dur: float = 1000.0) -> TraceBuilder:
    """`n` ProfilerSteps of host work only (forward-ish ops, no device events)."""
    for i in range(n):
        t = i * dur
        b.step(i + 1, t, dur)
        b.op("aten::linear", t + 10, dur * 0.8)
    return b


def gpu_steps(b: TraceBuilder, n: int = 4, dur: float = 1000.0) -> TraceBuilder:
    for i in range(n):
        t = i * dur
        b.step(i + 1, t, dur)
        b.op("aten::linear", t + 10, 100)
        b.kernel("ampere_sgemm_128x64_nn", t + 50, dur * 0.9, launch_at=t + 20)
    return b


def console_text(report) -> str:
    buf = io.StringIO()
    print_report(report, Console(file=buf, width=200, highlight=False))
    return buf.getvalue()


# --- 1. no device activity from a machine with an accelerator ---------------------------------

def test_cpu_only_trace_from_a_gpu_machine_is_not_healthy(tmp_path, capsys):
    path = host_steps(TraceBuilder(device_name="NVIDIA H100 80GB HBM3")).write(tmp_path / "t.json")
    rep = analyze_paths([str(path)])
    (spot,) = rep.blind_spots
    assert spot["kind"] == "no-device-activity" and spot["rank"] == 0
    assert ("device activity was not recorded: profile with "
            "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]") in spot["text"]
    assert "NVIDIA H100 80GB HBM3" in spot["text"]
    assert rep.healthy is None
    text = console_text(rep)
    assert text.startswith("Rank 0 (t.json): device activity was not recorded")
    assert "nothing in this run points to lost accelerator time" not in text and "Healthy" not in text
    # The CLI: its own exit code, and healthy null in the JSON report.
    out = tmp_path / "r.json"
    assert main(["analyze", str(path), "--json", str(out), "-q"]) == EXIT_BLIND
    doc = json.loads(out.read_text())
    assert doc["healthy"] is None and doc["blind_spots"][0]["kind"] == "no-device-activity"
    html = render_html(rep)
    assert "device activity was not recorded" in html and ">Healthy<" not in html
    assert html.index("device activity was not recorded") < html.index("Diagnosis matrix")


def test_cpu_only_machine_with_steps_can_be_healthy(tmp_path):
    # The same host work recorded on a machine without accelerators (no deviceProperties): its
    # steps are what a verdict needs.
    rep = analyze_paths([str(host_steps(TraceBuilder(device_name=None)).write(tmp_path / "t.json"))])
    assert rep.blind_spots == [] and rep.findings == [] and rep.healthy is True
    assert "No findings: nothing in this run points to lost accelerator time." in console_text(rep)


def test_one_step_without_a_trace_is_no_healthy_verdict():
    """A one-step job (pytorch/examples distributed/ddp) leaves only step 0, start-up, and no
    window: it was called healthy."""
    from torchdoctor.facts import RankFacts, StepTiming
    from torchdoctor.rules.engine import RankInputs
    from torchdoctor.session import verdict_gap

    one = RankInputs(0, facts=RankFacts(rank=0, steps=[StepTiming(step=0, total_ms=900.0)]))
    assert "only step 0" in verdict_gap(one)
    two = RankInputs(0, facts=RankFacts(rank=0, steps=[StepTiming(step=0, total_ms=900.0),
                                                       StepTiming(step=1, total_ms=9.0)]))
    assert verdict_gap(two) is None


def test_gpu_trace_with_kernels_has_no_blind_spot(tmp_path):
    rep = analyze_paths([str(gpu_steps(TraceBuilder()).write(tmp_path / "t.json"))])
    assert rep.blind_spots == []
    # A verdict either way: the device was seen over steady steps.
    assert rep.healthy is (not any(f.severity in ("critical", "warning") for f in rep.findings))


def test_no_healthy_verdict_without_device_activity_inside_the_window(tmp_path):
    # Kernels exist, but only after the last step: the steps themselves show an idle device.
    b = host_steps(TraceBuilder())
    b.kernel("ampere_sgemm_128x64_nn", 5000, 200, launch_at=4990)
    path = b.write(tmp_path / "t.json")
    rep = analyze_paths([str(path)])
    assert all(f.severity == "info" for f in rep.findings)  # nothing wrong in what was seen...
    assert rep.healthy is None  # ...but not enough was seen to call it healthy
    assert [s["kind"] for s in rep.blind_spots] == ["no-verdict"]
    assert "rank 0 shows no device activity inside the analysed window" in rep.blind_spots[0]["text"]
    text = console_text(rep)
    assert "Healthy" not in text and "no verdict" in text
    assert main(["analyze", str(path), "-q"]) == EXIT_OK  # a missing verdict is not a blind-spot exit


# --- 2. CUPTI range-profiler traces -------------------------------------------------------------

def range_profiler_trace(path):
    b = host_steps(TraceBuilder())
    for i, name in enumerate(["ampere_sgemm_128x64_nn", "vectorized_elementwise_kernel"] * 3):
        b.events.append({"ph": "X", "cat": "cuda_profiler_range", "name": name, "pid": DEVICE_PID, "tid": 0,
                         "ts": 100.0 * i, "dur": 100.0,
                         "args": {"correlation": 0, "sm__inst_executed_pipe_tensor.sum": 1024.0 * i}})
    return b.write(path)


def test_range_profiler_trace_says_counters_not_timeline(tmp_path):
    rep = analyze_paths([str(range_profiler_trace(tmp_path / "t.json.gz"))])
    (spot,) = rep.blind_spots
    assert spot["kind"] == "range-profiler" and spot["events"] == 6
    assert "hardware counters" in spot["text"] and "not a timeline" in spot["text"]
    assert rep.healthy is None
    assert main(["analyze", str(tmp_path / "t.json.gz"), "-q"]) == EXIT_BLIND


def test_the_sight_reads_the_categories_counted_while_decoding(tmp_path):
    """No second pass over the file: the decoder's counts give the blind spot."""
    path = range_profiler_trace(tmp_path / "t.json.gz")
    tr = load_trace(str(path))
    assert tr.categories["cuda_profiler_range"] == 6
    assert trace_sight(tr).range_events == 6


# --- 3. unknown accelerator ----------------------------------------------------------------------

def test_unknown_accelerator_is_named(tmp_path):
    b = gpu_steps(TraceBuilder())
    for i in range(5):
        b.events.append({"ph": "X", "cat": "mtia_ccp_events", "name": f"ccp_kernel_{i}", "pid": 1, "tid": 3,
                         "ts": 200.0 * i, "dur": 150.0, "args": {"device": 1}})
    rep = analyze_paths([str(b.write(tmp_path / "t.json"))])
    spots = [s for s in rep.blind_spots if s["kind"] == "unknown-accelerator"]
    assert len(spots) == 1 and spots[0]["categories"] == {"mtia_ccp_events": 5}
    assert "mtia_ccp_events (5)" in spots[0]["text"] and "not checked" in spots[0]["text"]
    assert rep.healthy is None


def test_category_counts_are_exact(tmp_path):
    path = range_profiler_trace(tmp_path / "t.json")
    doc = json.loads(path.read_text())
    # A key that ends in an escaped `"cat` is no category (it reads `"x\\"cat": "fake"` in the file).
    doc["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1,
                               "ts": 1.0, "dur": 1.0, "args": {'x"cat': "fake"}})
    path.write_text(json.dumps(doc))
    want: dict[str, int] = {}
    for e in doc["traceEvents"]:
        if "cat" in e and e.get("ph") == "X":  # complete events: the ones the decoder keeps
            want[e["cat"]] = want.get(e["cat"], 0) + 1
    assert load_trace(str(path)).categories == want


# --- 4 and 5: live jobs that end early ----------------------------------------------------------

CRASH_BEFORE_FIRST_STEP = """
import torch
from torch.utils.data import DataLoader, TensorDataset

loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=8)
model = torch.nn.Linear(8, 1)
x, y = next(iter(loader))
raise RuntimeError("the first batch is bad")
"""

# Trains; after optimizer step number `stop` (0-based, the probe's numbering) ends itself by `how`:
# SIGKILL, sys.exit(3), or os._exit(0) (no Python shutdown, exit code 0: as Ray Train's workers end).
ENDS_AT_STEP = """
import os, signal, sys
import torch

how, stop = sys.argv[1], int(sys.argv[2])
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(max(20, stop + 1)):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
    if step == stop:
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if how == "os_exit":
            os._exit(0)
        sys.exit(3)
"""


def run_reported(tmp_path, job, *args: str):
    """`torchdoctor run` (not --quiet: its report on stderr) with --json r.json."""
    return run([PY, "-m", "torchdoctor.runner", "--out", str(tmp_path / "run"), "--json", str(tmp_path / "r.json"),
                "--", PY, str(job), *args])


def test_job_that_crashes_before_its_first_step(tmp_path):
    job = script(tmp_path, CRASH_BEFORE_FIRST_STEP)
    result = run_reported(tmp_path, job)
    assert result.returncode == 1  # the job's own exit code passes through
    assert "RuntimeError: the first batch is bad" in result.stderr
    (spot,) = json.loads((tmp_path / "r.json").read_text())["blind_spots"]
    assert spot["kind"] == "no-step" and spot["exit_code"] == 1
    assert spot["rank"] == 0 and spot["step"] is None and spot["how"] == "raised RuntimeError and exited with code 1"
    assert spot["text"].startswith("The job ended (exit code 1) before its first training step")
    assert "before its first training step" in result.stderr
    assert main(["analyze", str(tmp_path / "run"), "-q"]) == EXIT_BLIND


def test_job_that_fails_before_any_torch_work_gets_one_explanation(tmp_path):
    """pytorch/examples minGPT-ddp without boto3: the ImportError, then "the probe saw no training"
    beside the report's own "ended before its first training step"."""
    job = script(tmp_path, "import torch\nimport a_module_that_is_not_installed\n")
    result = run_reported(tmp_path, job)
    assert result.returncode == 1 and "ModuleNotFoundError" in result.stderr
    assert "no rank wrote a summary" not in result.stderr
    assert "The job ended (exit code 1) before its first training step" in result.stderr


@pytest.mark.parametrize(("how", "code", "said"), [("kill", -signal.SIGKILL, "was killed by SIGKILL"),
                                                   ("exit", 3, "exited with code 3")])
def test_job_that_ends_itself_at_step_3(tmp_path, how, code, said):
    job = script(tmp_path, ENDS_AT_STEP)
    result = run_reported(tmp_path, job, how, "3")
    assert result.returncode == code
    facts = facts_of(tmp_path / "run")
    assert facts["last_step"] == 3 and facts["exit_code"] == code
    assert facts.get("ended") == (None if how == "kill" else "exit")  # SIGKILL: Python never shut down
    rep = report_from_run_dir(str(tmp_path / "run"))
    (spot,) = rep.blind_spots
    assert spot["kind"] == "job-failed" and (spot["rank"], spot["step"], spot["how"]) == (0, 3, said)
    assert f"rank 0 {said} after step 3" in spot["text"] and rep.healthy is None
    assert f"rank 0 {said} after step 3" in result.stderr  # the wrapper's report leads with it
    assert json.loads((tmp_path / "r.json").read_text())["blind_spots"][0]["step"] == 3


@pytest.mark.parametrize("flush_s", ["30", "0"])
def test_a_rank_that_leaves_without_its_last_summary_is_named(tmp_path, flush_s):
    job = script(tmp_path, ENDS_AT_STEP)
    result = run([PY, "-m", "torchdoctor.runner", "--out", str(tmp_path / "run"), "--profile-steps", "off",
                   "--json", str(tmp_path / "r.json"), "--", PY, str(job), "os_exit", "59"],
                 TORCHDOCTOR_FLUSH_S=flush_s)
    assert result.returncode == 0, result.stderr
    facts = facts_of(tmp_path / "run")
    assert facts["last_step"] == 59 and "ended" not in facts
    said = [w["message"] for w in json.loads((tmp_path / "r.json").read_text())["warnings"]
            if "stopped without Python shutting down" in w["message"]]
    if flush_s == "0":  # a summary at every step: nothing lost
        assert said == [] and max(st["step"] for st in facts["steps"]) >= 58
    else:
        seen = max(st["step"] for st in facts["steps"])
        assert seen < 20 and len(said) == 1
        assert said[0].startswith(f"rank 0: steps 0-{seen} of 0-59: the process stopped without Python shutting down")
        assert "TORCHDOCTOR_FLUSH_S" in said[0]


def test_a_cut_summary_is_told_from_a_long_or_profiled_one():
    from torchdoctor.facts import RankFacts, StepTiming
    from torchdoctor.rules.engine import RankInputs
    from torchdoctor.session import summary_cut, verdict_gap

    def facts(n: int, last: int, **kw) -> RankFacts:
        return RankFacts(steps=[StepTiming(step=i, total_ms=1.0) for i in range(n)], last_step=last, **kw)

    assert summary_cut(facts(5, 374)) == (4, 374)
    assert summary_cut(facts(5, 374, ended="exit")) is None  # Python shut down: its last summary came
    assert summary_cut(facts(5, 8)) is None  # most of its steps are there
    # The probe keeps 100,000 steps: a longer job's summary ends there whatever happened.
    assert summary_cut(facts(SUMMARY_STEPS_KEPT, 250_000)) is None
    # Profiled steps are held in the trace, not in the steps' timings.
    assert summary_cut(facts(5, 374, profile_steps=list(range(5, 200)))) is None
    # No "healthy" verdict from the start-up steps a cut summary holds.
    gap = verdict_gap(RankInputs(rank=0, facts=facts(5, 374)))
    assert gap == "rank 0's summary holds steps 0-4 of the 0-374 it ran"


# Rank 0 trains to step 5 and waits there; rank 1 trains to step 3, waits until rank 0 is at step 5
# (a file), then kills itself. torchrun then stops rank 0. Every step number is fixed.
TORCHRUN_RANK_DIES = """
import os, signal, sys, time
import torch

rank, flag = int(os.environ["RANK"]), sys.argv[1]
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6 if rank == 0 else 4):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
if rank == 0:
    open(flag, "w").close()
    signal.pause()  # until torchrun stops it, once rank 1 died
while not os.path.exists(flag):
    time.sleep(0.05)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_torchrun_rank_killed_at_step_3(tmp_path):
    job = script(tmp_path, TORCHRUN_RANK_DIES)
    torchrun = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(job),
                str(tmp_path / "rank0-at-step-5")]
    result = run([PY, "-m", "torchdoctor.runner", "--quiet", "--out", str(tmp_path / "run"), "--", *torchrun])
    assert result.returncode == 1  # torchrun's own code for a failed worker
    by_rank = {e["facts"].get("rank", 0): e["facts"] for e in load_run(tmp_path / "run")["ranks"]}
    # The launcher's probe kept what it reaped: rank 1 killed, rank 0 stopped by torchrun afterwards.
    assert by_rank[1]["exit_code"] == -signal.SIGKILL and by_rank[1]["signal"] == "SIGKILL"
    assert by_rank[1]["last_step"] == 3
    assert by_rank[0]["exit_code"] == -signal.SIGTERM and by_rank[0]["last_step"] == 5
    (spot,) = report_from_run_dir(str(tmp_path / "run")).blind_spots
    assert spot["kind"] == "job-failed" and (spot["rank"], spot["step"], spot["how"]) == (1, 3, "was killed by SIGKILL")
    assert spot["text"].startswith("The job failed (exit code 1): rank 1 was killed by SIGKILL after step 3")
    assert "Then rank 0 was killed by SIGTERM after step 5" in spot["text"]


# --- the exit status a probed parent keeps for its children (no torch needed) -------------------

def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def test_parent_records_the_exit_status_of_probed_children(tmp_path, monkeypatch):
    from multiprocessing import popen_fork

    # Restored after the test: _watch_children patches these process-wide.
    monkeypatch.setattr(subprocess.Popen, "_handle_exitstatus", subprocess.Popen._handle_exitstatus)
    monkeypatch.setattr(popen_fork.Popen, "poll", popen_fork.Popen.poll)
    run_dir = str(tmp_path)
    core._watch_children(type("P", (), {"config": type("C", (), {"run_dir": run_dir})()})())
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(7)"])
    output.Progress(run_dir, proc.pid).write(0, 2, "run")
    proc.wait()
    child = mp.get_context("fork").Process(target=_kill_self)
    child.start()
    output.Progress(run_dir, child.pid).write(1, 5, "run")
    child.join()
    unprobed = subprocess.Popen([sys.executable, "-c", "pass"])  # no progress line: nothing kept
    unprobed.wait()
    exits = output.read_exits(run_dir)
    assert set(exits) == {proc.pid, child.pid}
    payloads = runner.rank_endings(run_dir, [], runner.JobResult(1, 0.0, pid=None))
    facts = {p["facts"]["rank"]: p["facts"] for p in payloads}
    assert (facts[0]["exit_code"], facts[0]["last_step"], facts[0].get("signal")) == (7, 2, None)
    assert (facts[1]["exit_code"], facts[1]["last_step"], facts[1]["signal"]) == (-9, 5, "SIGKILL")


# --- 6. a job that runs its own torch.profiler ---------------------------------------------------

OWN_PROFILER = """
import sys
import torch
from torch.profiler import ProfilerActivity, profile

out = sys.argv[1]
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
prof = profile(activities=[ProfilerActivity.CPU])
for step in range(8):
    if step == 1:
        prof.start()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
    if step == 5:
        prof.stop()
        prof.export_chrome_trace(out)
"""


def test_job_with_its_own_profiler_names_its_traces(tmp_path):
    job = script(tmp_path, OWN_PROFILER)
    own = tmp_path / "own_trace.json"
    result = run_wrapped(tmp_path / "run", job, str(own), options=("--profile-steps", "3:5"))
    assert result.returncode == 0, result.stderr
    assert own.is_file()
    facts = facts_of(tmp_path / "run")
    assert facts["own_profiler"] is True and facts["own_traces"] == [str(own)]
    rep = report_from_run_dir(str(tmp_path / "run"))
    (spot,) = rep.blind_spots
    assert spot["kind"] == "own-profiler" and spot["traces"] == [str(own)]
    assert "ran its own torch.profiler" in spot["text"] and f"torchdoctor analyze {own}" in spot["text"]
    assert rep.healthy is None
    # The named trace is one `torchdoctor analyze` reads.
    assert main(["analyze", str(own), "-q"]) != 2
