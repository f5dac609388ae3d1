"""Shared test fixtures: the real traces and the code-built trace helper."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACES = ROOT.parent / "shared" / "traces"
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    if not SHARED_TRACES.is_dir():
        pytest.fail(f"real traces not found at {SHARED_TRACES}")
    return SHARED_TRACES
