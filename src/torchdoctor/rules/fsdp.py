"""Distributed layer, FSDP2: parameters all-gathered twice per step (DI-16).

FSDP2 frees each unit's unsharded parameters after its forward (``reshard_after_forward=True``,
the default for every unit but the root) and all-gathers them again for backward. With memory to
spare, keeping them is the cheapest communication cut there is: the same numbers, one all-gather
per unit and step instead of two (`fix` applies it: remedy ``fsdp.keep_unsharded``).
"""

from __future__ import annotations

from ..advice.fsdp import RESHARD_SETTINGS
from ._comm import PRIORITY, comm_evidence, comm_rule, keep_unsharded_room, resharding_fsdp2
from ._common import View, built_by, finding, fmt_ms, severity
from .engine import RuleInputs, rule
from .model import Evidence, Finding, Fix


def _fix(library: str | None, per: str) -> Fix:
    """DI-16's change: the library's setting where a library calls fully_shard (torchtune's recipes),
    else the job's own call. ``per``: "step", or "micro-batch" under gradient accumulation."""
    why = f"Keep each unit's parameters unsharded between forward and backward (more memory, one all-gather per unit and {per})"
    if library in RESHARD_SETTINGS:
        where, change = RESHARD_SETTINGS[library]
        return Fix(f"{why}: {where}.", change)
    return Fix(f"{why}.", "fully_shard(block, reshard_after_forward=False)   # each unit, and the root")


@rule("DI-16", priority=PRIORITY["DI-16"], budgets=("comm.exposed",))
def reshard_after_forward(inputs: RuleInputs) -> list[Finding]:
    """FSDP2 units reshard after forward while memory would hold them unsharded.

    Gain: the backward all-gathers' share of the exposed communication (rules/_comm.py
    backward_gather_ms: half the all-gather time where the trace names collective kinds, else a
    quarter of the exposed communication, of what was exposed before DI-6's reductions-only claim).
    Severity by that share of the step (default ladder).
    """
    def build(v: View, ms: float, budget: dict[str, float]) -> Finding | None:
        if v.pct(ms) < 0.5:
            return None
        fs = resharding_fsdp2(v)
        _, extra = keep_unsharded_room(v)
        assert fs is not None and extra is not None
        kinds = v.r is not None and v.r.signals is not None and bool(v.r.signals.collectives)
        where = "device memory allows it" if v.accel else "host memory: unchecked on a CPU job"
        more = f"{extra:.0f}" if extra >= 10 else f"{extra:.2g}"
        acc = v.r.signals.accumulation if v.r is not None and v.r.signals is not None else None
        # With gradient accumulation each micro-batch all-gathers for its forward and its backward.
        often = (f"twice per micro-batch ({2 * acc.micro_batches:g} times per step over {acc.micro_batches:g} "
                 "micro-batches)" if acc is not None and acc.micro_batches > 1 else "twice per step")
        return finding(
            v, "DI-16", "distributed",
            f"FSDP2 all-gathers every unit's parameters {often} (reshard_after_forward=True): keeping them "
            f"unsharded from forward to backward saves the backward all-gathers, about {fmt_ms(ms)} per step, "
            f"for {more} MB more memory per rank.",
            ms, sev=severity(v.pct(ms)),
            evidence=[comm_evidence(v, budget), Evidence(
                f"{fs.units or '?'} fully_shard unit(s), {fs.model_mb:.1f} MB of parameters unsharded; kept through "
                f"the step they add {extra:.1f} MB per rank ({where}).",
                {"units": fs.units, "model_mb": fs.model_mb, "extra_mb": round(extra, 1),
                 "split_by_kind": kinds})],
            fix=_fix(built_by(v), "micro-batch" if acc is not None and acc.micro_batches > 1 else "step"),
            confidence="medium" if kinds else "low",
            confirm="" if kinds else "the trace does not split communication by kind: `torchdoctor fix` measures it",
            remedy="fsdp.keep_unsharded", source="FSDP2 fully_shard docstring (reshard_after_forward)")
    return comm_rule(inputs, "DI-16", build)
