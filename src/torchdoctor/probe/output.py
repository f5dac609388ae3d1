"""Where rank summaries go: the run directory layout, gathering to rank 0, merging.

Layout of a run directory::

    run.json                    written by the wrapper after the job: schema torchdoctor.run/1
    ranks/rank{R}.json          each rank's own summary, rewritten at checkpoints and at exit
    ranks/rank{R}.analysis.json the analysis of its profiler window (probe/postprocess.py)
    ranks/gathered/rank{R}.json what rank 0 received over the job's process group (a snapshot
                                taken at the end of the profiler window; covers ranks on other
                                nodes when there is no shared filesystem)
    ranks/pid{P}.status         a probed process's progress line (rank, last closed step, state),
                                rewritten in place at every step, so it survives a kill
    ranks/pid{P}.exit           that process's exit status, written by the parent that reaped it
                                (torchrun, mp.spawn) when the parent is a probed Python process
    ranks/worker{P}.json        a DataLoader worker's own counters (probe/workers.py), read by its
                                training process when it summarises
    traces/rank{R}.json.gz      each rank's profiler window
    traces/rank{R}.owner        the pid that took the plain name; processes that share rank R (no
                                process group: Hogwild children, an evaluating parent) write
                                rank{R}.pid{P}.json.gz and ranks/rank{R}.pid{P}.json and
                                .analysis.json instead (``claim_trace_slot``)

A *payload* is ``{"facts": <RankFacts as builtins>, "analysis": <RankResult as builtins> | None}``.
Merging prefers a rank's own file (it covers the whole run) over the gathered snapshot.
This module imports no torch at module level (the wrapper uses it).
"""

from __future__ import annotations

import glob
import json
import os
import re
import time
from datetime import timedelta
from typing import Any

RUN_SCHEMA = "torchdoctor.run/1"
RANKS_DIR = "ranks"
GATHERED_DIR = os.path.join(RANKS_DIR, "gathered")
TRACES_DIR = "traces"

Payload = dict[str, Any]
_RANK_FILE = re.compile(r"^rank(\d+)(?:\.pid(\d+))?\.json$")
# A window's slot (``slot_name``, ``claim_trace_slot``): the name its trace and analysis files share.
SLOT = re.compile(r"rank\d+(?:\.pid\d+)?")


def slot_name(rank: int | str) -> str:
    """A window's files are named by its slot: ``rank{R}`` (an int rank), or a name that
    ``claim_trace_slot`` gave (``rank{R}.pid{P}``)."""
    return f"rank{rank}" if isinstance(rank, int) else rank


def trace_path(run_dir: str, rank: int | str) -> str:
    return os.path.join(run_dir, TRACES_DIR, f"{slot_name(rank)}.json.gz")


def analysis_path(run_dir: str, rank: int | str) -> str:
    """Where the post-processing child writes the analysis of a rank's window (probe/postprocess.py)."""
    return os.path.join(run_dir, RANKS_DIR, f"{slot_name(rank)}.analysis.json")


def claim_trace_slot(run_dir: str, rank: int, pid: int) -> str:
    """The slot of this process's window: ``rank{R}`` for the first process that claims it, else
    ``rank{R}.pid{P}``. Processes share a rank only without a process group (Hogwild training in
    torch.multiprocessing children, an evaluation in their parent): each keeps its own trace and
    analysis. The claim is an exclusive create (``traces/rank{R}.owner`` holds the pid), so two
    processes that close their windows at once cannot both take the plain name."""
    owner = os.path.join(run_dir, TRACES_DIR, f"rank{rank}.owner")
    os.makedirs(os.path.dirname(owner), exist_ok=True)
    try:
        fd = os.open(owner, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        try:
            with open(owner, encoding="utf-8") as f:
                held = int(f.read().strip() or 0)
        except (OSError, ValueError):
            held = 0  # being written by its owner this instant: not ours
        return f"rank{rank}" if held == pid else f"rank{rank}.pid{pid}"
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(str(pid))
    return f"rank{rank}"


def trace_slot(trace_file: str) -> str | None:
    """The slot of a facts' ``trace_file`` (``traces/rank0.pid7.json.gz`` -> ``rank0.pid7``)."""
    slot = os.path.basename(trace_file).removesuffix(".json.gz")
    return slot if trace_file.endswith(".json.gz") and SLOT.fullmatch(slot) else None


def write_json(path: str, obj: Any) -> None:
    """Write atomically, so a reader never sees half a file."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, separators=(",", ":"))
    os.replace(tmp, path)


def own_path(run_dir: str, rank: int, pid: int) -> str:
    """``ranks/rank{R}.json``, or ``rank{R}.pid{P}.json`` when another process already owns it.

    Two processes share a rank only without a process group (e.g. two independent trainings).
    """
    path = os.path.join(run_dir, RANKS_DIR, f"rank{rank}.json")
    try:
        with open(path, encoding="utf-8") as f:
            owner = json.load(f).get("facts", {}).get("pid")
    except (OSError, ValueError, AttributeError):
        return path
    if owner in (None, pid):
        return path
    return os.path.join(run_dir, RANKS_DIR, f"rank{rank}.pid{pid}.json")


def clear(run_dir: str) -> None:
    """Remove what an earlier run left in ``run_dir`` (only files this layout defines)."""
    patterns = (
        os.path.join(RANKS_DIR, "rank*.json"),
        os.path.join(GATHERED_DIR, "rank*.json"),
        os.path.join(RANKS_DIR, "pid*.status"),
        os.path.join(RANKS_DIR, "pid*.exit"),
        os.path.join(RANKS_DIR, "worker*.json"),
        os.path.join(RANKS_DIR, "worker*.json.tmp*"),  # a worker terminated mid-write
        os.path.join(TRACES_DIR, "rank*.json"),
        os.path.join(TRACES_DIR, "rank*.json.gz"),
        os.path.join(TRACES_DIR, "rank*.pending"),
        os.path.join(TRACES_DIR, "rank*.owner"),
        os.path.join(TRACES_DIR, "rank*.postprocess.log"),
        os.path.join("caches", "rank*.json"),
        os.path.join("caches", "rank*.megacache.bin"),
        os.path.join("caches", "output_code", "*.py"),
        "run.json",
    )
    for pattern in patterns:
        for path in glob.glob(os.path.join(run_dir, pattern)):
            os.remove(path)


def status_path(run_dir: str, pid: int) -> str:
    return os.path.join(run_dir, RANKS_DIR, f"pid{pid}.status")


def is_probed(run_dir: str, pid: int) -> bool:
    """Process ``pid`` ran under this run's probe (it wrote a progress line)."""
    return os.path.exists(status_path(run_dir, pid))


def exit_path(run_dir: str, pid: int) -> str:
    return os.path.join(run_dir, RANKS_DIR, f"pid{pid}.exit")


class Progress:
    """A process's progress line ``ranks/pid{P}.status``: ``rank=R step=S state=STATE``.

    ``step`` is the last step the probe closed (-1: none yet); ``state`` is ``run`` while the
    process runs, ``exit`` once Python shuts down, ``exception:<Type>`` after an uncaught
    exception. Each update is one ``pwrite`` of a fixed-size line at offset 0 (no reopen, no
    rename): it costs about a microsecond, and what the last one wrote stays in the file when the
    process is killed.
    """

    SIZE = 128

    def __init__(self, run_dir: str, pid: int) -> None:
        path = status_path(run_dir, pid)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def write(self, rank: int, step: int, state: str) -> None:
        if self.fd is None:
            return
        line = f"rank={rank} step={step} state={state}"[: self.SIZE - 1]
        os.pwrite(self.fd, line.ljust(self.SIZE - 1).encode() + b"\n", 0)

    def forget(self) -> None:
        """In a forked child: the file is the parent's; close our copy of the descriptor."""
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


def read_progress(run_dir: str) -> dict[int, dict[str, Any]]:
    """pid -> ``{"rank": int, "step": int | None, "state": str}`` from every progress line."""
    out: dict[int, dict[str, Any]] = {}
    for path in glob.glob(os.path.join(run_dir, RANKS_DIR, "pid*.status")):
        m = re.match(r"^pid(\d+)\.status$", os.path.basename(path))
        try:
            with open(path, encoding="utf-8") as f:
                fields = dict(kv.split("=", 1) for kv in f.read().split() if "=" in kv)
            step = int(fields.get("step", -1))
            record = {"rank": int(fields["rank"]), "step": step if step >= 0 else None,
                      "state": fields.get("state", "run")}
        except (OSError, ValueError, KeyError):
            continue  # torn or foreign: the rank's summary still says what it knows
        if m:
            out[int(m.group(1))] = record
    return out


def record_exit(run_dir: str, pid: int, returncode: int | None) -> None:
    """The parent of probed process ``pid`` reaped it: keep its exit status (others are skipped)."""
    if returncode is None or not is_probed(run_dir, pid):
        return
    write_json(exit_path(run_dir, pid), {"returncode": int(returncode), "time": time.time()})


def read_exits(run_dir: str) -> dict[int, dict[str, Any]]:
    """pid -> ``{"returncode": int, "time": float}`` recorded by the parents that reaped them."""
    out: dict[int, dict[str, Any]] = {}
    for path in glob.glob(os.path.join(run_dir, RANKS_DIR, "pid*.exit")):
        m = re.match(r"^pid(\d+)\.exit$", os.path.basename(path))
        record = load_dict(path)
        if m and record is not None and isinstance(record.get("returncode"), int):
            out[int(m.group(1))] = record
    return out


def write_gathered(run_dir: str, payloads: list[Payload]) -> None:
    for payload in payloads:
        if payload and isinstance(payload.get("facts"), dict):
            rank = int(payload["facts"].get("rank", 0))
            write_json(os.path.join(run_dir, GATHERED_DIR, f"rank{rank}.json"), payload)


def _load(path: str) -> Payload | None:
    payload = load_dict(path)
    return payload if payload is not None and isinstance(payload.get("facts"), dict) else None


def read_payloads(run_dir: str) -> list[Payload]:
    """All rank payloads of a run directory, own files first, sorted by (rank, pid)."""
    own: dict[tuple[int, int], Payload] = {}
    for path in glob.glob(os.path.join(run_dir, RANKS_DIR, "rank*.json")):
        payload = _load(path) if _RANK_FILE.match(os.path.basename(path)) else None
        if payload is not None:
            facts = payload["facts"]
            own[(int(facts.get("rank", 0)), int(facts.get("pid") or 0))] = payload
    ranks_seen = {rank for rank, _ in own}
    for path in glob.glob(os.path.join(run_dir, GATHERED_DIR, "rank*.json")):
        payload = _load(path)
        if payload is not None and int(payload["facts"].get("rank", 0)) not in ranks_seen:
            facts = payload["facts"]
            own[(int(facts.get("rank", 0)), int(facts.get("pid") or 0))] = payload
    for payload in own.values():
        slot = trace_slot(str(payload["facts"].get("trace_file") or ""))
        if slot is not None:
            # The post-processing child's result (probe/postprocess.py) when it ran on this
            # machine: newer than, and preferred to, a copy the rank embedded when it last wrote.
            analysis = load_dict(analysis_path(run_dir, slot))
            if analysis is not None:
                payload["analysis"] = analysis
    return [own[key] for key in sorted(own)]


def load_dict(path: str) -> dict | None:
    """A JSON object from ``path``; None when it is missing, unreadable or not an object."""
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def gather_to_rank0(payload: Payload, timeout_s: float = 120.0) -> list[Payload] | None:
    """Collective: every rank sends ``payload``; rank 0 gets the list, others get None.

    Uses the job's default group when it can move CPU objects (gloo), else a short-lived gloo
    subgroup with a bounded timeout, so NCCL streams and device placement are never touched.
    Returns None on rank 0 too when there is no initialised process group.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    rank, world = dist.get_rank(), dist.get_world_size()
    group, own_group = None, False
    if "gloo" not in str(dist.get_backend()).lower() and dist.is_gloo_available():
        group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        own_group = True
    received: list[Any] | None = [None] * world if rank == 0 else None
    try:
        dist.gather_object(payload, received, dst=0, group=group)
    finally:
        if own_group:
            dist.destroy_process_group(group)
    return received
