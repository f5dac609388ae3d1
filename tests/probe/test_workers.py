"""The DataLoader workers' counter files (probe/workers.py), read after the job: no torch needed."""

from __future__ import annotations

import json

from torchdoctor.probe import workers
from torchdoctor.probe.workers import WorkerStats


def write(run_dir, pid: int, **counts) -> None:
    path = workers.worker_path(str(run_dir), pid)
    (run_dir / "ranks").mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(counts, f)


def test_settle_sums_the_workers_of_each_loader_and_leaves_the_others(tmp_path):
    # Two workers of one loader (4 batches each: 30 + 10 ms of reads and collate per batch, 64
    # conversions counted over their first 2 + 2 collates), one worker of another loader.
    write(tmp_path, 11, batches=4, fetch_s=0.16, fetch_cpu_s=0.08, collate_calls=4, collate_s=0.04,
          collate_cpu_s=0.02, conversions=64, counted_collates=2)
    write(tmp_path, 12, batches=4, fetch_s=0.16, fetch_cpu_s=0.08, collate_calls=4, collate_s=0.04,
          collate_cpu_s=0.02, conversions=64, counted_collates=2)
    write(tmp_path, 21, batches=10, fetch_s=0.05, fetch_cpu_s=0.01, collate_calls=10, collate_s=0.01,
          collate_cpu_s=0.01, conversions=0, counted_collates=8)
    payloads = [{"facts": {"dataloaders": [{"num_workers": 2, "worker_pids": [11, 12]},
                                           {"num_workers": 1, "worker_pids": [21, 99]},  # 99 wrote nothing
                                           {"num_workers": 0}]}}]
    workers.settle(str(tmp_path), payloads)
    first, second, third = payloads[0]["facts"]["dataloaders"]
    assert first == {"num_workers": 2, "worker_pids": [11, 12], "worker_batches": 8,
                     "worker_dataset_ms_mean": 30.0, "worker_collate_ms_mean": 10.0,
                     "worker_collate_cpu_ms_mean": 5.0, "worker_cpu_ms_mean": 20.0,
                     "worker_collate_syncs_per_batch": 32.0}
    assert second["worker_batches"] == 10 and second["worker_collate_syncs_per_batch"] == 0.0
    assert third == {"num_workers": 0}


def test_unreadable_or_hostile_counter_files_are_skipped(tmp_path):
    (tmp_path / "ranks").mkdir()
    (tmp_path / "ranks" / "worker5.json").write_text("{not json")
    write(tmp_path, 6, batches=-3, fetch_s="1e9", collate_s=0.5)  # negative, non-numeric: the file is skipped
    write(tmp_path, 7, batches=2, fetch_s=0.02, collate_s=0.01)
    write(tmp_path, 8, batches=2, fetch_s=float("inf"))  # written as Infinity, read back as inf
    assert workers.read(str(tmp_path), {5}) is None
    got = workers.read(str(tmp_path), {5, 6, 7, 8})
    assert got is not None and got.batches == 2 and got.fetch_s == 0.02 and got.collate_s == 0.01
    payloads = [{"facts": {"dataloaders": [{"worker_pids": ["7"]}, "not a loader"]}}, {"facts": None}]
    workers.settle(str(tmp_path), payloads)  # pids that are not ints: left alone, no error
    assert payloads[0]["facts"]["dataloaders"][0] == {"worker_pids": ["7"]}


def test_a_worker_writes_its_counters_atomically_without_private_fields(tmp_path):
    stats = WorkerStats(batches=3, fetch_s=0.3, collate_s=0.1, conversions=12, counted_collates=3,
                        in_collate=True, eager=8)
    workers.write(str(tmp_path), stats)
    (path,) = (tmp_path / "ranks").glob("worker*.json")
    data = json.loads(path.read_text())
    assert data["batches"] == 3 and data["conversions"] == 12
    assert not {"in_collate", "last_write", "eager"} & set(data)
    assert not list((tmp_path / "ranks").glob("*.tmp*"))
