"""An analysis session: inputs (traces or a run directory) in, one `Report` out.

Ranks are analysed in parallel worker processes, each holding one trace at a time and sending
back only its small `RankResult`, so memory stays bounded by (workers x one trace), not by the
number of ranks.
"""

from __future__ import annotations

import gzip
import multiprocessing as mp
import os
import re
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor

import msgspec

from . import __version__
from .facts import RankFacts
from .metrics.model import RankResult
from .metrics.rank import analyze_rank
from .metrics.ranks import cross_rank
from .metrics.steps import WindowError
from .report.model import ErrorEntry, RankReport, Report
from .rules import RankInputs, RuleInputs, diagnose
from .trace.decode import TraceFormatError
from .trace.load import discover, load_trace, rank_from_filename

RUN_MANIFEST = "run.json"
_PEEK_RANK = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(\d+)')


def analyze_rank_file(path: str, steps: str | None = None, jobs: int = 1) -> RankResult:
    """Load and analyse one trace file. Raises TraceFormatError or WindowError (one-line messages).

    `jobs` > 1 decodes a large uncompressed file in that many processes.
    """
    return analyze_rank(load_trace(path, jobs), steps)


def _analyze_one(path: str, steps: str | None, jobs: int = 1) -> tuple[str, RankResult | str]:
    try:
        return "ok", analyze_rank_file(path, steps, jobs)
    except (TraceFormatError, WindowError) as e:
        return "error", str(e)
    except MemoryError:
        return "error", "out of memory while analysing"
    except Exception as e:  # one bad file must not stop the others; say what broke
        return "error", f"internal error: {type(e).__name__}: {e}"


def peek_rank(path: str) -> int | None:
    """The rank a file declares, from distributedInfo near its start, else from its name."""
    try:
        with open(path, "rb") as f:
            magic = f.read(2)
        opener = gzip.open if magic == b"\x1f\x8b" else open
        with opener(path, "rb") as f:
            head = f.read(1 << 20)
        m = _PEEK_RANK.search(head)
        if m:
            return int(m.group(1))
    except (OSError, EOFError):
        pass
    return rank_from_filename(path)


def _workers(n_files: int, jobs: int | None) -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(jobs or cpus, n_files))


def analyze_files(files: list[str], steps: str | None = None, jobs: int | None = None
                  ) -> list[tuple[str, RankResult | str]]:
    """Analyse files (in parallel when more than one), results in the files' order."""
    if len(files) == 1:
        # One file: its own decoding may use the CPUs (byte ranges of a large file).
        return [_analyze_one(files[0], steps, _workers(1 << 30, jobs))]
    n = _workers(len(files), jobs)
    if n == 1:
        return [_analyze_one(f, steps) for f in files]
    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
    with ProcessPoolExecutor(max_workers=n, mp_context=ctx) as pool:
        return list(pool.map(_analyze_one, files, [steps] * len(files), chunksize=1))


def assign_ranks(results: list[RankResult], files: list[str], warnings: list[ErrorEntry],
                 taken: dict[int, str] | None = None) -> None:
    """Ranks from distributedInfo, else the file name, else by order; duplicates are flagged, not merged.

    `taken` maps ranks already reported (a run directory's) to where they came from.
    """
    seen: dict[int, str] = dict(taken or {})
    for r in results:
        if r.rank is not None:
            if r.rank in seen:
                warnings.append(ErrorEntry(r.file, f"declares rank {r.rank} like {seen[r.rank]}; "
                                                   "both are reported separately"))
            seen.setdefault(r.rank, r.file)
    nxt = 0
    for r in results:
        if r.rank is None:
            while nxt in seen:
                nxt += 1
            r.rank, r.rank_source = nxt, "order"
            seen[nxt] = r.file


def analyze_paths(paths: list[str], steps: str | None = None, rank: int | None = None,
                  jobs: int | None = None) -> Report:
    """`torchdoctor analyze`: traces and/or run directories in, a diagnosed report out."""
    runs = [p for p in paths if is_run_dir(p)]
    if runs:
        return report_from_run_dir(runs[0], steps=steps, rank=rank, jobs=jobs,
                                   extra=[p for p in paths if p != runs[0]])
    results, errors, warnings = analyze_traces(paths, steps, rank, jobs)
    if rank is not None and not results and not errors:
        errors.append(ErrorEntry(", ".join(paths), f"no trace of rank {rank}"))
    return build_report([RankInputs(r.rank, result=r) for r in results], errors, warnings)


def analyze_traces(paths: list[str], steps: str | None = None, rank: int | None = None,
                   jobs: int | None = None, taken: dict[int, str] | None = None
                   ) -> tuple[list[RankResult], list[ErrorEntry], list[ErrorEntry]]:
    """Trace files, directories or globs -> (rank results, input errors, warnings).

    `taken`: ranks already reported elsewhere (a run directory's), kept apart from these.
    """
    files, input_errors = discover(paths)
    errors = [ErrorEntry(e.file, e.message) for e in input_errors]
    if rank is not None:
        files = [f for f in files if peek_rank(f) in (rank, None)]
    results: list[RankResult] = []
    for f, (status, value) in zip(files, analyze_files(files, steps, jobs), strict=True):
        if status == "ok":
            assert isinstance(value, RankResult)
            results.append(value)
        else:
            errors.append(ErrorEntry(f, str(value)))
    warnings: list[ErrorEntry] = []
    assign_ranks(results, files, warnings, taken)
    if rank is not None:
        results = [r for r in results if r.rank == rank]
    return results, errors, warnings


def build_report(ranks: list[RankInputs], errors: Iterable[ErrorEntry] = (),
                 warnings: Iterable[ErrorEntry] = (), run: dict | None = None,
                 source: str = "trace") -> Report:
    """Cross-rank metrics, the diagnosis matrix and the report around per-rank inputs."""
    ranks = sorted(ranks, key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0))
    results = [r.result for r in ranks if r.result is not None]
    cross = cross_rank(results)
    inputs = RuleInputs(ranks=ranks, cross=cross, run=run or {})
    findings, problems = diagnose(inputs)
    warn = list(warnings)
    for r in results:
        warn.extend(ErrorEntry(r.file, w) for w in r.warnings)
    warn.extend(ErrorEntry("torchdoctor", p) for p in problems)
    reports = []
    for ri in ranks:
        res = ri.result
        reports.append(RankReport(
            rank=ri.rank,
            file=res.file if res else (ri.facts.trace_file or "") if ri.facts else "",
            device=res.device if res else (ri.facts.device.name if ri.facts else None),
            window=msgspec.to_builtins(res.window) if res else {},
            metrics=msgspec.to_builtins(res.metrics) if res else {},
            analysis=res, facts=ri.facts,
        ))
    healthy = None
    if ranks:
        healthy = not any(f.severity in ("critical", "warning") for f in findings)
    return Report(version=__version__, source=source, ranks=reports, cross_rank=cross,
                  findings=findings, errors=list(errors), warnings=warn, healthy=healthy,
                  run=run or {})


# --- run directories (written by `torchdoctor run`) -------------------------------------------

class _RankEntry(msgspec.Struct):
    facts: RankFacts | None = None
    analysis: RankResult | None = None


class _RunManifest(msgspec.Struct):
    schema: str = ""
    command: list[str] = []
    exit_code: int | None = None
    duration_s: float | None = None
    ranks: list[_RankEntry] = []


def is_run_dir(path: str) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, RUN_MANIFEST))


def report_from_run_dir(run_dir: str, steps: str | None = None, rank: int | None = None,
                        jobs: int | None = None, extra: list[str] | None = None) -> Report:
    """Rebuild the report of a live run from its directory (facts + per-rank analyses).

    Ranks whose trace is present under the run directory are re-analysed when a different
    window is asked for (`steps`); otherwise the analysis gathered at run time is used.
    """
    path = os.path.join(run_dir, RUN_MANIFEST)
    errors: list[ErrorEntry] = []
    try:
        with open(path, "rb") as f:
            manifest = msgspec.json.decode(f.read(), type=_RunManifest)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as e:
        return build_report([], [ErrorEntry(path, f"unreadable run manifest: {e}")], source="run")
    inputs: list[RankInputs] = []
    for entry in manifest.ranks:
        facts, result = entry.facts, entry.analysis
        r = facts.rank if facts else (result.rank if result else None)
        if rank is not None and r != rank:
            continue
        trace = os.path.join(run_dir, facts.trace_file) if facts and facts.trace_file else None
        if trace and os.path.isfile(trace) and (steps is not None or result is None):
            status, value = _analyze_one(trace, steps)
            if status == "ok":
                assert isinstance(value, RankResult)
                result = value
                result.rank = r
            else:
                errors.append(ErrorEntry(trace, str(value)))
        inputs.append(RankInputs(r, result=result, facts=facts))
    warnings: list[ErrorEntry] = []
    if extra:
        # Traces named beside the run directory join its ranks (cross-rank metrics, diagnosis).
        taken = {ri.rank: run_dir for ri in inputs if ri.rank is not None}
        more, more_errors, warnings = analyze_traces(extra, steps, rank, jobs, taken)
        inputs.extend(RankInputs(r.rank, result=r) for r in more)
        errors.extend(more_errors)
    run = {"dir": run_dir, "command": manifest.command, "exit_code": manifest.exit_code,
           "duration_s": manifest.duration_s}
    return build_report(inputs, errors, warnings, run=run, source="run")
