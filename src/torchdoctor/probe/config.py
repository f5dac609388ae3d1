"""Environment contract between the ``torchdoctor run`` wrapper and the probe inside the job.

The wrapper sets these variables; every process of the job inherits them, so ranks started by
torchrun, ``torch.multiprocessing.spawn`` or any other launcher are instrumented too.
This module imports nothing heavy: the bootstrap reads it at interpreter start-up.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

# Directory of the run; the probe is active only when this is set.
ENV_RUN_DIR = "TORCHDOCTOR_RUN_DIR"
# Profiler window "A:B" (steps A <= s < B), or "off".
ENV_PROFILE_STEPS = "TORCHDOCTOR_PROFILE_STEPS"
# Comma-separated remedy ids for ``torchdoctor.remedies.apply`` (used by ``torchdoctor fix``).
ENV_REMEDIES = "TORCHDOCTOR_REMEDIES"
# Seconds between periodic writes of the rank summary (so a killed job still leaves one).
ENV_FLUSH_S = "TORCHDOCTOR_FLUSH_S"
# Test-only fault injection: comma list of probe sites that must raise (see ``errors.fault_point``).
ENV_FAULT = "TORCHDOCTOR_PROBE_FAULT"

DEFAULT_PROFILE_STEPS = (5, 8)
DEFAULT_FLUSH_S = 30.0


def parse_steps(text: str | None) -> tuple[int, int] | None:
    """Parse a profiler window "A:B" (half-open, A >= 1, B > A); "off"/"none"/"" disable it.

    Raises ValueError on anything else, so the CLI can reject it before starting the job.
    """
    if text is None:
        return DEFAULT_PROFILE_STEPS
    text = text.strip().lower()
    if text in ("", "off", "none", "0"):
        return None
    start, sep, end = text.partition(":")
    if not sep:
        raise ValueError(f"profile steps must look like A:B or 'off', got {text!r}")
    a, b = int(start), int(end)
    # Step 0 holds start-up work (compilation, worker start): never profile it.
    if a < 1 or b <= a:
        raise ValueError(f"profile steps need 1 <= A < B, got {text!r}")
    return a, b


@dataclass(frozen=True)
class ProbeConfig:
    """What the probe in one process was asked to do."""

    run_dir: str
    # Half-open window of steps to profile; None disables the profiler.
    profile: tuple[int, int] | None = DEFAULT_PROFILE_STEPS
    flush_s: float = DEFAULT_FLUSH_S
    fault: str | None = None

    @property
    def report_step(self) -> int:
        """Step at whose start ranks gather their summaries (end of the profiler window)."""
        return (self.profile or DEFAULT_PROFILE_STEPS)[1]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> ProbeConfig | None:
        """Read the config the wrapper exported; None when the probe is not requested."""
        run_dir = environ.get(ENV_RUN_DIR)
        if not run_dir:
            return None
        try:
            profile = parse_steps(environ.get(ENV_PROFILE_STEPS))
        except ValueError:
            profile = DEFAULT_PROFILE_STEPS
        try:
            flush_s = float(environ.get(ENV_FLUSH_S, DEFAULT_FLUSH_S))
        except ValueError:
            flush_s = DEFAULT_FLUSH_S
        return cls(run_dir=run_dir, profile=profile, flush_s=flush_s, fault=environ.get(ENV_FAULT) or None)
