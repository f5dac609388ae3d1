"""What happens to a profiler window's trace after the training thread let go of it.

The training thread only stops the profiler and has Kineto write the plain JSON
(``traces/rank{R}.json``: ``export_chrome_trace`` holds the GIL, so a thread would stall the job
just the same). Compressing it and analysing it take seconds on a large GPU trace, so they run in
a detached, low-priority child process (``python -m torchdoctor.probe.postprocess``) that the
job never waits for:

    traces/rank{R}.json          Kineto's output; removed once compressed
    traces/rank{R}.json.gz       the trace, written atomically by the child
    traces/rank{R}.pending       the child's pid while it works
    ranks/rank{R}.analysis.json  the child's RankResult (as builtins), written atomically

The wrapper (``torchdoctor run``) calls ``settle`` after the job: it waits for children still
working, and does the work itself for a trace whose child never started or died. A rank's
analysis reaches the gathered snapshot only when it was ready at gather time; the wrapper's
merge (``output.read_payloads``) attaches the analysis files of its own machine.
This module imports no torch.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import signal
import subprocess
import sys
import time

from torchdoctor.probe import output

_STRIP_ENV = ("TORCHDOCTOR_RUN_DIR", "TORCHDOCTOR_REMEDIES", "TORCHDOCTOR_PROBE_FAULT")


# Process ids of the detached children this process started (their CPU time is the probe's).
STARTED: list[int] = []


def paths(run_dir: str, rank: int | str) -> tuple[str, str, str, str]:
    """(raw JSON, gzipped trace, pending marker, analysis) of one rank's window (`rank`: the rank,
    or the slot name output.claim_trace_slot gave)."""
    gz = output.trace_path(run_dir, rank)
    raw = gz.removesuffix(".gz")
    return raw, gz, raw.removesuffix(".json") + ".pending", output.analysis_path(run_dir, rank)


def start(run_dir: str, rank: int | str) -> bool:
    """Hand the raw trace of ``rank`` to a detached child; False when no child could be started
    (the wrapper then does the work after the job)."""
    raw, gz, pending, analysis = paths(run_dir, rank)
    env = {k: v for k, v in os.environ.items() if k not in _STRIP_ENV}  # the child is not probed
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    log = _log_path(raw)
    try:
        with open(log, "wb") as err:
            child = subprocess.Popen(
                [sys.executable, "-m", "torchdoctor.probe.postprocess", raw, gz, pending, analysis],
                env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                start_new_session=True,  # the job's signals (Ctrl-C to its group) do not reach it
            )
        STARTED.append(child.pid)  # the probe's own work: not the job's child processes (summary.cpu_facts)
        lowest_priority(child.pid)
        _write_atomic(pending, str(child.pid).encode())
        child.returncode = 0  # never waited for here; keep Popen's destructor quiet
        return True
    except OSError:
        return False


def work(raw: str, gz: str, pending: str, analysis: str) -> None:
    """Compress ``raw`` into ``gz``, then analyse it into ``analysis``; the pending marker goes last."""
    try:
        if os.path.exists(raw):
            tmp = f"{gz}.tmp{os.getpid()}"
            with open(raw, "rb") as src, gzip.open(tmp, "wb", compresslevel=5) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            os.replace(tmp, gz)
            os.remove(raw)
        result = _analyze(gz)
        if result is not None:
            output.write_json(analysis, result)
    finally:
        with contextlib.suppress(OSError):
            os.remove(pending)


def _analyze(gz: str) -> dict | None:
    try:
        import msgspec

        from torchdoctor.session import analyze_rank_file
    except ImportError:
        return None  # an analysis-less install: `torchdoctor analyze` can still read the trace
    try:
        # The probe chose a steady-state window: every step of it counts.
        return msgspec.to_builtins(analyze_rank_file(gz, steps="all"))
    except Exception as exc:
        print(f"torchdoctor: analysis of {gz} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


def read_analysis(run_dir: str, rank: int | str) -> dict | None:
    """The analysis the child wrote for ``rank``, if it is there yet (never waits)."""
    return output.load_dict(output.analysis_path(run_dir, rank))


def discard(run_dir: str, rank: int | str) -> None:
    """Drop a window's trace and analysis that the job has since made obsolete (steps renumbered).

    The child still working on it is killed first (it is ours, and the next window reuses its
    paths), so neither its trace nor its analysis can land after the next window's. Never waits.
    """
    raw, gz, pending, analysis = paths(run_dir, rank)
    with contextlib.suppress(OSError, ValueError), open(pending, encoding="utf-8") as f:
        pid = int(f.read().strip() or 0)
        if pid > 0 and _is_our_child(pid):
            os.kill(pid, signal.SIGKILL)
    folder = os.path.dirname(gz)
    leftovers = [raw, gz, pending, analysis, _log_path(raw)]
    with contextlib.suppress(OSError):  # the killed child's half-written temporary files
        prefix = os.path.basename(gz) + ".tmp"
        leftovers += [os.path.join(folder, n) for n in os.listdir(folder) if n.startswith(prefix)]
    for path in leftovers:
        with contextlib.suppress(OSError):
            os.remove(path)


def _is_our_child(pid: int) -> bool:
    """Whether ``pid`` still runs this module (not a process that reused a dead child's pid);
    True where /proc cannot tell, and while the command line is still empty: a child that has
    just called execve has no arguments mapped yet (the suite caught that window)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        return not cmdline or b"torchdoctor.probe.postprocess" in cmdline
    except FileNotFoundError:
        return False  # gone already
    except OSError:
        return True


def settle(run_dir: str, timeout_s: float = 300.0) -> None:
    """After the job: wait for working children, then finish what none will (wrapper side)."""
    traces = os.path.join(run_dir, output.TRACES_DIR)
    if not os.path.isdir(traces):
        return
    deadline = time.monotonic() + timeout_s
    for name in sorted(os.listdir(traces)):
        if name.endswith(".pending"):
            _wait_for(os.path.join(traces, name), deadline)
    for name in sorted(os.listdir(traces)):
        base = name.removesuffix(".json")
        if name.endswith(".json") and output.SLOT.fullmatch(base):
            # A raw trace nobody compressed: its child never started, died or timed out.
            work(*paths(run_dir, base))


def _wait_for(pending: str, deadline: float) -> None:
    try:
        with open(pending, encoding="utf-8") as f:
            pid = int(f.read().strip() or 0)
    except (OSError, ValueError):
        return
    while pid and os.path.exists(pending):
        try:
            if time.monotonic() >= deadline:
                os.kill(pid, signal.SIGKILL)  # stuck: settle() takes its work over
                break
            os.kill(pid, 0)
        except ProcessLookupError:
            break  # the child is gone; settle() finishes its work
        except PermissionError:
            break  # not ours (the pid was reused)
        time.sleep(0.05)
    with contextlib.suppress(OSError):
        os.remove(pending)


def _write_atomic(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _log_path(raw: str) -> str:
    return raw.removesuffix(".json") + ".postprocess.log"


def lowest_priority(pid: int = 0) -> None:
    """Let process ``pid`` (0: this one) take only CPU time the job leaves idle.

    nice alone is not enough: the child runs in a session of its own, and with autogroup
    scheduling (Linux's default on desktops and many servers) each session is a group that gets
    an equal share of the CPU whatever the nice values inside it. So the group's nice is raised
    too (/proc/<pid>/autogroup), and the child gets SCHED_IDLE where the kernel offers it.
    The job lowers its child right after starting it, before the interpreter's start-up and
    imports run: at normal priority they slowed the job's next step 6x on 2 CPUs (LBFGS test
    job, 100 ms against 16 ms without the child).
    """
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, pid, 19)
    with contextlib.suppress(OSError), open(f"/proc/{pid or 'self'}/autogroup", "w") as f:
        f.write("19")
    if hasattr(os, "SCHED_IDLE"):
        with contextlib.suppress(OSError):
            os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))


def main(argv: list[str]) -> int:
    lowest_priority()
    work(*argv)
    with contextlib.suppress(OSError):
        if os.fstat(2).st_size == 0:
            os.remove(_log_path(argv[0]))  # nothing went wrong: leave no empty log behind
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
