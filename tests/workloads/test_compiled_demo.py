"""`torchdoctor demo --compile`: the compiled job's injected breaks and recompiles, each named at
its line with its cause, compile time priced against the job; the fixed job raises no compile
warning. Real torch.compile (Dynamo + AOTAutograd, backend aot_eager on CPU)."""

from __future__ import annotations

import inspect
import json

import pytest

from probe.livejob import PY, run
from torchdoctor.workloads import compiled

STEPS = "30"  # about 6 distinct batch lengths: recompiles past the warning, short of the limit


def demo(run_dir, *flags, **env):
    out = run_dir.with_suffix(".json")
    result = run([PY, "-m", "torchdoctor.workloads.cli", "--compile", "--quiet", "--steps", STEPS,
                  "--out", str(run_dir), "--json", str(out), *flags], **env)
    assert result.returncode in (0, 3), result.stderr[-3000:]
    return json.loads(out.read_text())


def line_of(text: str) -> int:
    src, first = inspect.getsourcelines(compiled.TinyLM.forward)
    return first + next(i for i, line in enumerate(src) if text in line)


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("torch_trace")


@pytest.fixture(scope="module")
def sick(tmp_path_factory, logs):
    """The pathological job, its structured compile logs written too (TORCH_TRACE)."""
    return demo(tmp_path_factory.mktemp("compiled") / "sick", TORCH_TRACE=str(logs))


def test_each_break_is_named_at_its_line_with_its_kind_and_eager_time(sick):
    cg2 = next(f for f in sick["findings"] if f["id"] == "CG-2")
    items = {i["location"].rsplit("/", 1)[-1]: i for e in cg2["evidence"] for i in e.get("items", []) if "location" in i}
    log_at, if_at = f"compiled.py:{line_of('log.debug')}", f"compiled.py:{line_of('if h.abs().max()')}"
    assert set(items) == {log_at, if_at}, items
    assert items[log_at]["kind"] == "logger" and items[log_at]["gb_id"] == "GB0291"
    assert items[if_at]["kind"] == "branch" and items[if_at]["gb_id"] == "GB0170"
    assert "at 2 place(s)" in cg2["title"] and cg2["recoverable_pct"] == 0.0
    # The branch, rewritten with torch.where after the run and validated in a child Python.
    assert items[if_at]["rewrite_ok"] is True and "both branches" in items[if_at]["rewrite_check"]
    assert "+            h = torch.where(h.abs().max() > CLIP, h.clamp(-CLIP, CLIP), h)" in cg2["fix"]["snippet"]
    assert "rewritten below with torch.where (validated: " in cg2["fix"]["text"]
    # Each break's eager time is measured in the profiler window (the gap before its resume).
    assert all(i["eager_ms_per_step"] is not None and i["eager_ms_per_step"] > 0 for i in items.values()), items
    # The report's compile section says the same, per break.
    section = sick["ranks"][0]["compile"]
    listed = {b["location"].rsplit("/", 1)[-1]: b for b in section["graph_breaks"]}
    assert set(listed) == {log_at, if_at} and all(b["function"] == "forward" for b in listed.values())
    assert [listed[k]["eager_ms_per_step"] for k in (log_at, if_at)] == [items[k]["eager_ms_per_step"] for k in (log_at, if_at)]
    assert section["compile_s"] > 0 and section["graphs"] >= 3


def test_recompiles_name_the_changing_dimension_and_cost_the_job_not_the_step(sick):
    cg3 = next(f for f in sick["findings"] if f["id"] == "CG-3")
    facts = sick["ranks"][0]["facts"]["compile"]
    forward = next(r for r in facts["recompile_frames"] if r["frame"] == "forward")
    assert (forward["kind"], forward["tensor"], forward["dim"]) == ("size", "ids", 1)
    assert any(r["frame"] == "forward" and r["count"] == forward["count"] for r in sick["ranks"][0]["compile"]["recompiles"])
    assert forward["count"] >= 2 and len(forward["values"]) == forward["count"] + 1
    assert cg3["severity"] in ("warning", "critical") and "input 'ids' changes size at dim 1" in cg3["title"]
    assert "torch._dynamo.mark_dynamic(ids, 1)" in cg3["fix"]["snippet"]
    assert cg3["recoverable_pct"] == 0.0 and not cg3.get("claims") and 0 < cg3["job_pct"] < 100
    cg6 = next(f for f in sick["findings"] if f["id"] == "CG-6")
    wall = sick["ranks"][0]["facts"]["train_wall_s"]
    assert abs(cg6["job_pct"] - 100 * facts["compile_time_s"] / wall) < 0.1
    assert cg6["job_s"] >= cg3["job_s"]


def test_the_fixed_compiled_job_raises_no_compile_warning(tmp_path):
    rep = demo(tmp_path / "healthy", "--healthy")
    compile_findings = [f for f in rep["findings"] if f["layer"] == "compile"]
    assert [f["id"] for f in compile_findings] == ["CG-6"] and compile_findings[0]["severity"] == "info"
    assert rep["ranks"][0]["facts"]["compile"].get("graph_breaks") == 0
    assert not rep["ranks"][0]["facts"]["compile"].get("recompiles")


def test_analyze_on_the_torch_trace_logs_finds_what_the_live_run_found(sick, logs, tmp_path):
    """`torchdoctor analyze TORCH_TRACE_DIR`: the same breaks (line, id, times met) and recompiles
    (frame, count, input, dim, sizes) as the probe read from Dynamo in the live run."""
    out = tmp_path / "logs.json"
    result = run([PY, "-m", "torchdoctor.cli", "analyze", str(logs), "--quiet", "--json", str(out)])
    assert result.returncode in (0, 3), result.stderr[-2000:]
    rep = json.loads(out.read_text())
    live, offline = sick["ranks"][0]["compile"], rep["ranks"][0]["compile"]

    def breaks(section):
        return sorted((b["location"], b["gb_id"], b["function"], b["count"]) for b in section["graph_breaks"])

    def recompiles(section):
        return sorted((r["frame"], r["count"], r["kind"], r["tensor"], r["dim"], tuple(r["values"]), r["limit_hit"])
                      for r in section["recompiles"])

    assert breaks(offline) == breaks(live) and len(breaks(live)) == 2
    assert recompiles(offline) == recompiles(live) and recompiles(live)
    assert offline["graphs"] == live["graphs"] and offline["compile_s"] > 0
    assert {f["id"] for f in rep["findings"]} >= {"CG-2", "CG-3", "CG-6"}
