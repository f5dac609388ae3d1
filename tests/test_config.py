"""User control of the rules: config discovery, validation, merge with --ignore, and its effect."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from real_traces import trace
from torchdoctor import config as cfg
from torchdoctor import runner
from torchdoctor.cli import EXIT_PARTIAL, build_parser, main
from torchdoctor.report.console import print_report
from torchdoctor.report.html import render_html
from torchdoctor.session import analyze_paths

REAL = "a100_8rank_rank3.json.gz"  # a real trace with several findings


def messages(entries) -> list[str]:
    return [f"{e.file}: {e.message}" for e in entries]


# --- discovery ---------------------------------------------------------------------------------

def test_discovery_walks_up_and_prefers_torchdoctor_toml(tmp_path):
    (tmp_path / ".git").mkdir()
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    assert cfg.find_config(str(deep)) is None
    (tmp_path / "pyproject.toml").write_text('[tool.torchdoctor]\nignore = ["DL-7"]\n')
    assert cfg.find_config(str(deep)) == str(tmp_path / "pyproject.toml")
    # A pyproject without the table is not a configuration: the search goes on upwards.
    (tmp_path / "a" / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert cfg.find_config(str(deep)) == str(tmp_path / "pyproject.toml")
    (tmp_path / "torchdoctor.toml").write_text('ignore = ["HO-5"]\n')
    assert cfg.find_config(str(deep)) == str(tmp_path / "torchdoctor.toml")  # wins in its directory
    (deep / "pyproject.toml").write_text('[tool.torchdoctor.thresholds]\n"*" = {warn_pct = 10}\n')
    assert cfg.find_config(str(deep)) == str(deep / "pyproject.toml")  # the nearest directory first


def test_discovery_stops_at_the_git_directory(tmp_path):
    (tmp_path / "torchdoctor.toml").write_text('ignore = ["DL-7"]\n')  # outside the repository
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "src").mkdir()
    assert cfg.find_config(str(repo / "src")) is None
    (repo / "torchdoctor.toml").write_text('ignore = ["DL-7"]\n')  # the .git directory is searched
    assert cfg.find_config(str(repo / "src")) == str(repo / "torchdoctor.toml")


# --- validation and merge -----------------------------------------------------------------------

def test_pyproject_table_is_read_and_validated(tmp_path):
    path = tmp_path / "pyproject.toml"
    path.write_text("""
[tool.torchdoctor]
ignore = ["dl-7", "XX-99"]
colour = "red"

[tool.torchdoctor.thresholds]
"*" = {warn_pct = 10}
"DL-2" = {warn_pct = 8, crit_pct = 30, min_pct = 1}
"HO-5" = {warn_pct = true, crit = 3}
"HW-1" = {warn_pct = 50, crit_pct = 20}
"NOPE-1" = {warn_pct = 1}
"DL-1" = {min_pct = 250}
""")
    loaded = cfg.load(str(path))
    assert loaded.errors == []
    assert loaded.rules.ignore == frozenset({"DL-7"})  # ids match case-insensitively
    assert loaded.rules.thresholds == {"*": {"warn_pct": 10.0},
                                       "DL-2": {"warn_pct": 8.0, "crit_pct": 30.0, "min_pct": 1.0}}
    got = messages(loaded.warnings)
    f = str(path)
    assert f"{f}: tool.torchdoctor.ignore: unknown rule id 'XX-99' ignored" in got
    assert any(m.startswith(f"{f}: unknown key 'tool.torchdoctor.colour' ignored") for m in got)
    assert any(m.startswith(f"{f}: 'tool.torchdoctor.thresholds.HO-5.warn_pct' must be a percentage") for m in got)
    assert any(m.startswith(f"{f}: unknown key 'tool.torchdoctor.thresholds.HO-5.crit' ignored") for m in got)
    assert f"{f}: 'tool.torchdoctor.thresholds.HW-1': warn_pct 50 above crit_pct 20: both ignored" in got
    assert f"{f}: tool.torchdoctor.thresholds: unknown rule id 'NOPE-1' ignored" in got
    assert any("'tool.torchdoctor.thresholds.DL-1.min_pct' must be a percentage from 0 to 100" in m for m in got)
    assert len(got) == 7 and all("\n" not in m for m in got)
    assert loaded.to_dict() == {"file": f, "ignore": ["DL-7"],
                                "thresholds": {"*": {"warn_pct": 10.0},
                                               "DL-2": {"warn_pct": 8.0, "crit_pct": 30.0, "min_pct": 1.0}}}


def test_cli_ignore_adds_to_the_file(tmp_path):
    path = tmp_path / "torchdoctor.toml"
    path.write_text('ignore = ["DL-7"]\n[thresholds]\n"*" = {warn_pct = 12.5}\n')
    loaded = cfg.resolve(None, "ho-5, XX-1", start=str(tmp_path))
    assert loaded.file == str(path)
    assert loaded.rules.ignore == frozenset({"DL-7", "HO-5"})
    assert loaded.rules.thresholds == {"*": {"warn_pct": 12.5}}
    assert messages(loaded.warnings) == ["--ignore: unknown rule id 'XX-1' ignored"]
    explicit = cfg.resolve(str(path), None, start="/")  # --config names a file: no search
    assert explicit.file == str(path) and explicit.rules.ignore == frozenset({"DL-7"})


def test_malformed_toml_is_one_line_error_and_defaults_are_used(tmp_path, capsys):
    bad = tmp_path / "torchdoctor.toml"
    bad.write_text('ignore = ["DL-7"\nthresholds = 3\n')
    out = tmp_path / "r.json"
    code = main(["analyze", trace(REAL), "--config", str(bad), "--json", str(out), "-q"])
    assert code == EXIT_PARTIAL  # as for a bad input
    err = capsys.readouterr().err.splitlines()
    (line,) = [e for e in err if str(bad) in e]
    assert line.startswith(f"torchdoctor: error: {bad}: not valid TOML (") and line.endswith("using the defaults")
    doc = json.loads(out.read_text())
    assert doc["config"] == {"file": str(bad), "ignore": [], "thresholds": {}}
    assert doc["ranks"] and doc["findings"]  # the analysis went on, with the defaults
    missing = cfg.resolve(str(tmp_path / "nope.toml"))
    assert [e.message for e in missing.errors] == ["cannot read the configuration: No such file or directory; "
                                                   "using the defaults"]


def test_unknown_ids_are_report_warnings_not_a_crash(tmp_path):
    path = tmp_path / "torchdoctor.toml"
    path.write_text('ignore = ["XX-99"]\nmystery = 1\n')
    rep = analyze_paths([trace(REAL)], config=cfg.resolve(str(path)))
    got = messages(rep.warnings)
    assert f"{path}: ignore: unknown rule id 'XX-99' ignored" in got
    assert any(m.startswith(f"{path}: unknown key 'mystery' ignored") for m in got)
    assert rep.errors == [] and rep.findings


# --- the effect on a real report ------------------------------------------------------------------

def test_ignore_removes_a_finding_from_a_real_report(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no configuration file around
    base = analyze_paths([trace(REAL)])
    top = base.findings[0].id
    assert base.config == {"file": None, "ignore": [], "thresholds": {}}
    out = tmp_path / "r.json"
    assert main(["analyze", trace(REAL), "--ignore", top, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert top not in [f["id"] for f in doc["findings"]]
    assert {f.id for f in base.findings} - {top} <= {f["id"] for f in doc["findings"]}
    assert doc["config"]["ignore"] == [top]
    # The console says which configuration was in effect, in one line.
    printed = capsys.readouterr().out
    assert f"ignoring {top}" in printed


def test_config_line_in_console_and_html(tmp_path):
    path = tmp_path / "torchdoctor.toml"
    path.write_text('ignore = ["DL-7"]\n[thresholds]\n"DL-2" = {warn_pct = 8}\n')
    rep = analyze_paths([trace(REAL)], config=cfg.resolve(str(path)))
    assert rep.config == {"file": str(path), "ignore": ["DL-7"], "thresholds": {"DL-2": {"warn_pct": 8.0}}}
    buf = io.StringIO()
    print_report(rep, Console(file=buf, width=300, highlight=False))
    line = f"config: {path} — ignoring DL-7 — thresholds DL-2 warn_pct=8"
    assert line in buf.getvalue()
    assert line in render_html(rep)
    plain = io.StringIO()
    print_report(analyze_paths([trace(REAL)], config=cfg.LoadedConfig()), Console(file=plain, width=300))
    assert "config:" not in plain.getvalue()  # the default configuration says nothing


def test_run_looks_the_config_up_from_where_it_starts(tmp_path, monkeypatch):
    """`run` (and `demo`, `fix`) read the configuration of the directory they start in."""
    (tmp_path / ".git").mkdir()
    (tmp_path / "torchdoctor.toml").write_text('ignore = ["HO-5"]\n')
    run_dir = tmp_path / "run"
    (run_dir / "ranks").mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"schema": "torchdoctor.run/1", "command": ["python", "x.py"],
                                                  "exit_code": 0, "ranks": []}))
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["run", "--ignore", "DL-7", "--json", str(tmp_path / "r.json"), "-q",
                                      "--", "python", "x.py"])
    runner.report_run(str(run_dir), args)
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["config"] == {"file": str(tmp_path / "torchdoctor.toml"), "ignore": ["DL-7", "HO-5"], "thresholds": {}}


@pytest.mark.parametrize("command", [["analyze", "x.json"], ["run", "--", "true"], ["demo"], ["fix", "--", "true"]])
def test_every_reporting_command_takes_ignore_and_config(command):
    args = build_parser().parse_args([command[0], "--ignore", "DL-7", "--config", "c.toml", *command[1:]])
    assert args.ignore == ["DL-7"] and args.config == "c.toml"
