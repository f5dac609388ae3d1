"""Terminal renderer (rich): per-rank numbers, where the idle time goes, the diagnosis matrix.

The report's blind spots (what the tool could not see) come first, each its own sentence; the
configuration follows in one line when it is not the default; "healthy" is said only when
`Report.healthy` is True.
"""

from __future__ import annotations

import os
import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..metrics.model import RankResult
from ..metrics.store import headline
from .labels import job_cost, steps_label
from .model import LazyRanks, Report
from .offenders import late_line, spread, worst
from .roofline_text import roofline_lines

LAYERS = ("input", "host", "compile", "distributed", "hardware")
SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
CAUSE_LABEL = {
    "dataloader": "waiting for the DataLoader",
    "sync": "host blocked in a device sync",
    "optimizer": "optimizer step on the host",
    "comm_host": "host inside a collective call",
    "host_ops": "host busy in other ops (launch overhead, Python ops)",
    "untraced": "host outside any traced op (Python, untraced work)",
}
MAX_RANK_ROWS = 16


def fmt(v: float | None, unit: str = "", digits: int = 1) -> str:
    return "–" if v is None else f"{v:.{digits}f}{unit}"


def make_console(stderr: bool = False) -> Console:
    """A console that keeps tables readable when piped (rich would fall back to 80 columns)."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 150
    return Console(highlight=False, stderr=stderr, width=width)


def print_report(report: Report, console: Console | None = None, verbose: bool = False) -> None:
    console = console or make_console()
    for spot in report.blind_spots:
        style = "dim" if spot.get("kind") == "no-verdict" else "bold yellow"
        console.print(Text(spot.get("text", ""), style))
    line = config_line(report.config)
    if line:
        console.print(Text(line, "dim"))
    lazy = isinstance(report.ranks, LazyRanks)
    # Ranks read from a store (thousands of them): keep only what the table shows of each.
    results = [headline(r.analysis) if lazy else r.analysis for r in report.ranks if r.analysis is not None]
    if results:
        straggler = report.cross_rank.straggler if report.cross_rank is not None else None
        console.print(rank_table(results, straggler))
        if len(results) > MAX_RANK_ROWS:
            console.print(spread_line(results))
        _print_cross_rank(report, console)
        first = next(r.analysis for r in report.ranks if r.analysis is not None) if lazy else results[0]
        if first.idle_causes and first.metrics.idle_pct:
            console.print(idle_table(first))
        elif first.device_kind == "cpu" and first.host.phases_ms:
            console.print(host_table(first, results))
        for line in roofline_lines(first):
            console.print(Text(f"rank {first.rank} {line}"))
    elif report.ranks:
        console.print(f"{len(report.ranks)} rank(s) reported facts but no profiler trace was analysed.")
    _print_inductor(report, console, verbose)
    _print_findings(report, console, verbose)
    for w in report.warnings[:20]:
        console.print(f"[dim]warning: {escape(w.file)}: {escape(w.message)}[/dim]")


def config_line(config: dict) -> str:
    """The effective rule configuration in one line; "" when it is the default."""
    ignore, thresholds = config.get("ignore") or [], config.get("thresholds") or {}
    if not (config.get("file") or ignore or thresholds):
        return ""
    parts = [f"config: {config.get('file') or 'command line'}"]
    if ignore:
        parts.append("ignoring " + ", ".join(ignore))
    if thresholds:
        parts.append("thresholds " + "; ".join(
            f"{rid} " + ", ".join(f"{k}={v:g}" for k, v in values.items()) for rid, values in thresholds.items()))
    return " — ".join(parts)


def rank_table(results: list[RankResult], straggler: int | None = None) -> Table:
    """One row per rank; beyond MAX_RANK_ROWS ranks, the straggler and the ranks that lose most."""
    many = len(results) > MAX_RANK_ROWS
    first = next((i for i, r in enumerate(results) if r.rank == straggler), None) if straggler is not None else None
    shown = [results[i] for i in worst(results, MAX_RANK_ROWS, first)]
    title = "Per-rank summary (shares of the analysis window)"
    if many:
        title = (f"Per-rank summary: {len(shown)} of {len(results)} ranks, "
                 f"{'the straggler and ' if first is not None else ''}those with most device idle time "
                 "(shares of the analysis window)")
    t = Table(title=title, title_justify="left")
    for col in ("rank", "device", "window", "step ms", "busy", "idle", "compute", "comm",
                "exposed comm", "data wait", "sync"):
        t.add_column(col, justify="right" if col not in ("device", "window") else "left")
    for r in shown:
        m, w = r.metrics, r.window
        steps = steps_label(w.steps) if w.steps else w.mode
        if w.steps and w.boundaries != "ProfilerStep":
            steps += f" from {w.boundaries}"  # no ProfilerStep: say where the inferred steps came from
        if w.skipped_warmup:
            steps += f" (warm-up {','.join(map(str, w.skipped_warmup))} skipped)"
        device = r.device or ("CPU only" if r.device_kind == "cpu" else f"{r.device_kind.upper()} (unnamed)")
        t.add_row(rank_label(r, results) + (" (straggler)" if many and r.rank == straggler else ""),
                  escape(device), steps,
                  fmt(m.step_ms_median, digits=2), fmt(m.busy_pct, "%"), fmt(m.idle_pct, "%"),
                  fmt(m.compute_pct, "%"), fmt(m.comm_pct, "%"), fmt(m.comm_exposed_pct, "%"),
                  fmt(m.dataloader_exposed_pct, "%"), fmt(m.sync_pct, "%"))
    return t


def spread_line(results: list[RankResult]) -> str:
    """The spread over all ranks of what the table shows for a few: median / p90 / max."""
    parts = []
    for label, values, unit, digits in (
            ("step", [r.metrics.step_ms_median for r in results], " ms", 2),
            ("device idle", [r.metrics.idle_pct for r in results], "%", 1),
            ("exposed comm", [r.metrics.comm_exposed_pct for r in results], "%", 1),
            ("data wait", [r.metrics.dataloader_exposed_pct for r in results], "%", 1)):
        s = spread(values)
        if s is not None:
            parts.append(f"{label} {fmt(s[0], unit, digits)} / {fmt(s[1], unit, digits)} / {fmt(s[2], unit, digits)}")
    return f"Across all {len(results)} ranks (median / p90 / max): " + "; ".join(parts) + "." if parts else ""


def idle_table(r: RankResult) -> Table:
    steps = max(len(r.window.steps), 1)
    total = sum(c.ns for c in r.idle_causes) or 1
    t = Table(title=f"Rank {r.rank}: what the host did while the device sat idle", title_justify="left")
    per = "ms/step" if r.window.steps else "ms in window"  # a trace without steps: the whole window
    for col in ("cause", per, "share of idle", "top ops"):
        t.add_column(col, justify="right" if col in (per, "share of idle") else "left")
    for c in sorted(r.idle_causes, key=lambda c: -c.ns):
        if c.ns <= 0:
            continue
        tops = ", ".join(escape(n.name[:40]) for n in c.top[:3])
        t.add_row(CAUSE_LABEL.get(c.cause, c.cause), f"{c.ns / 1e6 / steps:.2f}", f"{100 * c.ns / total:.0f}%", tops)
    return t


def rank_label(r: RankResult, results: list[RankResult]) -> str:
    """The rank, and its trace's name where processes share the rank (no process group: Hogwild
    children, independent trainings): ``0 (rank0.pid4242)``."""
    if r.rank is None or sum(x.rank == r.rank for x in results) < 2:
        return str(r.rank)
    name = os.path.basename(r.file)
    return f"{r.rank} ({name.removesuffix('.gz').removesuffix('.json')})"


def host_table(r: RankResult, results: list[RankResult] | None = None) -> Table:
    t = Table(title=f"Rank {rank_label(r, results or [r])}: host step time (CPU-only trace)", title_justify="left")
    t.add_column("phase")
    t.add_column("ms/step (median)", justify="right")
    t.add_column("share of window", justify="right")
    for phase, ms in r.host.phases_ms.items():
        t.add_row(phase, f"{ms:.2f}", fmt(r.host.phases_pct.get(phase), "%"))
    return t


# Generated kernels listed per run in the console (all of them in the JSON, and with --verbose).
INDUCTOR_ROWS = 8


def _print_inductor(report: Report, console: Console, verbose: bool) -> None:
    """What Inductor made of the first compiling rank's graphs (compile/fusion.py)."""
    rr = next((r for r in report.ranks if r.compile and r.compile.get("inductor")), None)
    if rr is None:
        return
    got = rr.compile["inductor"]
    console.print(Text(f"Inductor (rank {rr.rank}): {got['summary']}", "bold"))
    kernels = [k for m in got["modules"] for k in m["kernels"]]
    for k in kernels if verbose else kernels[:INDUCTOR_ROWS]:
        where = f" from {', '.join(k['lines'][:3])}" if k.get("lines") else ""
        if where and k.get("lines_from") == "op names":
            where += " (matched by op name)"
        times = f" x{k['launches']}" if k.get("launches", 1) > 1 else ""
        console.print(Text(f"  {k['name']}{times}: {', '.join(k['aten'])}{where}"))
    if not verbose and len(kernels) > INDUCTOR_ROWS:
        console.print(Text(f"  ... {len(kernels) - INDUCTOR_ROWS} more (--verbose, or the JSON's compile.inductor)", "dim"))


def _print_cross_rank(report: Report, console: Console) -> None:
    c = report.cross_rank
    if c is None:
        return
    line = (f"{c.ranks} ranks: median step {fmt(c.step_ms_median, ' ms', 2)}, "
            f"skew {fmt(c.step_skew_pct, '%')} (min {fmt(c.step_ms_min, ' ms', 2)}, max {fmt(c.step_ms_max, ' ms', 2)})")
    if c.straggler is not None:
        line += (f"; straggler: rank {c.straggler} (waits least in collectives, "
                 f"others wait up to {fmt(c.straggler_lead_ms, ' ms', 2)} more per step)")
    console.print(line)
    late = late_line(c)
    if late:
        console.print(late)


def _print_findings(report: Report, console: Console, verbose: bool) -> None:
    findings = report.findings
    actionable = [f for f in findings if f.severity != "info"]
    if not findings:
        if report.healthy:
            console.print("[green]No findings: nothing in this run points to lost accelerator time.[/green]")
        elif report.blind_spots:  # they lead the report: what was not seen
            console.print("No findings in what was recorded, and no verdict (see above).")
        else:
            console.print("No findings: nothing was analysed.")
        return
    if not actionable:
        if report.healthy:
            console.print("[green]Healthy: no warning-level findings.[/green]")
        else:
            console.print("No warning-level findings in what was recorded, and no verdict (see above).")
    else:
        top = actionable[0]
        cost = (f"  ({job_cost(top.job_s, top.job_pct, top.per)})"
                if top.job_s and not top.recoverable_ms else
                f"  (≈{top.recoverable_pct:.0f}% of {'the traced window' if top.per == 'window' else 'step time'}"
                + (f", {top.recoverable_ms:.1f} {'ms' if top.per == 'window' else 'ms/step'})"
                   if top.recoverable_ms else ")"))
        console.print(Text.assemble(("Fix first: ", "bold"), (f"{top.title}", SEVERITY_STYLE[top.severity]), cost))
        if top.fix:
            console.print(f"  {escape(top.fix.text)}")
            if top.fix.snippet:
                console.print(f"[dim]{escape(top.fix.snippet)}[/dim]")
    t = Table(title="Diagnosis matrix (ranked by time the fix gives back)", title_justify="left")
    for col in ("#", "layer", "id", "severity", "finding", "gain", "fix"):
        t.add_column(col, justify="right" if col in ("#", "gain") else "left")
    for i, f in enumerate(findings, 1):
        if f.severity == "info" and not verbose and i > 12:
            continue
        gain = f"{f.recoverable_pct:.1f}%" + (f"\n{f.recoverable_ms:.1f} ms" if f.recoverable_ms else "")
        if f.job_s and not f.recoverable_ms:  # a one-off cost of the job, not a share of the step
            gain = job_cost(f.job_s, f.job_pct, f.per, sep="\n")
        t.add_row(str(i), f.layer, f.id, Text(f.severity, SEVERITY_STYLE[f.severity]), escape(f.title), gain,
                  escape(f.fix.text if f.fix else ""))
    console.print(t)
    by_layer = {layer: [f for f in findings if f.layer == layer] for layer in LAYERS}
    summary = "  ".join(f"{layer}: {len(fs)}" for layer, fs in by_layer.items())
    console.print(f"[dim]findings per layer — {summary}[/dim]")
    if verbose:
        for f in findings:
            console.print(f"[bold]{f.id}[/bold] {escape(f.title)}")
            for ev in f.evidence:
                console.print(f"  • {escape(ev.text)}")
            if f.confirm:
                console.print(f"  [dim]to confirm: {escape(f.confirm)}[/dim]")
