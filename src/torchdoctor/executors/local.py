"""The local executor: worker processes on this machine, one task per trace.

A worker that dies (killed for memory, a crash in a native library) breaks Python's process pool and
with it every task still queued. Tasks that had not started go back to a fresh pool untouched. Each
task that was running when its pool broke is a suspect: it is retried once, alone in its own worker,
so one bad trace can neither take its neighbours down twice nor be blamed for their deaths; dying
again, it is reported as a failed rank.
"""

from __future__ import annotations

import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool

from .task import Keep, Task, TaskOutcome, decode, lost, run_task, same

# Set in each worker: one byte per task of the round, shared with the driver, set to 1 as the task
# starts (shared memory, not a pipe: a pipe nobody reads until the pool breaks fills up and blocks).
_started = None


def _init(started) -> None:
    global _started
    _started = started


def _run(slot: int, task: Task) -> bytes:
    if _started is not None:
        _started[slot] = 1
    return run_task(task)


def _context():
    return mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()


def _pool_round(tasks: list[Task], ids: list[int], workers: int, out: dict[int, TaskOutcome], progress,
                keep: Keep) -> tuple[list[int], list[int]]:
    """Run tasks `ids` in one pool until done or broken -> (not started, started but unfinished)."""
    ctx = _context()
    started = ctx.RawArray("b", len(ids))
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init, initargs=(started,))
    futures = {pool.submit(_run, slot, tasks[i]): i for slot, i in enumerate(ids)}
    broken = False
    try:
        for fut in as_completed(futures):  # once over all futures (wait() in a loop is quadratic)
            try:
                out[futures.pop(fut)] = keep(decode(fut.result()))  # the future, and its bytes, go
                progress(1)
            except BrokenProcessPool:
                broken = True
                break
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    if not broken:
        return [], []
    ran = {i for slot, i in enumerate(ids) if started[slot]}
    left = [i for i in ids if i not in out]
    return [i for i in left if i not in ran], [i for i in left if i in ran]


def run(tasks: list[Task], workers: int, progress, keep: Keep = same) -> list[TaskOutcome]:
    out: dict[int, TaskOutcome] = {}
    if workers <= 1 or len(tasks) <= 1:
        # One trace (its decode may use several processes itself): run it here, no pool to break.
        for i, t in enumerate(tasks):
            out[i] = keep(decode(run_task(t)))
            progress(1)
        return [out[i] for i in range(len(tasks))]
    todo, suspects = list(range(len(tasks))), []
    while todo:
        before = len(out)
        todo, hit = _pool_round(tasks, todo, workers, out, progress, keep)
        if not hit and todo and len(out) == before:  # broke before any task started: try each alone
            todo, hit = [], todo
        suspects += hit
    for i in suspects:  # the retry: alone, so a second death is this task's own
        rest, hit = _pool_round(tasks, [i], 1, out, progress, keep)
        if hit or rest:
            out[i] = keep(lost(tasks[i], "its worker process died"))
            progress(1)
    return [out[i] for i in range(len(tasks))]
