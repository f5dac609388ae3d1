"""The Dask executor: traces as tasks on a Dask cluster (`distributed`); one per task, or a few per
task past 64 tasks per worker (`task.batch_size`). On 2 CPUs at 4,096 ranks, one task per rank cost
1.67x the local executor's time and 16 ranks per task 1.22x (2026-12-03); against today's faster
driver, 1.38x (benchmarks/results/scale.md). Turning off work stealing and the workers' memory
monitor changed nothing measurable (512 ranks: 16.9 s with, 17.5 s without).

`address` None starts a local cluster for the run: one single-threaded worker process per CPU (the
decoder holds the GIL), no dashboard. Its workers are spawned (Dask's default `multiprocessing-method`),
not forked: forking saved 0.45 s of start-up (0.16 s against 0.61 s on 2 CPUs), but the cluster's
event-loop thread runs while the workers start, and a worker forked while that thread held a lock
waited on it forever (seen once in a full test-suite run on 2026-12-05: the worker's main thread
blocked in a lock acquire, the cluster's start hung). The user's Dask config decides otherwise.

A worker that dies takes down every task it was processing, the one that killed it and the ones queued
beside it, and Dask counts that death against all of them. So the local cluster gives up on them at
once (`allowed-failures` 0: `KilledWorker`), and each such task is then retried once here, alone on the
cluster: an innocent neighbour succeeds, a task that kills its worker again is reported as a failed
rank. (The local executor does the same, `local.py`.) A remote scheduler keeps its own
`allowed-failures`; its `KilledWorker` tasks get the same one retry.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

from ..advice.host_allocator import ANALYSIS_ENV
from . import ExecutorError
from .task import Keep, Task, TaskOutcome, batch_size, decode, failed, lost, run_batch, run_task, same

_PRE_SPAWN_ENVIRON = "distributed.nanny.pre-spawn-environ"


@contextlib.contextmanager
def _interrupts_left_to_this_process():
    """SIGINT ignored while the local cluster's workers start, so they inherit the ignore: Ctrl-C
    reaches the whole terminal process group, and each worker would print two tracebacks while
    this process, which owns the cluster, already stops it (`run`'s finally). Forked or spawned,
    a child keeps an ignored signal ignored."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        # Only the main thread may set handlers, and one installed outside Python could not be put
        # back: the workers keep Dask's own behaviour.
        yield
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


@contextlib.contextmanager
def _environ_kept():
    """This process's environment as it was before: a local cluster's nannies run in this process
    and write their workers' variables into its os.environ before each spawn (Dask's defaults
    include OMP_NUM_THREADS=1 and PYTHONHASHSEED), which would outlive the run in a caller's
    process and in whatever it starts later."""
    before = dict(os.environ)
    try:
        yield
    finally:
        # Never in place of the run's result: another thread changing the environment meanwhile
        # could make the copy raise.
        with contextlib.suppress(RuntimeError):
            for k in set(os.environ) - set(before):
                os.environ.pop(k, None)
            for k, v in before.items():
                if os.environ.get(k) != v:
                    os.environ[k] = v


def _client(address: str | None, workers: int):
    try:
        import dask
        from distributed import Client, LocalCluster
    except ImportError:
        raise ExecutorError("--executor dask needs Dask: pip install 'torchdoctor[dask]'") from None
    try:
        if address:
            return Client(address, timeout="20s"), None
        # Dask's nanny sets MALLOC_TRIM_THRESHOLD_=65536 in each worker it spawns: every decoded
        # piece freed goes back to the kernel and faults in again. The workers get the thresholds
        # the local executor's processes use instead (advice/host_allocator.py; 4,096 ranks:
        # 178.9 s with Dask's, 2026-12-05). The thresholds only, as there: with the top pad and no
        # mapped blocks too, 512 ranks took 10.1-12.5 s against 10.0-13.7 s (2026-12-06).
        environ = {**dask.config.get(_PRE_SPAWN_ENVIRON, {}), **ANALYSIS_ENV}
        settings: dict[str, object] = {"distributed.scheduler.allowed-failures": 0, _PRE_SPAWN_ENVIRON: environ}
        with dask.config.set(settings), _interrupts_left_to_this_process():
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                   dashboard_address=None, silence_logs=50)
            return Client(cluster), cluster
    except (OSError, TimeoutError) as e:
        raise ExecutorError(f"cannot reach the Dask scheduler {address or '(local)'}: {e}") from None


def run(address: str | None, tasks: list[Task], workers: int, progress, keep: Keep = same) -> list[TaskOutcome]:
    with _environ_kept():
        return _run(address, tasks, workers, progress, keep)


def _run(address: str | None, tasks: list[Task], workers: int, progress, keep: Keep) -> list[TaskOutcome]:
    from distributed import as_completed
    from distributed.scheduler import KilledWorker

    client, cluster = _client(address, workers)
    out: dict[int, TaskOutcome] = {}
    suspects: list[int] = []
    size = batch_size(len(tasks), workers)  # thousands of ranks: a few per Dask task (task.py)
    batches = [list(range(i, min(i + size, len(tasks)))) for i in range(0, len(tasks), size)]
    try:
        futures = client.map(run_batch, [[tasks[i] for i in b] for b in batches], pure=False,
                             key=[f"torchdoctor-{b[0]}-{b[-1]}" for b in batches])
        index = {f.key: k for k, f in enumerate(futures)}
        # with_results: results are gathered in batches as tasks finish (one round trip per future
        # would cost more than small tasks); an engine failure comes back as the task's exception.
        for fut, value in as_completed(futures, with_results=True, raise_errors=False):
            batch = batches[index[fut.key]]
            if isinstance(value, tuple) and len(value) == 3 and isinstance(value[1], BaseException):
                value = value[1]  # some releases give an erred task's (type, exception, traceback)
            if isinstance(value, list):
                for i, data in zip(batch, value, strict=True):
                    out[i] = keep(decode(data))
            elif isinstance(value, KilledWorker):
                suspects.extend(batch)
                fut.release()
                continue
            else:  # an engine failure on this task only: report its ranks, go on
                for i in batch:
                    out[i] = keep(failed(tasks[i], "Dask", value))
            progress(len(batch))
            fut.release()
        for i in sorted(suspects):  # the retry: each rank alone, so a second death is its own
            fut = client.submit(run_task, tasks[i], pure=False, key=f"torchdoctor-{i}-retry")
            try:
                out[i] = keep(decode(fut.result()))
            except KilledWorker:
                out[i] = keep(lost(tasks[i], "Dask killed worker"))
            except Exception as e:  # an engine failure on this task only: report the rank, go on
                out[i] = keep(failed(tasks[i], "Dask", e))
            progress(1)
            fut.release()
    finally:
        with contextlib.suppress(Exception):
            client.close()
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.close()
    return [out[i] for i in range(len(tasks))]
