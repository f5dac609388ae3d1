"""Compile layer, caches: a cold start that could have been warm (CG-7).

The caches that make a second compile cheap (FX graph, AOTAutograd, kernels) live in Inductor's
cache directory, by default under the temporary directory: on a CI runner, a container or a fresh
node every job compiles from scratch. `torchdoctor cache pack` / `run --cache` carry them across
machines (compile/cachepack.py).
"""

from __future__ import annotations

import os

from ..advice.command import job_command
from ._common import View, finding, per_rank
from .compile_cost import _job
from .engine import RuleInputs, rule
from .model import Evidence, Finding, Fix

# A cold compile worth a finding: this share of the job's wall time, or this many seconds.
COLD_MIN_PCT = 5.0
COLD_MIN_S = 30.0
# From this share of the job it is a warning (TBP's 10% for a one-off cost worth acting on).
COLD_WARN_PCT = 10.0


def _backend_cost(c, v: View) -> tuple[float, float | None, str]:
    """(the backend's compile seconds: what warm caches skip, their share of the job, the phrase)."""
    seconds = c.backend_s if c.backend_s is not None else (c.compile_time_s or 0.0)
    pct, cost = _job(c, v, seconds)
    return seconds, pct, cost


def _severity(pct: float | None) -> str:
    return "warning" if pct is not None and pct >= COLD_WARN_PCT else "info"


def _counters(c) -> str:
    return ", ".join(f"{k} {n}" for k, n in sorted(c.cache_counts.items()))


@rule("CG-7")
def cold_start(inputs: RuleInputs) -> list[Finding]:
    """Compiled from scratch where a warm cache was possible.

    Live facts: every FX graph cache lookup missed (none hit), and the cache directory is
    Inductor's default under the temporary directory, or a pack given to `run --cache` was refused.
    Priced as the backend's compile seconds (AOTAutograd and Inductor: what warm caches skip;
    Dynamo still traces), a one-off job cost (``job_s``), claimed from no step budget. Warning
    from COLD_WARN_PCT of the job, else info; silent below COLD_MIN_PCT and COLD_MIN_S.
    """
    if inputs.run.get("compile_cache"):
        return []  # an earlier run filled this cache directory: CG-8 says what changed

    def one(v: View) -> Finding | None:
        c = v.f.compile if v.f is not None else None
        if c is None or not c.used or not c.cache_counts.get("fx_graph.miss") or c.cache_counts.get("fx_graph.hit"):
            return None
        refused = c.cache_pack is not None and c.cache_pack.startswith("refused")
        if not (c.cache_dir_default or refused):
            return None
        seconds, pct, cost = _backend_cost(c, v)
        if not seconds:
            return None
        if (pct is None or pct < COLD_MIN_PCT) and seconds < COLD_MIN_S:
            return None
        misses = c.cache_counts.get("fx_graph.miss", 0)
        why = (f"the cache pack was refused ({c.cache_pack.removeprefix('refused: ')})" if refused else
               f"the cache directory is Inductor's default, {c.cache_dir}, under the temporary directory: "
               "gone with the machine, a CI runner or a container")
        f = finding(
            v, "CG-7", "compile",
            f"Compiled from scratch: {misses} FX graph cache miss(es), no hit; AOTAutograd and Inductor spent {cost}, "
            f"which a warm cache skips. {why[0].upper() + why[1:]}.",
            0.0, sev=_severity(pct),
            evidence=[Evidence(f"Cache counters: {_counters(c)}; "
                               f"cache directory {c.cache_dir or 'unknown'}.",
                               {"counters": dict(c.cache_counts), "cache_dir": c.cache_dir,
                                "default_dir": c.cache_dir_default, "pack": c.cache_pack, "backend_s": seconds})],
            fix=Fix("Keep the caches between runs: a persistent TORCHINDUCTOR_CACHE_DIR on one machine; across "
                    "machines (CI, many nodes), pack this run's caches and load them before the next run compiles.",
                    "export TORCHINDUCTOR_CACHE_DIR=/persistent/inductor-cache\n"
                    "torchdoctor cache pack td-runs/<this run> compile-cache.zip   # then, on the next machine:\n"
                    f"torchdoctor run --cache compile-cache.zip -- {job_command(inputs.run)}", language="shell"),
            confidence="high", confirm="run again with the same TORCHINDUCTOR_CACHE_DIR: the FX graph cache hits",
            source="PT FX graph cache (default on, cache_dir under tempfile.gettempdir()); Mega-Cache (2.7+)")
        f.job_s, f.job_pct = round(seconds, 3), (round(pct, 1) if pct is not None else None)
        return f
    return per_rank(inputs, one)


# What to do when one fingerprint field changed the keys (reference section 3.3).
_FIELD_FIX = {
    "threads": "Run with the same thread count as the run that filled the cache (OMP_NUM_THREADS, "
               "torch.set_num_threads), or keep it out of the key: TORCHINDUCTOR_CPP_DYNAMIC_THREADS=1.",
    "compiler.cache_key_tag": "Use the same TORCH_COMPILE_CACHE_KEY_TAG as the run that filled the cache.",
}


@rule("CG-8")
def changed_since_last_run(inputs: RuleInputs) -> list[Finding]:
    """Every FX graph lookup missed although an earlier run beside this one compiled into the same
    cache directory (compile/history.py): the fingerprint fields that changed, each with the caches it
    invalidates, or the graphs that did. Priced as the backend's compile seconds (a one-off job
    cost); warning from COLD_WARN_PCT of the job, else info.
    """
    got = inputs.run.get("compile_cache")
    if not got:
        return []

    def one(v: View) -> Finding | None:
        c = v.f.compile if v.f is not None else None
        if c is None or not c.used:
            return None
        seconds, pct, cost = _backend_cost(c, v)
        prev = os.path.basename(str(got["previous"]).rstrip(os.sep))
        if got["changed"]:
            why = "changed since then: " + "; ".join(got["changed"])
        elif got["graphs"] == "changed":
            why = "the fingerprint is the same but the captured graphs changed (the model or its input shapes)"
        else:
            why = ("nothing in the fingerprint changed" + (" and the graphs are the same" if got["graphs"] == "same" else "")
                   + ": the cache directory was emptied, or this is another machine")
        fixes = [_FIELD_FIX[f] for f in got["fields"] if f in _FIELD_FIX]
        f = finding(
            v, "CG-8", "compile",
            f"Compiled from scratch although the previous run in this cache directory ({prev}) compiled into it: {why}. "
            f"AOTAutograd and Inductor spent {cost}.",
            0.0, sev=_severity(pct),
            evidence=[Evidence(f"Previous run {got['previous']}, cache directory {got['cache_dir']}; "
                               f"this run's cache counters: {_counters(c)}.",
                               {"previous": got["previous"], "changed": got["changed"], "graphs": got["graphs"],
                                "backend_s": seconds})],
            fix=Fix(" ".join(fixes) or "Keep what goes into the cache keys the same between runs (`torchdoctor cache diff "
                    "PREVIOUS_RUN THIS_RUN` lists it), or pack the previous run's caches for this machine.",
                    f"torchdoctor cache diff {got['previous']} {inputs.run.get('dir', 'THIS_RUN')}", language="shell"),
            confidence="high" if got["changed"] else "medium",
            source="PT FX graph cache key (FxGraphHashDetails); reference section 3.3 key stability")
        f.job_s, f.job_pct = round(seconds, 3), (round(pct, 1) if pct is not None else None)
        return f

    return per_rank(inputs, one)
