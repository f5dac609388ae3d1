"""Fixtures for the report renderers: analysed real traces and the headless browser."""

from __future__ import annotations

import os

import pytest
from report_helpers import chromium_binary, trace

from torchdoctor.report.model import Report
from torchdoctor.session import analyze_paths


@pytest.fixture(scope="session")
def real_report() -> Report:
    rep = analyze_paths([trace("a100_8rank_rank3.json.gz")])
    assert rep.ranks and rep.ranks[0].analysis is not None, rep.errors
    return rep


@pytest.fixture(scope="session")
def multi_report() -> Report:
    names = ["sampled_128rank_rank0.json.gz", "sampled_128rank_rank1.json.gz", "a100_2rank_rank0_nccl.json.gz",
             "a100_16rank_rank0.json.gz"]
    rep = analyze_paths([trace(n) for n in names], jobs=2)
    assert len(rep.ranks) == len(names), rep.errors
    return rep


@pytest.fixture(scope="session")
def chromium() -> str:
    exe = chromium_binary()
    if exe is None:
        # .ci/run sets TORCHDOCTOR_REQUIRE_CHROMIUM=1: there a missing browser is a failure, not a skip.
        if os.environ.get("TORCHDOCTOR_REQUIRE_CHROMIUM") == "1" or os.environ.get("CI"):
            pytest.fail("chromium is required in CI (.ci/run installs Debian's chromium)")
        pytest.skip("chromium not installed: apt-get install chromium (CI runs these tests)")
    return exe
