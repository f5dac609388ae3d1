"""An analysis session: inputs (traces or a run directory) in, one `Report` out.

Ranks are analysed in parallel worker processes, each holding one trace at a time and sending
back only its small `RankResult` (and `TraceSight`), so memory stays bounded by (workers x one
trace), not by the number of ranks.

The report says what the tool could not see (*blind spots*, `Report.blind_spots`) before any
verdict: a trace without device activity from a machine with an accelerator, a CUPTI
range-profiler (counters) trace, device events of an accelerator the decoder does not know, a
live job that ended before its first step or that failed (which rank, at which step, how), a job
that ran its own profiler. `Report.healthy` is True only when none applies, no finding is a
warning or worse, and every rank showed device activity (or, CPU-only, its steps) over steady steps.
"""

from __future__ import annotations

import gzip
import os
import re
import signal
from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec
import numpy as np

from . import __version__
from . import config as user_config
from .compile import fusion, torch_trace
from .compile import history as compile_history
from .executors import ExecutorSpec, Task, TaskOutcome, run_tasks
from .executors.progress import rank_progress
from .facts import SUMMARY_STEPS_KEPT, CompileFacts, RankFacts, evaluation_only, forward_unseen, trains
from .metrics.compiled import compile_summary
from .metrics.model import RankResult
from .metrics.rank import analyze_rank
from .metrics.ranks import cross_rank
from .metrics.steps import WindowError
from .metrics.store import StoredResult, SummaryStore
from .metrics.summary import SUMMARY_RANKS
from .profiled_window import held_work, held_work_remark, slow_window_remark
from .report.model import ErrorEntry, LazyRanks, RankReport, Report
from .rules import RankInputs, RuleInputs, diagnose
from .trace.decode import TraceFormatError
from .trace.load import discover, load_trace, rank_from_filename
from .trace.model import CATEGORY_NAMES, DEVICE_WORK, HOST_CATS, IGNORED_CATEGORIES, Cat, RankTrace
from .trace.remote import is_url

RUN_MANIFEST = "run.json"
_PEEK_RANK = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(\d+)')
# Kineto's CUPTI range profiler (ActivityType::CUDA_PROFILER_RANGE): counters per kernel or range.
RANGE_CATEGORIES = frozenset({"cuda_profiler_range"})
# Blind spot kinds (Report.blind_spots); all but NO_VERDICT mean the tool could not judge the run.
NO_DEVICE, RANGE_PROFILER, UNKNOWN_DEVICE = "no-device-activity", "range-profiler", "unknown-accelerator"
NO_STEP, JOB_FAILED, OWN_PROFILER, NO_VERDICT = "no-step", "job-failed", "own-profiler", "no-verdict"
_ACTIVITY = {"cuda": "CUDA", "rocm": "CUDA", "xpu": "XPU"}  # ProfilerActivity that records the device


@dataclass
class TraceSight:
    """What one trace let the tool see of the device, for the blind spots.

    `device_properties`: entries in Kineto's `deviceProperties` (the machine had accelerators);
    `device_events`: kernel, memcpy and memset events with a non-zero duration (a timeline);
    `range_events`: CUPTI range-profiler events (`cuda_profiler_range`: counters, not times);
    `unknown_device`: categories the decoder cannot classify, by event count, when such events sit
    on device rows (pids without host events); empty otherwise.
    """

    device_properties: int = 0
    device_events: int = 0
    range_events: int = 0
    unknown_device: dict[str, int] = field(default_factory=dict)


def trace_sight(tr: RankTrace) -> TraceSight:
    """The `TraceSight` of a loaded trace. Range-profiler and unknown-device categories are looked
    for (in the decoder's per-category counts) only when the columns show no device timeline or
    unclassified device rows."""
    host = np.isin(tr.cat, [int(c) for c in HOST_CATS])
    device = np.isin(tr.cat, [int(c) for c in DEVICE_WORK])
    sight = TraceSight(len(tr.device_properties), int((device & (tr.end > tr.ts)).sum()))
    device_rows = (tr.cat == Cat.OTHER) & (tr.pid >= 0) & ~np.isin(tr.pid, np.unique(tr.pid[host]))
    if sight.device_events and not device_rows.any():
        return sight
    cats = tr.categories
    sight.range_events = sum(n for c, n in cats.items() if c.lower() in RANGE_CATEGORIES)
    if device_rows.any():
        sight.unknown_device = {c: n for c, n in sorted(cats.items()) if c.lower() not in CATEGORY_NAMES
                                and c not in IGNORED_CATEGORIES and c.lower() not in RANGE_CATEGORIES}
    return sight


def analyze_rank_file(path: str, steps: str | None = None, jobs: int = 1) -> RankResult:
    """Load and analyse one trace file. Raises TraceFormatError or WindowError (one-line messages).

    `jobs` > 1 decodes a large uncompressed file in that many processes.
    """
    return analyze_rank(load_trace(path, jobs), steps)


def analyze_rank_file_seen(path: str, steps: str | None = None, jobs: int = 1
                           ) -> tuple[RankResult, TraceSight]:
    """`analyze_rank_file` plus what the trace let the tool see of the device."""
    tr = load_trace(path, jobs)
    return analyze_rank(tr, steps), trace_sight(tr)


# ("ok", the rank's result or its handle in a SummaryStore, what it saw) or ("error", why, None).
Outcome = tuple[str, RankResult | StoredResult | str, TraceSight | None]


def _analyze_one(path: str, steps: str | None, jobs: int = 1) -> Outcome:
    try:
        return ("ok", *analyze_rank_file_seen(path, steps, jobs))
    except (TraceFormatError, WindowError) as e:
        return "error", str(e), None
    except MemoryError:
        return "error", "out of memory while analysing", None
    except Exception as e:  # one bad file must not stop the others; say what broke
        return "error", f"internal error: {type(e).__name__}: {e}", None


def peek_rank(path: str) -> int | None:
    """The rank a file declares, from distributedInfo near its start, else from its name (a URL:
    from its name only; its worker reads it)."""
    if is_url(path):
        return rank_from_filename(path)
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


def analyze_files(files: list[str], steps: str | None = None, jobs: int | None = None,
                  executor: ExecutorSpec | None = None, progress: bool | None = None) -> list[Outcome]:
    """Analyse files as tasks on an executor (local processes by default), results in the files'
    order. Above SUMMARY_RANKS files each rank's result is reduced to its summary on the worker
    (metrics/summary.py), so the driver's memory stays flat however many ranks there are.
    `progress`: a bar on stderr (None: when stderr is a terminal).

    Summaries are put in a compressed store as they arrive (metrics/store.py) and their values are
    `StoredResult` handles, so the driver never holds thousands of decoded results."""
    spec = executor or ExecutorSpec("local")
    compact = len(files) > SUMMARY_RANKS
    store = SummaryStore() if compact else None
    if len(files) == 1 and spec.engine == "local":
        # One file: its own decoding may use the CPUs (byte ranges of a large file).
        tasks = [Task(files[0], steps, compact, _workers(1 << 30, jobs))]
    else:
        # A cluster's workers do not share this process's working directory: absolute paths.
        far = spec.engine != "local"
        tasks = [Task(os.path.abspath(f) if far and not is_url(f) else f, steps, compact) for f in files]
    with rank_progress(len(tasks), f"analysing ranks ({spec})", progress) as advance:
        outcomes = run_tasks(spec, tasks, _workers(len(files), jobs), advance, lambda o: _outcome(o, store))
    for f, (status, value, _) in zip(files, outcomes, strict=True):
        if status == "ok":
            assert isinstance(value, (RankResult, StoredResult))
            value.file = f  # the name the user gave
    return outcomes


def _outcome(o: TaskOutcome, store: SummaryStore | None = None) -> Outcome:
    if o.status != "ok" or o.result is None:
        return "error", o.message, None
    sight = TraceSight(**o.sight) if isinstance(o.sight, dict) else None
    return "ok", store.put(o.result) if store is not None else o.result, sight


def assign_ranks(results: list[RankResult | StoredResult], files: list[str], warnings: list[ErrorEntry],
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
                  jobs: int | None = None, config: user_config.LoadedConfig | None = None,
                  executor: ExecutorSpec | None = None, progress: bool | None = None) -> Report:
    """`torchdoctor analyze`: traces and/or run directories in, a diagnosed report out.

    `config`: the rule configuration (default: the running command's, `config.active()`);
    `executor`: where the per-rank work runs (executors/, default local processes); `progress`: a bar
    over ranks on stderr (None: when stderr is a terminal)."""
    runs = [p for p in paths if is_run_dir(p)]
    if runs:
        return report_from_run_dir(runs[0], steps=steps, rank=rank, jobs=jobs,
                                   extra=[p for p in paths if p != runs[0]], config=config)
    logs, paths = torch_trace.split_paths(paths)
    results, errors, warnings, sights = (analyze_traces(paths, steps, rank, jobs, executor=executor, progress=progress)
                                         if paths else ([], [], [], {}))
    compiled, log_errors = read_torch_traces(logs, [r.rank for r in results])
    errors += log_errors
    if rank is not None:
        compiled = {k: v for k, v in compiled.items() if k == rank}
    if rank is not None and not results and not compiled and not errors:
        errors.append(ErrorEntry(", ".join(paths), f"no trace of rank {rank}"))
    by_rank = {r.rank: r for r in results}
    inputs = [RankInputs(r.rank, result=r, facts=RankFacts(rank=r.rank, compile=compiled[r.rank])
                         if r.rank in compiled else None) for r in results]
    inputs += [RankInputs(k, facts=RankFacts(rank=k, compile=c)) for k, c in sorted(compiled.items()) if k not in by_rank]
    return build_report(inputs, errors, warnings, config=config, sights=sights)


def read_torch_traces(logs: list[str], trace_ranks: list[int | None]) -> tuple[dict[int, CompileFacts], list[ErrorEntry]]:
    """TORCH_TRACE logs -> compile facts by rank, and one error per unreadable log. A log without
    a rank belongs to the only trace's rank (or rank 0); of two logs of one rank (a helper process
    that compiled too), the one with more records is the rank's."""
    out: dict[int, CompileFacts] = {}
    records: dict[int, int] = {}
    errors: list[ErrorEntry] = []
    default = trace_ranks[0] if len(trace_ranks) == 1 and trace_ranks[0] is not None else 0
    for path in logs:
        try:
            got = torch_trace.read(path)
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            errors.append(ErrorEntry(path, f"TORCH_TRACE log: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"))
            continue
        key = got.rank if got.rank is not None else default
        if got.records > records.get(key, -1):
            out[key], records[key] = got.facts, got.records
    return out, errors


def analyze_traces(paths: list[str], steps: str | None = None, rank: int | None = None,
                   jobs: int | None = None, taken: dict[int, str] | None = None,
                   executor: ExecutorSpec | None = None, progress: bool | None = None
                   ) -> tuple[list[RankResult | StoredResult], list[ErrorEntry], list[ErrorEntry], dict[str, TraceSight]]:
    """Trace files, directories or globs -> (rank results or their stored handles, input errors,
    warnings, sight by file).

    `taken`: ranks already reported elsewhere (a run directory's), kept apart from these.
    """
    files, input_errors = discover(paths)
    errors = [ErrorEntry(e.file, e.message) for e in input_errors]
    if rank is not None:
        files = [f for f in files if peek_rank(f) in (rank, None)]
    results: list[RankResult | StoredResult] = []
    sights: dict[str, TraceSight] = {}
    for f, (status, value, sight) in zip(files, analyze_files(files, steps, jobs, executor, progress), strict=True):
        if status == "ok":
            assert isinstance(value, (RankResult, StoredResult))
            results.append(value)
            if sight is not None:
                sights[value.file] = sight
        else:
            errors.append(ErrorEntry(f, str(value)))
    warnings: list[ErrorEntry] = []
    assign_ranks(results, files, warnings, taken)
    if rank is not None:
        results = [r for r in results if r.rank == rank]
    return results, errors, warnings, sights


def build_report(ranks: list[RankInputs], errors: Iterable[ErrorEntry] = (),
                 warnings: Iterable[ErrorEntry] = (), run: dict | None = None,
                 source: str = "trace", config: user_config.LoadedConfig | None = None,
                 sights: dict[str, TraceSight] | None = None) -> Report:
    """Cross-rank metrics, the diagnosis matrix, the blind spots and the report around per-rank inputs.

    `config`: the rule configuration (default: the running command's, `config.active()`);
    `sights`: what each trace file let the tool see (`trace_sight`), by file.
    """
    loaded = config if config is not None else user_config.active()
    ranks = sorted(ranks, key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0))
    # One rank decoded at a time (stored ranks, metrics/store.py): no list of every result.
    cross = cross_rank(ri.view for ri in ranks if ri.has_result)
    inputs = RuleInputs(ranks=ranks, cross=cross, run=run or {})
    findings, problems = diagnose(inputs, loaded.rules)
    warn = list(loaded.warnings) + list(warnings)
    errors = [*loaded.errors, *errors]
    for ri in ranks:
        head = ri.stored or ri.result  # the handle carries the file and warnings without a decode
        if head is not None:
            warn.extend(ErrorEntry(head.file, w) for w in head.warnings)
    warn.extend(ErrorEntry("torchdoctor", p) for p in problems)
    if any(ri.stored is not None for ri in ranks):
        reports: list[RankReport] = LazyRanks(ranks, rank_report)  # type: ignore[assignment]
    else:
        reports = [rank_report(ri) for ri in ranks]
    spots = blind_spots(ranks, run or {}, sights or {}, warn)
    slow_window_remark(ranks, inputs.memo.get("view_steps"), warn)
    healthy = None
    if ranks and not spots:
        healthy = not any(f.severity in ("critical", "warning") for f in findings)
        gaps = [g for g in (verdict_gap(ri) for ri in ranks) if g] if healthy else []
        if gaps:  # nothing wrong in what was seen, but not enough was seen to call it healthy
            healthy = None
            spots.append({"kind": NO_VERDICT, "text": "No verdict: " + "; ".join(gaps[:4])
                          + (f"; and {len(gaps) - 4} more ranks" if len(gaps) > 4 else "") + "."})
    return Report(version=__version__, source=source, ranks=reports, cross_rank=cross,
                  findings=findings, errors=errors, warnings=warn, healthy=healthy,
                  run=run or {}, config=loaded.to_dict(), blind_spots=spots)


def rank_report(ri: RankInputs) -> RankReport:
    """One rank of the report: its trace's numbers and/or its live facts."""
    res = ri.result
    return RankReport(
        rank=ri.rank,
        file=res.file if res else (ri.facts.trace_file or "") if ri.facts else "",
        device=res.device if res else (ri.facts.device.name if ri.facts else None),
        window=msgspec.to_builtins(res.window) if res else {},
        metrics=msgspec.to_builtins(res.metrics) if res else {},
        analysis=res, facts=ri.facts,
        compile=compile_summary(ri.facts.compile if ri.facts else None, res.compile_gaps_ms if res else {}),
    )


# --- blind spots --------------------------------------------------------------------------------

def blind_spots(ranks: list[RankInputs], run: dict, sights: dict[str, TraceSight],
                warnings: list[ErrorEntry]) -> list[dict]:
    """What the tool could not see, most fundamental first: the job's end, then each trace."""
    spots = run_blind_spots(ranks, run) if run else []
    for ri in ranks:
        res = ri.view  # a stored rank: only the fields read are decoded
        spots.extend(trace_blind_spots(ri, sights.get(res.file) if res else None, warnings))
    spots.extend(own_profiler_spots(ranks, warnings))
    unseen_forward_remark(ranks, warnings)
    nonfinite_loss_remark(ranks, warnings)
    cut_summary_remark(ranks, warnings)
    return spots


def summary_cut(f: RankFacts) -> tuple[int, int] | None:
    """(last step summarised, last step run) of a rank whose process stopped without Python shutting
    down after running at least twice the steps its last summary holds (its profiled steps count as
    held); None otherwise."""
    if f.ended is not None or f.last_step is None or not f.steps or len(f.steps) >= SUMMARY_STEPS_KEPT:
        return None
    seen = max(max(s.step for s in f.steps), max(f.profile_steps, default=0))
    return (seen, f.last_step) if f.last_step >= 2 * (seen + 1) else None


def cut_summary_remark(ranks: list[RankInputs], warnings: list[ErrorEntry]) -> None:
    """Ranks whose process stopped without Python shutting down (no final summary) after training
    well past the probe's last summary: their step timings end there. Ray Train's workers end so
    (its torch_linear_example: 375 steps in about a second, the summaries of steps 0-4 only, the
    probe writing one after step 1 and then every 30 s)."""
    cut = [(ri.rank, *c) for ri in ranks if ri.facts is not None and (c := summary_cut(ri.facts))]
    if not cut:
        return
    names = "; ".join(f"rank {r}: steps 0-{seen} of 0-{last}" for r, seen, last in cut[:8])
    names += f" (and {len(cut) - 8} more ranks)" if len(cut) > 8 else ""
    warnings.append(ErrorEntry("torchdoctor", (
        f"{names}: the process stopped without Python shutting down (killed, or os._exit as Ray's actors "
        "end), so the probe's last summary is all there is of it, and the per-step split covers those "
        "steps only. The probe writes one after step 1 and then every 30 s unless told otherwise: a shorter interval in the "
        "job's environment keeps more of a short job (TORCHDOCTOR_FLUSH_S, in seconds: well under 1 for a "
        "job of a few seconds).")))


def nonfinite_loss_remark(ranks: list[RankInputs], warnings: list[ErrorEntry]) -> None:
    """Ranks whose loss turned NaN or inf and stayed so at every step read after (3 or more): the job
    trains on nothing from that step, whatever its speed (pytorch/examples' FSDP2 example on CPU: NaN
    from step 0). The probe reads one loss per step, CPU scalars only (`Probe.read_loss`)."""
    bad = [ri.facts for ri in ranks if ri.facts is not None and ri.facts.losses_nonfinite >= 3
           and ri.facts.first_nonfinite_step is not None
           and (ri.facts.last_finite_step is None or ri.facts.last_finite_step < ri.facts.first_nonfinite_step)]
    if not bad:
        return
    def counts(f: RankFacts) -> str:
        return f"at every step read from step {f.first_nonfinite_step} ({f.losses_nonfinite} of {f.losses_read})"

    same = len({counts(f) for f in bad}) == 1
    names = ", ".join(str(f.rank) for f in bad[:8]) + (" …" if len(bad) > 8 else "")
    where = (f"rank{'s' if len(bad) > 1 else ''} {names}: the loss was NaN or inf {counts(bad[0])}" if same else
             "; ".join(f"rank {f.rank}: the loss was NaN or inf {counts(f)}" for f in bad[:8]))
    warnings.append(ErrorEntry("torchdoctor", (
        f"{where}: from there the job learns nothing. The findings are about its speed; fix its numerics "
        "first (learning rate, initialisation, inputs).")))


def unseen_forward_remark(ranks: list[RankInputs], warnings: list[ErrorEntry]) -> None:
    """Ranks whose probe timed no forward (`facts.forward_unseen`): their per-step split is partly
    blind, so say so rather than let "other" stand for the forward."""
    blind = [ri.rank for ri in ranks if ri.facts is not None and forward_unseen(ri.facts.steps)]
    if not blind:
        return
    scripted = [ri.rank for ri in ranks if ri.facts is not None and ri.rank in blind and ri.facts.script_roots]
    if scripted:
        names = ", ".join(str(r) for r in scripted[:8]) + (" …" if len(scripted) > 8 else "")
        warnings.append(ErrorEntry("torchdoctor", (
            f"rank {names}: the probe timed no forward: the model is a TorchScript module (torch.jit.script or "
            "torch.jit.trace), and TorchScript modules take no forward hooks. The probe's per-step split counts "
            "that forward as 'other'; a profiler trace's split does not.")))
        blind = [r for r in blind if r not in scripted]
        if not blind:
            return
    names = ", ".join(str(r) for r in blind[:8]) + (" …" if len(blind) > 8 else "")
    warnings.append(ErrorEntry("torchdoctor", (
        f"rank {names}: the probe timed no forward, although backward passes ran. Its hooks sit on the "
        "top-level modules that exist at the end of step 0 and run only when a module is called as "
        "module(x) through torch's own __call__: a model called as model.forward(x), a module class with a "
        "__call__ of its own (GPyTorch's), or a model built after the first step is not timed. "
        "The probe's per-step split counts that forward as 'other'; a profiler trace's split does not.")))


def _rank_label(ri: RankInputs) -> str:
    res = ri.view
    where = os.path.basename(res.file) if res and res.file else ""
    return f"Rank {ri.rank}" + (f" ({where})" if where else "")


def trace_blind_spots(ri: RankInputs, sight: TraceSight | None, warnings: list[ErrorEntry]) -> list[dict]:
    """Blind spots of one rank's trace: no device activity, counters only, an unknown accelerator."""
    res, facts = ri.view, ri.facts
    if res is None:
        return []
    label, spots = _rank_label(ri), []
    if sight is not None and sight.range_events and not sight.device_events:
        spots.append({"kind": RANGE_PROFILER, "rank": ri.rank, "file": res.file, "events": sight.range_events,
                      "text": f"{label} is a CUPTI range-profiler trace ({sight.range_events} cuda_profiler_range "
                              "events): it holds hardware counters per kernel or range, not a timeline (their "
                              "times are placeholders), so device busy and idle time cannot be measured from "
                              "it; record a regular trace with activities=[ProfilerActivity.CPU, "
                              "ProfilerActivity.CUDA] and no profiler_metrics."})
    elif res.device_kind == "cpu" and _has_accelerator(res, sight, facts):
        device = res.device or (facts.device.name if facts is not None else None) or "an accelerator"
        activity = _ACTIVITY.get(facts.device.kind, "CUDA") if facts is not None else "CUDA"  # ROCm too
        spots.append({"kind": NO_DEVICE, "rank": ri.rank, "file": res.file, "device": device,
                      "text": f"{label}: device activity was not recorded: profile with "
                              f"activities=[ProfilerActivity.CPU, ProfilerActivity.{activity}] (the trace comes "
                              f"from a machine with {device} but holds no kernel, memcpy or memset event)."})
    elif sight is not None and sight.range_events:
        warnings.append(ErrorEntry(res.file, f"{sight.range_events} cuda_profiler_range (counter) events "
                                             "not analysed"))
    if sight is not None and sight.unknown_device:
        listed = ", ".join(f"{c} ({n})" for c, n in sight.unknown_device.items())
        spots.append({"kind": UNKNOWN_DEVICE, "rank": ri.rank, "file": res.file,
                      "categories": dict(sight.unknown_device),
                      "text": f"{label}: accelerator not recognised: device events of category {listed} "
                              "that the decoder cannot classify; numbers for that device are not checked "
                              "(busy, idle and the findings count only CUDA/ROCm kernels, copies and sets)."})
    return spots


def _has_accelerator(res: RankResult, sight: TraceSight | None, facts: RankFacts | None) -> bool:
    """Whether the machine that recorded a trace had an accelerator the trace should show."""
    if facts is not None and facts.device.kind in _ACTIVITY:
        return True
    return bool(res.device) or bool(sight and sight.device_properties) or res.launches.launches > 0


def _how(f: RankFacts) -> str:
    """How a rank ended, in words ("was killed by SIGKILL", "exited with code 3", ...)."""
    raised = f.ended.split(":", 1)[1] if f.ended and f.ended.startswith("exception:") else None
    if f.exit_code is not None and f.exit_code < 0:
        return f"was killed by {f.signal or f'signal {-f.exit_code}'}"
    if raised:
        return f"raised {raised}" + (f" and exited with code {f.exit_code}" if f.exit_code else "")
    if f.exit_code:
        return f"exited with code {f.exit_code}"
    if f.ended is None:
        return "stopped without Python shutting down (killed by a signal or os._exit; no exit status recorded)"
    return "exited"


def _when(f: RankFacts) -> str:
    return (f"after step {f.last_step} (the last step the probe recorded)" if f.last_step is not None
            else "before its first step")


def _job_status(run: dict) -> str:
    code = run.get("exit_code")
    if code is None:
        return "exit code unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _failed_ranks(facts: list[RankFacts], job_failed: bool) -> list[RankFacts]:
    """Ranks that failed, the first failure first (earliest reaped, else lowest rank)."""
    failed = [f for f in facts if (f.exit_code not in (None, 0))
              or (f.ended or "").startswith("exception:")]
    if not failed and job_failed:
        failed = [f for f in facts if f.ended is None]  # they never reached Python's shutdown
    return sorted(failed, key=lambda f: (f.exit_time is None, f.exit_time or 0.0, f.rank))


def run_blind_spots(ranks: list[RankInputs], run: dict) -> list[dict]:
    """A live job that ended before its first step, or that failed: which rank, at which step, how."""
    facts = [ri.facts for ri in ranks if ri.facts is not None]
    code = run.get("exit_code")
    job_failed = code not in (None, 0)
    failed = _failed_ranks(facts, job_failed)
    stepped = any(f.steps or f.profile_steps or f.last_step is not None for f in facts)
    first = failed[0] if failed else None
    detail = {"exit_code": code}
    if first is not None:
        detail.update(rank=first.rank, step=first.last_step, how=_how(first),
                      rank_exit_code=first.exit_code, signal=first.signal)
    if not stepped:
        text = f"The job ended ({_job_status(run)}) before its first training step: the probe recorded no step"
        text += f"; rank {first.rank} {_how(first)}." if first is not None else ", so there is nothing to diagnose."
        return [{"kind": NO_STEP, "text": text, **detail}]
    if not (job_failed or failed):
        return []
    if first is None:
        text = f"The job failed ({_job_status(run)}) after its ranks had ended (no rank reported a failure)."
    else:
        text = f"The job failed ({_job_status(run)}): rank {first.rank} {_how(first)} {_when(first)}."
        later = [f"rank {f.rank} {_how(f)} {_when(f)}" for f in failed[1:4]]
        if later:
            text += " Then " + "; ".join(later) + "."
    return [{"kind": JOB_FAILED, "text": text, **detail}]


def own_profiler_spots(ranks: list[RankInputs], warnings: list[ErrorEntry]) -> list[dict]:
    """Ranks that ran their own torch.profiler (the probe then records no window): name their traces."""
    own = [ri for ri in ranks if ri.facts is not None and ri.facts.own_profiler]
    if not own:
        return []
    traces = sorted({p for ri in own for p in ri.facts.own_traces if os.path.exists(p)})
    names = ", ".join(str(ri.rank) for ri in own)
    if traces:
        where = os.path.commonpath([os.path.dirname(p) for p in traces]) if len(traces) > 1 else traces[0]
        found = (f"Its traces: {', '.join(traces[:6])}{' …' if len(traces) > 6 else ''}; "
                 f"diagnose them with `torchdoctor analyze {where}`.")
    else:
        found = ("The trace files it wrote were not found (the probe notes those written through "
                 "export_chrome_trace, which tensorboard_trace_handler uses).")
    if all(ri.result is not None for ri in own):  # the probe's window still ran: a remark, not a gap
        warnings.append(ErrorEntry("torchdoctor", f"rank {names} also ran its own torch.profiler. {found}"))
        return []
    return [{"kind": OWN_PROFILER, "ranks": [ri.rank for ri in own], "traces": traces,
             "text": f"Rank {names} ran its own torch.profiler, so the probe stood aside and recorded no "
                     f"profiler window: this report has no device timeline. {found}"}]


def verdict_gap(ri: RankInputs) -> str | None:
    """Why this rank does not support a "healthy" verdict (None when it does): a verdict needs
    device activity over steady steps, or, for a CPU-only job, its steps."""
    res, facts = ri.view, ri.facts
    if res is not None:
        w = res.window
        if not w.steps and w.mode != "trace":
            return f"rank {ri.rank} has no training steps (ProfilerStep#N) in its trace to judge"
        if res.device_kind != "cpu" and not res.metrics.busy_pct:
            span = f"steps {w.steps[0]}–{w.steps[-1]}" if w.steps else w.mode
            return f"rank {ri.rank} shows no device activity inside the analysed window ({span})"
        return None
    if facts is not None:
        if facts.device.kind != "cpu":
            return f"rank {ri.rank} has no analysed profiler window, so its device activity was not seen"
        if cut := summary_cut(facts):
            return f"rank {ri.rank}'s summary holds steps 0-{cut[0]} of the 0-{cut[1]} it ran"
        if not facts.steps:
            return f"rank {ri.rank} recorded no training step"
        if not any(s.step >= 1 for s in facts.steps):  # step 0 is start-up: nothing steady to judge
            return f"rank {ri.rank} recorded only step 0 (start-up) and no profiler window: too little to judge"
        return None
    return f"rank {ri.rank} has nothing recorded"


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
                        jobs: int | None = None, extra: list[str] | None = None,
                        config: user_config.LoadedConfig | None = None) -> Report:
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
        return build_report([], [ErrorEntry(path, f"unreadable run manifest: {e}")], source="run",
                            config=config)
    inputs: list[RankInputs] = []
    sights: dict[str, TraceSight] = {}
    entries = [e for e in manifest.ranks if rank is None or _entry_rank(e) == rank]
    # Profiled steps that held an evaluation or a save: the window becomes the others, on every rank.
    held = held_work([e.facts for e in entries if e.facts is not None])
    clean = held.steps if held is not None and steps is None else None
    analysed_clean = False
    for entry in entries:
        facts, result, r = entry.facts, entry.analysis, _entry_rank(entry)
        trace = os.path.join(run_dir, facts.trace_file) if facts and facts.trace_file else None
        if trace and os.path.isfile(trace) and (steps is not None or result is None or clean is not None):
            status, value, sight = _analyze_one(trace, steps or clean)
            if status == "ok":
                assert isinstance(value, RankResult)
                result = value
                result.rank = r
                analysed_clean = analysed_clean or (steps is None and clean is not None)
                if sight is not None:
                    sights[result.file] = sight
            elif steps is not None or result is None:  # a stored analysis of the whole window stays
                errors.append(ErrorEntry(trace, str(value)))
        inputs.append(RankInputs(r, result=result, facts=facts))
    warnings: list[ErrorEntry] = [held_work_remark(held, run_dir, steps, analysed_clean, len(entries))] if held is not None else []
    evaluators = [ri for ri in inputs if evaluation_only(ri.facts)]
    if evaluators and len(evaluators) < len(inputs) and any(trains(ri.facts) for ri in inputs):
        # Beside processes that train, one that only evaluated (the Hogwild example's parent tests
        # the model its children trained) is not part of the training step: its loader and its
        # window would speak for the job.
        inputs = [ri for ri in inputs if ri not in evaluators]
        warnings.extend(ErrorEntry(run_dir, f"process {ri.facts.pid} (rank {ri.rank}) only evaluated: "
                                   f"{len(ri.facts.steps)} steps (DataLoader batches) without a backward or an optimizer step; "
                                   "left out of the training diagnosis") for ri in evaluators)
    shared = number_shared_ranks(inputs)
    if shared:
        warnings.append(ErrorEntry(run_dir, shared))
    if extra:
        # Traces named beside the run directory join its ranks (cross-rank metrics, diagnosis).
        taken = {ri.rank: run_dir for ri in inputs if ri.rank is not None}
        more, more_errors, more_warnings, more_sights = analyze_traces(extra, steps, rank, jobs, taken)
        warnings.extend(more_warnings)
        inputs.extend(RankInputs(r.rank, result=r) for r in more)
        errors.extend(more_errors)
        sights.update(more_sights)
    run = {"dir": run_dir, "command": manifest.command, "exit_code": manifest.exit_code,
           "duration_s": manifest.duration_s}
    misses = compile_history.explain_misses(run_dir)  # caches an earlier run beside it filled (CG-8)
    if misses is not None:
        run["compile_cache"] = misses
    report = build_report(inputs, errors, warnings, run=run, source="run", config=config, sights=sights)
    attach_inductor(report, run_dir)
    return report


def _entry_rank(entry: _RankEntry) -> int | None:
    """A run manifest entry's rank: its facts', else its stored analysis's."""
    return entry.facts.rank if entry.facts else (entry.analysis.rank if entry.analysis else None)


def number_shared_ranks(inputs: list[RankInputs]) -> str:
    """Give processes that share a rank numbers of their own (in place); what was renumbered, or "".

    Only processes without a process group share one (every such process reads RANK as 0): Hogwild
    children of torch.multiprocessing, independent trainings launched together. The diagnosis keeps
    its claims per rank, so two of them under one number would spend one budget."""
    taken = {ri.rank for ri in inputs if ri.rank is not None}
    if len(taken) == sum(ri.rank is not None for ri in inputs):
        return ""
    seen: set[int] = set()
    fresh = max(taken) + 1
    moved = []
    for ri in inputs:
        if ri.rank is None:
            continue
        if ri.rank in seen:
            pid = ri.facts.pid if ri.facts else None
            moved.append(f"process {pid} as rank {fresh}")
            ri.rank = fresh
            if ri.facts is not None:
                ri.facts.rank = fresh
            if ri.result is not None:
                ri.result.rank = fresh
            fresh += 1
        seen.add(ri.rank)
    return ("processes share a rank (no process group); reported as ranks of their own: "
            + ", ".join(moved))


def attach_inductor(report: Report, run_dir: str) -> None:
    """The first compiling rank's `compile.inductor`: what Inductor generated from its graphs, read
    from the output code the probe kept (compile/fusion.py)."""
    got = compile_history.record(run_dir)
    if got is None or not got[0].get("output_code"):
        return
    modules = fusion.report(os.path.join(run_dir, "caches"), got[0])
    target = next((rr for rr in report.ranks if rr.compile is not None), None)
    if modules and target is not None:
        ops = sum(g.get("ops", 0) for g in got[0].get("graphs") or []) or None
        target.compile["inductor"] = {"summary": fusion.summary(modules, ops), "modules": modules}
