"""Verdicts of the A/B loop: is the treated job faster, does it still learn the same, and which
remedy earns its place (no torch).

- Speed-up: per round k, the pair ratio r_k = steps/s of B_k over A_k (the arms of a round run back
  to back, in ABBA order, so slow drift of the machine hits both and neither always runs first).
  The estimate is the geometric mean of the r_k; its interval is a 90% two-sided percentile
  bootstrap over the pair log-ratios (BOOTSTRAP_RESAMPLES resamples of the pairs with replacement,
  numpy's default_rng(BOOTSTRAP_SEED), numpy.percentile with linear interpolation at 5 and 95),
  so each bound is a 95% one-sided bound. Below MIN_PAIRS pairs no interval is given: it is "not
  established". The interval is coarse with few pairs: with 3, the resamples repeating the
  smallest ratio three times are 1/27 (3.7%) of all, so the lower bound is (up to resampling) the
  log-mean of the smallest ratio taken twice and the middle one once. The exact two-sided sign test over the pairs (ties left out) is reported alongside.
- Kept only when the interval's lower bound is > 1 (the gain is established), or when the remedy
  is free and safe by construction (``Remedy.free``): then "neutral, kept because it costs
  nothing". Rejected as slower when the upper bound is < 1; otherwise rejected: "no established
  gain". The run-to-run spread of the arms (``noise``) is reported, not used to decide.
- Learning: the loss of every step is compared with the same round's baseline over the same steps
  and seed. ``safe`` remedies must give identical losses (when the baseline reproduces itself;
  otherwise the check is inconclusive and says so); ``numerics`` remedies must stay within
  ``|delta| <= atol + rtol * |loss|`` at every step (when the baselines stay within it of each
  other; otherwise, as for ``safe``, inconclusive unless 1.5x further than they are apart). One exception: a remedy that changes the
  random stream the workers of a loader draw from (``WORKER_STREAMS``), where its dataset draws random
  numbers as it loads (random augmentation, seen by the workers' probe, or by the training process's
  for a loader without workers): another worker count hands each batch another worker's stream, and persistent workers carry their stream on into the
  next epoch where new workers are seeded afresh. The same images then get other crops and flips and
  the losses differ step by step by design. There the losses must agree on average: the mean of the
  per-step deltas (one a step, by batch means) within Student's t 99% bound of zero ("same on
  average"), else "changed". A ``numerics`` remedy whose losses first differ at fp32 rounding level
  (ROUNDING_REL) and part beyond the tolerance later, none turning NaN or inf, is judged on average
  too, as an equivalence: a GAN's game carries a rounding difference on until the curves are apart
  step by step (pytorch/examples' dcgan with fused Adam: 1.6e-7 at first, 9.6 later). See _parted.
- Each remedy's own share (``--ablate``): leave-one-out, the same statistic over the pairs
  (treated_k / treated_k without that remedy).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..report.model import ABRemedy, ABResult
from .catalogue import BY_ID, SAFETY_RANK, Spec
from .measure import Arm, LossDiff, loss_diff, resumed, same_value

NOISE_FLOOR = 0.03  # below 3% two runs of the same job on a shared machine are not told apart
NUMERICS_RTOL = 0.05
NUMERICS_ATOL = 1e-3
# Remedies that change the random stream the loader's workers draw each batch's augmentation from,
# and why. Persistent workers: pytorch/ignite's cifar10 example (RandomCrop, RandomHorizontalFlip),
# losses identical through epoch 1 and different from the first step of epoch 2 on.
WORKER_STREAMS = {
    "dataloader.workers": "another worker count hands each batch another worker's random stream",
    "dataloader.persistent_workers": ("persistent workers carry their random stream on into the next epoch, "
                                      "where new ones are seeded afresh"),
}
# The mean per-step loss delta is "same on average" within Student's t bound of 99% (two-sided) for
# the batch means' degrees of freedom (batches - 1) standard errors of zero: with about sqrt(n)
# batches a fixed 3 would call curves that agree "changed" one time in ten at n = 10 to 15.
T99 = {1: 63.657, 2: 9.925, 3: 5.841, 4: 4.604, 5: 4.032, 6: 3.707, 7: 3.499, 8: 3.355, 9: 3.250, 10: 3.169,
       11: 3.106, 12: 3.055, 13: 3.012, 14: 2.977, 15: 2.947, 16: 2.921, 17: 2.898, 18: 2.878, 19: 2.861,
       20: 2.845, 25: 2.787, 30: 2.750, 40: 2.704, 60: 2.660, 120: 2.617}


def t99(dof: int) -> float:
    """The two-sided 99% bound of Student's t with ``dof`` degrees of freedom (T99; a dof between
    tabulated ones takes the smaller one's, a little wider)."""
    return T99[max(d for d in T99 if d <= max(dof, 1))]


MIN_MEAN_STEPS = 10  # steps needed for the mean test
# A numerics remedy whose losses first differ by at most this relative amount changed the rounding
# only (fp32: fused Adam's 1.6e-7 on dcgan; bf16 and TF32 differ by 1e-3 at once): where the job's
# dynamics carry it on until the curves part, they are judged on average (check_losses, _parted).
ROUNDING_REL = 1e-5
MIN_PAIRS = 3  # fewer pairs give no interval
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20240612
CONFIDENCE = 0.90  # two-sided: each bound is one-sided at 95%
METHOD = (f"geometric mean of the per-round pair ratios; {CONFIDENCE:.0%} percentile bootstrap interval "
          f"({BOOTSTRAP_RESAMPLES} resamples of the pair log-ratios, seed {BOOTSTRAP_SEED}; none below "
          f"{MIN_PAIRS} pairs); exact two-sided sign test over the pairs")


@dataclass(frozen=True)
class Paired:
    """The paired statistic over per-round ratios (treated over reference, same round)."""

    ratios: tuple[float, ...]
    geomean: float | None  # exp(mean(log r)); None without pairs
    interval: tuple[float, float] | None  # None below MIN_PAIRS pairs
    sign_p: float | None  # exact two-sided binomial p over the pairs; None without untied pairs

    @property
    def pairs(self) -> int:
        return len(self.ratios)

    @property
    def gain(self) -> bool:
        """The interval lies above 1: faster, established."""
        return self.interval is not None and self.interval[0] > 1

    @property
    def loss(self) -> bool:
        """The interval lies below 1: slower, established."""
        return self.interval is not None and self.interval[1] < 1

    def text(self) -> str:
        """E.g. "x1.31 (90% CI x1.22..x1.40 over 4 pairs, sign test p=0.125)"."""
        if self.geomean is None:
            return "no pair of runs measured"
        if self.interval is None:
            return (f"x{self.geomean:.2f} over {self.pairs} pair(s): interval not established "
                    f"(it needs {MIN_PAIRS} rounds or more, --repeats {MIN_PAIRS})")
        lo, hi = self.interval
        p = f", sign test p={self.sign_p:.3g}" if self.sign_p is not None else ""
        return f"x{self.geomean:.2f} ({CONFIDENCE:.0%} CI x{lo:.2f}..x{hi:.2f} over {self.pairs} pairs{p})"


def sign_test(ratios: list[float]) -> float | None:
    """Exact two-sided sign test of "faster as often as slower": 2 x P(X >= max(k, n-k)), X ~ B(n, 1/2).

    k = pairs with r > 1 among the n pairs with r != 1 (ties carry no sign); capped at 1.
    """
    up, down = sum(r > 1 for r in ratios), sum(r < 1 for r in ratios)
    n = up + down
    if n == 0:
        return None
    tail = sum(math.comb(n, i) for i in range(max(up, down), n + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def bootstrap_interval(ratios: list[float]) -> tuple[float, float] | None:
    """The CONFIDENCE percentile interval of the geometric mean (module docstring), None below MIN_PAIRS."""
    if len(ratios) < MIN_PAIRS:
        return None
    logs = np.log(np.asarray(ratios, dtype=float))
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    means = logs[rng.integers(0, len(logs), size=(BOOTSTRAP_RESAMPLES, len(logs)))].mean(axis=1)
    tail = 100 * (1 - CONFIDENCE) / 2
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return float(math.exp(lo)), float(math.exp(hi))


def paired(ratios: list[float]) -> Paired:
    """Geometric mean, bootstrap interval and sign test of per-round ratios."""
    rs = [r for r in ratios if r > 0 and math.isfinite(r)]
    geo = math.exp(statistics.fmean(math.log(r) for r in rs)) if rs else None
    return Paired(tuple(rs), geo, bootstrap_interval(rs), sign_test(rs))


@dataclass
class Verdict:
    spec: Spec
    status: str  # kept | rejected | refused | no-op
    speedup: float | None = None  # median pair ratio
    spread: tuple[float, float] | None = None
    reason: str = ""
    stat: Paired | None = None
    pairs_of: str = ""  # which pairs the statistic is over


@dataclass
class LossCheck:
    status: str  # identical | within tolerance | same on average | changed | inconclusive | not recorded
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
    workers: dict[str, Any] | None = None  # the advised-N vs N+1 comparison of `fix`, if it ran
    compile_modes: dict[str, Any] | None = None  # the default vs another compile setting, if it ran
    resumed: list[tuple[str, str]] = field(default_factory=list)  # (arm, file an earlier run wrote)


def _spread(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    return (max(values) - min(values)) / statistics.median(values)


def _ratios(num: list[Arm], den: list[Arm]) -> list[float]:
    """rate(num_k) / rate(den_k) for every round k where both ran fine."""
    by_round = {a.round: a for a in den}
    out = []
    for b in num:
        a = by_round.get(b.round)
        if a is not None and a.steps_per_s and b.steps_per_s and a.ok and b.ok:
            out.append(b.steps_per_s / a.steps_per_s)
    return out


def compare(num: list[Arm], den: list[Arm]) -> Paired:
    """The paired statistic of ``num`` over ``den``, round by round (e.g. workers N+1 over N)."""
    return paired(_ratios(num, den))


def within(a: dict[int, list[float]], b: dict[int, list[float]], rtol: float, atol: float) -> bool:
    """Every step within atol + rtol x |loss|; a NaN or inf step only where the other run has the same
    (a GradScaler step that overflowed in both); inf is not within any tolerance of a number."""
    return all(_within_one(x, y, rtol, atol) for r, xs in a.items() for x, y in zip(xs, b.get(r, []), strict=False))


def _within_one(x: float, y: float, rtol: float, atol: float) -> bool:
    """One step of ``within``."""
    return same_value(x, y) or (math.isfinite(x) and math.isfinite(y) and abs(x - y) <= atol + rtol * abs(x))


def check_losses(base: list[Arm], treated: list[Arm], safety: str, rtol: float) -> LossCheck:
    """Do the treated runs learn the same as the baseline runs of the same rounds?"""
    pairs = [(a, b) for a in base for b in treated if a.round == b.round]
    diffs = [(a, b, loss_diff(a.losses, b.losses)) for a, b in pairs if a.ok and b.ok]
    diffs = [(a, b, d) for a, b, d in diffs if d is not None]
    if not diffs:
        return LossCheck("not recorded", "no loss recorded (the job calls no backward on a scalar)")
    worst = max((d for _, _, d in diffs), key=lambda d: d.max_abs)
    if not any(d.finite for _, _, d in diffs):
        # NaN == NaN would read "identical", and every numerics remedy "changed": neither is known.
        return LossCheck("inconclusive", f"{_not_finite(base, worst)}: the job learns nothing the losses could "
                         "show, so they cannot tell whether a remedy changes what it learns (fix the job's "
                         "numerics first)", worst)
    selfs = [loss_diff(base[0].losses, a.losses) for a in base[1:] if a.ok]
    selfs_d = [d for d in selfs if d is not None]
    reproducible = all(d.identical for d in selfs_d) if selfs_d else None
    where = (f"max |delta| {worst.max_abs:.3g} ({worst.max_rel:.2%}) first at step {worst.first_step}"
             if worst.first_step is not None else f"identical losses over {worst.compared} steps")
    if safety == "safe":
        if all(d.identical for _, _, d in diffs):
            extra = "" if reproducible else " (the baseline's own reproducibility was not checked: one round)"
            return LossCheck("identical", f"identical losses over {worst.compared} steps{extra}", worst)
        if reproducible is False:
            return _against_noise(worst, selfs_d, f"{where};")
        if streams := _random_streams(base, treated):
            why, since = streams
            first = min(d.first_step for _, _, d in diffs if d.first_step is not None)
            if since is None or first < since:  # before any epoch boundary persistent workers change nothing
                at = f"step {since}" if since is not None else "no epoch boundary the probe timed"
                return LossCheck("changed", f"losses differ from the baseline: {where}, before the first epoch "
                                 f"boundary ({at}), where persistent workers change no random number", worst)
            return _same_on_average([(a.losses, b.losses) for a, b, _ in diffs], where, worst,
                                    f"the dataset draws random numbers as it loads (augmentation), and {why}", since)
        return LossCheck("changed", f"losses differ from the baseline: {where}", worst)
    ok = all(within(a.losses, b.losses, rtol, NUMERICS_ATOL) for a, b, _ in diffs)
    tol = f"|delta| <= {NUMERICS_ATOL:g} + {rtol:g} x |loss| at every step"
    if ok:
        return LossCheck("within tolerance", f"{where}; within {tol}", worst)
    # Baselines that are themselves beyond the tolerance of each other (Hogwild's racing updates,
    # an unseeded shuffle): the treated runs' distance says nothing unless it is clearly larger.
    if selfs_d and not all(within(base[0].losses, a.losses, rtol, NUMERICS_ATOL) for a in base[1:] if a.ok):
        return _against_noise(worst, selfs_d, f"{where}; beyond {tol},")
    if _rounding_first(diffs) and not any(_lost_finite(a.losses, b.losses) for a, b, _ in diffs):
        return _parted([(a.losses, b.losses) for a, b, _ in diffs], where, worst, rtol)
    return LossCheck("changed", f"{where}; beyond {tol}", worst)


def _rounding_first(diffs: list[tuple[Arm, Arm, LossDiff]]) -> bool:
    """Whether the first step at which each pair's losses differ differs at fp32 rounding level
    (ROUNDING_REL): a remedy that changed the rounding only, whose difference the job may carry on.
    bf16 or TF32 arithmetic differs by 1e-3 at once."""
    for a, b, d in diffs:
        if d.first_step is None:
            continue
        for rank, xs in a.losses.items():
            ys = b.losses.get(rank, [])
            if d.first_step < min(len(xs), len(ys)):
                x, y = xs[d.first_step], ys[d.first_step]
                if not (math.isfinite(x) and math.isfinite(y)) or abs(x - y) > ROUNDING_REL * max(abs(x), 1e-12):
                    return False
    return True


def _parted_at(a: dict[int, list[float]], b: dict[int, list[float]], rtol: float) -> int | None:
    """The first step beyond the numerics tolerance, the earliest over the ranks that have one."""
    firsts = []
    for rank, xs in a.items():
        for i, (x, y) in enumerate(zip(xs, b.get(rank, []), strict=False)):
            if not _within_one(x, y, rtol, NUMERICS_ATOL):
                firsts.append(i)
                break
    return min(firsts, default=None)


def _parted(pairs: list[tuple[dict[int, list[float]], dict[int, list[float]]]], where: str, worst: LossDiff,
            rtol: float) -> LossCheck:
    """A numerics remedy whose losses first differ at rounding level and part beyond the tolerance
    later (``check_losses``). A seeded job's rounds repeat one pair of curves, so this is one
    realisation of a process whose deltas stay correlated for long: equivalence is asked for, not
    the failure to tell them apart. "changed" when the mean delta of the last third of the steps
    (a drift, a plateau, a curve that ends worse) or of all of them from the parting step on is
    beyond the tolerance (on the baseline's mean |loss| there) by more than its t99 error; "same
    on average" when it is within the tolerance with its t99 error; else "inconclusive"."""
    since = min((p for a, b in pairs if (p := _parted_at(a, b, rtol)) is not None), default=0)
    by_step, levels = _step_deltas(pairs, since)
    steps = sorted(by_step)
    why = (f"the losses first differ at rounding level and part beyond the tolerance from step {since} on, "
           "which is what a job whose own dynamics carry a rounding difference on does (a GAN's game)")
    if len(steps) < MIN_MEAN_STEPS:
        return LossCheck("changed", f"{where}; {why}, but {len(steps)} finite steps after it are too few to "
                         f"compare their mean (>= {MIN_MEAN_STEPS})", worst)
    deltas = [statistics.fmean(by_step[i]) for i in steps]
    level = [statistics.fmean(levels[i]) for i in steps]
    tail = len(deltas) - max(len(deltas) // 3, 4)
    end_mean, end_se, end_batches = _batch_means(deltas[tail:])
    end_tol = NUMERICS_ATOL + rtol * statistics.fmean(level[tail:])
    mean, se, batches = _batch_means(deltas)
    tol = NUMERICS_ATOL + rtol * statistics.fmean(level)
    bound = t99(batches - 1)
    text = (f"{where}; {why}: the mean delta is {mean:+.3g} (t99 error {bound * se:.2g}, {batches} batch means) "
            f"against a tolerance of {tol:.3g} ({rtol:g} x the baseline's mean |loss|), over the last third "
            f"{end_mean:+.3g} against {end_tol:.3g}")
    if abs(end_mean) - t99(end_batches - 1) * end_se > end_tol:
        return LossCheck("changed", f"{text}: the curves end apart, beyond the tolerance by more than its t99 "
                         "error", worst)
    if abs(mean) - bound * se > tol:
        return LossCheck("changed", f"{text}: beyond the tolerance", worst)
    if abs(mean) + bound * se <= tol:
        return LossCheck("same on average", f"{text}: within the tolerance", worst)
    return LossCheck("inconclusive", f"{text}: one pair of curves cannot show it within the tolerance or "
                     "beyond it (more steps narrow the error)", worst)


def _lost_finite(a: dict[int, list[float]], b: dict[int, list[float]]) -> bool:
    """A step whose loss is finite in ``a`` and not in ``b``: a remedy that made the job diverge."""
    return any(math.isfinite(x) and not math.isfinite(y)
               for r, xs in a.items() for x, y in zip(xs, b.get(r, []), strict=False))


def _not_finite(base: list[Arm], worst: LossDiff) -> str:
    """'the baseline's loss is NaN at every step compared (20 steps over 2 ranks)' (or inf, or NaN or inf)."""
    ok = [a for a in base if a.ok]
    kinds = sorted({"NaN" if math.isnan(x) else "inf" for a in ok for xs in a.losses.values() for x in xs
                    if not math.isfinite(x)})
    ranks = max((len(a.losses) for a in ok), default=1)
    return (f"the baseline's loss is {' or '.join(kinds)} at every step compared ({worst.compared} steps"
            + (f" over {ranks} ranks)" if ranks > 1 else ")"))


def _against_noise(worst: LossDiff, selfs: list[LossDiff], where: str) -> LossCheck:
    """Baselines that do not reproduce each other: the treated runs' distance is "changed" only when
    1.5x beyond the baselines' own, else "inconclusive"."""
    noise = max(d.max_abs for d in selfs)
    status = "inconclusive" if worst.max_abs <= noise * 1.5 + 1e-12 else "changed"
    return LossCheck(status, f"{where} but two baseline runs already differ by {noise:.3g}: "
                     "the job is not deterministic (fix its seeds to check)", worst)


def _random_streams(base: list[Arm], treated: list[Arm]) -> tuple[str, int | None] | None:
    """Why the treated runs' workers draw other random numbers (WORKER_STREAMS), where the loader's
    workers draw any, and the first step that can differ for that reason: 0 with another worker
    count; with persistent workers alone, the first epoch boundary after step 0 (None when the
    probe timed none: then nothing can differ for that reason). None when no such remedy applies."""
    loaders = [d for a in base for f in a.facts for d in f.dataloaders]
    in_workers = any(d.worker_random_draws for d in loaders)
    # A loader without workers that draws changes streams only when it gets workers: persistent
    # workers are no setting of a loader without them.
    in_process = any(d.dataset_random_draws and not d.num_workers for d in loaders)
    if not (in_workers or in_process):
        return None
    applied = {rid.split("=")[0] for a in treated for rid in a.applied}
    whys = [why for rid, why in WORKER_STREAMS.items() if rid in applied and (in_workers or rid == "dataloader.workers")]
    if not whys:
        return None
    since = 0 if "dataloader.workers" in applied else _first_epoch_boundary(base)
    return " and ".join(whys), since


def _first_epoch_boundary(base: list[Arm]) -> int | None:
    """The first step after step 0 that started an epoch, in the baselines' probe timings."""
    starts = [s.step for a in base for f in a.facts for s in f.steps if s.epoch_starts and s.step > 0]
    return min(starts, default=None)


def _batch_means(deltas: list[float]) -> tuple[float, float, int]:
    """Mean, standard error and number of batches of a series of per-step deltas by batch means:
    about sqrt(n) batches of consecutive steps (lengths differing by one at most). Two loss curves that part drift apart for many steps at a
    time (each step's weights carry the last one's), so the per-step deltas are not independent and
    stdev/sqrt(n) would be too small: accelerate's cv_example (a linear head trained at lr 3e-2 on
    frozen features) was called 'changed' at a mean of -1.15 with a standard error of 0.19."""
    k = max(2, math.isqrt(len(deltas)))
    batches = [float(b.mean()) for b in np.array_split(np.asarray(deltas, dtype=float), k)]
    return statistics.fmean(deltas), statistics.stdev(batches) / math.sqrt(k), k


def _step_deltas(pairs: list[tuple[dict[int, list[float]], dict[int, list[float]]]],
                 since: int) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    """From step ``since`` on, per step: the deltas (treated - baseline) and the baseline's |loss|,
    over ranks and pairs, where both losses are finite."""
    by_step: dict[int, list[float]] = {}
    levels: dict[int, list[float]] = {}
    for a, b in pairs:
        for rank, xs in a.items():
            for i, (x, y) in enumerate(zip(xs[since:], b.get(rank, [])[since:], strict=False)):
                if math.isfinite(x) and math.isfinite(y):
                    by_step.setdefault(i, []).append(y - x)
                    levels.setdefault(i, []).append(abs(x))
    return by_step, levels


def _same_on_average(pairs: list[tuple[dict[int, list[float]], dict[int, list[float]]]], where: str,
                     worst: LossDiff, why: str, since: int = 0) -> LossCheck:
    """The per-step deltas (treated - baseline, same round, rank and step) from step `since` on
    (before it the streams are the same) have a mean within t99 standard errors of zero: other
    random draws, the same learning. ``why``: why the losses differ step by step."""
    by_step, _ = _step_deltas(pairs, since)
    # One delta a step, the mean over ranks and pairs: a seeded job's rounds repeat the same two loss
    # curves, so its pairs are copies, not independent samples.
    deltas = [statistics.fmean(by_step[i]) for i in sorted(by_step)]
    if len(deltas) < MIN_MEAN_STEPS:
        return LossCheck("changed", f"losses differ from the baseline: {where}; {why}, but {len(deltas)} "
                         f"steps are too few to compare their mean (>= {MIN_MEAN_STEPS})", worst)
    mean, se, batches = _batch_means(deltas)
    bound = t99(batches - 1)
    text = (f"{where}; {why}: the mean delta is {mean:+.3g} over {len(deltas)} steps"
            f"{f' from step {since} on' if since else ''}, standard error {se:.2g} from {batches} batch means")
    if abs(mean) <= bound * se + NUMERICS_ATOL:
        return LossCheck("same on average", f"{text}: within {bound:g} standard errors of zero (99%, t with "
                         f"{batches - 1} degrees of freedom)", worst)
    return LossCheck("changed", f"{text}: beyond {bound:g} standard errors of zero (99%, t with {batches - 1} "
                     "degrees of freedom)", worst)


def _stats(xs: list[float]) -> tuple[float, float, float]:
    return (statistics.median(xs), min(xs), max(xs)) if xs else (0.0, 0.0, 0.0)


def _r(x: float | None) -> float | None:
    return round(x, 4) if x is not None else None


def _interval(p: Paired | None) -> list[float] | None:
    return [round(p.interval[0], 4), round(p.interval[1], 4)] if p is not None and p.interval else None


def judge(arms: list[Arm], specs: list[Spec], pre_refused: dict[str, str], rtol: float = NUMERICS_RTOL,
          since: float | None = None) -> Outcome:
    """Verdicts over the arms; ``since``: when `fix` started (files the arms loaded that are newer
    were written by its own earlier runs)."""
    base = [a for a in arms if a.kind == "baseline"]
    treated = [a for a in arms if a.kind == "treated"]
    base_rates = [a.steps_per_s for a in base if a.ok and a.steps_per_s]
    treated_rates = [a.steps_per_s for a in treated if a.ok and a.steps_per_s]
    stat = compare(treated, base)
    noise = max(NOISE_FLOOR, _spread(base_rates), _spread(treated_rates))  # type: ignore[arg-type]
    # The treated job's class: the loosest of the remedies it actually ran with.
    loss = check_losses(base, treated, loss_class(treated[0].specs, "") if treated else "safe", rtol)
    carried = resumed(arms, since) if since is not None else []
    compared = {a.label for a in base + treated}
    if (hit := next((c for c in carried if c[0] in compared), None)) and loss.status != "not recorded":
        # The first arm trained from scratch, later ones from where an earlier one stopped: their
        # losses differ whatever the remedies do.
        label, path = hit
        loss = LossCheck("inconclusive", f"arm {label} resumed from {path}, which an earlier run of this fix "
                         "wrote: the runs did not start from the same state", loss.diff)
    med, lo, hi = _stats(list(stat.ratios))
    failed = [a for a in treated if not a.ok]
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
        verdicts.append(_verdict(spec, arms, base, treated, failed, loss, stat, rtol))
    ab = ABResult(
        baseline_steps_per_s=round(statistics.median(base_rates), 4) if base_rates else 0.0,
        treated_steps_per_s=round(statistics.median(treated_rates), 4) if treated_rates else 0.0,
        speedup_median=round(med, 4), speedup_min=round(lo, 4), speedup_max=round(hi, 4),
        remedies=[_ab_remedy(v) for v in verdicts],
        speedup_geomean=_r(stat.geomean), interval=_interval(stat), pairs=stat.pairs,
        sign_p=_r(stat.sign_p), method=METHOD,
    )
    return Outcome(ab, verdicts, loss, noise, resumed=carried)


def _ab_remedy(v: Verdict) -> ABRemedy:
    p = v.stat
    return ABRemedy(str(v.spec), v.status == "kept", _r(v.speedup), f"{v.status}: {v.reason}",
                    geomean=_r(p.geomean) if p else None, interval=_interval(p), pairs=p.pairs if p else 0,
                    sign_p=_r(p.sign_p) if p else None, method=v.pairs_of)


def _free(spec: Spec) -> str | None:
    """Why ``spec`` costs nothing by construction (catalogue ``free`` and ``safe``), else None."""
    r = BY_ID.get(spec.id)
    return r.why_free if r is not None and r.free and r.safety == "safe" else None


def _decide(v: Verdict, stat: Paired, gain: str, loss_text: str, slower: str, none: str) -> Verdict:
    """Kept, neutral-kept or rejected from the interval alone (failures and losses decided before)."""
    if stat.loss:
        v.reason = f"{slower}: {stat.text()}"
    elif stat.gain:
        v.status, v.reason = "kept", f"{gain}: {stat.text()}; losses {loss_text}"
    elif (free := _free(v.spec)) is not None:
        v.status = "kept"
        v.reason = f"neutral, kept because it costs nothing ({free}): {stat.text()}; losses {loss_text}"
    else:
        v.reason = f"{none}: {stat.text()}"
    return v


def _verdict(spec: Spec, arms: list[Arm], base: list[Arm], treated: list[Arm], failed: list[Arm],
             loss: LossCheck, stat: Paired, rtol: float) -> Verdict:
    """Kept or rejected: from the leave-one-out arms when there are any, else as part of the set."""
    ablated = [a for a in arms if a.kind == "ablated" and a.without == spec.id]
    if ablated:
        return _own_share(spec, base, treated, _with_it(ablated, arms), ablated, failed, loss, rtol)
    med, lo, hi = _stats(list(stat.ratios))
    v = Verdict(spec, "rejected", med if treated and not failed and stat.pairs else None, (lo, hi), stat=stat,
                pairs_of="treated / baseline, per round")
    if failed:
        v.reason = f"the job failed with the remedies (exit {failed[0].exit_code}); see {failed[0].run_dir}/job.log"
        return v
    if not stat.pairs and (why := idle_text(arms)):
        v.reason = f"no pair of runs measured: {why}"
        return v
    note = " with the set" if len(treated[0].specs) > 1 else ""
    if not loss.passed:
        # A remedy that is measurably slower is rejected for that first: whether it learns the same
        # is moot, and on a job that is not deterministic the loss check cannot tell anyway.
        slower = f"the job is slower{note}: {stat.text()}; also " if stat.loss else ""
        v.reason = f"{slower}the job learns differently: {loss.text}"
        return v
    return _decide(v, stat, f"faster{note}", loss.status, f"the job is slower{note}", f"no established gain{note}")


# The cure for a job that resumes from what an earlier run of the same `fix` saved.
FRESH_CHECKPOINTS = ("Give every run a fresh checkpoint directory, or remove it before each run "
                     "(fix -- sh -c 'rm -rf DIR && exec COMMAND')")


def idle_text(arms: list[Arm]) -> str | None:
    """Why some runs measured nothing, when they ended well without a training step while others
    trained: the job did not do the same work every time (it resumed from a checkpoint an earlier
    run wrote and found nothing left to train, the commonest cause); None otherwise."""
    idle = [a.label for a in arms if a.ok and not a.steps_per_s and not a.facts]
    trained = [a for a in arms if a.ok and a.steps_per_s]
    if not idle or not trained:
        return None
    return (f"{'arms' if len(idle) > 1 else 'arm'} {', '.join(idle)} ended (exit 0) without a training step while "
            f"{trained[0].label} trained: a job that resumes from "
            "the checkpoint an earlier run wrote (Lightning's ckpt_path=\"last\", an auto-resume) finds nothing left "
            f"to train. {FRESH_CHECKPOINTS}")


def _with_it(ablated: list[Arm], arms: list[Arm]) -> list[Arm]:
    """For each ablated arm, the treated (or variant) arm of its round that ran with exactly its
    remedies plus the one it leaves out: the other half of its leave-one-out pair."""
    out = []
    for a in ablated:
        for c in sorted(arms, key=lambda c: c.kind != "treated"):  # the treated arm first, then a variant
            extra = set(c.specs) - set(a.specs)
            if c.kind in ("treated", "variant") and c.round == a.round and set(a.specs) <= set(c.specs) \
                    and len(extra) == 1 and next(iter(extra)).split("=")[0] == a.without:
                out.append(c)
                break
    return out


def _own_share(spec: Spec, base: list[Arm], treated: list[Arm], with_it: list[Arm], ablated: list[Arm],
               failed: list[Arm], loss: LossCheck, rtol: float) -> Verdict:
    """Leave-one-out: what the job loses when only this remedy is taken away."""
    share = compare(with_it, ablated)
    med, lo, hi = _stats(list(share.ratios))
    v = Verdict(spec, "rejected", med if share.pairs else None, (lo, hi) if share.pairs else None, stat=share,
                pairs_of="treated / treated without it, per round (leave-one-out)")
    if failed and any(a.ok for a in ablated):
        v.reason = f"the job fails with it (exit {failed[0].exit_code}) and runs without it"
    elif not loss.passed and check_losses(base, ablated, loss_class(treated[0].specs, spec.id), rtol).passed:
        v.reason = f"the losses change with it and not without it: {loss.text}"
    elif share.loss:
        v.reason = f"the job is faster without it: own share {share.text()}"
    elif failed or not loss.passed:
        # Not the sole cause, but nothing shows it is harmless either: a fix must be proven.
        v.reason = "unproven: the set fails or learns differently with and without it"
    else:
        return _decide(v, share, "own share, leave-one-out", loss.status, "the job is faster without it",
                       "no established gain of its own, leave-one-out")
    return v


def loss_class(specs: list[str], without: str) -> str:
    """Safety class of a set of remedies given as "id[=value]" strings, minus one of them."""
    ids = [s.split("=")[0] for s in specs if s.split("=")[0] != without]
    return max((BY_ID[i].safety for i in ids if i in BY_ID), key=lambda c: SAFETY_RANK[c], default="safe")
