"""`torchdoctor run [options] -- COMMAND...`: diagnose a live training job without code changes.

The wrapper puts the probe's bootstrap directory first on ``PYTHONPATH`` and exports the run
directory; every Python process the command starts (``python train.py``, ``python -m pkg``,
torchrun and its ranks, spawned children) then loads the probe at start-up. The command runs in
its own process group: SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to the wrapper
are forwarded to that group, and when the wrapper owns the terminal the group gets the terminal
(Ctrl-C, Ctrl-Z and reading stdin behave as without the wrapper). The job's stdin, stdout and
stderr are the wrapper's own.

After the job ends the wrapper merges the rank summaries into ``RUN_DIR/run.json`` (schema
``torchdoctor.run/1``), prints the diagnosis to stderr (the job's stdout stays the job's) and
exits with the job's exit status: the same code, or the same signal when the job was killed.

How each rank ended goes into its facts (``last_step``, ``ended``, ``exit_code``, ``signal``): the
probe's progress line gives the last step and whether Python shut down; the exit status is the
job's own for the process the wrapper started, else what the rank's parent (torchrun, mp.spawn,
when probed) recorded when it reaped it (probe/output.py). Nothing is parsed from torchrun's
output: TORCHELASTIC_ERROR_FILE holds nothing for a rank killed by a signal.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from torchdoctor.probe import config as probe_config
from torchdoctor.probe import output, postprocess, workers

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(probe_config.__file__)), "bootstrap")
FORWARDED_SIGNALS = tuple(
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
    if hasattr(signal, name)
)


@dataclass
class JobResult:
    """How the job ended: ``returncode`` as subprocess reports it (negative: killed by that signal)."""

    returncode: int
    duration_s: float
    pid: int | None = None  # the process the wrapper started


def default_run_dir(base: str = "td-runs") -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path, n = os.path.join(base, stamp), 1
    while os.path.exists(path):
        n += 1
        path = os.path.join(base, f"{stamp}-{n}")
    return path


def job_env(
    run_dir: str, profile: tuple[int, int] | None, base: dict[str, str] | None = None
) -> dict[str, str]:
    """The job's environment: the caller's plus the bootstrap on PYTHONPATH and the probe settings."""
    env = dict(os.environ if base is None else base)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != BOOTSTRAP_DIR]
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, *paths])
    env[probe_config.ENV_RUN_DIR] = os.path.abspath(run_dir)
    env[probe_config.ENV_PROFILE_STEPS] = f"{profile[0]}:{profile[1]}" if profile else "off"
    return env


class _Terminal:
    """The controlling terminal, when the wrapper is its foreground process group."""

    def __init__(self) -> None:
        self.fd: int | None = None
        with contextlib.suppress(OSError, ValueError, AttributeError):
            fd = sys.stdin.fileno()
            if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
                self.fd = fd

    def hand_to(self, pgid: int) -> None:
        if self.fd is None:
            return
        # A background group changing the foreground group gets SIGTTOU unless it ignores it.
        previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        try:
            with contextlib.suppress(OSError):
                os.tcsetpgrp(self.fd, pgid)
        finally:
            signal.signal(signal.SIGTTOU, previous)

    def child_setup(self) -> None:
        """Runs in the child before exec: own process group, and the terminal if we had it."""
        os.setpgid(0, 0)
        self.hand_to(os.getpgrp())


def run_job(command: Sequence[str], env: dict[str, str]) -> JobResult:
    """Run ``command`` in its own process group, forwarding signals; return how it ended."""
    terminal = _Terminal()
    child: list[int] = []  # pid once started
    pending: list[int] = []  # signals that arrived while the child was being started

    def forward(signum: int, _frame: object) -> None:
        if not child:
            pending.append(signum)
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child[0], signum)

    # A signal ignored by whoever started us (`nohup`, or `cmd &` in a script: SIGINT and SIGQUIT)
    # stays ignored, so the job inherits the ignore across exec exactly as it would without us.
    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS
                if signal.getsignal(sig) != signal.SIG_IGN}
    start = time.monotonic()
    try:
        proc = subprocess.Popen(list(command), env=env, preexec_fn=terminal.child_setup)
        child.append(proc.pid)
        for signum in pending:
            forward(signum, None)
        returncode = _wait(proc.pid, terminal)
        proc.returncode = returncode  # reaped by us: keep Popen from waiting again
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        terminal.hand_to(os.getpgrp())
    return JobResult(returncode, time.monotonic() - start, proc.pid)


def _wait(pid: int, terminal: _Terminal) -> int:
    flags = os.WUNTRACED if terminal.fd is not None else 0
    while True:
        _, status = os.waitpid(pid, flags)
        if os.WIFSTOPPED(status):
            # Ctrl-Z stopped the job: stop ourselves too, so the shell gets its prompt back; on
            # `fg` the shell continues us and we continue the job.
            terminal.hand_to(os.getpgrp())
            os.kill(os.getpid(), signal.SIGSTOP)
            terminal.hand_to(pid)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGCONT)
            continue
        return os.waitstatus_to_exitcode(status)


def write_manifest(run_dir: str, command: Sequence[str], job: JobResult) -> dict:
    """Merge the rank summaries into ``run.json``; return the manifest."""
    postprocess.settle(run_dir)  # first, the traces the job handed to post-processing children
    manifest: dict = {
        "schema": output.RUN_SCHEMA,
        "command": list(command),
        "exit_code": job.returncode,
        "duration_s": round(job.duration_s, 3),
        "ranks": rank_endings(run_dir, output.read_payloads(run_dir), job),
    }
    workers.settle(run_dir, manifest["ranks"])  # DataLoader workers' last counters (probe/workers.py)
    attach_rewrites(manifest["ranks"])
    if job.returncode < 0:
        with contextlib.suppress(ValueError):
            manifest["signal"] = signal.Signals(-job.returncode).name
    output.write_json(os.path.join(run_dir, "run.json"), manifest)
    return manifest


def attach_rewrites(payloads: list[dict]) -> None:
    """Rewrite each data-dependent branch that broke the graph (compile/rewrite.py) and validate
    the rewrite in a child Python, after the job (never inside it). Once per source line."""
    from torchdoctor.compile.rewrite import rewrite
    from torchdoctor.compile.rewrite_check import check

    done: dict[str, tuple[str, bool | None, str] | None] = {}
    for payload in payloads:
        for b in (payload.get("facts") or {}).get("compile", {}).get("breaks", []) or []:
            loc = b.get("location")
            if not isinstance(loc, str) or b.get("reason") != "Data-dependent branching" or ":" not in loc:
                continue
            if loc not in done:
                path, _, line = loc.rpartition(":")
                rw = rewrite(path, int(line)) if line.isdigit() else None
                done[loc] = (rw.diff, *check(rw)) if rw is not None else None
            if done[loc] is not None:
                b["rewrite"], b["rewrite_ok"], b["rewrite_check"] = done[loc]


def rank_endings(run_dir: str, payloads: list[dict], job: JobResult) -> list[dict]:
    """Add how each rank ended to its facts; a rank known only by its progress line (killed
    before its first summary) gets a payload of its own. Returns the payloads."""
    progress = output.read_progress(run_dir)
    exits = output.read_exits(run_dir)
    for payload in payloads:
        facts = payload["facts"]
        pid = facts.get("pid")
        line = progress.pop(pid, None) if isinstance(pid, int) else None
        _ending(facts, line, exits.get(pid) if isinstance(pid, int) else None, job)
    for pid, line in sorted(progress.items(), key=lambda kv: (kv[1]["rank"], kv[0])):
        facts = {"rank": line["rank"], "pid": pid}
        _ending(facts, line, exits.get(pid), job)
        payloads.append({"facts": facts, "analysis": None})
    return payloads


def _ending(facts: dict, line: dict | None, exited: dict | None, job: JobResult) -> None:
    if line is not None:
        previous = facts.get("last_step")
        if line["step"] is not None and (previous is None or previous < line["step"]):
            facts["last_step"] = line["step"]
        if line["state"] != "run":
            facts["ended"] = line["state"]
    code = job.returncode if facts.get("pid") == job.pid else (exited or {}).get("returncode")
    if code is None:
        return
    facts["exit_code"] = code
    if exited is not None and isinstance(exited.get("time"), int | float):
        facts["exit_time"] = exited["time"]
    if code < 0:
        with contextlib.suppress(ValueError):
            facts["signal"] = signal.Signals(-code).name


def exit_like(returncode: int) -> int:
    """The wrapper's exit code for the job's ``returncode``; a job killed by a signal kills us the same way."""
    if returncode >= 0:
        return returncode
    sig = -returncode
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    with contextlib.suppress(Exception):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the job's crash, not ours: no core file
    with contextlib.suppress(Exception):  # SIGKILL and SIGSTOP refuse a handler: kill anyway
        signal.signal(sig, signal.SIG_DFL)
    with contextlib.suppress(Exception):
        os.kill(os.getpid(), sig)
    return 128 + sig  # the signal did not end us (blocked or ignored): the shell's convention


def report_run(run_dir: str, args: argparse.Namespace) -> int | None:
    """Print the diagnosis of a finished run (stderr) and write --json/--html; return emit's code."""
    try:
        from torchdoctor.cli import config_from_args, emit
        from torchdoctor.session import report_from_run_dir
    except ImportError as exc:
        print(f"torchdoctor: no report: {exc}", file=sys.stderr)
        return None
    try:
        # --config / --ignore, looked up from the directory the command was started in.
        config = getattr(args, "rule_config", None) or config_from_args(args)
        report = report_from_run_dir(run_dir, config=config)
        with contextlib.redirect_stdout(sys.stderr):
            return emit(report, args)
    except Exception as exc:  # the job's exit status matters more than our report
        print(f"torchdoctor: could not build the report: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


def execute(
    command: Sequence[str], run_dir: str, profile: tuple[int, int] | None, args: argparse.Namespace
) -> int:
    """Run, record, report; return the wrapper's exit code (see ``exit_like``)."""
    output.clear(run_dir)  # a reused --out must not mix two runs
    os.makedirs(os.path.join(run_dir, output.RANKS_DIR), exist_ok=True)
    try:
        job = run_job(command, {**job_env(run_dir, profile), **cache_env(getattr(args, "cache", None))})
    except (FileNotFoundError, PermissionError) as exc:
        print(f"torchdoctor: cannot run {command[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127 if isinstance(exc, FileNotFoundError) else 126
    manifest = write_manifest(run_dir, command, job)
    if not manifest["ranks"] and job.returncode == 0:  # a failed job: the report says when it ended
        print(
            "torchdoctor: no rank wrote a summary: the probe saw no training (it follows torch.optim "
            "optimizers, autograd's backward and DataLoaders, not torch.distributed.rpc's distributed "
            "autograd and optimizer), or Python ran with -I/-S/-E (the probe loads through PYTHONPATH "
            "and sitecustomize)",
            file=sys.stderr,
        )
    emitted = report_run(run_dir, args)
    print(
        f"torchdoctor: run directory {run_dir} (render again with `torchdoctor analyze {run_dir}`)",
        file=sys.stderr,
    )
    if job.returncode == 0 and emitted == 3:  # --fail-on gate of a job that itself succeeded
        return 3
    return exit_like(job.returncode)


def cmd_run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print(
            "torchdoctor: run: give the command after --, e.g. torchdoctor run -- python train.py",
            file=sys.stderr,
        )
        return 2
    try:
        profile = probe_config.parse_steps(args.profile_steps)
    except ValueError as exc:
        print(f"torchdoctor: run: {exc}", file=sys.stderr)
        return 2
    return execute(command, args.out or default_run_dir(), profile, args)


def cache_env(pack: str | None) -> dict[str, str]:
    """The environment that makes every rank load `pack` (probe/compile_cache.py); empty, with one
    line on stderr, when it is not a usable pack (the job then compiles cold)."""
    if not pack:
        return {}
    from torchdoctor.compile.cachepack import PackError, open_pack

    try:
        z, _ = open_pack(pack)
        z.close()
    except PackError as exc:
        print(f"torchdoctor: cache pack not loaded: {exc} (the job compiles cold)", file=sys.stderr)
        return {}
    return {"TORCHDOCTOR_CACHE_PACK": os.path.abspath(pack)}


def add_run_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``run`` on the ``torchdoctor`` command line."""
    p = subparsers.add_parser(
        "run",
        help="run a training command under the probe and diagnose it when it ends",
        description="Run COMMAND (python script, python -m module, torchrun ...) with every Python "
        "process instrumented; print the diagnosis when it ends. The exit status is the job's.",
    )
    p.add_argument("--out", metavar="DIR", help="run directory (default: ./td-runs/<timestamp>)")
    p.add_argument(
        "--profile-steps",
        metavar="A:B|off",
        default=f"{probe_config.DEFAULT_PROFILE_STEPS[0]}:{probe_config.DEFAULT_PROFILE_STEPS[1]}",
        help="torch.profiler window: steps A <= s < B (default %(default)s; when steps are long, "
        "fewer: about 5 s of them, one at least); 'off' disables it",
    )
    p.add_argument("--cache", metavar="PACK",
                   help="load this compile-cache pack (`torchdoctor cache pack`) before the job compiles; "
                        "one made for another environment is refused and the job compiles cold")
    add_report_options(p)
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND...")
    p.set_defaults(func=cmd_run)
    return p


def add_report_options(p: argparse.ArgumentParser) -> None:
    """The report options of ``torchdoctor analyze`` (--json, --html, --verbose, ...)."""
    try:
        from torchdoctor.cli import add_output_options
    except ImportError:
        p.add_argument("--json", metavar="FILE")
        p.add_argument("--html", metavar="FILE")
        return
    add_output_options(p)


def main(argv: list[str] | None = None) -> int:
    """``python -m torchdoctor.runner -- COMMAND...`` (the same as ``torchdoctor run``)."""
    parser = argparse.ArgumentParser(prog="python -m torchdoctor.runner")
    sub = parser.add_subparsers(dest="subcommand", required=True)
    add_run_parser(sub)
    args = parser.parse_args(["run", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
