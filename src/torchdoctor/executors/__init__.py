"""Where per-rank analysis runs: this machine's processes, a Dask cluster or a Ray cluster.

Per-rank work (decode, metrics, the rank's summary) is embarrassingly parallel and returns a few KB,
so it runs as one task per trace on an engine, and only the encoded result (msgpack, `task.py`)
travels back: the driver never holds a trace. `--executor`:

- `local` (default): worker processes on this machine (`local.py`); needs neither engine.
- `dask`: a local Dask cluster started for the run; `dask://HOST:PORT` (or `dask://tcp://HOST:PORT`):
  the scheduler of an existing cluster (`dask_engine.py`).
- `ray`: a local Ray instance started for the run; `ray://HOST:PORT`: a Ray client address;
  `ray://auto`: the cluster this machine belongs to (`ray_engine.py`).

Every executor returns the results in the input order, retries once a task whose worker died, then
reports that rank as failed, and calls `progress()` as tasks finish. Dask and Ray are optional extras,
imported only when asked for; their workers need torchdoctor installed (the same version).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .task import Keep, Task, TaskOutcome, same

ENGINES = ("local", "dask", "ray")
Progress = Callable[[int], None]  # called with the number of tasks just finished


class ExecutorError(Exception):
    """An executor that cannot be used (unknown, not installed, cluster not reachable): one line."""


@dataclass(frozen=True)
class ExecutorSpec:
    engine: str  # "local" | "dask" | "ray"
    address: str | None = None  # None: start a local cluster/instance for the run

    def __str__(self) -> str:
        return self.engine + (f"://{self.address}" if self.address else "")


def parse_executor(spec: str | None) -> ExecutorSpec:
    """`local`, `dask`, `dask://ADDRESS`, `ray`, `ray://ADDRESS` -> ExecutorSpec."""
    text = (spec or "local").strip()
    engine, sep, address = text.partition("://")
    engine = engine.lower()
    if engine not in ENGINES:
        raise ExecutorError(f"unknown executor {text!r}: use local, dask[://ADDRESS] or ray[://ADDRESS]")
    if sep and not address:
        raise ExecutorError(f"executor {text!r} names no address")
    if engine == "local" and sep:
        raise ExecutorError("the local executor takes no address")
    if engine == "dask" and address and "://" not in address:
        address = f"tcp://{address}"
    if engine == "ray" and address and address != "auto":
        address = f"ray://{address}"
    return ExecutorSpec(engine, address or None)


def run_tasks(spec: ExecutorSpec, tasks: list[Task], workers: int, progress: Progress | None = None,
              keep: Keep = same) -> list[TaskOutcome]:
    """Run every task on the executor; outcomes in the tasks' order, each passed through `keep` as it
    arrives."""
    done = progress or (lambda n: None)
    if spec.engine == "dask":
        from .dask_engine import run as run_dask

        return run_dask(spec.address, tasks, workers, done, keep)
    if spec.engine == "ray":
        from .ray_engine import run as run_ray

        return run_ray(spec.address, tasks, workers, done, keep)
    from .local import run as run_local

    return run_local(tasks, workers, done, keep)


__all__ = ["ExecutorError", "ExecutorSpec", "Keep", "Task", "TaskOutcome", "parse_executor", "run_tasks"]
