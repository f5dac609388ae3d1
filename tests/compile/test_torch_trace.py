"""TORCH_TRACE logs read into CompileFacts (compile/torch_trace.py), from logs built here."""

from __future__ import annotations

import json

import pytest

from torchdoctor.compile import torch_trace
from torchdoctor.session import analyze_paths

HEAD = "V1203 07:35:23.079000 15716 torch/_dynamo/utils.py:2009] "
BREAK = """Graph break in user code at /job/model.py:21
Graph Break Reason: Encountered graph break when attempting to trace CALL: a function call, e.g. f(x, y):

Data-dependent branching
  Explanation: Detected data-dependent branching (e.g. `if my_tensor.sum() > 0:`).
  Hint: Use `torch.cond` to express dynamic control flow.

 For more details about this graph break, please visit: https://meta-pytorch.github.io/compile-graph-break-site/gb/gb0170.html

User code traceback:
  File "/job/train.py", line 40, in <module>
    loss = model(x).sum()
  File "/job/model.py", line 21, in forward
    if h.abs().max() > 8:
"""


def rec(meta: dict, payload: str | None = None) -> str:
    text = HEAD + json.dumps(meta) + "\n"
    if payload is not None:
        text += "".join(f"\t{line}\n" for line in payload.splitlines())
    return text


def metrics(cid: str, name: str, seconds: float, reason: str | None = None, fail: str | None = None) -> str:
    return rec({"compilation_metrics": {"compile_id": cid, "co_name": name, "co_filename": "/job/model.py",
                                        "co_firstlineno": 17, "entire_frame_compile_time_s": seconds,
                                        "backend_compile_time_s": seconds / 2, "recompile_reason": reason,
                                        "fail_reason": fail}, "frame_id": int(cid[0]), "frame_compile_id": int(cid[2])})


def storm_log(tmp_path, name="dedicated_log_torch_trace_rank_3_abc.log"):
    lines = [rec({"str": ["/job/model.py", 1]}), rec({"dynamo_start": {"stack": []}, "frame_id": 0}),
             rec({"artifact": {"name": "dynamo_graph_break_reason", "encoding": "string"}, "frame_id": 0}, BREAK),
             rec({"dynamo_output_graph": {"sizes": {}}, "frame_id": 0}, "graph ..."), metrics("0/0", "forward", 2.0)]
    for i in range(1, 9):
        guard = f"0/{i - 1}: tensor 'x' size mismatch at index 1. expected {60 + i}, actual {61 + i}"
        lines.append(rec({"artifact": {"name": "recompile_reasons", "encoding": "json"}, "frame_id": 0,
                          "frame_compile_id": i}, json.dumps(guard)))
        if i < 8:
            lines.append(metrics(f"0/{i}", "forward", 0.5, reason=guard))
            lines.append(rec({"artifact": {"name": "dynamo_graph_break_reason", "encoding": "string"}, "frame_id": 0}, BREAK))
    lines.append(metrics("0/8", None, 0.01, reason="...", fail="Dynamo recompile limit exceeded\n  Explanation: ..."))
    lines.append(rec({"artifact": {"name": "fx_graph_cache_miss", "encoding": "json"}}, "{}"))
    path = tmp_path / name
    path.write_text("".join(lines))
    return path


def test_a_log_gives_breaks_recompiles_the_limit_and_compile_seconds(tmp_path):
    got = torch_trace.read(str(storm_log(tmp_path)))
    assert got.rank == 3
    f = got.facts
    (b,) = f.breaks
    assert (b.location, b.gb_id, b.function, b.source, b.compiles) == (
        "/job/model.py:21", "GB0170", "forward", "if h.abs().max() > 8:", 8)
    assert b.reason == "Data-dependent branching" and "torch.cond" in b.hints[0]
    (r,) = f.recompile_frames
    assert (r.frame, r.count, r.kind, r.tensor, r.dim, r.limit_hit) == ("forward", 7, "size", "x", 1, True)
    assert r.values == [str(v) for v in range(61, 70)] and r.compile_s == 3.5
    assert f.recompiles == 7 and f.unique_graphs == 1 and f.cache_misses == 1 and f.cache_hits == 0
    assert f.compile_time_s == 5.51 and f.backend_s == 2.755 and f.dynamo_s == 2.755


def test_analyze_reports_a_log_directory_as_its_rank_and_names_bad_logs(tmp_path):
    storm_log(tmp_path)
    (tmp_path / "dedicated_log_torch_trace_rank_4_x.log").write_text("this is not a structured log\n" * 5)
    rep = analyze_paths([str(tmp_path)])
    assert [r.rank for r in rep.ranks] == [3]
    ids = {f.id: f for f in rep.findings}
    assert ids["CG-3"].severity == "critical" and ids["CG-2"].severity == "warning"
    assert ids["CG-6"].job_s == 5.51 and ids["CG-6"].job_pct is None  # the job's wall time is not in a log
    (err,) = rep.errors
    assert err.file.endswith("rank_4_x.log") and "not a TORCH_TRACE log" in err.message and "\n" not in err.message


def test_a_record_cut_short_is_skipped_not_fatal(tmp_path):
    path = storm_log(tmp_path, "dedicated_log_torch_trace_x.log")
    path.write_text(path.read_text() + HEAD + '{"compilation_metrics": {"compile_id": "1/0", "co_na')
    got = torch_trace.read(str(path))
    assert got.rank is None and got.facts.recompiles == 7


@pytest.mark.parametrize("name", ["dedicated_log_torch_trace_abc.log", "dedicated_log_torch_trace_rank_0_q1.log"])
def test_log_names(name):
    assert torch_trace.is_log(f"/x/{name}") and not torch_trace.is_log("/x/trace.json")
