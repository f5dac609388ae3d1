"""The job's own command line, for snippets that say how to start the job differently.

A snippet written as ``OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 train.py`` is wrong for a job
started as ``python spawn_ddp.py`` (torch.multiprocessing.spawn), ``accelerate launch`` or a
Lightning script: a live run knows the command it started, so its advice shows that command. A
trace-only analysis knows none and keeps the generic ``python train.py``.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence

GENERIC = "python train.py"

# Launchers that start the ranks as child processes: a profiler must follow the children.
_LAUNCHERS = frozenset({"torchrun", "accelerate", "deepspeed", "lightning", "composer"})
# Launchers whose tasks are not their children (srun's are slurmstepd's, mpirun's the daemons'):
# the profiler goes inside each task.
_REMOTE = frozenset({"srun", "mpirun", "mpiexec"})
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?$")


def job_argv(run: Mapping) -> list[str] | None:
    """The command a live run started (``run.json``'s ``command``), or None (a trace, no command)."""
    command = run.get("command") if isinstance(run, Mapping) else None
    if not isinstance(command, Sequence) or isinstance(command, str) or not command:
        return None
    argv = [a for a in command if isinstance(a, str)]
    return argv if len(argv) == len(command) else None


def job_command(run: Mapping, fallback: str = GENERIC) -> str:
    """The job's command line, quoted for a POSIX shell, or ``fallback`` when it is not known."""
    argv = job_argv(run)
    return shlex.join(argv) if argv else fallback


def is_launcher(argv: Sequence[str]) -> bool:
    """Whether the command starts its ranks as children (torchrun, ``python -m torch.distributed.run``,
    accelerate, deepspeed...): what a py-spy record of it must follow."""
    if not argv:
        return False
    if os.path.basename(argv[0]) in _LAUNCHERS:
        return True
    return _is_python(argv[0]) and len(argv) > 2 and argv[1] == "-m" and argv[2] in (
        "torch.distributed.run", "torch.distributed.launch", "accelerate.commands.launch")


def py_spy(run: Mapping, svg: str, processes: int = 1) -> str:
    """A ``py-spy record`` of the job, following its children where the ranks are child processes
    (a launcher, torch.multiprocessing.spawn: ``processes`` > 1, or a command that is not Python
    itself, such as a shell script); inside each task under srun or mpirun."""
    argv = job_argv(run)
    if argv and os.path.basename(argv[0]) in _REMOTE:
        stem = svg.rsplit(".", 1)[0]
        return f"{argv[0]} ... py-spy record -o {stem}-%p.svg -- python train.py ...   # py-spy inside each task"
    follow = argv is None or processes > 1 or is_launcher(argv) or not _is_python(argv[0])
    return f"py-spy record {'--subprocesses ' if follow else ''}-o {svg} -- {job_command(run)}"


def cprofile(run: Mapping, processes: int = 1) -> str | None:
    """``python -m cProfile -s cumtime SCRIPT ARGS`` (or ``-m MODULE``) for a one-process job started
    as ``python SCRIPT ARGS``; None for several processes (cProfile sees only the parent), a launcher
    or an installed entry point."""
    argv = job_argv(run)
    if argv is None:
        return f"python -m cProfile -s cumtime {GENERIC.split()[-1]}"
    if processes > 1 or len(argv) < 2 or not _is_python(argv[0]) or is_launcher(argv):
        return None
    if argv[1].startswith("-") and not (argv[1] == "-m" and len(argv) > 2):
        return None  # an interpreter option cProfile would take as its own
    return shlex.join([argv[0], "-m", "cProfile", "-s", "cumtime", *argv[1:]])


def _is_python(arg: str) -> bool:
    return bool(_PYTHON.match(os.path.basename(arg)))


def _torchrun_at(argv: Sequence[str]) -> int | None:
    """Where torchrun's own options start in ``argv``, or None when torchrun did not start the job."""
    if os.path.basename(argv[0]) == "torchrun":
        return 1
    if _is_python(argv[0]) and list(argv[1:3]) == ["-m", "torch.distributed.run"]:
        return 3
    return None


def started_by_torchrun(run: Mapping) -> bool | None:
    """Whether torchrun started the job; None when the command is not known (a trace)."""
    argv = job_argv(run)
    return None if argv is None else _torchrun_at(argv) is not None


def torchrun_with(run: Mapping, flag: str, fallback: str) -> str:
    """The job's torchrun command with ``flag`` added to torchrun's own options; ``fallback`` when
    the job was not started by torchrun (or the command is not known)."""
    argv = job_argv(run)
    at = _torchrun_at(argv) if argv else None
    if argv is None or at is None:
        return fallback
    return shlex.join([*argv[:at], flag, *argv[at:]])
