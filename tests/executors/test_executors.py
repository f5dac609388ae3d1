"""Per-rank analysis on each executor: the same report everywhere, a worker lost once is retried, a
worker lost twice is a failed rank in errors[] while the other ranks are still reported.

Dask and Ray are pinned in requirements-dev.txt: these tests run (and fail, never skip) without them."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from rank_job import write_job
from torchdoctor.advice.host_allocator import ANALYSIS_ENV
from torchdoctor.cli import main
from torchdoctor.executors import ExecutorError, ExecutorSpec, parse_executor
from torchdoctor.executors.task import KILL_ENV
from torchdoctor.report.json_out import to_json
from torchdoctor.session import analyze_paths

WORLD = 6


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    folder = tmp_path_factory.mktemp("job")
    write_job(folder, WORLD, straggler=2)
    return folder


def comparable(report) -> dict:
    doc = json.loads(to_json(report))
    doc.pop("generated", None)
    return doc


def test_parse_executor():
    assert parse_executor(None) == ExecutorSpec("local")
    assert parse_executor("dask") == ExecutorSpec("dask")
    assert parse_executor("dask://sched:8786") == ExecutorSpec("dask", "tcp://sched:8786")
    assert parse_executor("dask://tls://sched:8786") == ExecutorSpec("dask", "tls://sched:8786")
    assert parse_executor("ray://head:10001") == ExecutorSpec("ray", "ray://head:10001")
    assert parse_executor("ray://auto") == ExecutorSpec("ray", "auto")
    for bad in ("spark", "dask://", "local://x"):
        with pytest.raises(ExecutorError):
            parse_executor(bad)


def test_unknown_executor_is_a_one_line_error(job, capsys):
    assert main(["analyze", str(job), "--executor", "spark", "-q"]) == 2  # usage error
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown executor 'spark'" in err


def test_local_executor_names_the_straggler(job):
    report = analyze_paths([str(job)], jobs=2)
    assert [r.rank for r in report.ranks] == list(range(WORLD)) and not report.errors
    assert report.cross_rank.straggler == 2
    assert report.cross_rank.victims == [0, 1, 3, 4, 5]
    # Serially, in this process: the same report.
    assert comparable(analyze_paths([str(job)], jobs=1)) == comparable(report)


def test_local_worker_lost_once_is_retried(job, tmp_path, monkeypatch):
    marker = tmp_path / "died"
    monkeypatch.setenv(KILL_ENV, f"rank3.json:{marker}")
    report = analyze_paths([str(job)], jobs=2)
    assert marker.exists(), "the fault was not injected"
    assert not report.errors and [r.rank for r in report.ranks] == list(range(WORLD))
    assert report.cross_rank.straggler == 2


def test_local_worker_lost_twice_fails_that_rank_only(job, tmp_path, monkeypatch):
    monkeypatch.setenv(KILL_ENV, "rank3.json")
    out = tmp_path / "r.json"
    code = main(["analyze", str(job), "-j", "2", "--json", str(out), "-q"])
    doc = json.loads(out.read_text())
    assert code == 1  # partial: some input could not be analysed
    assert [e["file"].rsplit("/", 1)[-1] for e in doc["errors"]] == ["rank3.json"]
    assert "worker lost twice" in doc["errors"][0]["message"]
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2, 4, 5]
    assert doc["cross_rank"]["straggler"] == 2


@pytest.mark.parametrize("engine", ["dask", "ray"])
def test_engine_gives_the_local_report_and_survives_a_lost_worker(engine, job, tmp_path, monkeypatch):
    local = comparable(analyze_paths([str(job)], jobs=2))
    spec = parse_executor(engine)
    assert comparable(analyze_paths([str(job)], jobs=2, executor=spec)) == local
    marker = tmp_path / "died"
    monkeypatch.setenv(KILL_ENV, f"rank4.json:{marker}")
    report = analyze_paths([str(job)], jobs=2, executor=spec)
    assert marker.exists(), "the fault was not injected"
    assert comparable(report) == local


@pytest.mark.parametrize("engine", ["dask", "ray"])
def test_engine_reports_a_rank_whose_worker_dies_every_time(engine, job, monkeypatch):
    monkeypatch.setenv(KILL_ENV, "rank4.json")
    report = analyze_paths([str(job)], jobs=2, executor=parse_executor(engine))
    assert [e.file.rsplit("/", 1)[-1] for e in report.errors] == ["rank4.json"]
    assert "worker lost twice" in report.errors[0].message
    assert [r.rank for r in report.ranks] == [0, 1, 2, 3, 5]
    assert report.cross_rank.straggler == 2


def test_progress_counts_every_rank_once_even_after_a_retry(job, tmp_path, monkeypatch):
    from torchdoctor.executors import Task, run_tasks

    marker = tmp_path / "died"
    monkeypatch.setenv(KILL_ENV, f"rank1.json:{marker}")
    ticks: list[int] = []
    tasks = [Task(str(job / f"rank{r}.json")) for r in range(WORLD)]
    outcomes = run_tasks(ExecutorSpec("local"), tasks, 2, ticks.append)
    assert marker.exists() and [o.status for o in outcomes] == ["ok"] * WORLD
    assert sum(ticks) == WORLD


def test_dask_runs_several_ranks_per_task_and_a_killed_batch_is_retried_rank_by_rank(job, monkeypatch):
    """Past 64 tasks per worker ranks travel in batches (task.batch_size); a batch whose worker dies
    is retried one rank at a time: its innocent ranks are reported, the culprit is the failed one."""
    from torchdoctor.executors import dask_engine, task

    assert [task.batch_size(n, 2) for n in (64, 128, 512, 4096, 100_000)] == [1, 1, 4, 16, 16]
    monkeypatch.setattr(dask_engine, "batch_size", lambda n, workers: 4)  # 6 ranks: batches of 4 and 2
    local = comparable(analyze_paths([str(job)], jobs=2))
    # The local cluster's nannies write their workers' variables (OMP_NUM_THREADS=1, PYTHONHASHSEED,
    # the malloc thresholds) into this process's environment: all taken back.
    written = ("OMP_NUM_THREADS", "PYTHONHASHSEED", "MALLOC_TRIM_THRESHOLD_", "__DASK_PARENT_PID")
    for k in written:
        monkeypatch.delenv(k, raising=False)
    before = dict(os.environ)
    assert comparable(analyze_paths([str(job)], jobs=2, executor=parse_executor("dask"))) == local
    assert dict(os.environ) == before and not set(written) & set(os.environ)
    monkeypatch.setenv(KILL_ENV, "rank1.json")  # in the first batch, with ranks 0, 2 and 3
    report = analyze_paths([str(job)], jobs=2, executor=parse_executor("dask"))
    assert [e.file.rsplit("/", 1)[-1] for e in report.errors] == ["rank1.json"]
    assert [r.rank for r in report.ranks] == [0, 2, 3, 4, 5]


def _driver_mark() -> object:
    from torchdoctor.executors import dask_engine

    return getattr(dask_engine, "_test_driver_mark", None)


def test_local_dask_cluster_spawns_its_workers(monkeypatch):
    """A spawned worker imports torchdoctor afresh (a value set in the driver is not there): a
    forked one could inherit a lock the cluster's event-loop thread held at the fork and hang the
    cluster's start (it did once, 2026-12-05, when the local cluster forked its workers)."""
    from torchdoctor.executors import dask_engine

    monkeypatch.setattr(dask_engine, "_test_driver_mark", "set in the driver", raising=False)
    with dask_engine._environ_kept():  # as run() does: the nannies' variables stay out of this process
        _check_spawned_workers(dask_engine)


def _check_spawned_workers(dask_engine) -> None:
    client, cluster = dask_engine._client(None, 1)
    try:
        assert client.submit(_driver_mark, pure=False).result() is None
        # The malloc thresholds the local executor's forked workers inherit (Dask's nanny sets its
        # own trim threshold of 64 KiB otherwise: every decoded piece handed back to the kernel).
        got = {k: client.submit(os.getenv, k, pure=False).result() for k in ANALYSIS_ENV}
        assert got == ANALYSIS_ENV
    finally:
        client.close()
        cluster.close()


def test_local_ray_workers_get_the_analysis_malloc_thresholds(monkeypatch):
    """Ray starts its workers from the raylet's environment, not from this process: without the
    thresholds, 512 ranks of 1.6 MB took 15.5-16.5 s against 13.1-14.8 s with them (2 CPUs)."""
    from torchdoctor.executors import ray_engine

    for k in ANALYSIS_ENV:  # from this process's environment they would reach the workers anyway
        monkeypatch.delenv(k, raising=False)
    ray, started = ray_engine._start(None, 1)
    try:
        assert started
        getenv = ray.remote(num_cpus=1)(os.getenv)
        assert {k: ray.get(getenv.remote(k)) for k in ANALYSIS_ENV} == ANALYSIS_ENV
    finally:
        ray.shutdown()


def test_ray_gets_the_thresholds_only_where_the_run_owns_the_cluster(monkeypatch):
    """A local instance gets the thresholds the user did not set; an attached cluster none (a `ray
    job submit` job's own env_vars for the same keys would make ray.init fail to merge them)."""
    import ray

    from torchdoctor.executors import ray_engine

    calls: list[tuple[dict, dict]] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append((kw, {k: os.environ.get(k) for k in ANALYSIS_ENV})))
    for k in ANALYSIS_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1234")  # the user's own
    ray_engine._start(None, 2)
    ray_engine._start("auto", 2)
    (local, local_env), (attached, attached_env) = calls
    # Through the environment the raylet starts with (Ray's runtime-env agent cost 1.7 s), then gone again.
    assert "runtime_env" not in local and "runtime_env" not in attached and attached["address"] == "auto"
    assert local_env == {"MALLOC_MMAP_THRESHOLD_": ANALYSIS_ENV["MALLOC_MMAP_THRESHOLD_"], "MALLOC_TRIM_THRESHOLD_": "1234"}
    assert attached_env == {"MALLOC_MMAP_THRESHOLD_": None, "MALLOC_TRIM_THRESHOLD_": "1234"}
    assert os.environ.get("MALLOC_MMAP_THRESHOLD_") is None


def test_a_local_ray_instance_s_workers_run_with_the_thresholds(monkeypatch):
    """The raylet ray.init starts inherits the environment, and its workers with it."""
    import ray

    from torchdoctor.executors import ray_engine

    for k in ANALYSIS_ENV:
        monkeypatch.delenv(k, raising=False)
    if ray.is_initialized():
        ray.shutdown()
    ray_engine._start(None, 1)
    try:
        got = ray.get(ray.remote(lambda: {k: os.environ.get(k) for k in ANALYSIS_ENV}).remote())
    finally:
        ray.shutdown()
    assert got == ANALYSIS_ENV and all(k not in os.environ for k in ANALYSIS_ENV)


def _sigint_at_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # pytest may run as a background job, SIGINT ignored


def test_ctrl_c_stops_a_dask_run_quietly(job, tmp_path):
    """Ctrl-C reaches the terminal's whole process group, the local cluster's workers included: the
    run stops at once with 130, and no worker prints a traceback (each printed two) or outlives it."""
    fifo = tmp_path / "rank9.json"
    os.mkfifo(fifo)  # a worker reading it waits for data: the run is still under way when the signal comes
    cmd = [sys.executable, "-m", "torchdoctor.cli", "analyze", str(job / "rank0.json"), str(fifo), "--executor", "dask"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_sigint_at_default)
    deadline = time.monotonic() + 120
    while True:  # the FIFO opens for writing once a worker has opened it for reading
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as e:
            assert e.errno == errno.ENXIO and proc.poll() is None and time.monotonic() < deadline, e
            time.sleep(0.05)
    try:
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(fd)
    assert proc.returncode == 130, err
    assert "Traceback" not in out + err, err
    deadline = time.monotonic() + 30
    with pytest.raises(ProcessLookupError):  # the session's process group is empty: no worker left
        while time.monotonic() < deadline:
            os.killpg(proc.pid, 0)
            time.sleep(0.1)
