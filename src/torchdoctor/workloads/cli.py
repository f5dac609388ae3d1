"""`torchdoctor demo`: run the bundled DDP job (``workloads.demo``) under ``torchdoctor run``."""

from __future__ import annotations

import argparse
import os
import sys

from torchdoctor import runner
from torchdoctor.probe import config as probe_config
from torchdoctor.workloads.pathologies import PATHOLOGIES

DEMO_RANKS = 2


def demo_command(flags: list[str], nproc: int = DEMO_RANKS) -> list[str]:
    """The torchrun command line of the demo job."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        "-m", "torchdoctor.workloads.demo", *flags,
    ]  # fmt: skip


def compiled_command(flags: list[str]) -> list[str]:
    """The command line of the compiled demo job (one process)."""
    return [sys.executable, "-m", "torchdoctor.workloads.compiled", *flags]


DEMO_STEPS = 48
COMPILED_STEPS = 60  # enough distinct sequence lengths to reach the recompile limit


def demo_flags(args: argparse.Namespace) -> list[str]:
    steps = args.steps if args.steps is not None else COMPILED_STEPS if getattr(args, "compile", False) else DEMO_STEPS
    flags = ["--steps", str(steps)]
    if args.healthy:
        flags.append("--healthy")
    elif args.pathologies:
        flags += ["--pathologies", args.pathologies]
    return flags


def cmd_demo(args: argparse.Namespace) -> int:
    # torchrun sets one thread per rank anyway and prints a banner about it; set it quietly.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    command = compiled_command(demo_flags(args)) if args.compile else demo_command(demo_flags(args))
    if getattr(args, "fix", False):  # `demo --fix`: the A/B loop of `torchdoctor fix` (fixer.py)
        from torchdoctor.fixer import fix_demo

        return fix_demo(command, args)
    try:
        profile = probe_config.parse_steps(args.profile_steps)
    except ValueError as exc:
        print(f"torchdoctor: demo: {exc}", file=sys.stderr)
        return 2
    return runner.execute(command, args.out or runner.default_run_dir(), profile, args)


def add_demo_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``demo`` on the ``torchdoctor`` command line."""
    p = subparsers.add_parser(
        "demo",
        help="run a bundled 2-rank DDP job with known problems under the probe and diagnose it",
        description="Train a small DDP model on 2 processes (gloo on CPU, NCCL on GPUs) with injected "
        f"pathologies ({', '.join(PATHOLOGIES)}) and print the diagnosis matrix. --healthy runs the fixed job.",
    )
    p.add_argument("--healthy", action="store_true", help="run the fixed job (no pathology)")
    p.add_argument("--pathologies", metavar="LIST", help="comma list of pathologies to inject (default: all)")
    p.add_argument("--compile", action="store_true",
                   help="run the compiled single-process job instead (workloads/compiled.py: graph breaks, recompiles; "
                        "--healthy runs its fixed version)")
    p.add_argument("--steps", type=int, default=None,
                   help=f"optimizer steps per rank (default {DEMO_STEPS}; {COMPILED_STEPS} with --compile)")
    p.add_argument("--out", metavar="DIR", help="run directory (default: ./td-runs/<timestamp>)")
    # Later than `run`'s default: the healthy job's workers fill their prefetch queues first.
    p.add_argument(
        "--profile-steps", metavar="A:B|off", default="10:13", help="profiler window (default %(default)s)"
    )
    runner.add_report_options(p)
    from torchdoctor.fixer import add_demo_fix_options  # `demo --fix` and its options (fixer.py)

    add_demo_fix_options(p)
    p.set_defaults(func=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m torchdoctor.workloads.cli [options]`` (the same as ``torchdoctor demo``)."""
    parser = argparse.ArgumentParser(prog="python -m torchdoctor.workloads.cli")
    sub = parser.add_subparsers(dest="subcommand", required=True)
    add_demo_parser(sub)
    args = parser.parse_args(["demo", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
