"""What `torchdoctor fix` prints (progress on stderr, verdicts on stdout) and the report it writes."""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from typing import TYPE_CHECKING, Any

from . import quiet
from .breakeven import break_even
from .breakeven import sentence as breakeven_sentence
from .measure import Arm
from .suggest import Change
from .verdict import FRESH_CHECKPOINTS, Outcome, idle_text

if TYPE_CHECKING:
    from .select import Choice


def _err(text: str) -> None:
    print(f"torchdoctor: fix: {text}", file=sys.stderr, flush=True)


def _rate(x: float | None, unit: str) -> str:
    return "–" if x is None else f"{x:.3g} {unit}"


def progress(arm: Arm) -> None:
    workers = next((s.partition("=")[2] for s in arm.specs if s.startswith("dataloader.workers=")), None)
    mode = next((s.partition("=")[2] for s in arm.specs if s.startswith("compile=")), None)
    variant = f"treated, {workers} workers" if workers else f"treated, {mode}" if mode else "variant"
    what = {"baseline": "baseline", "treated": "treated ", "ablated": f"without {arm.without}",
            "variant": variant, "diagnosis": "diagnosis (profiler window on)"}[arm.kind]
    status = "" if arm.ok else f"  EXIT {arm.exit_code}"
    if arm.other_cpu_share is not None and arm.other_cpu_share > quiet.BUSY_SHARE:
        status += f"  (busy machine: others took {arm.other_cpu_share:.0%} of its CPUs)"
    _err(f"{arm.label.split('-')[0]:<4} {what:<28} {_rate(arm.steps_per_s, 'steps/s'):>14}  "
         f"{_rate(arm.samples_per_s, 'samples/s'):>16}  {arm.wall_s:6.1f} s{status}")


def failed(what: str, code: int, log: str) -> None:
    _err(f"{what} failed (exit {code}); its output: {log}")


def plan(level: str, choices: list[Choice], refused: dict[str, str], unknown: dict[str, str],
         diag_dir: str | None, header: bool = True) -> None:
    if header:
        src = f"the findings of {diag_dir}" if diag_dir else "the command line"
        _err(f"remedies to try ({level}, from {src}):" if choices else f"no remedy to try ({level}, from {src})")
        for c in choices:
            _err(f"  {c.spec}  <- {c.why}")
    for rid, why in {**refused, **unknown}.items():
        _err(f"  refused {rid}: {why}")


def _median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return round(statistics.median(vals), 4) if vals else None


def _order(arms: list[Arm], ablate: bool) -> str:
    """How the arms of a round were ordered (fixer.round_order)."""
    names = "A B" + (" V" if any(a.kind == "variant" for a in arms) else "") + (" C..." if ablate else "")
    what = ("; V: the treated job with N+1 workers or another compile setting" if " V" in names else "") + (
        "; C: the treated job without each remedy" if ablate else "")
    return f"counterbalanced (ABBA): {names} in odd rounds, reversed in even rounds{what}"


def _stat(geomean: float | None, interval: list[float] | None, pairs: int, sign_p: float | None) -> str:
    """x1.31 [x1.22, x1.40] (4 pairs, p=0.125), or what is missing."""
    if geomean is None:
        return "–"
    if interval is None:
        return f"x{geomean:.2f} ({pairs} pair(s): no interval below 3)"
    p = f", p={sign_p:.3g}" if sign_p is not None else ""
    return f"x{geomean:.2f} [x{interval[0]:.2f}, x{interval[1]:.2f}] ({pairs} pairs{p})"


def _details(outcome: Outcome, arms: list[Arm], choices: list[Choice], unknown: dict[str, str],
             changes: list[Change], opts: Any, out: str, diag_dir: str | None) -> dict[str, Any]:
    base = [a for a in arms if a.kind == "baseline" and a.samples_per_s]
    treated = [a for a in arms if a.kind == "treated" and a.samples_per_s]
    return {
        "apply": opts.apply,
        "rounds": max((a.round for a in arms), default=0),
        "order": _order(arms, opts.ablate),
        "statistic": outcome.ab.method,
        "workers": outcome.workers,
        "compile_modes": outcome.compile_modes,
        "compile": break_even(arms),
        "ablation": "leave-one-out: treated steps/s over treated-without-it steps/s" if opts.ablate else None,
        "steps_limit": opts.steps,
        "steady_state": "steps after the first max(2, n//10) of each run (1 below 6 steps); slowest rank",
        "noise": round(outcome.noise, 4),
        "baseline_samples_per_s": _median([a.samples_per_s for a in base]),
        "treated_samples_per_s": _median([a.samples_per_s for a in treated]),
        # Every finished arm of each kind (a job without a DataLoader has no samples/s).
        "baseline_peak_rss_mib": _median([a.peak_rss_mib for a in arms if a.kind == "baseline" and a.ok]),
        "treated_peak_rss_mib": _median([a.peak_rss_mib for a in arms if a.kind == "treated" and a.ok]),
        "loss_check": {"status": outcome.loss.status, "text": outcome.loss.text, "rtol": opts.rtol},
        "resumed": [{"arm": label, "path": path} for label, path in outcome.resumed],
        "chosen_by": {str(c.spec): c.why for c in choices},
        "unknown": unknown,
        "arms": [{"label": a.label, "kind": a.kind, "remedies": a.specs, "exit_code": a.exit_code,
                  "steps_per_s": a.steps_per_s, "samples_per_s": a.samples_per_s, "steady_steps": a.steady_steps,
                  "wall_s": round(a.wall_s, 3), "run_dir": a.run_dir, "refused": a.refused,
                  "other_cpu_share": a.other_cpu_share} for a in arms],
        "code_changes": [{"remedies": c.ids, "where": c.where, "language": c.language, "text": c.text}
                         for c in changes],
        "out": out,
        "report_dir": diag_dir or next((a.run_dir for a in arms if a.kind == "baseline"), None),
    }


def resumed_sentence(carried: list[tuple[str, str]]) -> str:
    """The warning for arms that resumed from what an earlier run of the same `fix` wrote."""
    arms = list(dict.fromkeys(label for label, _ in carried))  # in the order they ran
    paths = sorted({path for _, path in carried})
    shown = ", ".join(paths[:2]) + (f" and {len(paths) - 2} more" if len(paths) > 2 else "")
    return (f"warning: arm{'s' if len(arms) > 1 else ''} {', '.join(arms)} loaded {shown} before "
            f"{'their' if len(arms) > 1 else 'its'} first "
            "step, written by an earlier run of this fix: the job resumes from its own checkpoints, so the "
            "runs did not start from the same state (losses not compared; the speed-up holds only if a resumed "
            f"run does the same work). {FRESH_CHECKPOINTS}.")


def gain_pct(speedup: float | None) -> float | None:
    """The share of the baseline step a speed-up gives back: (A - B) / A = 1 - 1/speed-up, in %."""
    return None if not speedup else round(100.0 * (1.0 - 1.0 / speedup), 1)


def same_job(outcome: Outcome) -> bool:
    """Every remedy was a no-op or refused in the treated runs: they ran the baseline's job."""
    return bool(outcome.verdicts) and all(v.status in ("no-op", "refused") for v in outcome.verdicts)


def estimate_vs_measured(outcome: Outcome, estimates: dict[str, float] | None,
                         estimates_ms: dict[str, float] | None = None) -> dict[str, Any] | None:
    """The diagnosis' estimate next to what the A/B measured: for the treated set (the estimates of
    its remedies summed) and, with --ablate, for each remedy (its leave-one-out gain). With
    ``estimates_ms``, also in ms per step: the claims' ms against the measured share of the baseline's
    time per step (1000 / its steps/s). The shares can differ where the claims' ms are close: the
    claims are shares of the profiled step, the A/B's of its own steps/s over the whole run, which
    also spreads an evaluation or a save between steps over them (trl's SFT script: 113.7 ms claimed
    of a 492 ms profiled step, 23.1%; the A/B's 18.6% of its 527.7 ms baseline step is 98 ms). The ms
    compare runs made at different times, whose speed a busy machine changes; the shares do not."""
    ab = outcome.ab
    if estimates is None or not ab.speedup_geomean:
        return None
    applied = [r for r in ab.remedies if r.geomean is not None or r.kept]
    ids = [r.id for r in applied]
    if not ids:  # nothing ran changed: no claim of these findings was put to the test
        return None
    own = {r.id: r for r in applied if r.method and "without" in r.method}

    def estimate(rid: str, table: dict[str, float] = estimates) -> float | None:
        # "dataloader.workers=3" ran; the finding named "dataloader.workers"
        return table.get(rid, table.get(rid.partition("=")[0]))

    measured_ms = measured_ms_interval = None
    if ab.baseline_steps_per_s:
        # The measured share of the baseline's time per step, so that it reads like the claims' ms.
        base_ms = 1000.0 / ab.baseline_steps_per_s
        measured_ms = round(base_ms * (1.0 - 1.0 / ab.speedup_geomean), 1)
        if ab.interval:
            measured_ms_interval = [round(base_ms * (1.0 - 1.0 / x), 1) if x else None for x in ab.interval]
    claimed_ms = [estimate(i, estimates_ms or {}) for i in ids]
    return {
        "estimated_ms": round(sum(x or 0.0 for x in claimed_ms), 1) if estimates_ms and any(claimed_ms) else None,
        "measured_ms": measured_ms,
        "measured_ms_interval": measured_ms_interval,
        "estimated_pct": round(min(100.0, sum(estimate(i) or 0.0 for i in ids)), 1),
        "measured_pct": gain_pct(ab.speedup_geomean),
        "measured_interval_pct": [gain_pct(x) for x in ab.interval] if ab.interval else None,
        "per_remedy": [{"id": i, "estimated_pct": estimate(i), "measured_pct": gain_pct(own[i].geomean),
                        "measured_interval_pct": [gain_pct(x) for x in own[i].interval] if own[i].interval else None}
                       for i in ids if i in own],
    }


def finish(outcome: Outcome, arms: list[Arm], choices: list[Choice], unknown: dict[str, str],
           changes: list[Change], opts: Any, out: str, diag_dir: str | None,
           estimates: dict[str, float] | None = None, estimates_ms: dict[str, float] | None = None) -> None:
    from ..report.model import ABRemedy

    outcome.details = _details(outcome, arms, choices, unknown, changes, opts, out, diag_dir)
    outcome.details["estimate_vs_measured"] = evm = estimate_vs_measured(outcome, estimates, estimates_ms)
    outcome.ab.details = outcome.details
    outcome.ab.remedies.extend(ABRemedy(rid, False, None, f"refused: {why}") for rid, why in unknown.items())
    if opts.quiet:
        return
    ab, d = outcome.ab, outcome.details
    print(f"\nA/B: {d['rounds']} round(s), {d['order']}; steps/s of the slowest rank over the steady "
          "state (warm-up steps left out)")
    if ab.treated_steps_per_s:
        samples = ""
        if d["baseline_samples_per_s"] and d["treated_samples_per_s"]:
            samples = f"; samples/s {d['baseline_samples_per_s']:.4g} -> {d['treated_samples_per_s']:.4g}"
        print(f"speed-up {_stat(ab.speedup_geomean, ab.interval, ab.pairs, ab.sign_p)}: geometric mean of "
              f"the per-round ratios [90% bootstrap interval] (sign test p); median x{ab.speedup_median:.2f}, "
              f"min x{ab.speedup_min:.2f}, max x{ab.speedup_max:.2f}, noise {outcome.noise:.0%}: "
              f"{ab.baseline_steps_per_s:.4g} -> {ab.treated_steps_per_s:.4g} steps/s{samples}")
        if same_job(outcome):
            print("note: no remedy changed anything in the treated runs (verdicts below): both arms ran the same job, "
                  "and the speed-up above is their run-to-run difference, not a gain")
        print(f"learning: {outcome.loss.status}: {outcome.loss.text}")
        if d["baseline_peak_rss_mib"] and d["treated_peak_rss_mib"]:
            print(f"host memory: peak resident {d['baseline_peak_rss_mib']:.0f} -> {d['treated_peak_rss_mib']:.0f} MiB "
                  "(the largest rank process; median over the arms)")
        if evm is not None:
            iv = evm["measured_interval_pct"]
            print(f"estimate vs measured: the findings behind these remedies claimed {evm['estimated_pct']:.1f}% of "
                  f"the step; the A/B gave back {evm['measured_pct']:.1f}%"
                  + (f" [{iv[0]:.1f}%, {iv[1]:.1f}%]" if iv else "") + " (1 - 1/speed-up)"
                  + (f"; per step, {evm['estimated_ms']:.1f} ms claimed and {evm['measured_ms']:.1f} ms measured"
                     + (f" [{evm['measured_ms_interval'][0]:.1f}, {evm['measured_ms_interval'][1]:.1f}]"
                        if evm.get("measured_ms_interval") and None not in evm["measured_ms_interval"] else "")
                     + " (that share of the baseline's time per step)"
                     if evm.get("estimated_ms") is not None and evm.get("measured_ms") is not None else "")
                  + "".join(f"; {r['id']} {r['estimated_pct'] or 0:.1f}% vs {r['measured_pct']:.1f}%"
                            for r in evm["per_remedy"] if r["measured_pct"] is not None))
    if outcome.resumed:
        print(resumed_sentence(outcome.resumed))
    if idle := idle_text(arms):
        print(f"warning: {idle}")
    if busy := quiet.busy_text([(a.label, a.other_cpu_share) for a in arms if a.other_cpu_share is not None]):
        print(busy)
    if d.get("compile"):
        print(breakeven_sentence(d["compile"]))
    if outcome.compile_modes and outcome.compile_modes.get("notes"):
        secs = outcome.compile_modes.get("compile_s") or {}
        print(f"compile settings: {'; '.join(outcome.compile_modes['notes'])}" + (
            f" ({outcome.compile_modes['text']})" if outcome.compile_modes.get("text") else "") + (
            "; compile s " + ", ".join(f"{k} {v:g}" for k, v in secs.items()) if secs else ""))
    if outcome.workers and outcome.workers.get("notes"):
        print(f"workers: {'; '.join(outcome.workers['notes'])}" + (
            f" ({outcome.workers['text']})" if outcome.workers.get("text") else ""))
    print("verdicts:")
    for r in ab.remedies:
        sp = f"x{r.geomean:.2f}" if r.geomean is not None else "–"
        status, _, why = r.reason.partition(": ")
        print(f"  {status:<8} {sp:>6}  {r.id:<34} {why}")
    treated = [a for a in arms if a.kind == "treated"]
    if treated and len(treated[0].specs) > 1 and not d["ablation"]:
        print("  (a speed-up measured with the set is the whole set's; --ablate measures each one's own share)")
    if changes:
        print("\nto make the kept remedies permanent:")
        for c in changes:
            print(f"# {', '.join(c.ids)} ({c.where})")
            print(c.text.rstrip("\n"))
    print(f"\nruns: {out}")


def write_report(outcome: Outcome, args: argparse.Namespace) -> None:
    """--json / --html: the diagnosis report of the run the remedies came from, with ``ab`` added."""
    if not (getattr(args, "json", None) or getattr(args, "html", None) or getattr(args, "verbose", False)):
        return
    from ..cli import emit
    from ..session import build_report, report_from_run_dir

    run_dir = outcome.details.get("report_dir")
    report = report_from_run_dir(run_dir) if run_dir else build_report([])
    report.source = "fix"
    report.ab = outcome.ab
    quiet = argparse.Namespace(**{**vars(args), "quiet": not getattr(args, "verbose", False), "fail_on": None})
    with contextlib.redirect_stdout(sys.stderr):
        emit(report, quiet)
