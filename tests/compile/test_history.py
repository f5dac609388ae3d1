"""Why a run missed the caches an earlier run beside it filled (compile/history.py, CG-8)."""

from __future__ import annotations

import json
import os

from torchdoctor.compile import history

FP = {"torch": "2.13.0", "python": "3.11.7", "threads": "2"}


def write(run, *, fp=FP, counters, cache_dir="/ci/cache", graphs=("g1",), mtime):
    folder = run / "caches"
    folder.mkdir(parents=True)
    path = folder / "rank0.json"
    path.write_text(json.dumps({"fingerprint": fp, "counters": counters, "cache_dir": cache_dir,
                                "graphs": [{"hash": g, "nodes": []} for g in graphs]}))
    os.utime(path, (mtime, mtime))


def test_the_previous_run_in_the_same_directory_and_what_changed(tmp_path):
    write(tmp_path / "a", counters={"fx_graph.miss": 2}, mtime=1000)
    write(tmp_path / "b", counters={"fx_graph.hit": 2}, mtime=2000)
    write(tmp_path / "other", counters={"fx_graph.miss": 2}, cache_dir="/elsewhere", mtime=2500)
    write(tmp_path / "c", fp=dict(FP, threads="1"), counters={"fx_graph.miss": 2}, mtime=3000)
    got = history.explain_misses(str(tmp_path / "c"))
    assert got["previous"] == str(tmp_path / "b")  # the latest older run with the same cache directory
    assert got["changed"] == ["threads: 2 -> 1 (invalidates fx_graph, aot_autograd, dynamo)"]
    assert got["fields"] == ["threads"] and got["graphs"] == "same"
    assert history.explain_misses(str(tmp_path / "b")) is None  # it hit
    assert history.explain_misses(str(tmp_path / "a")) is None  # nothing before it


def test_same_fingerprint_with_other_graphs(tmp_path):
    write(tmp_path / "a", counters={"fx_graph.miss": 1}, mtime=1000)
    write(tmp_path / "b", counters={"fx_graph.miss": 1}, graphs=("g2",), mtime=2000)
    got = history.explain_misses(str(tmp_path / "b"))
    assert got["changed"] == [] and got["graphs"] == "changed"
