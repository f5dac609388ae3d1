"""Command line: `torchdoctor analyze | run | fix | demo`.

Exit codes (all subcommands that analyse):
  0  everything asked for was analysed
  1  some inputs could not be analysed (each named on stderr in one line), or the configuration
     file is not valid TOML (the defaults were used); the rest were
  2  usage error, or no input could be analysed at all
  3  --fail-on SEVERITY: a finding at or above that severity was raised (CI gate)
  4  blind spot: the inputs were read but do not show what a verdict needs (no device activity
     recorded, a counters-only range-profiler trace, an unknown accelerator, a job that ended
     before its first step or failed, a job that ran its own profiler); the report leads with it
For `run` and `fix`, the exit code is the user's job's own exit code (it passes through).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from . import __version__

EXIT_OK, EXIT_PARTIAL, EXIT_FAILED, EXIT_GATE, EXIT_BLIND = 0, 1, 2, 3, 4
EXIT_EPILOG = "exit codes:\n" + __doc__.split("Exit codes (all subcommands that analyse):\n", 1)[1].rstrip('"\n ')


def add_output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="FILE", help="write the report as JSON (schema torchdoctor.report/1); '-' for stdout, "
                   "which then holds nothing else")
    p.add_argument("--html", metavar="FILE", help="write a self-contained HTML report")
    p.add_argument("--annotated-trace", metavar="FILE",
                   help="write a copy of the (first) trace with the findings as an extra track (Perfetto)")
    p.add_argument("--verbose", "-v", action="store_true", help="print every finding's evidence")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing but errors")
    p.add_argument("--fail-on", choices=("critical", "warning", "info"),
                   help="exit 3 when a finding of this severity or worse is raised (for CI)")
    p.add_argument("--ignore", metavar="ID,...", action="append",
                   help="rule ids to leave out (comma list, repeatable); adds to the configuration's")
    p.add_argument("--config", metavar="FILE",
                   help="configuration file (torchdoctor.toml keys, or a pyproject.toml's [tool.torchdoctor]); "
                        "default: the first found from the current directory upwards")


def config_from_args(args):
    """The rule configuration of a command's --config / --ignore, looked up from the current
    directory; None when the command has no such options."""
    if not hasattr(args, "ignore") and not hasattr(args, "config"):
        return None
    from .config import resolve

    ignore = ",".join(getattr(args, "ignore", None) or [])
    return resolve(getattr(args, "config", None), ignore or None)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="torchdoctor", description=__doc__.splitlines()[0],
                                     epilog=EXIT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"torchdoctor {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("analyze", help="diagnose existing torch.profiler (Kineto) traces or a run directory",
                       description="Analyse Kineto traces (files, directories, globs; .json or .json.gz) "
                                   "or a `torchdoctor run` directory.",
                       epilog=EXIT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("paths", nargs="+", metavar="PATH")
    a.add_argument("--rank", type=int, help="analyse only this rank")
    a.add_argument("--steps", metavar="A:B|all|trace",
                   help="window: ProfilerStep numbers A<=N<B, 'all' steps, or 'trace' = first to last "
                        "device event (HTA's window). Default: steady-state steps (warm-up skipped)")
    a.add_argument("--jobs", "-j", type=int, help="worker processes for multi-rank input (default: CPUs)")
    a.add_argument("--executor", metavar="local|dask[://ADDR]|ray[://ADDR]", default="local",
                   help="where the per-rank work runs: local processes (default), a Dask cluster or a "
                        "Ray cluster (a local one is started when no address is given); only each "
                        "rank's summary travels back. Paths may be URLs that fsspec reads (s3://...)")
    add_output_options(a)
    a.set_defaults(func=cmd_analyze)
    # Live-run subcommands live in their own modules (they need torch only inside the user's job).
    # They import without torch; one that fails to import is a broken install, shown, never hidden.
    for name, module, adder in (("run", "torchdoctor.runner", "add_run_parser"),
                                ("fix", "torchdoctor.fixer", "add_fix_parser"),
                                ("demo", "torchdoctor.workloads.cli", "add_demo_parser"),
                                ("checkpoint", "torchdoctor.checkpoint.cli", "add_checkpoint_parser"),
                                ("topo", "torchdoctor.hardware.topo_cli", "add_topo_parser"),
                                ("comm", "torchdoctor.comm.cli", "add_comm_parser"),
                                ("cache", "torchdoctor.compile.cache_cli", "add_cache_parser")):
        try:
            getattr(importlib.import_module(module), adder)(sub)
        except Exception as e:  # noqa: BLE001 - any failure leaves the command registered, reporting it
            _add_broken_command(sub, name, module, e)
    return parser


def _add_broken_command(sub, name: str, module: str, error: Exception) -> None:
    """Register `name` so that calling it says why it cannot run (exit 2) instead of 'invalid choice'."""
    reason = f"{type(error).__name__}: {error}".splitlines()[0]
    if name in sub.choices:  # the module failed after registering `name`: replace the half-built one
        del sub.choices[name]
        sub._choices_actions[:] = [a for a in sub._choices_actions if a.dest != name]
    p = sub.add_parser(name, help=f"unavailable: {module} failed to import ({reason})", add_help=False)

    def broken(_args) -> int:
        print(f"torchdoctor: error: '{name}' is unavailable: {module} failed to import: {reason}",
              file=sys.stderr)
        return EXIT_FAILED

    p.set_defaults(func=broken, accepts_any_arguments=True)


def emit(report, args) -> int:
    """Render a report to every requested output; return the exit code it implies."""
    from .report.console import print_report
    from .report.json_out import write_json

    # `--json -` makes stdout the JSON document: the console report would corrupt it.
    if not getattr(args, "quiet", False) and getattr(args, "json", None) != "-":
        print_report(report, verbose=getattr(args, "verbose", False))
    # One line per unreadable input, on stderr, whatever else is printed.
    for e in report.errors:
        print(f"torchdoctor: error: {e.file}: {e.message}", file=sys.stderr)
    if getattr(args, "json", None):
        write_json(report, args.json)
    failed = False
    if getattr(args, "html", None):
        from .report.html import write_html

        failed |= not _write(write_html, report, args.html)
    if getattr(args, "annotated_trace", None):
        from .report.annotate import write_annotated_trace

        failed |= not _write(write_annotated_trace, report, args.annotated_trace)
    code = exit_code(report, getattr(args, "fail_on", None))
    return EXIT_PARTIAL if failed and code == EXIT_OK else code


def _write(writer, report, path: str) -> bool:
    """Run one output writer; a failure is one line on stderr, not a traceback."""
    try:
        writer(report, path)
        return True
    except (OSError, ValueError) as e:
        print(f"torchdoctor: error: {path}: {e}", file=sys.stderr)
        return False


def exit_code(report, fail_on: str | None) -> int:
    """The code a report implies: nothing analysed (2) < CI gate (3) < blind spot (4) < errors (1)."""
    from .report.model import SEVERITY_ORDER

    blind = any(s.get("kind") != "no-verdict" for s in report.blind_spots)
    if not report.ranks and not blind:
        return EXIT_FAILED
    if fail_on and any(SEVERITY_ORDER[f.severity] <= SEVERITY_ORDER[fail_on] for f in report.findings):
        return EXIT_GATE
    if blind:
        return EXIT_BLIND
    return EXIT_PARTIAL if report.errors else EXIT_OK


def cmd_analyze(args) -> int:
    from .advice.host_allocator import keep_freed_memory
    from .executors import ExecutorError, parse_executor
    from .metrics.steps import WindowError, parse_step_range
    from .session import analyze_paths

    try:
        executor = parse_executor(args.executor)
    except ExecutorError as e:
        print(f"torchdoctor: {e}", file=sys.stderr)
        return EXIT_FAILED

    if args.steps not in (None, "all", "trace"):
        try:
            parse_step_range(args.steps)
        except WindowError as e:
            print(f"torchdoctor: {e}", file=sys.stderr)
            return EXIT_FAILED
    # Decoding allocates and frees ~16 MB blocks and column arrays per piece; glibc's default
    # thresholds hand them back to the kernel and fault them in again (HO-15's diagnosis, here of
    # ourselves): on 16 x 620 MB this cut system time 8.6 -> 2.0 s and wall 10%. This process and the
    # workers it forks are ours (the local Dask cluster's too), so the setting is too (never a library
    # caller's or an attached engine's).
    keep_freed_memory(big_blocks=False)
    try:
        report = analyze_paths(args.paths, steps=args.steps, rank=args.rank, jobs=args.jobs,
                               config=getattr(args, "rule_config", None), executor=executor,
                               progress=False if args.quiet else None)
    except ExecutorError as e:
        print(f"torchdoctor: {e}", file=sys.stderr)
        return EXIT_FAILED
    return emit(report, args)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "accepts_any_arguments", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        loaded = config_from_args(args)
        if loaded is None:
            return int(args.func(args) or 0)
        from .config import activated

        args.rule_config = loaded
        with activated(loaded):  # for the reports built without an explicit configuration (fix)
            return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
