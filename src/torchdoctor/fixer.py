"""`torchdoctor fix [--apply safe|numerics|ID,...] [--steps N] [--ablate] -- COMMAND...`

Closes the loop from a finding to a measured fix, without touching the user's code:

1. what to try: ``--apply safe`` / ``numerics`` run the job once under the probe (or read
   ``--from RUN_DIR``) and take the remedies its findings name; ``--apply ID,...`` takes those;
2. the job then runs K rounds of baseline and treated (A B A B ...; ``--ablate`` adds, per round,
   the treated job without each remedy), every run under the probe with the profiler off, the
   remedies applied by the bootstrap, and the loss of every step recorded;
3. verdicts (``remedies.verdict``): speed-up from the steady-state step timings, the same learning
   checked on the losses, kept or rejected per remedy; then the code changes that make the kept
   ones permanent.

The job's output goes to ``RUN/<arm>/job.log`` (``--show-output`` lets it through). The exit code is
the job's own (its baseline run's); a run killed by a signal ends the loop the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from torchdoctor import runner
from torchdoctor.probe import config as probe_config
from torchdoctor.remedies import catalogue, render, select
from torchdoctor.remedies.measure import Arm, load
from torchdoctor.remedies.runtime import ENV_RECORD, ENV_SAID, ENV_STEPS
from torchdoctor.remedies.suggest import changes_for
from torchdoctor.remedies.verdict import NUMERICS_RTOL, Outcome, judge

LEVELS = ("safe", "numerics")
DEFAULT_REPEATS = 2


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
    with _output_to(log):
        job = runner.run_job(command, env)
    runner.write_manifest(arm.run_dir, command, job)
    arm.exit_code, arm.wall_s = job.returncode, job.duration_s
    load(arm)
    if not opts.quiet:
        render.progress(arm)
    return arm


def _what_to_try(command: Sequence[str], opts: FixOptions, out: str
                 ) -> tuple[list[select.Choice], dict[str, str], dict[str, str], select.JobFacts | None, str | None, int]:
    """(choices, refused by precondition, unknown ids, facts, diagnosis run dir, exit code)."""
    if opts.apply not in LEVELS:
        specs, unknown = catalogue.parse_all(opts.apply.split(","))
        return [select.Choice(s, "asked for") for s in specs], {}, unknown, None, None, 0
    diag_dir = opts.from_run
    if diag_dir is None:
        diag_dir = os.path.join(out, "diagnose")
        window = probe_config.DEFAULT_PROFILE_STEPS
        steps = max(opts.steps, window[1] + 2) if opts.steps else None
        diag = run_arm(command, Arm("D", "diagnosis", [], diag_dir), opts, profile=window, steps=steps)
        if not diag.ok:
            return [], {}, {}, None, diag_dir, diag.exit_code
    from torchdoctor.session import report_from_run_dir

    report = report_from_run_dir(diag_dir)
    jf = select.JobFacts([r.facts for r in report.ranks if r.facts is not None])
    choices, refused = select.finalize(select.choose(report.findings, opts.apply), jf)
    return choices, refused, {}, jf, diag_dir, 0


def fix(command: Sequence[str], opts: FixOptions) -> tuple[int, Outcome | None]:
    """The whole loop; returns (exit code, outcome). Writes nothing but run directories."""
    out = opts.out or runner.default_run_dir() + "-fix"
    os.makedirs(out, exist_ok=True)
    choices, refused, unknown, jf, diag_dir, code = _what_to_try(command, opts, out)
    if code:
        render.failed("the diagnosis run", code, os.path.join(diag_dir or out, "job.log"))
        return code, None
    asked = {c.spec.id: c.spec for c in choices}
    if not opts.quiet:
        render.plan(opts.apply, choices, refused, unknown, diag_dir)
    arms: list[Arm] = []
    ablated: list[select.Choice] = []
    for k in range(1, max(1, opts.repeats) + 1):
        a = run_arm(command, Arm(f"A{k}", "baseline", [], os.path.join(out, f"A{k}"), round=k), opts)
        arms.append(a)
        if not a.ok:
            render.failed(f"baseline run A{k}", a.exit_code, os.path.join(a.run_dir, "job.log"))
            return a.exit_code, None
        if jf is None:  # ids given: the first baseline run tells what the preconditions need
            jf = select.JobFacts(a.facts)
            choices, more = select.finalize(choices, jf)
            refused.update(more)
            if not opts.quiet and more:
                render.plan(opts.apply, choices, more, {}, None, header=False)
        if not choices:
            break
        specs = [str(c.spec) for c in choices]
        b = run_arm(command, Arm(f"B{k}", "treated", specs, os.path.join(out, f"B{k}"), round=k), opts)
        arms.append(b)
        if b.exit_code < 0:
            return b.exit_code, None  # killed by a signal (Ctrl-C): stop here
        if not b.ok:
            break  # the remedies break the job: rejected, no need to see it again
        if k == 1:  # leave out, one at a time, only what the job actually applied
            ablated = [c for c in choices if c.spec.id in b.applied] if opts.ablate and len(specs) > 1 else []
        for c in ablated:
            rest = [s for s in specs if s != str(c.spec)]
            label = f"C{k}-{c.spec.id}"
            arms.append(run_arm(command, Arm(label, "ablated", rest, os.path.join(out, label),
                                             without=c.spec.id, round=k), opts))
    # Verdicts for what ran (values filled in) and for what was refused (as asked).
    requested = [c.spec for c in choices] + [asked.get(rid, catalogue.Spec(rid)) for rid in refused]
    outcome = judge(arms, requested, refused, opts.rtol)
    kept = [v.spec.id for v in outcome.verdicts if v.status == "kept"]
    applied = {rid: e for a in arms if a.kind == "treated" for rid, e in a.applied.items()}
    changes = changes_for(kept, applied)
    render.finish(outcome, arms, choices, unknown, changes, opts, out, diag_dir)
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
                   help="remedy class picked from the diagnosis, or remedy ids (ID or ID=VALUE); default safe")
    if steps:
        p.add_argument("--steps", dest="fix_steps", type=int, metavar="N", help="end every run after N optimizer steps")
    p.add_argument("--repeats", "-k", type=int, default=DEFAULT_REPEATS, metavar="K",
                   help="baseline/treated rounds, alternating (default %(default)s)")
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
        "alternating A B A B; keep the remedies that make it faster while it learns the same, and "
        "print the code changes that make them permanent. The exit status is the job's.")
    add_fix_options(p)
    p.add_argument("--out", metavar="DIR", help="directory of the runs (default: ./td-runs/<timestamp>-fix)")
    runner.add_report_options(p)
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND...")
    p.set_defaults(func=cmd_fix)
    return p
