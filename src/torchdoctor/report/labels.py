"""Words and colours shared by the visual renderers (HTML report, annotated trace).

Kept apart from `console` so the trace annotator does not import rich, and from `html` so it does
not import plotly: both renderers must agree on what an idle cause is called and how it looks.
"""

from __future__ import annotations

# Short enough for a slice label in Perfetto ("idle: waiting for DataLoader, 23 ms").
CAUSE_SHORT = {
    "dataloader": "waiting for DataLoader",
    "sync": "host blocked in device sync",
    "optimizer": "optimizer step on host",
    "comm_host": "host in collective call",
    "host_ops": "host busy in other ops",
    "untraced": "host outside traced ops",
}
# Okabe–Ito palette: distinguishable under the common colour-vision deficiencies. Busy time is a
# muted slate so the idle gaps, which are what the report is about, carry the colour.
CAUSE_COLOR = {
    "dataloader": "#E69F00",
    "sync": "#D55E00",
    "optimizer": "#CC79A7",
    "comm_host": "#0072B2",
    "host_ops": "#56B4E9",
    "untraced": "#5E6B78",
}
UNKNOWN_CAUSE_COLOR = "#333333"
BUSY_COLOR = "#D3DAE2"
CAUSE_ORDER = tuple(CAUSE_SHORT)


def cause_label(cause: str) -> str:
    return CAUSE_SHORT.get(cause, cause)


def fmt_ms(ms: float) -> str:
    """Milliseconds with as many digits as a reader needs: 23 ms, 4.2 ms, 0.35 ms, 0.012 ms."""
    a = abs(ms)
    if a >= 10:
        return f"{ms:.0f}"
    if a >= 1:
        return f"{ms:.1f}"
    if a >= 0.1:
        return f"{ms:.2f}"
    return f"{ms:.3f}"


def job_cost(job_s: float, job_pct: float | None, per: str, sep: str = ", ") -> str:
    """A cost priced against the job's wall time, not the step: compiling is paid once; work
    between steps (``per`` "job") recurs over the whole run."""
    head = f"{job_s:.1f} s in all" if per == "job" else f"once: {job_s:.1f} s"
    return head + (f"{sep}{job_pct:.0f}% of the job" if job_pct is not None else "")


def steps_label(steps: tuple[int, ...] | list[int]) -> str:
    """A window's steps in words: "step 5", "steps 5–7"."""
    return f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}–{steps[-1]}"
