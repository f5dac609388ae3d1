"""Compare torchdoctor's device idle % with Holistic Trace Analysis (HTA) on every reference trace.

What it measures
    For each trace in tests/data/hta it runs
      * HTA's ``get_temporal_breakdown``, for each selected release (``--hta 0.5.0|0.6.1|both``, default
        both: 0.5.0 from PyPI ``holistictraceanalysis``, 0.6.1 from PyPI ``traceinsight``), each in its
        own isolated virtualenv via ``_hta_side.py``, and
      * ``torchdoctor analyze TRACE --steps trace --json OUT`` (HTA's window: first to last device event),
    and prints trace | HTA idle % (per release) | torchdoctor idle % | difference (pp) | explanation.

How differences are explained (computed, not asserted)
    The script re-derives idle % from the raw trace in pure Python, once with torchdoctor's definition and
    then adding HTA's behaviours one at a time (see trace_analysis_anchor_hta.md §1.1 and §2.1):

      E0  exact     union of kernel / gpu_memcpy / gpu_memset (2021: Kernel / Memcpy / Memset) intervals,
                    float µs as recorded (ns precision), window = first device start .. last device end.
                    This is torchdoctor's definition; torchdoctor must land here.
      E1  +rows     HTA's busy set: every event with ``dur`` and ``cat`` whose ``args.stream`` parses as an
                    int other than -1, so ``cuda_sync`` events (Stream/Context Sync, Stream Wait Event,
                    stream 2^32-1 included) count as busy.
      E2  +µs       HTA rounds float timestamps: ts = ceil(ts), end = floor(ts + dur).
      E3  +orphans  with >= 2 ProfilerSteps HTA keeps only device rows whose ``correlation`` matches a CPU
                    row, so work launched before profiling started (no launching runtime event) is dropped.
      E4  +last     ... and only rows launched before the start of the last ProfilerStep (HTA drops the
                    last step). E4 is the emulation of HTA's default; it must reproduce HTA's number.

    Each step's change is that behaviour's contribution to the difference. Two more emulations are checked
    against HTA itself, run with ``include_last_profiler_step=True`` and with ``HTA_DISABLE_NS_ROUNDING=1``,
    so the emulation is validated three ways. A difference > 1 pp counts as explained only when
    |torchdoctor - E0| and |HTA - E4| are both <= 0.05 pp, for each HTA release on its own.

How to run (from the repo root)
    bash benchmarks/setup_hta.sh both                  # once: HTA 0.5.0 and 0.6.1, one venv each
    .venv/bin/python benchmarks/hta_compare.py         # both releases; writes benchmarks/results/hta_compare.md
    .venv/bin/python benchmarks/hta_compare.py --hta 0.6.1 --out /tmp/hta061.md
    .venv/bin/python benchmarks/hta_compare.py --torchdoctor ".venv/bin/python -m torchdoctor.cli"

Exit status: 0 when every trace is within 1 pp or explained and torchdoctor analysed every trace without
error; 1 otherwise; 2 on a setup problem (no HTA venv, no torchdoctor).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gzip
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

from _hta_versions import HtaVersion, add_hta_arg, missing_venvs, selected, setup_hint

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_TRACES = REPO / "tests" / "data" / "hta"
DEFAULT_TORCHDOCTOR = REPO / ".venv" / "bin" / "torchdoctor"
HTA_SIDE = HERE / "_hta_side.py"
RESULTS = HERE / "results" / "hta_compare.md"
HTA_CACHE_DIR = HERE / "out"  # git-ignored; HTA takes ~80 s per release on these traces

DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"})
SYNC_NAMES = ("Event Sync", "Context Sync")  # HTA's GPUKernelFilter keeps these whatever their stream
THRESHOLD_PP = 1.0  # the tolerance
RESIDUAL_PP = 0.05  # how close the recomputations must land to count as an explanation


# --------------------------------------------------------------------------------------------------
# Independent recomputation of idle % (torchdoctor's definition and HTA's, step by step)
# --------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Row:
    """One complete event as HTA keeps it (an event with ``dur`` and ``cat``)."""

    name: str
    cat: str
    ts: float
    end: float
    stream: int
    corr: int


@dataclass(slots=True)
class Idle:
    """Idle share of a window: ``idle_pct = 100 * (span - |union|) / span``."""

    idle_pct: float
    start: float  # µs, trace clock
    end: float
    rows: int


@dataclass
class Emulation:
    """E0..E4 (see module docstring) plus the two HTA-toggle variants and what each step changed."""

    e0: Idle | None = None
    e1: Idle | None = None
    e2: Idle | None = None
    e3: Idle | None = None
    e4: Idle | None = None
    incl_last: Idle | None = None  # emulates include_last_profiler_step=True
    no_round: Idle | None = None  # emulates HTA_DISABLE_NS_ROUNDING=1
    extra_rows: Counter[str] = field(default_factory=Counter)
    float_ts: bool = False
    n_steps: int = 0
    last_step: str = ""
    orphans: int = 0
    orphans_until_ms: float = 0.0  # last orphan's end, ms after the first device event
    dropped_last: int = 0


def _open_text(path: Path) -> Any:
    return gzip.open(path, "rt") if path.name.endswith(".gz") else open(path)


class RawFloat(str):
    """A JSON float kept as its text, so E0 gets exact ns ("1712195495519689.047" is beyond float64's
    ns resolution) while the HTA emulation uses float(text), exactly as HTA's json.loads does."""


def load_events(path: Path) -> list[dict[str, Any]]:
    with _open_text(path) as f:
        doc = json.load(f, parse_float=RawFloat)
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    return [e for e in events if isinstance(e, dict)]


def _ns(x: Any) -> int:
    """Exact integer ns from a µs value (int, float, or RawFloat text)."""
    if isinstance(x, RawFloat):
        return int((Decimal(x) * 1000).to_integral_value(ROUND_HALF_EVEN))
    if isinstance(x, float):
        return int((Decimal(repr(x)) * 1000).to_integral_value(ROUND_HALF_EVEN))
    return int(x) * 1000


def _as_int(x: Any, default: int = -1) -> int:
    """HTA's normalize_gpu_stream_numbers: int(x), or -1 when that fails (e.g. ROCm's '0x0')."""
    if x is None:
        return default
    try:
        return int(x)
    except (ValueError, TypeError):
        return default


def hta_union_idle(intervals: Iterable[tuple[float, float]]) -> Idle | None:
    """Idle % with HTA's merge_kernel_intervals: sort by start, a row opens a new group when it starts
    after the running max of all earlier ends; busy = sum of (group max end - group min start);
    span = last group's end - first group's start. Identical to an exact union for non-negative
    durations, and reproduces HTA's arithmetic for the negative durations its rounding creates."""
    iv = sorted(intervals)
    if not iv:
        return None
    groups: list[list[float]] = []
    run_max = -math.inf
    for ts, end in iv:
        if groups and ts <= run_max:
            g = groups[-1]
            if end > g[1]:
                g[1] = end
        else:
            groups.append([ts, end])
        run_max = max(run_max, end)
    span = groups[-1][1] - groups[0][0]
    busy = sum(e - s for s, e in groups)
    pct = 100.0 * (span - busy) / span if span > 0 else 0.0
    return Idle(pct, groups[0][0], groups[-1][1], len(iv))


def emulate(events: list[dict[str, Any]]) -> Emulation:
    em = Emulation()
    raw: list[Row] = []
    exact: list[tuple[int, int]] = []  # E0 intervals in exact ns
    for e in events:
        if isinstance(e.get("ts"), (RawFloat, float)):
            em.float_ts = True  # pandas then holds ts as float64 and HTA rounds
        dur, cat, ts = e.get("dur"), e.get("cat"), e.get("ts")
        if dur is None or cat is None or cat == "Trace" or ts is None:
            continue
        args = e.get("args") or {}
        raw.append(
            Row(
                str(e.get("name", "")),
                str(cat),
                float(ts),
                float(ts) + float(dur),
                _as_int(args.get("stream", -1)),
                _as_int(args.get("correlation", -1)),
            )
        )
        if cat in DEVICE_CATS:
            t = _ns(ts)
            exact.append((t, t + _ns(dur)))

    e0 = hta_union_idle(exact)
    if e0:
        e0.start, e0.end = e0.start / 1e3, e0.end / 1e3
    em.e0 = e0
    busy_rows = [r for r in raw if r.stream != -1]
    for r in busy_rows:
        if r.cat not in DEVICE_CATS:
            em.extra_rows[f"{r.cat}:{r.name}"] += 1
    em.e1 = hta_union_idle((r.ts, r.end) for r in busy_rows)

    rounded = (
        [Row(r.name, r.cat, math.ceil(r.ts), math.floor(r.end), r.stream, r.corr) for r in raw]
        if em.float_ts
        else raw
    )
    em.e2 = hta_union_idle((r.ts, r.end) for r in rounded if r.stream != -1)

    steps = {r.name for r in raw if "ProfilerStep" in r.name}
    em.n_steps = len(steps)

    def is_gpu(r: Row) -> bool:
        return (r.stream >= 0 and r.corr >= 0) or r.name in SYNC_NAMES

    def filtered(rows: list[Row], mode: str) -> Idle | None:
        """HTA's _filter_irrelevant_gpu_kernels; a no-op with fewer than two ProfilerStep names."""
        if len(steps) < 2:
            return hta_union_idle((r.ts, r.end) for r in rows if r.stream != -1)
        cpu = [r for r in rows if not is_gpu(r)]
        step_rows = [r for r in cpu if r.name in steps]
        if mode == "last_start":
            last = max(r.ts for r in step_rows)
            cpu = [r for r in cpu if r.ts < last]
        elif mode == "last_end":
            last_end = max(r.end for r in step_rows)
            cpu = [r for r in cpu if r.ts <= last_end]
        corrs = {r.corr for r in cpu}
        kept = [r for r in rows if is_gpu(r) and r.corr in corrs] + cpu
        return hta_union_idle((r.ts, r.end) for r in kept if r.stream != -1)

    em.e3 = filtered(rounded, "orphans")
    em.e4 = filtered(rounded, "last_start")
    em.incl_last = filtered(rounded, "last_end")
    em.no_round = filtered(raw, "last_start")
    if len(steps) >= 2:
        cpu = [r for r in rounded if not is_gpu(r)]
        all_corr = {r.corr for r in cpu}
        orphan_rows = [r for r in rounded if is_gpu(r) and r.stream != -1 and r.corr not in all_corr]
        em.orphans = len(orphan_rows)
        if orphan_rows and em.e0:
            em.orphans_until_ms = (max(r.end for r in orphan_rows) - em.e0.start) / 1e3
        last_row = max((r for r in cpu if r.name in steps), key=lambda r: r.ts)
        em.last_step = last_row.name
        early_corr = {r.corr for r in cpu if r.ts < last_row.ts}
        em.dropped_last = sum(
            1
            for r in rounded
            if is_gpu(r) and r.stream != -1 and r.corr in all_corr and r.corr not in early_corr
        )
    return em


# --------------------------------------------------------------------------------------------------
# Running the two tools
# --------------------------------------------------------------------------------------------------


@dataclass
class TdResult:
    idle_pct: float | None = None
    window_ns: tuple[int, int] | None = None
    device: str | None = None
    ranks: int = 0
    rc: int | None = None
    error: str | None = None


def run_torchdoctor(cmd: list[str], trace: Path, tmp: Path) -> TdResult:
    out = tmp / (trace.name + ".td.json")
    proc = subprocess.run(
        [*cmd, "analyze", str(trace), "--steps", "trace", "--json", str(out)],
        capture_output=True,
        text=True,
    )
    res = TdResult(rc=proc.returncode)
    if not out.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        res.error = f"rc={proc.returncode}, no JSON written: {tail[-1] if tail else ''}"
        return res
    rep = json.loads(out.read_text())
    if rep.get("schema") != "torchdoctor.report/1":
        res.error = f"unexpected schema {rep.get('schema')!r}"
    ranks = rep.get("ranks") or []
    res.ranks = len(ranks)
    errors = rep.get("errors") or []
    if errors:
        res.error = "; ".join(str(e.get("message", e)) for e in errors)
    if ranks:
        r0 = ranks[0]
        res.device = r0.get("device")
        res.idle_pct = (r0.get("metrics") or {}).get("idle_pct")
        w = r0.get("window") or {}
        if w.get("start_ns") is not None and w.get("end_ns") is not None:
            res.window_ns = (int(w["start_ns"]), int(w["end_ns"]))
    return res


def run_hta(hv: HtaVersion, traces: list[Path], variants: bool, tmp: Path, refresh: bool) -> dict[str, Any]:
    """HTA `hv`'s temporal breakdown of each trace (cached under benchmarks/out/, one file per release,
    keyed by the files' names, sizes and mtimes, the variants flag and _hta_side.py's own mtime)."""
    cache = HTA_CACHE_DIR / f"hta_temporal_cache.{hv.slug}.json"
    key = {
        "hta": hv.version,
        "traces": [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in traces],
        "variants": variants,
        "side": HTA_SIDE.stat().st_mtime_ns,
    }
    if not refresh and cache.exists():
        cached = json.loads(cache.read_text())
        if cached.get("key") == key:
            print(f"using cached HTA {hv.version} results from {cache} (--refresh-hta to rerun)", file=sys.stderr)
            return dict(cached["data"])
    out = tmp / f"{hv.slug}.json"
    cmd = [str(hv.python), str(HTA_SIDE), "temporal", *map(str, traces), "--out", str(out)]
    if variants:
        cmd.append("--variants")
    print(f"running HTA {hv.version} on {len(traces)} traces (~1-2 min) ...", file=sys.stderr)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    data: dict[str, Any] = json.loads(out.read_text())
    if data.get("hta_version") != hv.version:
        raise SystemExit(f"error: {hv.python} runs HTA {data.get('hta_version')}, expected {hv.version}")
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"key": key, "data": data}))
    return data


def readme_reference(traces_dir: Path) -> dict[str, str]:
    """file -> HTA idle % (or 'HTA failed: ...') from the table in tests/data/hta/README.md."""
    ref: dict[str, str] = {}
    readme = traces_dir / "README.md"
    if not readme.exists():
        return ref
    for line in readme.read_text().splitlines():
        m = re.match(r"\|\s*(\S+\.json(?:\.gz)?)\s*\|.*\|\s*(?:idle ([\d.]+)%|(HTA failed: [^|]*))", line)
        if m:
            ref[m.group(1)] = m.group(2) if m.group(2) is not None else m.group(3).strip()
    return ref


# --------------------------------------------------------------------------------------------------
# Explanations
# --------------------------------------------------------------------------------------------------


def _d(a: Idle | None, b: Idle | None) -> float:
    return (b.idle_pct - a.idle_pct) if (a and b) else 0.0


def _fmt(x: float | None, nd: int = 2) -> str:
    return "–" if x is None else f"{x:.{nd}f}"


def _pp(x: float) -> str:
    if abs(x) < 0.0005:
        return "±0.000 pp"
    return f"{x:+.3f} pp" if 0 < abs(x) < 0.01 else f"{x:+.2f} pp"


def factor_lines(em: Emulation) -> list[tuple[str, float]]:
    """(description, effect on HTA's idle % in pp) for each HTA behaviour, in E1..E4 order."""
    out: list[tuple[str, float]] = []
    if em.extra_rows:
        by_cat = Counter[str]()
        for k, n in em.extra_rows.items():
            by_cat[k.split(":", 1)[0]] += n
        names = Counter[str]()
        for k, n in em.extra_rows.items():
            names[k.split(":", 1)[1]] += n
        top = ", ".join(f"{n}×{k}" for k, n in names.most_common(3))
        cats = ", ".join(f"{n} {c}" for c, n in by_cat.most_common())
        out.append((f"HTA counts {cats} rows as busy ({top})", _d(em.e0, em.e1)))
    elif abs(_d(em.e0, em.e1)) >= 0.001:
        out.append(("HTA parses µs timestamps as float64 (epoch µs keep ~0.25 µs)", _d(em.e0, em.e1)))
    if em.float_ts:
        out.append(("HTA rounds ns timestamps to whole µs (ts↑, end↓)", _d(em.e1, em.e2)))
    if em.n_steps >= 2:
        out.append(
            (
                f"HTA drops {em.orphans} device rows with no launching CPU event (all within the first "
                f"{em.orphans_until_ms:.1f} ms: launched before the profiler started)"
                if em.orphans
                else "HTA drops device rows with no launching CPU event (none here)",
                _d(em.e2, em.e3),
            )
        )
        w3, w4 = em.e3, em.e4
        span = ""
        if w3 and w4:
            span = f"; window {(w3.end - w3.start) / 1e3:.1f} → {(w4.end - w4.start) / 1e3:.1f} ms"
        out.append(
            (
                f"HTA drops the last ProfilerStep ({em.last_step}: {em.dropped_last} device rows{span})",
                _d(em.e3, em.e4),
            )
        )
    return out


@dataclass
class Verdict:
    """One HTA release's result on one trace, compared with torchdoctor."""

    hta: float | None
    hta_err: str | None
    variants: dict[str, Any]
    diff: float | None = None
    status: str = ""
    explanation: str = ""


@dataclass
class Line:
    trace: str
    readme: str | None
    td: TdResult
    em: Emulation
    hta: dict[str, Verdict]  # HTA release -> its verdict

    @property
    def verdicts(self) -> list[Verdict]:
        return list(self.hta.values())


BAD_STATUSES = ("UNEXPLAINED", "TORCHDOCTOR ERROR", "MISSING")


def judge(line: Line, v: Verdict) -> None:
    td, em = line.td, line.em
    if td.error:
        v.status = "TORCHDOCTOR ERROR"
        v.explanation = td.error
        return
    if v.hta_err is not None:
        crash = not v.hta_err.startswith("no result")
        v.status = "HTA crashed" if crash else "HTA: no result"
        if em.e0 is None:
            idle = "no device events, so no idle %" if td.idle_pct is None else f"idle {td.idle_pct:.2f}%"
            what = f"crashes ({v.hta_err.split(':')[0]})" if crash else "returns no temporal breakdown"
            v.explanation = (
                f"HTA {what} on a trace without device events; "
                f"torchdoctor analyses it without error (rc={td.rc}, {idle})"
            )
        else:
            v.explanation = f"HTA: {v.hta_err}"
        return
    if v.hta is None or td.idle_pct is None:
        v.status = "MISSING"
        v.explanation = "torchdoctor gave no idle % for a trace with device events"
        return
    v.diff = td.idle_pct - v.hta
    if line.readme and re.fullmatch(r"[\d.]+", line.readme) and abs(v.hta - float(line.readme)) > 0.006:
        v.explanation = f"(live HTA {v.hta:.2f} differs from README's {line.readme}) "
    td_res = td.idle_pct - em.e0.idle_pct if em.e0 else math.inf
    emu_res = v.hta - em.e4.idle_pct if em.e4 else math.inf
    parts = [f"{t}: {_pp(c)}" for t, c in factor_lines(em) if abs(c) >= 0.001]
    checks = f"torchdoctor − exact recomputation {_pp(td_res)}; HTA − emulation {_pp(emu_res)}"
    if abs(v.diff) <= THRESHOLD_PP:
        v.status = "ok (≤ 1 pp)"
        v.explanation += "; ".join(parts)
    elif abs(td_res) <= RESIDUAL_PP and abs(emu_res) <= RESIDUAL_PP:
        v.status = "explained"
        v.explanation += "; ".join(parts) + f". Check: {checks}"
    else:
        v.status = "UNEXPLAINED"
        v.explanation += ("; ".join(parts) + ". " if parts else "") + f"Check failed: {checks}"


def _per_release(line: Line, attr: str) -> str:
    """A verdict field for the table: once when every release agrees, else one entry per release."""
    vals = {ver: getattr(v, attr) for ver, v in line.hta.items()}
    if len(set(vals.values())) == 1:
        return next(iter(vals.values()))
    sep = "; " if attr == "status" else "<br>"
    return sep.join(f"**{ver}**: {val}" for ver, val in vals.items())


# --------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------


def _git_rev() -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip() or "?"
    except OSError:
        return "?"


def render(lines: list[Line], versions: list[str], meta: dict[str, str]) -> str:
    md: list[str] = []
    md.append("# torchdoctor vs HTA: device idle % over HTA's window\n")
    md.append(
        f"Generated {meta['date']} by `benchmarks/hta_compare.py{meta['flags']}` (repo {meta['rev']}); "
        f"{meta['hta_version']}, {'each from its own' if len(versions) > 1 else 'from its'} virtualenv; "
        f"torchdoctor: `{meta['td']}` "
        "`analyze TRACE --steps trace --json OUT`.\n"
    )
    md.append(
        "Difference = torchdoctor − HTA. A difference above 1 pp is *explained* when an independent "
        "recomputation from the raw trace (i) with torchdoctor's definition lands on torchdoctor's "
        f"number and (ii) with HTA's behaviours added one by one lands on HTA's number, both within "
        f"{RESIDUAL_PP} pp; the explanation lists each behaviour's effect on HTA's idle %.\n"
    )
    if len(versions) > 1:
        md.append(
            "Status and explanation are given once where every HTA release gets the same, else per release. "
            "The explanation is each behaviour's effect computed from the trace; each release is checked "
            "against the same emulation.\n"
        )
    hta_cols = " | ".join(f"HTA {ver} idle %" for ver in versions)
    diff_cols = " | ".join(f"diff vs {ver} (pp)" for ver in versions)
    md.append(f"| trace | {hta_cols} | torchdoctor idle % | {diff_cols} | status | explanation |")
    md.append("|---|" + "---:|" * (2 * len(versions) + 1) + "---|---|")

    def hta_cell(v: Verdict) -> str:
        if v.hta_err:
            return "no result" if v.hta_err.startswith("no result") else v.hta_err.split(":")[0] + " (crash)"
        return _fmt(v.hta)

    for ln in lines:
        htas = " | ".join(hta_cell(v) for v in ln.verdicts)
        diffs = " | ".join("–" if v.diff is None else f"{v.diff:+.2f}" for v in ln.verdicts)
        md.append(
            f"| {ln.trace} | {htas} | {_fmt(ln.td.idle_pct)} | {diffs} | "
            f"{_per_release(ln, 'status')} | {_per_release(ln, 'explanation')} |"
        )
    md.append("\n## Step-by-step recomputation (idle %, unrounded)\n")
    md.append(
        "E0 = torchdoctor's definition (kernel/memcpy/memset union, ns, first→last device event); "
        "E1 = + HTA's busy row set (`args.stream` ≠ −1, e.g. `cuda_sync`); E2 = + µs rounding; "
        "E3 = + orphan device rows dropped; E4 = + last ProfilerStep dropped = HTA emulated. "
        "The last columns check the emulation against HTA run with `include_last_profiler_step=True` "
        "and with `HTA_DISABLE_NS_ROUNDING=1`.\n"
    )
    slash = " / ".join(versions)
    md.append(
        "| trace | torchdoctor | E0 exact | E1 +rows | E2 +µs | E3 +orphans | E4 +last = emu | "
        + " | ".join(f"HTA {ver}" for ver in versions)
        + f" | README | incl-last emu / HTA {slash} | no-round emu / HTA {slash} |"
    )
    md.append("|---|" + "---:|" * (7 + len(versions)) + "---|---|")
    for ln in lines:
        em = ln.em

        def v(x: Idle | None) -> str:
            return _fmt(x.idle_pct if x else None, 3)

        def variant(name: str, verdicts: list[Verdict] = ln.verdicts) -> str:
            return " / ".join(_fmt((vd.variants.get(name) or {}).get("idle_pct_exact"), 3) for vd in verdicts)

        hta_exact = " | ".join(
            "crash" if vd.hta_err else _fmt((vd.variants.get("default") or {}).get("idle_pct_exact"), 3)
            for vd in ln.verdicts
        )
        md.append(
            f"| {ln.trace} | {_fmt(ln.td.idle_pct, 3)} | {v(em.e0)} | {v(em.e1)} | {v(em.e2)} | {v(em.e3)} | "
            f"{v(em.e4)} | {hta_exact} | {ln.readme or '–'} | "
            f"{v(em.incl_last)} / {variant('include_last_step')} | {v(em.no_round)} / {variant('no_rounding')} |"
        )
    md.append("\n## Windows (ms)\n")
    md.append(
        "| trace | torchdoctor window | E0 window (first→last device event) | "
        + " | ".join(f"HTA {ver} window" for ver in versions)
        + " |"
    )
    md.append("|---|" + "---:|" * (2 + len(versions)))
    for ln in lines:
        tdw = ln.td.window_ns
        e0 = ln.em.e0
        hws = []
        for vd in ln.verdicts:
            hw = (vd.variants.get("default") or {}).get("window_us")
            hws.append(_fmt((hw[1] - hw[0]) / 1e3, 3) if hw and None not in hw else "–")
        md.append(
            f"| {ln.trace} | {_fmt((tdw[1] - tdw[0]) / 1e6, 3) if tdw else '–'} | "
            f"{_fmt((e0.end - e0.start) / 1e3, 3) if e0 else '–'} | {' | '.join(hws)} |"
        )
    md.append(
        "\nReproduce: `bash benchmarks/setup_hta.sh both && .venv/bin/python benchmarks/hta_compare.py` "
        "(about 2 minutes per HTA release, most of it HTA).\n"
    )
    return "\n".join(md)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="directory of reference traces")
    ap.add_argument(
        "--torchdoctor",
        default=os.environ.get("TORCHDOCTOR", str(DEFAULT_TORCHDOCTOR)),
        help="command that runs torchdoctor (default: the project venv's console script)",
    )
    ap.add_argument("--out", type=Path, default=RESULTS, help="markdown results file")
    ap.add_argument("--no-variants", action="store_true", help="skip the two extra HTA runs (faster)")
    ap.add_argument("--only", nargs="*", help="only traces whose file name contains one of these")
    ap.add_argument("--refresh-hta", action="store_true", help="rerun HTA even if cached results match")
    add_hta_arg(ap)
    args = ap.parse_args(argv)
    versions = selected(args.hta)

    traces = sorted(p for p in args.traces.iterdir() if p.name.endswith((".json", ".json.gz")))
    if args.only:
        traces = [p for p in traces if any(s in p.name for s in args.only)]
    if not traces:
        print(f"error: no traces in {args.traces}", file=sys.stderr)
        return 2
    if missing := missing_venvs(versions):
        names = ", ".join(f"{v.version} ({v.venv})" for v in missing)
        print(f"error: no HTA virtualenv for {names}; {setup_hint(missing)}", file=sys.stderr)
        return 2
    td_cmd = shlex.split(args.torchdoctor)
    if not Path(td_cmd[0]).exists() and not any(
        (Path(p) / td_cmd[0]).exists() for p in os.environ.get("PATH", "").split(os.pathsep)
    ):
        print(f"error: torchdoctor not found: {args.torchdoctor}", file=sys.stderr)
        return 2

    ref = readme_reference(args.traces)
    with tempfile.TemporaryDirectory(prefix="hta_compare_") as tmp_s:
        tmp = Path(tmp_s)
        hta = {hv.version: run_hta(hv, traces, not args.no_variants, tmp, args.refresh_hta) for hv in versions}
        lines: list[Line] = []
        for p in traces:
            print(f"  {p.name}", file=sys.stderr)
            td = run_torchdoctor(td_cmd, p, tmp)
            em = emulate(load_events(p))
            verdicts: dict[str, Verdict] = {}
            for ver, data in hta.items():
                hv_res = data["results"].get(p.name, {})
                d = hv_res.get("default", {})
                verdicts[ver] = Verdict(hta=d.get("idle_pct_exact"), hta_err=d.get("error"), variants=hv_res)
            ln = Line(
                trace=p.name.replace(".json.gz", "").replace(".json", ""),
                readme=ref.get(p.name),
                td=td,
                em=em,
                hta=verdicts,
            )
            for v in ln.verdicts:
                judge(ln, v)
            lines.append(ln)

    flags = " ".join(argv if argv is not None else sys.argv[1:])
    meta = {
        "date": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "rev": _git_rev(),
        "hta_version": " and ".join(f"HTA {hv.version} (PyPI `{hv.dist}`)" for hv in versions),
        "td": args.torchdoctor.replace(str(REPO) + "/", ""),
        "flags": (" " + flags) if flags else "",
    }
    md = render(lines, [hv.version for hv in versions], meta)
    print(md)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(md)
    print(f"\nwrote {args.out}", file=sys.stderr)
    bad = [ln for ln in lines if any(v.status in BAD_STATUSES for v in ln.verdicts)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
