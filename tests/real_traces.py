"""The real Kineto traces kept in the repository (tests/data/hta and tests/data/public, see their READMEs
for origin and licence)."""

from __future__ import annotations

from pathlib import Path

TRACES = Path(__file__).resolve().parent / "data" / "hta"
# Public traces from other projects (tests/data/public, see its README for origin and licence).
PUBLIC = TRACES.parent / "public"


def trace(name: str, folder: Path = TRACES) -> str:
    """Path of one real trace by file name; a missing file is a broken checkout, never a skip."""
    path = folder / name
    if not path.is_file():
        raise FileNotFoundError(f"real trace {path} missing from the repository")
    return str(path)
