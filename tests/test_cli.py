"""The analyze command end to end: exit codes, one-line errors, the JSON schema."""

from __future__ import annotations

import json
import subprocess
import sys

from kineto_builder import TraceBuilder
from torchdoctor.cli import main


def good_trace(path, rank=0):
    b = TraceBuilder(rank=rank, world_size=2)
    b.step(1, 0, 1000)
    b.kernel("ampere_sgemm", 100, 500, launch_at=50)
    return b.write(path)


def test_json_to_stdout_is_the_only_thing_on_stdout(tmp_path):
    # `--json -` without -q printed the console report first: `| jq` failed (seen on a public trace).
    done = subprocess.run([sys.executable, "-m", "torchdoctor.cli", "analyze", str(good_trace(tmp_path / "t.json")),
                           "--json", "-"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["schema"] == "torchdoctor.report/1"


def test_json_schema_fields(tmp_path):
    out = tmp_path / "r.json"
    assert main(["analyze", str(good_trace(tmp_path / "t.json")), "--json", str(out), "-q"]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == "torchdoctor.report/1"
    (r,) = doc["ranks"]
    assert {"rank", "file", "device", "window", "metrics"} <= r.keys()
    assert {"start_ns", "end_ns", "steps"} <= r["window"].keys()
    want = {"busy_pct", "idle_pct", "compute_pct", "comm_pct", "comm_exposed_pct", "memcpy_pct", "dataloader_pct",
            "dataloader_exposed_pct", "sync_pct", "overlap_pct", "step_ms_median"}
    assert want <= r["metrics"].keys()
    assert r["metrics"]["busy_pct"] == 50.0 and r["metrics"]["step_ms_median"] == 1.0
    assert doc["errors"] == [] and isinstance(doc["findings"], list)


def test_bad_inputs_give_one_line_errors_and_the_rest_is_analysed(tmp_path, capsys):
    good_trace(tmp_path / "rank0.json")
    (tmp_path / "rank1.json").write_text('{"traceEvents": [{"ph": "X", "ts": 1')
    (tmp_path / "rank2.json.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    (tmp_path / "empty").mkdir()
    out = tmp_path / "r.json"
    code = main(["analyze", str(tmp_path), str(tmp_path / "empty"), "--json", str(out), "-q"])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3  # rank1, rank2 and the empty directory: one line each
    assert all(line.startswith("torchdoctor: error: ") for line in err)
    assert any("rank1.json: invalid JSON" in line for line in err)
    assert "Traceback" not in "\n".join(err)
    doc = json.loads(out.read_text())
    assert [r["rank"] for r in doc["ranks"]] == [0]
    assert {e["file"].rsplit("/", 1)[-1] for e in doc["errors"]} == {"rank1.json", "rank2.json.gz", "empty"}


def test_nothing_analysable_exits_2(tmp_path):
    (tmp_path / "x.json").write_text("")
    assert main(["analyze", str(tmp_path / "x.json"), "-q"]) == 2
    assert main(["analyze", str(tmp_path / "missing*.json"), "-q"]) == 2


def test_bad_steps_argument_is_a_usage_error(tmp_path, capsys):
    t = good_trace(tmp_path / "t.json")
    assert main(["analyze", str(t), "--steps", "5", "-q"]) == 2
    assert "--steps" in capsys.readouterr().err
    # A range that selects nothing is reported per file.
    assert main(["analyze", str(t), "--steps", "7:9", "-q"]) == 2


def test_ranks_from_names_and_order_never_merged(tmp_path):
    for name in ("worker_rank3.json", "b.json", "c.json"):
        b = TraceBuilder(rank=None)
        b.step(1, 0, 100)
        b.write(tmp_path / name)
    out = tmp_path / "r.json"
    main(["analyze", str(tmp_path), "--json", str(out), "-q"])
    doc = json.loads(out.read_text())
    ranks = {r["file"].rsplit("/", 1)[-1]: r["rank"] for r in doc["ranks"]}
    assert ranks == {"b.json": 0, "c.json": 1, "worker_rank3.json": 3}


def test_duplicate_rank_is_flagged_not_merged(tmp_path):
    good_trace(tmp_path / "a.json", rank=0)
    good_trace(tmp_path / "b.json", rank=0)
    out = tmp_path / "r.json"
    main(["analyze", str(tmp_path), "--json", str(out), "-q"])
    doc = json.loads(out.read_text())
    assert len(doc["ranks"]) == 2
    assert any("declares rank 0" in w["message"] for w in doc["warnings"])


def test_rank_filter(tmp_path):
    good_trace(tmp_path / "a.json", rank=0)
    good_trace(tmp_path / "b.json", rank=1)
    out = tmp_path / "r.json"
    assert main(["analyze", str(tmp_path), "--rank", "1", "--json", str(out), "-q"]) == 0
    assert [r["rank"] for r in json.loads(out.read_text())["ranks"]] == [1]


def test_analysis_path_does_not_import_torch(tmp_path):
    t = good_trace(tmp_path / "t.json")
    code = ("import sys; from torchdoctor.cli import main; rc = main(['analyze', sys.argv[1], '-q']);"
            "print('torch' in sys.modules, rc)")
    out = subprocess.run([sys.executable, "-c", code, str(t)], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "0"]


def test_a_subcommand_that_fails_to_import_says_so(monkeypatch, capsys):
    import importlib

    real = importlib.import_module

    def failing(name, *a, **k):
        if name == "torchdoctor.fixer":
            raise ImportError("cannot import name 'x' from 'torchdoctor.remedies'")
        return real(name, *a, **k)

    monkeypatch.setattr(importlib, "import_module", failing)
    assert main(["fix", "--apply", "safe", "--", "python", "train.py"]) == 2
    err = capsys.readouterr().err
    assert "'fix' is unavailable" in err and "cannot import name 'x'" in err
    # The other live commands are still registered and parse their arguments.
    from torchdoctor.cli import build_parser

    assert build_parser().parse_args(["demo", "--healthy"]).command == "demo"


def test_run_dir_with_extra_trace_keeps_its_ranks(tmp_path):
    """`analyze RUN_DIR other.json`: the run's ranks and the other file's ranks are all reported."""
    import msgspec

    from torchdoctor.session import analyze_paths

    run = tmp_path / "run"
    (run / "traces").mkdir(parents=True)
    good_trace(run / "traces" / "rank0.json", rank=0)
    manifest = {"schema": "torchdoctor.run/1", "command": ["python", "train.py"], "exit_code": 0,
                "ranks": [{"facts": {"rank": 0, "trace_file": "traces/rank0.json"}}]}
    (run / "run.json").write_bytes(msgspec.json.encode(manifest))
    other = good_trace(tmp_path / "other.json", rank=1)
    rep = analyze_paths([str(run), str(other)])
    assert [r.rank for r in rep.ranks] == [0, 1] and rep.errors == []
    assert rep.ranks[1].file == str(other) and rep.ranks[1].analysis.metrics.busy_pct == 50.0
    # A second file that claims the run's rank is reported apart, with a warning.
    dup = good_trace(tmp_path / "dup.json", rank=0)
    rep = analyze_paths([str(run), str(dup)])
    assert len(rep.ranks) == 2 and any("declares rank 0" in w.message for w in rep.warnings)


def test_a_subcommand_that_fails_after_registering_itself_still_leaves_a_working_cli(monkeypatch, capsys):
    """`demo` registers its parser, then fails importing the fixer: no argparse conflict, no traceback."""
    import torchdoctor.workloads.cli as demo_cli

    def half(sub):
        sub.add_parser("demo")
        raise ImportError("msgspec is broken")

    monkeypatch.setattr(demo_cli, "add_demo_parser", half)
    assert main(["demo", "--healthy"]) == 2
    assert "'demo' is unavailable" in capsys.readouterr().err
    from torchdoctor.cli import build_parser

    assert build_parser().parse_args(["analyze", "x.json"]).command == "analyze"


def test_analyze_keeps_freed_memory_in_its_own_process(tmp_path, monkeypatch):
    # The decoder frees ~16 MB pieces and column arrays; glibc's default thresholds hand them back
    # to the kernel and fault them in again (benchmarks/results/scale.md: 10% of the wall time on
    # 16 x 620 MB). analyze sets the thresholds once, before its workers fork.
    import torchdoctor.advice.host_allocator as ha

    calls = []
    monkeypatch.setattr(ha, "keep_freed_memory", lambda **kw: calls.append(kw))
    assert main(["analyze", str(good_trace(tmp_path / "t.json")), "-q"]) == 0
    # Without the top pad and the heap for big blocks: analyze's blocks stay under the mmap
    # threshold, and both would only keep more resident (advice/host_allocator.keep_freed_memory).
    assert calls == [{"big_blocks": False}]
