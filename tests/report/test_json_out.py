"""The JSON file is written rank by rank, byte for byte what encoding the report whole gives."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rank_job import write_job
from torchdoctor.report.json_out import chunks, read_json, to_json, write_json
from torchdoctor.session import analyze_paths


@pytest.mark.parametrize("ranks", [0, 1, 5])
def test_rank_by_rank_bytes_equal_the_whole(tmp_path, ranks):
    paths = [str(p) for p in write_job(tmp_path / "job", ranks, straggler=None)] if ranks else [str(tmp_path / "none")]
    report = analyze_paths(paths)
    assert len(report.ranks) == ranks
    whole = to_json(report)
    assert b"".join(chunks(report)) == whole
    out = tmp_path / "r.json"
    write_json(report, str(out))
    assert out.read_bytes() == whole
    assert [r.rank for r in read_json(str(out)).ranks] == list(range(ranks))


def test_json_to_stdout_is_whole(tmp_path):
    write_job(tmp_path / "job", 40, straggler=7)
    proc = subprocess.run([sys.executable, "-m", "torchdoctor.cli", "analyze", str(tmp_path / "job"),
                           "--json", "-", "-q"], capture_output=True, check=False)
    doc = json.loads(proc.stdout)
    assert len(doc["ranks"]) == 40 and doc["cross_rank"]["straggler"] == 7
