"""Where ``torchdoctor analyze`` spends its wall time on a multi-rank input: one JSON line per run.

Runs in torchdoctor's environment (``.venv/bin/python benchmarks/_td_breakdown.py DIR``) and calls
the CLI in-process exactly as ``torchdoctor analyze DIR --json OUT`` does, with thin timers wrapped
around the functions that split the work (nothing in torchdoctor is changed):

* parent: imports, ``discover``, the worker pool (``analyze_files``: fork, tasks, results), the report
  (``build_report``: cross-rank metrics and rules) and ``emit`` (the JSON writer);
* each rank, in its worker process: decode (``load_trace``), metrics (``analyze_rank``), and what it
  costs to send the ``RankResult`` back (pickle time and size), with the worker's start and end on
  the parent's clock so the gaps (fork, queueing, unpickling) show.

speed_vs_hta.py --profile prints the result as a table; the interpreter's own start-up is measured
there (wall of the whole child minus what this script sees).
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

T0 = time.time()  # the interpreter has started and run `site`; everything else is measured from here


def _timed(store: dict[str, float], key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            store[key] = store.get(key, 0.0) + time.time() - t

    return wrapper


RANK_DIR = tempfile.mkdtemp(prefix="td_breakdown_")  # each worker writes its timings here
_REAL: dict[str, Callable[..., Any]] = {}  # the wrapped torchdoctor functions


def analyze_one_timed(path: str, steps: str | None, jobs: int = 1) -> Any:
    """Runs in the worker (fork): session._analyze_one with each phase timed."""
    try:
        rec: dict[str, Any] = {"file": os.path.basename(path), "pid": os.getpid(), "start": time.time()}
        c0 = time.process_time()
        t = time.time()
        tr = _REAL["load_trace"](path, jobs)
        rec["decode_s"] = time.time() - t
        t = time.time()
        res = _REAL["analyze_rank"](tr, steps)
        rec["metrics_s"] = time.time() - t
        del tr
        t = time.time()
        blob = pickle.dumps(("ok", res))
        rec["pickle_s"] = time.time() - t
        rec["pickle_bytes"] = len(blob)
        rec["cpu_s"] = time.process_time() - c0
        rec["end"] = time.time()
    except Exception:  # an input the timers do not handle: the real thing, untimed
        return _REAL["_analyze_one"](path, steps, jobs)
    with open(os.path.join(RANK_DIR, f"{os.getpid()}.{rec['file']}.json"), "w") as f:
        json.dump(rec, f)
    return "ok", res


def main(argv: list[str]) -> int:
    target, extra = argv[0], argv[1:]
    parent: dict[str, float] = {}
    t = time.time()
    import torchdoctor.cli as cli
    import torchdoctor.session as session

    parent["import"] = time.time() - t
    _REAL.update(load_trace=session.load_trace, analyze_rank=session.analyze_rank,
                 _analyze_one=session._analyze_one)
    # The pool pickles the task function by name: make the timed one *be* session._analyze_one.
    analyze_one_timed.__module__, analyze_one_timed.__qualname__ = session.__name__, "_analyze_one"
    session._analyze_one = analyze_one_timed
    session.discover = _timed(parent, "discover", session.discover)
    session.analyze_files = _timed(parent, "pool (analyze_files)", session.analyze_files)
    session.build_report = _timed(parent, "report (build_report)", session.build_report)
    cli.emit = _timed(parent, "emit (JSON)", cli.emit)
    out = os.path.join(RANK_DIR, "report.json")
    t_cli = time.time()
    rc = cli.main(["analyze", target, "--json", out, *extra])
    parent["total_in_process"] = time.time() - T0
    ranks = []
    for name in sorted(os.listdir(RANK_DIR)):
        if name != "report.json":
            with open(os.path.join(RANK_DIR, name)) as f:
                rec = json.load(f)
            rec["start_after_cli_s"] = rec.pop("start") - t_cli
            rec["end_after_cli_s"] = rec.pop("end") - t_cli
            ranks.append(rec)
    print(json.dumps({"rc": rc, "parent_s": parent, "ranks": ranks, "cpus": len(os.sched_getaffinity(0))}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
