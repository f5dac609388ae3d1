"""`torchdoctor fix [--apply safe|numerics|ID,...] [--steps N] [--ablate] -- COMMAND...`

Closes the loop from a finding to a measured fix, without touching the user's code:

1. what to try: ``--apply safe`` / ``numerics`` run the job once under the probe (or read
   ``--from RUN_DIR``) and take the remedies its findings name; ``--apply ID,...`` takes those;
2. the job then runs K rounds (default 3) of baseline A and treated B in counterbalanced (ABBA)
   order: A B in odd rounds, B A in even ones (``round_order``), so neither arm always runs first.
   Within a round also run, in the same reversing order: with an advised worker count N, the
   treated job with N+1 workers (V, ``workers_plan``); with ``--ablate``, the treated job without
   each remedy (C). Every run is under the probe with the profiler off, the remedies applied by
   the bootstrap, and the loss of every step recorded;
3. verdicts (``remedies.verdict``): the paired speed-up (geometric mean of B_k / A_k with its
   bootstrap interval) from the steady-state step timings, the same learning checked on the
   losses, kept or rejected per remedy; N+1 workers replace N only when V_k / B_k has an interval
   above 1. Then the code changes that make the kept ones permanent.

The job's output goes to ``RUN/<arm>/job.log`` (``--show-output`` lets it through). The exit code is
the job's own (its baseline run's); a run killed by a signal ends the loop the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

from torchdoctor import runner
from torchdoctor.probe import config as probe_config
from torchdoctor.remedies import catalogue, quiet, render, select
from torchdoctor.remedies.measure import Arm, load
from torchdoctor.remedies.runtime import ENV_RECORD, ENV_SAID, ENV_STEPS
from torchdoctor.remedies.suggest import changes_for
from torchdoctor.remedies.verdict import NUMERICS_RTOL, Outcome, compare, judge

LEVELS = ("safe", "numerics")
DEFAULT_REPEATS = 3  # the fewest rounds that give the speed-up an interval (verdict.MIN_PAIRS)
WORKERS = "dataloader.workers"
T = TypeVar("T")


@dataclass
class FixOptions:
    apply: str = "safe"
    steps: int | None = None
    repeats: int = DEFAULT_REPEATS
    ablate: bool = False
    from_run: str | None = None
    out: str | None = None
    rtol: float = NUMERICS_RTOL
    show_output: bool = False
    quiet: bool = False


@contextlib.contextmanager
def _output_to(path: str | None) -> Iterator[None]:
    """Send this process's stdout/stderr (and so the job's, which inherits them) to ``path``."""
    if path is None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


def run_arm(command: Sequence[str], arm: Arm, opts: FixOptions, profile: tuple[int, int] | None = None,
            steps: int | None = None) -> Arm:
    """Run the job once as ``arm`` and read back what it recorded."""
    os.makedirs(os.path.join(arm.run_dir, "ranks"), exist_ok=True)
    env = runner.job_env(arm.run_dir, profile)
    for name in (probe_config.ENV_REMEDIES, ENV_SAID, ENV_STEPS):
        env.pop(name, None)
    if arm.specs:
        env[probe_config.ENV_REMEDIES] = ",".join(arm.specs)
    env[ENV_RECORD] = "1"
    if steps or opts.steps:
        env[ENV_STEPS] = str(steps or opts.steps)
    log = None if opts.show_output else os.path.join(arm.run_dir, "job.log")
    arm.started = time.time()
    mark = quiet.start() if profile is None else None  # a profiled run's trace work is detached
    with _output_to(log):
        job = runner.run_job(command, env)
    arm.other_cpu_share = quiet.other_share(mark)
    runner.write_manifest(arm.run_dir, command, job)
    arm.exit_code, arm.wall_s = job.returncode, job.duration_s
    load(arm)
    if not opts.quiet:
        render.progress(arm)
    return arm


def estimates_of(findings: Sequence[Any], ms: bool = False) -> dict[str, float]:
    """Remedy id -> the share of the step (%) its findings say it gives back (summed, at most 100), or
    with ``ms`` the ms per step they claim: what `fix` then measures, so the two can be shown side by side."""
    def claim(f: Any) -> float:
        # A finding of a trace without steps speaks of its window, not of a step: no ms per step.
        if ms:
            return (f.recoverable_ms or 0.0) if getattr(f, "per", "step") == "step" else 0.0
        return f.recoverable_pct or 0.0

    cap = float("inf") if ms else 100.0
    out: dict[str, float] = {}
    for f in findings:
        if f.remedy:
            out[f.remedy] = min(cap, round(out.get(f.remedy, 0.0) + claim(f), 2))
    # num_workers=0 (DL-1: a batch costs less to make than to receive) removes the workers, and with
    # them what other findings price: their start at every epoch (DL-6) and their competition for the
    # CPUs (HO-14). skorch's README example: DL-1 claimed 14.0%, `fix` measured 70.7% [69.0%, 72.4%];
    # with DL-6's 29.2% and HO-14's 30.5%, 73.7%. The matrix keeps each cost with its own finding.
    key = select.ADVISED_VALUE["dataloader.workers"]
    if any(f.remedy == "dataloader.workers" and any(e.values.get(key) == 0 for e in f.evidence) for f in findings):
        alone = sum(claim(f) for f in findings if f.remedy == "dataloader.workers")
        out["dataloader.workers=0"] = min(cap, round(alone + sum(
            claim(f) for f in findings if f.id in WORKER_COSTS and f.remedy != "dataloader.workers"), 2))
    return out


WORKER_COSTS = ("DL-6", "HO-14")  # findings whose cost exists only while the job has DataLoader workers


class ToTry(NamedTuple):
    """What the diagnosis (or the user) asks `fix` to try, and what the diagnosis estimated."""

    choices: list[select.Choice]
    refused: dict[str, str]  # by precondition
    unknown: dict[str, str]  # ids the catalogue does not know
    facts: select.JobFacts | None
    diag_dir: str | None  # the diagnosis run directory
    exit_code: int
    estimates: dict[str, float] | None = None  # remedy id -> % of the step its findings claim
    estimates_ms: dict[str, float] | None = None  # remedy id -> ms per step its findings claim


def _what_to_try(command: Sequence[str], opts: FixOptions, out: str) -> ToTry:
    from torchdoctor.session import report_from_run_dir

    if opts.apply not in LEVELS:
        specs, unknown = catalogue.parse_all(opts.apply.split(","))
        findings = report_from_run_dir(opts.from_run).findings if opts.from_run else []
        # An id asked for without a value takes the diagnosis's advice when there is one (HO-13's
        # threads per process), as when the diagnosis picks it; the worker count keeps its own
        # advice, measured against N+1 (`Loop.advised`), but for DL-1's and DL-6's num_workers=0
        # (a batch cheaper made in the process than received): litgpt's pretrain, told 0 by DL-6,
        # was given 1, which its IterableDataset refused, and `fix` measured nothing.
        advised = {c.spec.id: c.spec.value for c in select.choose(findings, "numerics")
                   if c.spec.value and (c.spec.id != WORKERS or c.spec.value == "0")}
        specs = [catalogue.Spec(s.id, advised[s.id]) if s.value is None and s.id in advised else s for s in specs]
        estimates = estimates_of(findings) if opts.from_run else None
        estimates_ms = estimates_of(findings, ms=True) if opts.from_run else None
        return ToTry([select.Choice(s, "asked for") for s in specs], {}, unknown, None, opts.from_run, 0, estimates,
                     estimates_ms)
    diag_dir = opts.from_run
    if diag_dir is None:
        diag_dir = os.path.join(out, "diagnose")
        window = probe_config.DEFAULT_PROFILE_STEPS
        steps = max(opts.steps, window[1] + 2) if opts.steps else None
        diag = run_arm(command, Arm("D", "diagnosis", [], diag_dir), opts, profile=window, steps=steps)
        if not diag.ok:
            return ToTry([], {}, {}, None, diag_dir, diag.exit_code)
    report = report_from_run_dir(diag_dir)
    jf = select.JobFacts([r.facts for r in report.ranks if r.facts is not None])
    choices, refused = select.finalize(select.choose(report.findings, opts.apply), jf)
    return ToTry(choices, refused, {}, jf, diag_dir, 0, estimates_of(report.findings),
                 estimates_of(report.findings, ms=True))


def round_order(k: int, arms: Sequence[T]) -> list[T]:
    """The order of round ``k`` (1-based): as planned (A, B, V, C...) when k is odd, reversed when
    even. Over two rounds every arm runs once before and once after each other one (ABBA)."""
    return list(arms) if k % 2 else list(reversed(arms))


@dataclass
class Plan:
    """What every round runs besides the baseline."""

    specs: list[str]  # the treated job's remedies
    variant: list[str] | None = None  # the same with N+1 workers
    ablated: list[select.Choice] = field(default_factory=list)  # left out one at a time


def round_arms(k: int, out: str, plan: Plan) -> list[Arm]:
    """Round ``k``'s arms in planned order: baseline, treated, workers variant, ablations."""
    arms = [Arm(f"A{k}", "baseline", [], os.path.join(out, f"A{k}"), round=k),
            Arm(f"B{k}", "treated", plan.specs, os.path.join(out, f"B{k}"), round=k)]
    if plan.variant:
        arms.append(Arm(f"V{k}", "variant", plan.variant, os.path.join(out, f"V{k}"), round=k))
    for c in plan.ablated:
        label = f"C{k}-{c.spec.id}"
        rest = [s for s in plan.specs if s != str(c.spec)]
        arms.append(Arm(label, "ablated", rest, os.path.join(out, label), without=c.spec.id, round=k))
    return arms


def workers_plan(choices: list[select.Choice], jf: select.JobFacts
                 ) -> tuple[list[select.Choice], list[str] | None, dict[str, Any] | None]:
    """For an advised worker count N in the set: (choices, the N+1 variant's specs, what was planned).

    N is lowered to the largest count the job accepts (``select.precondition``: the remedy refuses
    more than WORKERS_PER_CPU_CAP workers per CPU of the affinity mask); the variant is None when
    N+1 would be refused.
    """
    c = next((c for c in choices if c.spec.id == WORKERS and c.spec.value), None)
    if c is None:
        return choices, None, None
    specs = [x.spec for x in choices]
    advised = n = int(c.spec.value or 0)
    while n > 1 and select.precondition(catalogue.Spec(WORKERS, str(n)), jf, specs):
        n -= 1
    info: dict[str, Any] = {"advised": advised, "measured": [n], "kept": n, "notes": []}
    if n != advised:
        info["notes"].append(f"advised {advised}, measured {n}: "
                             f"{select.precondition(catalogue.Spec(WORKERS, str(advised)), jf, specs)}")
        c2 = select.Choice(catalogue.Spec(WORKERS, str(n)), f"{c.why}; lowered to {n}, the most the job accepts")
        choices = [c2 if x is c else x for x in choices]
    why_not = select.precondition(catalogue.Spec(WORKERS, str(n + 1)), jf, specs)
    if why_not:
        info["notes"].append(f"{n + 1} not measured: {why_not}")
        return choices, None, info
    info["measured"].append(n + 1)
    variant = [f"{WORKERS}={n + 1}" if x.spec.id == WORKERS else str(x.spec) for x in choices]
    return choices, variant, info


def pick_workers(arms: list[Arm], info: dict[str, Any], choices: list[select.Choice]) -> list[select.Choice]:
    """Keep N+1 workers only when V_k / B_k has an established gain (interval above 1), else N."""
    n = info["measured"][0]
    return pick_variant(arms, info, choices, WORKERS, n + 1, f"{n + 1} over {n} workers",
                        f"kept the advised {n}", f"kept {n + 1}: faster than {n}",
                        f"{n + 1} measured faster than {n}", len(info["measured"]) == 2)


def pick_variant(arms: list[Arm], info: dict[str, Any], choices: list[select.Choice], rid: str, value: Any,
                 what: str, keep_old: str, keep_new: str, why_new: str, planned: bool) -> list[select.Choice]:
    """Keep the variant's value of remedy `rid` only when V_k / B_k has an established gain (interval
    above 1). When it wins its arms become the treated ones (and the treated ones the variant), so
    that every verdict and the code change are about the setting kept."""
    variant = [a for a in arms if a.kind == "variant"]
    if not planned or not variant:
        if planned:
            info["notes"].append(f"{keep_old}: the variant did not run (the treated job failed)")
        return choices
    unchanged = [a for a in variant if a.ok and rid not in a.applied and rid in a.skipped]
    if unchanged:
        # The variant's value was not applied (an IterableDataset takes no workers from a remedy): its runs
        # kept the job's own setting, and what they measured is not the variant's.
        info["notes"].append(f"{keep_old}: the variant's {rid}={value} changed nothing ({unchanged[0].skipped[rid]})")
        return choices
    stat = compare(variant, [a for a in arms if a.kind == "treated"])
    failed = [a.label for a in variant if not a.ok]
    info.update(pairs=stat.pairs, geomean=stat.geomean, sign_p=stat.sign_p,
                interval=list(stat.interval) if stat.interval else None, text=f"{what}: {stat.text()}")
    if failed or not stat.gain:
        why = f"the variant failed ({', '.join(failed)})" if failed else "no established gain of the variant"
        info["notes"].append(f"{keep_old}: {why}")
        return choices
    info["kept"] = value
    info["notes"].append(keep_new)
    for a in arms:
        if a.kind in ("treated", "variant"):
            a.kind = "variant" if a.kind == "treated" else "treated"
    spec = catalogue.Spec(rid, str(value))
    return [select.Choice(spec, f"{c.why}; {why_new}") if c.spec.id == rid else c for c in choices]


COMPILE = "compile"


def compile_plan(choices: list[select.Choice], jf: select.JobFacts
                 ) -> tuple[list[str] | None, dict[str, Any] | None]:
    """For the compile remedy asked without a setting: the variant that also runs (issue: try the
    settings that fit the job): dynamic=True when the job recompiled, else
    mode='max-autotune-no-cudagraphs'. (The variant's specs, what was planned), or (None, None)."""
    c = next((c for c in choices if c.spec.id == COMPILE and not c.spec.value), None)
    if c is None:
        return None, None
    recompiled = any((f.compile.recompiles or 0) > 0 for f in jf.ranks)
    mode = "dynamic" if recompiled else "max-autotune-no-cudagraphs"
    info: dict[str, Any] = {"measured": ["default", mode], "kept": "default", "notes": [],
                            "why": "the job recompiled" if recompiled else "no recompiles: tune the kernels"}
    return [f"{COMPILE}={mode}" if x.spec.id == COMPILE else str(x.spec) for x in choices], info


def pick_compile(arms: list[Arm], info: dict[str, Any], choices: list[select.Choice]) -> list[select.Choice]:
    """Keep the variant compile setting only when it is faster than the default (established gain);
    each setting's compile seconds (median over its runs) are noted either way."""
    mode = info["measured"][1]
    for kind, name in (("treated", "default"), ("variant", mode)):
        secs = [f.compile.compile_time_s for a in arms if a.kind == kind for f in a.facts[:1]
                if f.compile.compile_time_s is not None]
        if secs:
            info.setdefault("compile_s", {})[name] = round(sorted(secs)[len(secs) // 2], 2)
    return pick_variant(arms, info, choices, COMPILE, mode, f"compile {mode} over the default",
                        "kept the default", f"kept {mode}: faster than the default", f"{mode} measured faster",
                        True)


def _run_all(command: Sequence[str], todo: list[Arm], opts: FixOptions, arms: list[Arm]) -> tuple[int, bool]:
    """Run ``todo`` in order; (exit code that ends `fix`, or 0; whether to stop the rounds)."""
    for arm in todo:
        arms.append(run_arm(command, arm, opts))
        if arm.kind == "baseline" and not arm.ok:
            render.failed(f"baseline run {arm.label}", arm.exit_code, os.path.join(arm.run_dir, "job.log"))
            return arm.exit_code, True
        if arm.exit_code < 0:
            return arm.exit_code, True  # killed by a signal (Ctrl-C): stop here
        if arm.kind == "treated" and not arm.ok:
            return 0, True  # the remedies break the job: rejected, no need to see it again
    return 0, False


@dataclass
class Loop:
    """The rounds of one `fix`: what each round runs, and every arm that ran (in run order)."""

    command: Sequence[str]
    opts: FixOptions
    out: str
    choices: list[select.Choice]
    refused: dict[str, str]
    jf: select.JobFacts | None
    advised: bool  # the worker count is torchdoctor's advice (compare N with N+1), not a given value
    arms: list[Arm] = field(default_factory=list)
    plan: Plan | None = None
    workers: dict[str, Any] | None = None
    compile_modes: dict[str, Any] | None = None

    def run(self, todo: list[Arm]) -> tuple[int, bool]:
        return _run_all(self.command, todo, self.opts, self.arms)

    def first_round(self) -> tuple[int, bool]:
        """Round 1: the baseline, then the plan of every round from what it and the treated run show."""
        code, stop = self.run(round_arms(1, self.out, Plan([]))[:1])
        if code or stop:
            return code, True
        if self.jf is None:  # ids given: the first baseline run tells what the preconditions need
            self.jf = select.JobFacts(self.arms[0].facts)
            self.choices, more = select.finalize(self.choices, self.jf)
            self.refused.update(more)
            if not self.opts.quiet and more:
                render.plan(self.opts.apply, self.choices, more, {}, None, header=False)
        if not self.choices:
            return 0, True
        variant = None
        if self.advised:
            self.choices, variant, self.workers = workers_plan(self.choices, self.jf)
        if variant is None:  # one variant per round: the worker count's, else the compile setting's
            variant, self.compile_modes = compile_plan(self.choices, self.jf)
        self.plan = Plan([str(c.spec) for c in self.choices], variant)
        code, stop = self.run(round_arms(1, self.out, self.plan)[1:2])
        if code or stop:
            return code, stop
        if self.opts.ablate and len(self.plan.specs) > 1:  # leave out, one at a time, what the job applied
            self.plan.ablated = [c for c in self.choices if c.spec.id in self.arms[-1].applied]
        return self.run(round_arms(1, self.out, self.plan)[2:])

    def rounds(self) -> int:
        """Run every round; the exit code that ends `fix` without verdicts, or 0."""
        for k in range(1, max(1, self.opts.repeats) + 1):
            if self.plan is None:
                code, stop = self.first_round()
            else:
                code, stop = self.run(round_order(k, round_arms(k, self.out, self.plan)))
            if code or stop:
                return code
            if self.plan is not None and any(a.kind == "variant" and not a.ok for a in self.arms):
                self.plan.variant = None  # the variant breaks the job: no need to see it again
        return 0


def fix(command: Sequence[str], opts: FixOptions) -> tuple[int, Outcome | None]:
    """The whole loop; returns (exit code, outcome). Writes nothing but run directories."""
    started = time.time()  # files its runs load that are newer were written by them (judge)
    out = opts.out or runner.default_run_dir() + "-fix"
    os.makedirs(out, exist_ok=True)
    choices, refused, unknown, jf, diag_dir, code, estimates, estimates_ms = _what_to_try(command, opts, out)
    if code:
        render.failed("the diagnosis run", code, os.path.join(diag_dir or out, "job.log"))
        return code, None
    asked = {c.spec.id: c.spec for c in choices}
    advised = opts.apply in LEVELS or (WORKERS in asked and asked[WORKERS].value is None)
    if not opts.quiet:
        render.plan(opts.apply, choices, refused, unknown, diag_dir)
    loop = Loop(command, opts, out, choices, refused, jf, advised)
    code = loop.rounds()
    if code:
        return code, None
    arms, choices = loop.arms, loop.choices
    if loop.workers is not None and loop.plan is not None:
        choices = pick_workers(arms, loop.workers, choices)
    elif loop.compile_modes is not None and loop.plan is not None:
        choices = pick_compile(arms, loop.compile_modes, choices)
    # Verdicts for what ran (values filled in) and for what was refused (as asked).
    requested = [c.spec for c in choices] + [asked.get(rid, catalogue.Spec(rid)) for rid in loop.refused]
    outcome = judge(arms, requested, loop.refused, opts.rtol, since=started)
    outcome.workers = loop.workers
    outcome.compile_modes = loop.compile_modes
    kept = [v.spec.id for v in outcome.verdicts if v.status == "kept"]
    applied = {rid: e for a in arms if a.kind == "treated" for rid, e in a.applied.items()}
    changes = changes_for(kept, applied, shlex.join(command))
    render.finish(outcome, arms, choices, unknown, changes, opts, out, diag_dir, estimates, estimates_ms)
    return 0, outcome


def exit_code_of(code: int) -> int:
    return runner.exit_like(code) if code < 0 else code


def options(args: argparse.Namespace) -> FixOptions:
    return FixOptions(apply=args.apply, steps=getattr(args, "fix_steps", None), repeats=args.repeats,
                      ablate=args.ablate, from_run=args.from_run, out=args.out, rtol=args.rtol,
                      show_output=args.show_output, quiet=args.quiet)


def run_and_report(command: Sequence[str], opts: FixOptions, args: argparse.Namespace) -> int:
    code, outcome = fix(command, opts)
    if outcome is not None:
        render.write_report(outcome, args)
    return exit_code_of(code)


def add_demo_fix_options(p: argparse.ArgumentParser) -> None:
    """`torchdoctor demo --fix`: the same loop on the bundled demo."""
    p.add_argument("--fix", action="store_true",
                   help="apply remedies to the demo and measure them side by side (`torchdoctor fix`)")
    add_fix_options(p, steps=False)


def fix_demo(command: Sequence[str], args: argparse.Namespace) -> int:
    if args.repeats < 1:
        print("torchdoctor: demo --fix: --repeats must be >= 1", file=sys.stderr)
        return 2
    return run_and_report(command, options(args), args)


def cmd_fix(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("torchdoctor: fix: give the command after --, e.g. torchdoctor fix -- python train.py", file=sys.stderr)
        return 2
    if args.fix_steps is not None and args.fix_steps < 1 or args.repeats < 1:
        print("torchdoctor: fix: --steps and --repeats must be >= 1", file=sys.stderr)
        return 2
    return run_and_report(command, options(args), args)


def add_fix_options(p: argparse.ArgumentParser, steps: bool = True) -> None:
    """The loop's options (shared with `torchdoctor demo --fix`, whose --steps is the demo's own)."""
    p.add_argument("--apply", default="safe", metavar="safe|numerics|ID,...",
                   help="remedy class picked from the diagnosis, or remedy ids (ID or ID=VALUE; with --from, an ID "
                        "without a value takes the diagnosis's advice); default safe")
    if steps:
        p.add_argument("--steps", dest="fix_steps", type=int, metavar="N", help="end every run after N optimizer steps")
    p.add_argument("--repeats", "-k", type=int, default=DEFAULT_REPEATS, metavar="K",
                   help="baseline/treated rounds, in ABBA order; 3 or more give an interval (default %(default)s)")
    p.add_argument("--ablate", action="store_true",
                   help="measure each remedy's own share (the treated job without it, per round)")
    p.add_argument("--from", dest="from_run", metavar="RUN_DIR",
                   help="pick remedies from the findings of this `torchdoctor run` directory")
    p.add_argument("--rtol", type=float, default=NUMERICS_RTOL,
                   help="loss tolerance of `numerics` remedies, relative per step (default %(default)s)")
    p.add_argument("--show-output", action="store_true", help="let the job's output through (default: job.log)")


def add_fix_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``fix`` on the ``torchdoctor`` command line."""
    p = subparsers.add_parser(
        "fix", help="apply remedies without code changes and measure them side by side (A/B)",
        description="Run COMMAND as it is and with remedies applied at start-up (no code change), "
        "in counterbalanced rounds (A B, B A, ...); keep the remedies whose speed-up is established (its "
        "interval above 1) or that cost nothing, while it learns the same, and print the code changes that "
        "make them permanent. The exit status is the job's.")
    add_fix_options(p)
    p.add_argument("--out", metavar="DIR", help="directory of the runs (default: ./td-runs/<timestamp>-fix)")
    runner.add_report_options(p)
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND...")
    p.set_defaults(func=cmd_fix)
    return p
