"""Shared test fixtures: the real traces and the code-built trace helper."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from real_traces import TRACES  # noqa: E402  (importable only once tests/ is on the path)


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    return TRACES
