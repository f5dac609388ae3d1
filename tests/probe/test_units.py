"""Probe building blocks without a training job: clock, run-directory layout, shims, hooks, bootstrap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest

from torchdoctor.probe import imphook, output, shims, sysinfo
from torchdoctor.probe.clock import REUSE_READ_S, Phase, Source, StepClock
from torchdoctor.runner import BOOTSTRAP_DIR


def test_clock_optimizer_steps_and_skipped_window():
    clock = StepClock(skip=lambda step: step == 1)
    clock.begin(0.0)
    for i in range(3):
        clock.add(Phase.FORWARD, 0.010)
        clock.add(Phase.BACKWARD, 0.020)
        assert clock.boundary(Source.OPTIMIZER, 0.1 * (i + 1)) == i
        clock.resume(0.1 * (i + 1))
    assert [s.step for s in clock.steps] == [0, 2]
    # The skipped (profiled) step is kept apart, with what ran in it (a save is the job's own).
    assert [(s.step, s.total_ms, s.forward_ms) for s in clock.profiled_steps] == [(1, 100.0, 10.0)]
    step = clock.steps[0]
    assert (step.total_ms, step.forward_ms, step.backward_ms, step.other_ms) == (100.0, 10.0, 20.0, 70.0)
    clock.attribute_comm(2, 0.005)
    assert (clock.steps[1].comm_ms, clock.steps[1].backward_ms) == (5.0, 15.0)
    assert clock.steps[1].comm_sampled and not clock.steps[0].comm_sampled  # DDP timed step 2 only


def test_profiled_steps_are_the_finished_windows_only():
    """A step 0 that a stronger step source folded while the window ran closes inside it, and is
    skipped with the window's steps: it is none of them (nor is any step of an unfinished window)."""
    from types import SimpleNamespace

    from torchdoctor.probe.summary import _profiled_steps

    clock = StepClock(skip=lambda step: True)
    clock.begin(0.0)
    for now in (0.8, 0.9, 1.0):
        clock.boundary(Source.OPTIMIZER, now)
        clock.resume(now)
    clock.index, clock.started_at = 5, 1.0
    for now in (1.1, 1.2, 1.3):
        clock.boundary(Source.OPTIMIZER, now)
        clock.resume(now)
    assert [s.step for s in clock.profiled_steps] == [0, 1, 2, 5, 6, 7]
    assert [s.step for s in _profiled_steps(SimpleNamespace(profiled=[5, 8], clock=clock))] == [5, 6, 7]
    assert _profiled_steps(SimpleNamespace(profiled=[], clock=clock)) == []


def test_clock_folds_micro_batches_into_the_first_optimizer_step():
    clock = StepClock()
    clock.begin(0.0)
    for i in range(4):  # gradient accumulation: four backward calls, then one optimizer step
        clock.add(Phase.BACKWARD, 0.01)
        clock.boundary(Source.BACKWARD, 0.1 * (i + 1))
        clock.resume(0.1 * (i + 1))
        assert clock.boundary(Source.DATALOADER, 0.1 * (i + 1)) is None  # weaker source: ignored
    assert clock.boundary(Source.OPTIMIZER, 0.5) == 0
    (step,) = clock.steps
    assert (step.step, step.total_ms, step.backward_ms) == (0, 500.0, 40.0)
    clock.resume(0.5)
    clock.add(Phase.BACKWARD, 0.01)
    assert clock.boundary(Source.BACKWARD, 0.6) is None  # backward no longer marks steps
    assert clock.boundary(Source.OPTIMIZER, 0.7) == 1


def test_clock_dataloader_fallback():
    clock = StepClock()
    assert clock.boundary(Source.DATALOADER, 1.0) is None  # the first batch request opens step 0
    clock.add(Phase.DATALOADER, 0.25)
    assert clock.boundary(Source.DATALOADER, 2.0) == 0
    assert clock.steps[0].dataloader_ms == 250.0 and clock.source == Source.DATALOADER


def test_clock_records_the_training_threads_scheduler_counters_per_step():
    reads = iter([(0, 0), (8_000_000, 2_000_000),  # step 0: 8 ms on a CPU, 2 ms waiting for one
                  (9_000_000, 2_500_000), (12_000_000, 9_500_000)])  # housekeeping between, then step 1
    clock = StepClock(sched=lambda: next(reads))
    clock.begin(0.0)
    assert clock.boundary(Source.OPTIMIZER, 0.010) == 0
    clock.resume(0.011)
    assert clock.boundary(Source.OPTIMIZER, 0.021) == 1
    s0, s1 = clock.steps
    assert (s0.thread_cpu_ms, s0.run_delay_ms) == (8.0, 2.0)
    assert (s1.thread_cpu_ms, s1.run_delay_ms) == (3.0, 7.0)  # the gap between the steps is no step's
    plain = StepClock()
    plain.begin(0.0)
    plain.boundary(Source.OPTIMIZER, 0.01)
    assert plain.steps[0].run_delay_ms is None and plain.steps[0].thread_cpu_ms is None


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"), reason="Linux schedstat only")
def test_schedstat_sees_a_thread_wait_for_a_cpu_held_by_a_busy_process():
    """Real counters: pinned to one CPU beside a busy loop, the thread waits for about half of the time."""
    cpu = min(os.sched_getaffinity(0))
    busy = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}}); "
                             "[0 for _ in iter(int, 1)]"])
    mask = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {cpu})
        import time as _time

        _time.sleep(0.3)  # the loop is spinning
        reader = sysinfo.ThreadSchedstat()
        on0, wait0 = reader.read()
        t0 = _time.perf_counter()
        while _time.perf_counter() - t0 < 0.6:
            pass
        on1, wait1 = reader.read()
    finally:
        os.sched_setaffinity(0, mask)
        busy.kill()
        busy.wait()
    wall = 0.6e9
    assert 0.2 * wall < wait1 - wait0 < 0.8 * wall and 0.2 * wall < on1 - on0 < 0.8 * wall
    assert sysinfo.cpus_busy_s([cpu]) > 0 and sysinfo.cpus_busy_s([]) >= sysinfo.cpus_busy_s([cpu])


def payload(rank, pid, steps):
    return {"facts": {"rank": rank, "pid": pid, "steps": steps}, "analysis": None}


def test_run_directory_merge_prefers_own_files(tmp_path):
    run = str(tmp_path)
    output.write_json(output.own_path(run, 0, 11), payload(0, 11, [1, 2, 3]))
    output.write_gathered(run, [payload(0, 11, [1]), payload(1, 12, [1])])
    merged = output.read_payloads(run)
    assert [(p["facts"]["rank"], len(p["facts"]["steps"])) for p in merged] == [(0, 3), (1, 1)]
    # A second process claiming rank 0 (no process group) gets its own file.
    assert output.own_path(run, 0, 99).endswith("rank0.pid99.json")
    assert output.own_path(run, 0, 11).endswith("rank0.json")
    (tmp_path / "notes.txt").write_text("mine")
    output.clear(run)
    assert output.read_payloads(run) == [] and (tmp_path / "notes.txt").exists()


def _raiser():
    raise ValueError("boom")


def _warner():
    warnings.warn("from inside", UserWarning, stacklevel=2)


def test_shims_are_transparent():
    seen = []
    shim = shims.around(_raiser, lambda args: "token", lambda t, a, r: seen.append((t, r)), seen.append)
    with pytest.raises(ValueError) as info:
        shim()
    assert seen == [("token", shims.FAILED)]
    shims.strip_exception(info.value)
    frames = []
    tb = info.value.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    assert shims.SHIM_FILENAME not in frames and frames[-1] == __file__
    # A failing probe callback never stops the original call.
    failing = shims.before_only(lambda x: x * 2, lambda args: 1 / 0, seen.append)
    assert failing(21) == 42 and isinstance(seen[-1], ZeroDivisionError)
    # stacklevel=2 warnings name the caller, not the shim.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        shims.around(_warner, lambda a: None, lambda t, a, r: None, seen.append)()
    assert caught[0].filename == __file__


def test_post_import_hook(tmp_path, monkeypatch):
    (tmp_path / "td_fresh_module.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    got = []
    imphook.when_imported("td_fresh_module", lambda m: got.append(m.VALUE))
    import td_fresh_module  # noqa: F401

    assert got == [7]
    assert not any(isinstance(f, imphook._PostImportFinder) for f in sys.meta_path)
    imphook.when_imported("td_fresh_module", lambda m: got.append(-m.VALUE))  # already imported: at once
    assert got == [7, -7]


PROBE_STATE = (
    "import json, os, sys; print(json.dumps({'torch': 'torch' in sys.modules, "
    "'td': 'torchdoctor.probe.bootstrap' in sys.modules, 'marker': os.environ.get('USER_SITE_RAN'), "
    "'site': getattr(sys.modules.get('sitecustomize'), '__file__', None), "
    "'bootstrap_on_path': any(os.path.abspath(p) == %r for p in sys.path)}))"
)


def _start(tmp_path, run_dir, user_site):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR_")}
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, str(user_site)])
    if run_dir:
        env["TORCHDOCTOR_RUN_DIR"] = str(run_dir)
    code = PROBE_STATE % BOOTSTRAP_DIR
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_bootstrap_chain_loads_the_users_sitecustomize(tmp_path):
    user_site = tmp_path / "site"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = 'yes'\n")
    active = json.loads(_start(tmp_path, tmp_path / "run", user_site).stdout)
    assert active == {
        "torch": False,
        "td": True,
        "marker": "yes",
        "site": str(user_site / "sitecustomize.py"),
        "bootstrap_on_path": False,
    }
    idle = json.loads(_start(tmp_path, None, user_site).stdout)
    assert idle["td"] is False and idle["marker"] == "yes"


def test_broken_user_sitecustomize_reports_as_usual(tmp_path):
    user_site = tmp_path / "site"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text("raise RuntimeError('user site broke')\n")
    plain_env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR_")}
    plain_env["PYTHONPATH"] = str(user_site)
    plain = subprocess.run([sys.executable, "-c", "print(1)"], env=plain_env, capture_output=True, text=True)
    wrapped = _start(tmp_path, tmp_path / "run", user_site)
    assert "Error in sitecustomize" in plain.stderr and plain.stderr == wrapped.stderr


def test_a_child_process_reading_that_fails_leaves_the_step_clock_running(tmp_path, monkeypatch):
    """The first training activity also reads the job's child processes (probe/sysinfo.py): that
    reading runs inside the training hooks, so a failure there is a probe error said once, and the
    clock starts and closes steps as without it."""
    import torch

    from torchdoctor.probe import sysinfo
    from torchdoctor.probe.config import ProbeConfig
    from torchdoctor.probe.core import Probe
    from torchdoctor.probe.errors import ERRORS

    def broken() -> list[int]:
        raise RuntimeError("no /proc here")

    monkeypatch.setattr(sysinfo, "child_pids", broken)
    probe = Probe(torch, ProbeConfig(run_dir=str(tmp_path), profile=None))  # not installed: torch untouched
    try:
        probe.activity(1.0)
        probe.boundary(Source.OPTIMIZER, 2.0)
        assert [s.step for s in probe.clock.steps] == [0] and probe.clock.running
        assert probe.progress is not None  # the rest of the first activity ran (its progress line)
        assert any(m.startswith("child processes: RuntimeError") for m in ERRORS.messages)
    finally:
        ERRORS.reset()


def test_a_failing_boundary_still_closes_the_step(tmp_path):
    import torch

    from torchdoctor.probe.config import ProbeConfig
    from torchdoctor.probe.core import Probe
    from torchdoctor.probe.errors import ERRORS, set_fault

    probe = Probe(torch, ProbeConfig(run_dir=str(tmp_path), profile=None))  # not installed: torch untouched
    set_fault("boundary")
    try:
        probe.activity(1.0)
        probe.boundary(Source.OPTIMIZER, 2.0)
        assert [s.step for s in probe.clock.steps] == [0] and probe.clock.running
        assert any(m.startswith("boundary: RuntimeError") for m in ERRORS.messages)
    finally:
        set_fault(None)
        ERRORS.reset()


def test_private_loader_state_that_does_not_read_marks_its_site_broken():
    """batch_ready reads DataLoader iterator internals; a torch where they differ is detected once."""
    pytest.importorskip("torch")
    from torchdoctor.probe import hooks
    from torchdoctor.probe.errors import ERRORS

    class Queue:
        def __init__(self, n: int) -> None:
            self.n = n

        def qsize(self) -> int:
            return self.n

    class Iterator:  # the shape of _MultiProcessingDataLoaderIter that batch_ready reads
        _task_info: dict = {}
        _rcvd_idx = 0

        def __init__(self, n: int) -> None:
            self._data_queue = Queue(n)

    saved = set(ERRORS.broken), list(ERRORS.messages)
    try:
        assert hooks.batch_ready(Iterator(1)) is True and hooks.batch_ready(Iterator(0)) is False
        assert "dataloader.batch_ready" not in hooks.BROKEN
        assert hooks.batch_ready(object()) is None
        assert "dataloader.batch_ready" in hooks.BROKEN
        assert any("batch_ready" in m for m in ERRORS.messages)
        ERRORS.reset()  # in place: the hooks' reference sees it
        assert "dataloader.batch_ready" not in hooks.BROKEN
    finally:
        ERRORS.reset()
        ERRORS.broken.update(saved[0])
        ERRORS.messages.extend(saved[1])


def test_ddp_logging_data_that_raises_is_guarded_and_never_called_again(tmp_path):
    torch = pytest.importorskip("torch")
    import weakref

    from torchdoctor.facts import DDPFacts
    from torchdoctor.probe.config import ProbeConfig
    from torchdoctor.probe.core import Probe
    from torchdoctor.probe.errors import ERRORS
    from torchdoctor.probe.summary import DDPRecord

    class Ddp:
        calls = 0

        def _get_ddp_logging_data(self):
            Ddp.calls += 1
            raise RuntimeError("no logger on this torch")

    ddp = Ddp()
    probe = Probe(torch, ProbeConfig(run_dir=str(tmp_path), profile=None))
    probe.ddps.append(DDPRecord(weakref.ref(ddp), DDPFacts()))
    try:
        for step in range(3):
            probe._after_step(step)  # the step-boundary housekeeping that reads DDP's stats
        assert Ddp.calls == 1 and "ddp.logging_data" in ERRORS.broken
    finally:
        ERRORS.reset()


def test_a_step_resumed_at_once_starts_from_the_counters_read_when_the_last_one_closed():
    # Two syscalls a step fewer: with no housekeeping worth the name between two steps, the
    # readings taken at the close are the next step's start; after a long pause they are read again.
    calls = []

    def sched():
        calls.append("sched")
        return (len(calls) * 1_000_000, 0)

    def faults():
        calls.append("faults")
        return (len(calls), 0)

    clock = StepClock(sched=sched, faults=faults)
    clock.begin(0.0)
    assert len(calls) == 2
    clock.boundary(Source.OPTIMIZER, 0.010)
    clock.resume(0.010 + REUSE_READ_S / 2)
    assert len(calls) == 4  # closing reads only: reused as step 1's start
    clock.boundary(Source.OPTIMIZER, 0.020)
    clock.resume(0.020 + 10 * REUSE_READ_S)
    assert len(calls) == 8  # a long pause (a flush, the profiler window): read afresh
    clock.boundary(Source.OPTIMIZER, 0.030)
    s0, s1, s2 = clock.steps
    # step 1 runs from the close of step 0 (reads 3, 4) to its own close (reads 5, 6)
    assert s1.thread_cpu_ms == (6 - 4) and s1.minor_faults == 5 - 3
    assert s2.thread_cpu_ms == (10 - 7) and s2.minor_faults == 9 - 8  # start: reads 7 (sched), 8 (faults)


def test_clock_records_the_training_threads_page_faults_and_system_time_per_step():
    faults = iter([(100, 0), (2600, 4_000_000), (2610, 4_100_000), (2620, 4_200_000)])
    clock = StepClock(sched=lambda: (0, 0), faults=lambda: next(faults))
    clock.begin(0.0)
    clock.boundary(Source.OPTIMIZER, 0.010)
    clock.resume(0.011)
    clock.boundary(Source.OPTIMIZER, 0.021)
    s0, s1 = clock.steps
    assert (s0.minor_faults, s0.thread_sys_ms) == (2500, 4.0)
    assert (s1.minor_faults, s1.thread_sys_ms) == (10, 0.1)
    plain = StepClock()
    plain.begin(0.0)
    plain.boundary(Source.OPTIMIZER, 0.01)
    assert plain.steps[0].minor_faults is None and plain.steps[0].thread_sys_ms is None


@pytest.mark.skipif(sysinfo.thread_faults() is None, reason="getrusage(RUSAGE_THREAD) is Linux only")
def test_thread_faults_counts_the_pages_this_thread_touches_first():
    import mmap

    before = sysinfo.thread_faults()
    region = mmap.mmap(-1, 8 * 2**20)  # fresh anonymous pages: each first write faults one in
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        region.madvise(mmap.MADV_NOHUGEPAGE)  # 4 KiB pages even where transparent huge pages are on
    for offset in range(0, len(region), mmap.PAGESIZE):
        region[offset] = 1
    after = sysinfo.thread_faults()
    region.close()
    assert after[0] - before[0] >= 8 * 2**20 // mmap.PAGESIZE
    assert after[1] >= before[1]


def test_a_window_of_long_steps_profiles_fewer_of_them():
    """The default window is 3 steps; at most WINDOW_BUDGET_S of them are profiled, at least one."""
    from torchdoctor.probe.window import WINDOW_BUDGET_S, ProfilerWindow

    assert WINDOW_BUDGET_S == 5.0
    cases = [([], 8), ([40.0, 50.0, 45.0], 8), ([2100.0, 2000.0, 1900.0], 7), ([30_000.0], 6)]
    for recent_ms, end in cases:
        window = ProfilerWindow(5, 8)
        window.fit(recent_ms)
        assert (window.start_step, window.end_step) == (5, end), recent_ms
