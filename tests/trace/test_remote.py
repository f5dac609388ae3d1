"""Traces named by URL: listed through fsspec on the driver, copied and analysed by the worker."""

from __future__ import annotations

import fsspec
import pytest

from rank_job import write_job
from torchdoctor.session import analyze_paths
from torchdoctor.trace.load import is_trace_name
from torchdoctor.trace.remote import discover_url, is_url


def test_is_url():
    assert is_url("s3://bucket/run/") and is_url("file:///tmp/x.json") and is_url("memory://a/b.json.gz")
    assert not is_url("/tmp/x.json") and not is_url("traces/rank0.json") and not is_url("C:\\x.json")


@pytest.fixture()
def remote_job(tmp_path):
    """A job's traces in fsspec's in-memory filesystem (a stand-in for an object store: nothing is on
    disk under these URLs; forked workers inherit its contents)."""
    fs = fsspec.filesystem("memory")
    local = write_job(tmp_path / "job", 4, straggler=1, gz=True)
    for p in local:
        fs.pipe(f"/job-{tmp_path.name}/{p.name}", p.read_bytes())
    fs.pipe(f"/job-{tmp_path.name}/notes.txt", b"not a trace")
    yield f"memory:///job-{tmp_path.name}", tmp_path / "job"
    fs.rm(f"/job-{tmp_path.name}", recursive=True)


def test_url_directory_is_listed_and_analysed_like_local_files(remote_job):
    url, local = remote_job
    files = discover_url(url, is_trace_name)
    assert [f.rsplit("/", 1)[-1] for f in files] == [f"rank{r}.json.gz" for r in range(4)]
    remote = analyze_paths([url], jobs=2)
    here = analyze_paths([str(local)], jobs=2)
    assert not remote.errors
    assert [r.file for r in remote.ranks] == files  # the report names the URLs
    assert remote.cross_rank.straggler == here.cross_rank.straggler == 1
    assert [r.metrics for r in remote.ranks] == [r.metrics for r in here.ranks]


def test_missing_url_and_file_url(remote_job, tmp_path):
    url, local = remote_job
    report = analyze_paths([url + "-nope", f"file://{local}/rank0.json.gz"])
    assert [(e.file, e.message) for e in report.errors] == [(url + "-nope", "no .json or .json.gz trace at this URL")]
    assert [r.rank for r in report.ranks] == [0]
