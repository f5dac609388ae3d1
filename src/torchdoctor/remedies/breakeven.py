"""When does compiling pay? Break-even steps of a remedy that compiles, from the A/B runs.

`fix` measures the steady step of the baseline and of the treated runs; the probe of each run
records how long it compiled (``CompileFacts.compile_time_s``). Compiling pays once the steps
after it saved more than it cost: break-even = extra compile seconds / seconds saved per step.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from torchdoctor.remedies.measure import Arm


def _compile_s(arm: Arm) -> float:
    """Seconds the run compiled: its slowest rank (the others wait for it at the first collective)."""
    return max((f.compile.compile_time_s or 0.0 for f in arm.facts), default=0.0)


def _steps(arm: Arm) -> int | None:
    last = [f.last_step for f in arm.facts if f.last_step is not None]
    return max(last) + 1 if last else None


def break_even(arms: Sequence[Arm]) -> dict[str, Any] | None:
    """The compile remedy's cost and payback; None when the treated runs compiled no more than the
    baseline (nothing was compiled by the remedy) or a side has no measured speed.

    ``compile_s``: extra compile seconds of the treated runs (median over rounds, slowest rank,
    less the baseline's own); ``baseline_step_ms`` / ``treated_step_ms``: steady steps (median
    over rounds); ``saved_ms_per_step``; ``break_even_steps`` (None when compiling saves nothing
    per step: it never pays); ``job_steps``: steps of one run; ``pays_within_run``.
    """
    base = [a for a in arms if a.kind == "baseline" and a.ok and a.steps_per_s]
    treated = [a for a in arms if a.kind == "treated" and a.ok and a.steps_per_s]
    if not base or not treated:
        return None
    extra = statistics.median(_compile_s(a) for a in treated) - statistics.median(_compile_s(a) for a in base)
    if extra <= 0:
        return None
    base_ms = 1000.0 / statistics.median(a.steps_per_s for a in base)  # type: ignore[misc]
    treated_ms = 1000.0 / statistics.median(a.steps_per_s for a in treated)  # type: ignore[misc]
    saved = base_ms - treated_ms
    steps = _steps(treated[0])
    even = int(-(-extra * 1000.0 // saved)) if saved > 0 else None
    return {
        "compile_s": round(extra, 3), "baseline_step_ms": round(base_ms, 3), "treated_step_ms": round(treated_ms, 3),
        "saved_ms_per_step": round(saved, 3), "break_even_steps": even, "job_steps": steps,
        "pays_within_run": bool(even is not None and steps is not None and even <= steps),
    }


def sentence(be: dict[str, Any]) -> str:
    """One line for the console."""
    head = (f"compile: {be['compile_s']:.1f} s compiling; steady step {be['baseline_step_ms']:.1f} -> "
            f"{be['treated_step_ms']:.1f} ms")
    if be["break_even_steps"] is None:
        return head + ": compiled steps are not faster, so compiling never pays back."
    runs = f" (this run: {be['job_steps']} steps" + (", it pays within it)" if be["pays_within_run"]
                                                     else ", it does not pay within it)") if be["job_steps"] else ""
    return head + f": pays back after {be['break_even_steps']:,} steps{runs}."
