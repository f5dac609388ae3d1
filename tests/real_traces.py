"""The real Kineto traces kept in the repository (tests/data/hta, see its README for origin and licence)."""

from __future__ import annotations

from pathlib import Path

TRACES = Path(__file__).resolve().parent / "data" / "hta"


def trace(name: str) -> str:
    """Path of one real trace by file name; a missing file is a broken checkout, never a skip."""
    path = TRACES / name
    if not path.is_file():
        raise FileNotFoundError(f"real trace {path} missing from the repository")
    return str(path)
