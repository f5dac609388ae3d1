"""`benchmarks/gpu_check.sh --dry-run`: the GPU check's every step really runs on a CPU, small.

The GPU machine's time is short; this keeps the script from rotting between its runs there.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_check.sh"
STEPS = [
    "env", "wheels", "demo_sick", "demo_healthy", "demo_fix", "analyze_demo_sick", "analyze_demo_healthy",
    *(f"{kind}{case}" for case in ("cpu_module", "fp32_matmul", "unpinned_copy", "item_sync", "unfused_adamw")
      for kind in ("path_", "analyze_path_")),
    "overhead", "bundle",
]  # fmt: skip
MAX_FILES, MAX_BYTES = 8, 16 * 2**20
ROW = re.compile(r"^\| (\w+) \| (-?\d+) \| ([\d.]+) \|")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check") / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR_")}
    env["GPU_CHECK_PYTHON"] = sys.executable  # the interpreter (and torch) this test suite runs with
    result = subprocess.run(
        ["bash", str(SCRIPT), str(out), "--dry-run"], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    return result, out


def test_every_step_runs_and_exits_0(dry_run):
    result, out = dry_run
    assert result.returncode == 0, (result.stdout[-4000:], result.stderr[-2000:])
    summary = (out / "summary.md").read_text()
    assert result.stdout.rstrip().endswith(summary.rstrip())  # the summary is printed last
    rows = {m[1]: (int(m[2]), float(m[3])) for m in map(ROW.match, summary.splitlines()) if m}
    assert list(rows) == STEPS, summary
    assert {name: rc for name, (rc, _) in rows.items() if rc != 0} == {}, summary
    assert "nvidia-smi: not run" in (out / "env.txt").read_text()


def test_reports_parse_and_name_the_pathologies(dry_run):
    _, out = dry_run
    reports = {name: json.loads((out / f"{name}.json").read_text()) for name in ("demo_sick", "demo_healthy", "demo_fix")}
    for report in reports.values():
        assert report["schema"] == "torchdoctor.report/1" and len(report["ranks"]) == 2
    # The pathological demo's top finding on a CPU: the DataLoader in the training process. Which
    # input rule leads depends on the CPU time the job measured: with a core free for a worker, DL-2
    # (num_workers=0) claims the wait; with the job's threads on every core (a loaded machine), DL-1.
    sick = reports["demo_sick"]["findings"]
    assert sick and sick[0]["id"] in ("DL-2", "DL-1") and sick[0]["severity"] == "critical"
    assert any(f["id"] == "DL-2" for f in sick)
    assert reports["demo_fix"]["source"] == "fix" and reports["demo_fix"]["ab"]["remedies"]
    overhead = json.loads((out / "overhead.json").read_text())
    assert overhead["plain_steps_per_s"] and overhead["probe_steps_per_s"]
    # The other reports and the run directories travel in the archive; each pathology left a trace.
    with tarfile.open(out / "gpu_check.tar.gz") as tar:
        names = tar.getnames()
        for name in [n for n in names if n.startswith("gpu_check/reports/")]:
            report = json.load(tar.extractfile(name))
            assert report["schema"] == "torchdoctor.report/1" and report["ranks"], name
    for case in ("cpu_module", "fp32_matmul", "unpinned_copy", "item_sync", "unfused_adamw"):
        assert f"gpu_check/reports/path_{case}.json" in names
        assert f"gpu_check/reports/analyze_path_{case}.json" in names
        assert f"gpu_check/runs/path_{case}/traces/rank0.json.gz" in names


def test_out_dir_stays_small(dry_run):
    _, out = dry_run
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= MAX_FILES, files
    assert max(p.stat().st_size for p in files) <= MAX_BYTES
    assert {p.name for p in files} >= {"summary.md", "env.txt", "steps.log", "gpu_check.tar.gz"}
