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
_LAUNCHERS = frozenset({"torchrun", "accelerate", "deepspeed", "lightning", "mpirun", "srun", "composer"})
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


def py_spy(run: Mapping, svg: str) -> str:
    """A ``py-spy record`` of the job, following its children when a launcher starts the ranks."""
    argv = job_argv(run)
    follow = "--subprocesses " if argv is None or is_launcher(argv) else ""
    return f"py-spy record {follow}-o {svg} -- {job_command(run)}"


def cprofile(run: Mapping) -> str | None:
    """``python -m cProfile -s cumtime SCRIPT ARGS`` for a job started as ``python SCRIPT ARGS``;
    None for a launcher or an installed entry point (cProfile cannot run those by name)."""
    argv = job_argv(run)
    if argv is None:
        return f"python -m cProfile -s cumtime {GENERIC.split()[-1]}"
    if len(argv) < 2 or not _is_python(argv[0]) or argv[1].startswith("-"):
        return None
    return shlex.join([argv[0], "-m", "cProfile", "-s", "cumtime", *argv[1:]])


def _is_python(arg: str) -> bool:
    return bool(_PYTHON.match(os.path.basename(arg)))


def torchrun_with(run: Mapping, flag: str, fallback: str) -> str:
    """The job's torchrun command with ``flag`` added to torchrun's own options; ``fallback`` when
    the job was not started by torchrun (or the command is not known)."""
    argv = job_argv(run)
    if not argv:
        return fallback
    if os.path.basename(argv[0]) == "torchrun":
        at = 1
    elif _is_python(argv[0]) and argv[1:3] == ["-m", "torch.distributed.run"]:
        at = 3
    else:
        return fallback
    return shlex.join([*argv[:at], flag, *argv[at:]])
