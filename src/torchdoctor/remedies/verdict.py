"""Verdicts of the A/B loop: is the treated job faster, does it still learn the same, and which
remedy earns its place (no torch).

- Speed-up: per round k, steps/s of B_k over A_k (A and B alternate, so slow drift of the machine
  hits both); reported as the median with its min and max. The noise is the run-to-run spread of
  the arms themselves (never below ``NOISE_FLOOR``); slower "beyond noise" means the median
  speed-up is below 1 - noise and no round was faster.
- Learning: the loss of every step is compared with the same round's baseline over the same steps
  and seed. ``safe`` remedies must give identical losses (when the baseline reproduces itself;
  otherwise the check is inconclusive and says so); ``numerics`` remedies must stay within
  ``|delta| <= atol + rtol * |loss|`` at every step.
- Each remedy's own share (``--ablate``): leave-one-out, steps/s of the treated job over the
  treated job without that remedy, per round.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from ..report.model import ABRemedy, ABResult
from .catalogue import SAFETY_RANK, Spec
from .measure import Arm, LossDiff, loss_diff

NOISE_FLOOR = 0.03  # below 3% two runs of the same job on a shared machine are not told apart
NUMERICS_RTOL = 0.05
NUMERICS_ATOL = 1e-3


@dataclass
class Verdict:
    spec: Spec
    status: str  # kept | rejected | refused | no-op
    speedup: float | None = None
    spread: tuple[float, float] | None = None
    reason: str = ""


@dataclass
class LossCheck:
    status: str  # identical | within tolerance | changed | inconclusive | not recorded
    text: str
    diff: LossDiff | None = None

    @property
    def passed(self) -> bool:
        return self.status != "changed"


@dataclass
class Outcome:
    ab: ABResult
    verdicts: list[Verdict]
    loss: LossCheck
    noise: float
    details: dict[str, Any] = field(default_factory=dict)


def _spread(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    return (max(values) - min(values)) / statistics.median(values)


def _ratios(num: list[Arm], den: list[Arm]) -> list[float]:
    by_round = {a.round: a for a in den}
    out = []
    for b in num:
        a = by_round.get(b.round)
        if a is not None and a.steps_per_s and b.steps_per_s and a.ok and b.ok:
            out.append(b.steps_per_s / a.steps_per_s)
    return out


def within(a: dict[int, list[float]], b: dict[int, list[float]], rtol: float, atol: float) -> bool:
    return all(abs(x - y) <= atol + rtol * abs(x) for r, xs in a.items() for x, y in zip(xs, b.get(r, []), strict=False))


def check_losses(base: list[Arm], treated: list[Arm], safety: str, rtol: float) -> LossCheck:
    """Do the treated runs learn the same as the baseline runs of the same rounds?"""
    pairs = [(a, b) for a in base for b in treated if a.round == b.round]
    diffs = [(a, b, loss_diff(a.losses, b.losses)) for a, b in pairs if a.ok and b.ok]
    diffs = [(a, b, d) for a, b, d in diffs if d is not None]
    if not diffs:
        return LossCheck("not recorded", "no loss recorded (the job calls no backward on a scalar)")
    worst = max((d for _, _, d in diffs), key=lambda d: d.max_abs)
    selfs = [loss_diff(base[0].losses, a.losses) for a in base[1:] if a.ok]
    selfs_d = [d for d in selfs if d is not None]
    reproducible = all(d.identical for d in selfs_d) if selfs_d else None
    where = f"max |delta| {worst.max_abs:.3g} ({worst.max_rel:.2%}) first at step {worst.first_step}"
    if safety == "safe":
        if all(d.identical for _, _, d in diffs):
            extra = "" if reproducible else " (the baseline's own reproducibility was not checked: one round)"
            return LossCheck("identical", f"identical losses over {worst.compared} steps{extra}", worst)
        if reproducible is False:
            noise = max(d.max_abs for d in selfs_d)
            status = "inconclusive" if worst.max_abs <= noise * 1.5 + 1e-12 else "changed"
            return LossCheck(status, f"{where}; but two baseline runs already differ by {noise:.3g}: "
                             "the job is not deterministic (fix its seeds to check)", worst)
        return LossCheck("changed", f"losses differ from the baseline: {where}", worst)
    ok = all(within(a.losses, b.losses, rtol, NUMERICS_ATOL) for a, b, _ in diffs)
    tol = f"|delta| <= {NUMERICS_ATOL:g} + {rtol:g} x |loss| at every step"
    if ok:
        return LossCheck("within tolerance", f"{where}; within {tol}", worst)
    return LossCheck("changed", f"{where}; beyond {tol}", worst)


def _stats(xs: list[float]) -> tuple[float, float, float]:
    return (statistics.median(xs), min(xs), max(xs)) if xs else (0.0, 0.0, 0.0)


def judge(arms: list[Arm], specs: list[Spec], pre_refused: dict[str, str], rtol: float = NUMERICS_RTOL) -> Outcome:
    base = [a for a in arms if a.kind == "baseline"]
    treated = [a for a in arms if a.kind == "treated"]
    base_rates = [a.steps_per_s for a in base if a.ok and a.steps_per_s]
    treated_rates = [a.steps_per_s for a in treated if a.ok and a.steps_per_s]
    speedups = _ratios(treated, base)
    noise = max(NOISE_FLOOR, _spread(base_rates), _spread(treated_rates))  # type: ignore[arg-type]
    # The treated job's class: the loosest of the remedies it actually ran with.
    loss = check_losses(base, treated, loss_class(treated[0].specs, "") if treated else "safe", rtol)
    med, lo, hi = _stats(speedups)
    failed = [a for a in treated if not a.ok]
    slower = bool(speedups) and med < 1 - noise and hi < 1
    applied = {rid for a in treated for rid in a.applied}
    refused = {rid: why for a in treated for rid, why in a.refused.items() if rid not in applied}
    verdicts = []
    for spec in specs:
        rid = spec.id
        if rid in pre_refused or rid in refused:
            verdicts.append(Verdict(spec, "refused", reason=pre_refused.get(rid) or refused[rid]))
            continue
        if treated and not failed and rid not in applied:
            why = next((a.skipped[rid] for a in treated if rid in a.skipped), "the job never reached what it changes")
            verdicts.append(Verdict(spec, "no-op", reason=f"nothing to change: {why}"))
            continue
        verdicts.append(_verdict(spec, arms, base, treated, failed, loss, slower, (med, lo, hi), noise, rtol))
    ab = ABResult(
        baseline_steps_per_s=round(statistics.median(base_rates), 4) if base_rates else 0.0,
        treated_steps_per_s=round(statistics.median(treated_rates), 4) if treated_rates else 0.0,
        speedup_median=round(med, 4), speedup_min=round(lo, 4), speedup_max=round(hi, 4),
        remedies=[ABRemedy(str(v.spec), v.status == "kept",
                           round(v.speedup, 4) if v.speedup is not None else None,
                           f"{v.status}: {v.reason}") for v in verdicts],
    )
    return Outcome(ab, verdicts, loss, noise)


def _verdict(spec: Spec, arms: list[Arm], base: list[Arm], treated: list[Arm], failed: list[Arm],
             loss: LossCheck, slower: bool, stats: tuple[float, float, float], noise: float,
             rtol: float) -> Verdict:
    """Kept or rejected: from the leave-one-out arms when there are any, else as part of the set."""
    ablated = [a for a in arms if a.kind == "ablated" and a.without == spec.id]
    if ablated:
        return _own_share(spec, base, treated, ablated, failed, loss, noise, rtol)
    med, lo, hi = stats
    v = Verdict(spec, "rejected", med if treated and not failed else None, (lo, hi))
    if failed:
        v.reason = f"the job failed with the remedies (exit {failed[0].exit_code}); see {failed[0].run_dir}/job.log"
    elif not loss.passed:
        v.reason = f"the job learns differently: {loss.text}"
    elif slower:
        v.reason = f"the job is slower: x{med:.2f} (x{lo:.2f}..x{hi:.2f}; noise {noise:.0%})"
    else:
        note = " with the set" if len(treated[0].specs) > 1 else ""
        effect = "no measurable effect" if med < 1 + noise else "faster"
        v.status, v.reason = "kept", f"{effect}{note}: x{med:.2f} (x{lo:.2f}..x{hi:.2f}); losses {loss.status}"
    return v


def _own_share(spec: Spec, base: list[Arm], treated: list[Arm], ablated: list[Arm], failed: list[Arm],
               loss: LossCheck, noise: float, rtol: float) -> Verdict:
    """Leave-one-out: what the job loses when only this remedy is taken away."""
    share = _ratios(treated, ablated)
    med, lo, hi = _stats(share)
    v = Verdict(spec, "rejected", med if share else None, (lo, hi) if share else None)
    if failed and any(a.ok for a in ablated):
        v.reason = f"the job fails with it (exit {failed[0].exit_code}) and runs without it"
    elif not loss.passed and check_losses(base, ablated, loss_class(treated[0].specs, spec.id), rtol).passed:
        v.reason = f"the losses change with it and not without it: {loss.text}"
    elif share and med < 1 - noise and hi < 1:
        v.reason = f"the job is faster without it: own share x{med:.2f} (x{lo:.2f}..x{hi:.2f}; noise {noise:.0%})"
    elif failed or not loss.passed:
        # Not the sole cause, but nothing shows it is harmless either: a fix must be proven.
        v.reason = "unproven: the set fails or learns differently with and without it"
    else:
        effect = "no measurable effect on its own" if not share or med < 1 + noise else "own share"
        v.status, v.reason = "kept", f"{effect}: x{med:.2f} (x{lo:.2f}..x{hi:.2f}), leave-one-out; losses {loss.status}"
    return v


def loss_class(specs: list[str], without: str) -> str:
    """Safety class of a set of remedies given as "id[=value]" strings, minus one of them."""
    from .catalogue import BY_ID

    ids = [s.split("=")[0] for s in specs if s.split("=")[0] != without]
    return max((BY_ID[i].safety for i in ids if i in BY_ID), key=lambda c: SAFETY_RANK[c], default="safe")
