"""Which HTA releases the benchmarks compare against, and where each one's virtualenv lives.

Shared by hta_compare.py and speed_vs_hta.py (runs in torchdoctor's environment; the HTA side,
_hta_side.py, runs in each HTA venv). The venvs are made by ``bash benchmarks/setup_hta.sh both``.

    0.5.0  PyPI ``holistictraceanalysis``                  benchmarks/.hta-venv
    0.6.1  PyPI ``traceinsight`` (the newest, renamed)     benchmarks/out/hta-venv-0.6.1

Both import as ``hta``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class HtaVersion:
    version: str
    dist: str  # PyPI distribution
    venv: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def slug(self) -> str:
        """For file names: '0.6.1' -> 'hta061'."""
        return "hta" + self.version.replace(".", "")


HTA_VERSIONS: dict[str, HtaVersion] = {
    "0.5.0": HtaVersion("0.5.0", "holistictraceanalysis", HERE / ".hta-venv"),
    "0.6.1": HtaVersion("0.6.1", "traceinsight", HERE / "out" / "hta-venv-0.6.1"),
}


def add_hta_arg(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--hta",
        choices=[*HTA_VERSIONS, "both"],
        default="both",
        help="HTA release(s) to compare against, each in its own venv (default: both)",
    )


def selected(choice: str) -> list[HtaVersion]:
    return list(HTA_VERSIONS.values()) if choice == "both" else [HTA_VERSIONS[choice]]


def missing_venvs(versions: list[HtaVersion]) -> list[HtaVersion]:
    return [v for v in versions if not v.python.exists()]


def setup_hint(versions: list[HtaVersion]) -> str:
    arg = "both" if len(versions) > 1 else versions[0].version
    return f"run: bash benchmarks/setup_hta.sh {arg}"
