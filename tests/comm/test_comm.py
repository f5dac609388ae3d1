"""`torchdoctor comm`: a real 2-rank gloo benchmark, nccl-tests' bandwidth arithmetic, a dying rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from torchdoctor.comm.bandwidth import OPS, bus_factor, sizes
from torchdoctor.comm.cli import parse_bytes


def comm(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchdoctor.cli", "comm", *args], capture_output=True, text=True,
                          timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1", **env})


def test_bandwidth_arithmetic():
    assert bus_factor("all_reduce", 8) == 2 * 7 / 8 and bus_factor("all_gather", 8) == 7 / 8
    assert bus_factor("broadcast", 8) == 1.0 and bus_factor("all_reduce", 1) == 1.0
    assert sizes(8, 64 << 10) == [8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384, 65536]
    assert parse_bytes("16M") == 16 << 20 and parse_bytes("1GiB") == 1 << 30 and parse_bytes("8") == 8


def test_two_gloo_ranks_measure_every_op_at_every_size(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "comm.json"
    res = comm("--nproc-per-node", "2", "--max-bytes", "64K", "--json", str(out))
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(out.read_text())
    assert got["backend"] == "gloo" and got["world_size"] == 2 and got["skipped"] == {}
    by_op: dict[str, list[dict]] = {}
    for row in got["collectives"]:
        by_op.setdefault(row["op"], []).append(row)
    assert set(by_op) == set(OPS)
    for op, rows in by_op.items():
        assert [r["bytes"] for r in rows] == sizes(8, 64 << 10)
        for r in rows:
            algbw = r["bytes"] / (r["time_us"] / 1e6) / 1e9
            assert r["time_us"] > 0 and abs(r["algbw_gbps"] - algbw) <= 1e-4 + 0.01 * algbw
            assert abs(r["busbw_gbps"] - r["algbw_gbps"] * bus_factor(op, 2)) <= 1e-4 + 0.01 * r["busbw_gbps"]
    assert got["peak"]["gbps"] > 0 and "memory copy" in got["peak"]["source"]
    assert "busbw (GB/s)" in res.stdout and "% of peak" in res.stdout


def test_a_rank_that_dies_ends_the_benchmark_with_one_line_and_no_hang(tmp_path):
    pytest.importorskip("torch")
    t0 = time.monotonic()
    res = comm("--nproc-per-node", "2", "--max-bytes", "1K", "--ops", "all_reduce,broadcast", "--timeout", "10",
               TORCHDOCTOR_COMM_DIE_RANK="1")
    assert res.returncode == 1 and time.monotonic() - t0 < 120
    assert res.stderr.startswith("torchdoctor: comm: the benchmark failed") and len(res.stderr.strip().splitlines()) == 1


def nccl_trace(path):
    """Rank 0 of a 2-rank NCCL job: 3 all-reduces of 1 MiB (900 µs each) and 3 all-gathers of
    64 KiB per rank (128 KiB gathered, 300 µs each), with Kineto 2026's metadata on the kernels."""
    from kineto_builder import TraceBuilder

    b = TraceBuilder(rank=0, world_size=2)
    at = 100.0
    for seq, (kernel, name, nelems, dur) in enumerate(
            [("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "allreduce", 1 << 18, 900.0),
             ("ncclDevKernel_AllGather_RING_LL", "_allgather_base", 1 << 14, 300.0)] * 3):
        b.op("record_param_comms", at - 40, 20)
        b.kernel(kernel, at, dur, stream=22, launch_at=at - 30)
        b.events[-1]["args"].update({"Collective name": name, "In msg nelems": nelems, "Out msg nelems": nelems * 2,
                                     "Group size": 2, "dtype": "Float", "Process Group Name": "0", "Seq": seq})
        at += dur + 10
    return b.write(path)


def test_the_job_s_collectives_are_placed_on_the_measured_curve(tmp_path):
    bench = {"backend": "nccl", "world_size": 2, "device": "x", "collectives": [
        {"op": "all_reduce", "bytes": 1 << 18, "time_us": 100.0, "algbw_gbps": 2.0, "busbw_gbps": 2.0},
        {"op": "all_reduce", "bytes": 1 << 22, "time_us": 500.0, "algbw_gbps": 8.0, "busbw_gbps": 8.0},
        {"op": "all_gather", "bytes": 1 << 17, "time_us": 50.0, "algbw_gbps": 1.0, "busbw_gbps": 0.5}]}
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    trace = nccl_trace(tmp_path / "rank0.json")
    out = tmp_path / "placed.json"
    res = comm("--from-json", str(tmp_path / "bench.json"), "--compare", str(trace), "--compare-json", str(out))
    assert res.returncode == 0, res.stderr
    rows = {r["op"]: r for r in json.loads(out.read_text())["placed"]}
    ar = rows["all_reduce"]
    # 1 MiB in 900 µs = 1.165 GB/s; the fabric at 1 MiB: halfway (log-log) between 2 and 8 GB/s = 4 GB/s.
    assert ar["bytes"] == 1 << 20 and ar["time_us"] == 900.0 and ar["fabric_algbw_gbps"] == 4.0
    assert abs(ar["pct_of_fabric"] - 100 * (2**20 / 900e-6 / 1e9) / 4.0) < 0.1
    # All-gathers: 64 KiB per rank in, 128 KiB gathered (nccl-tests' size) in 300 µs; the fabric: 1 GB/s.
    ag = rows["all_gather"]
    assert ag["bytes"] == 1 << 17 and abs(ag["pct_of_fabric"] - 100 * (2**17 / 300e-6 / 1e9) / 1.0) < 0.1
    assert "your 1 MiB all_reduce calls (3 in the window, 900 µs each) reach 29% of what this fabric does" in res.stdout
    assert "the rest is waiting" in res.stdout


def test_compare_without_sizes_or_with_a_bad_result_file_says_so(tmp_path):
    (tmp_path / "bad.json").write_text("[]")
    res = comm("--from-json", str(tmp_path / "bad.json"), "--compare", str(tmp_path))
    assert res.returncode == 2 and "not a comm result" in res.stderr and len(res.stderr.strip().splitlines()) == 1
