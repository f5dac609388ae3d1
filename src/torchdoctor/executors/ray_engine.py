"""The Ray executor: one task per trace on a Ray cluster.

`address` None starts a local Ray instance for the run (as many CPUs as asked for, no dashboard) and
stops it after; an address connects to an existing cluster (`ray://HOST:PORT`, or `auto`) and leaves it
running. A task whose worker process dies is retried once (`max_retries=1`); dying again, its rank is
reported failed. Exceptions are not retried: a bad trace is an "error" outcome of the task itself.
"""

from __future__ import annotations

import contextlib
import os

from ..advice.host_allocator import ANALYSIS_ENV
from . import ExecutorError
from .task import Keep, Task, TaskOutcome, decode, failed, lost, run_task, same


@contextlib.contextmanager
def _environ_with(extra: dict[str, str]):
    """os.environ with ``extra`` added while the block runs (the processes it starts inherit them),
    then as it was."""
    added = [k for k in extra if k not in os.environ]
    os.environ.update({k: extra[k] for k in added})
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


def _start(address: str | None, workers: int):
    try:
        import ray
    except ImportError:
        raise ExecutorError("--executor ray needs Ray: pip install 'torchdoctor[ray]'") from None
    started = False
    if not ray.is_initialized():
        try:
            if address:
                # An attached cluster's environment is its operator's (a `ray job submit` job's own
                # env_vars cannot be merged with other values for the same keys).
                ray.init(address=address, logging_level="ERROR", log_to_driver=False)
            else:
                # The workers are started by the raylet, which ray.init starts with this process's
                # environment: they find torchdoctor the way this process did (an editable install,
                # or PYTHONPATH in tests), and they get the malloc thresholds torchdoctor's analysis
                # processes run with unless the user set their own: 512 ranks of 1.6 MB took
                # 15.5-16.5 s without them against 13.1-14.8 s (2 CPUs), every decoded piece handed
                # back to the kernel. Through the environment, not a runtime_env: Ray's runtime-env
                # agent took 1.1 s more to start and the first task 0.6 s more (64 ranks in 1.4 s).
                with _environ_with({k: v for k, v in ANALYSIS_ENV.items() if k not in os.environ}):
                    ray.init(num_cpus=workers, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
            started = True
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise ExecutorError(f"cannot start or reach Ray {address or '(local)'}: {e}") from None
    return ray, started


def run(address: str | None, tasks: list[Task], workers: int, progress, keep: Keep = same) -> list[TaskOutcome]:
    ray, started = _start(address, workers)
    from ray.exceptions import RayError, WorkerCrashedError

    remote = ray.remote(num_cpus=1, max_retries=1, retry_exceptions=False)(run_task)
    out: dict[int, TaskOutcome] = {}
    try:
        refs = [remote.remote(t) for t in tasks]
        index = {r: i for i, r in enumerate(refs)}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=min(len(pending), 64), timeout=1.0)
            for ref in ready:
                i = index.pop(ref)
                try:
                    out[i] = keep(decode(ray.get(ref)))
                except WorkerCrashedError:
                    out[i] = keep(lost(tasks[i], "Ray worker crashed"))
                except RayError as e:
                    out[i] = keep(failed(tasks[i], "Ray", e))
                progress(1)
    finally:
        if started and address is None:
            with contextlib.suppress(Exception):
                ray.shutdown()
    return [out[i] for i in range(len(tasks))]
