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
