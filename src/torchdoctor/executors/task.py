"""One rank's analysis as a task any executor can run: a trace path (or URL) in, msgpack bytes out.

The bytes are a `TaskOutcome`: the rank's `RankResult` (reduced to its summary, metrics/summary.py,
when `compact`) and what the trace let the tool see (`TraceSight`), or the one-line reason it could
not be analysed. Encoding on the worker keeps what travels small and independent of the engine's
own serialiser (pickle, cloudpickle, Arrow).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import msgspec

from ..metrics.model import RankResult

# Fault injection for the tests of worker loss: "NAME" kills the worker process that starts on a
# trace whose file name is NAME, every time; "NAME:MARKER" only while the file MARKER does not exist
# (it is created first, so the retry succeeds).
KILL_ENV = "TORCHDOCTOR_FAULT_KILL_TASK"


class Task(msgspec.Struct, frozen=True):
    path: str
    steps: str | None = None
    compact: bool = False
    jobs: int = 1  # processes for decoding one large uncompressed file


class TaskOutcome(msgspec.Struct):
    path: str
    status: str  # "ok" | "error"
    result: RankResult | None = None
    message: str = ""
    sight: Any = None  # session.TraceSight as a dict (decoded by the session)


def run_task(task: Task) -> bytes:
    """Analyse one trace; never raises for a bad trace (that is an "error" outcome)."""
    _maybe_die(task.path)
    from .. import session  # here, not at import: the session imports the executors
    from ..metrics.summary import compact
    from ..trace.remote import RemoteError, is_url, local_path

    try:
        if is_url(task.path):
            with local_path(task.path) as local:  # the session names the result by its URL
                status, value, sight = session._analyze_one(local, task.steps, task.jobs)
        else:
            status, value, sight = session._analyze_one(task.path, task.steps, task.jobs)
    except RemoteError as e:
        status, value, sight = "error", str(e), None
    if status != "ok":
        return msgspec.msgpack.encode(TaskOutcome(task.path, "error", message=str(value)))
    result = compact(value) if task.compact else value
    return msgspec.msgpack.encode(TaskOutcome(task.path, "ok", result, sight=sight))


def run_batch(tasks: list[Task]) -> list[bytes]:
    """Several ranks in one engine task, one after the other (each as `run_task`, its failure its own):
    thousands of small ranks cost the scheduler fewer round trips."""
    return [run_task(t) for t in tasks]


def batch_size(n_tasks: int, workers: int, per_worker: int = 64, most: int = 16) -> int:
    """Ranks per engine task: 1 up to `per_worker` tasks per worker, then as many as keep about that
    many tasks per worker (for balance at the end of the run), at most `most`."""
    return max(1, min(most, n_tasks // max(1, workers * per_worker)))


def decode(data: bytes) -> TaskOutcome:
    return msgspec.msgpack.decode(data, type=TaskOutcome)


# What the driver does with each outcome as it arrives (before the next one is gathered): e.g. put
# its result in a compressed store (metrics/store.py), so thousands of decoded results are never
# held at once.
Keep = Callable[[TaskOutcome], TaskOutcome]


def same(outcome: TaskOutcome) -> TaskOutcome:
    return outcome


def failed(task: Task, engine: str, exc: BaseException) -> TaskOutcome:
    """The outcome of a task the engine itself failed (not the trace): one line naming the error."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return TaskOutcome(task.path, "error", message=f"{engine} task failed: {type(exc).__name__}: {text}")


def lost(task: Task, why: str) -> TaskOutcome:
    """The outcome of a task whose worker died on both tries."""
    return TaskOutcome(task.path, "error", message=f"worker lost twice while analysing ({why}); rank not analysed")


def _maybe_die(path: str) -> None:
    spec = os.environ.get(KILL_ENV)
    if not spec:
        return
    name, _, marker = spec.partition(":")
    if os.path.basename(path) != name:
        return
    if marker:
        if os.path.exists(marker):
            return
        with open(marker, "w"):
            pass
    os.kill(os.getpid(), signal.SIGKILL)
