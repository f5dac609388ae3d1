"""What the remedies did inside one process of the job, and where that is written.

Each process that applied, refused or recorded anything writes ``RUN_DIR/remedies/pid<PID>.json``
at exit (``torchdoctor fix`` merges them):

    {"pid", "rank", "requested": [ids], "applied": [{id, target, site, set, was}],
     "refused": [{id, reason}], "skipped": [{id, reason}] (nothing to change here),
     "losses": [float per backward], "steps": optimizer steps (calls of backward in a job
     without an optimizer)}

A refusal is printed once per job on stderr: the ids already printed travel to child processes in
an environment variable, so ranks started by a launcher do not repeat what the launcher said.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from ..callsite import Site, caller_frame
from ..callsite import creation_site as walk_out
from .catalogue import Spec

ENV_RUN_DIR = "TORCHDOCTOR_RUN_DIR"  # the probe's run directory (probe/config.py)
ENV_RECORD = "TORCHDOCTOR_AB_RECORD"  # set by `fix` in its A/B arms: record the loss of every step
ENV_STEPS = "TORCHDOCTOR_AB_STEPS"  # set by `fix --steps N`: end the job after N optimizer steps
ENV_SAID = "TORCHDOCTOR_REMEDIES_SAID"  # refusals already printed by a parent process
RECORDS_DIR = "remedies"


def say(message: str) -> None:
    try:
        sys.stderr.write(f"torchdoctor: {message}\n")
        sys.stderr.flush()
    except Exception:  # stderr closed: the job must not notice
        pass


class Runtime:
    """Remedy state of this process."""

    def __init__(self) -> None:
        self.specs: dict[str, Spec] = {}
        self.requested: list[str] = []
        self.applied: list[dict[str, Any]] = []
        self.refused: dict[str, str] = {}
        # Why a requested remedy had nothing to change so far (reported at exit if never applied).
        self.skipped: dict[str, str] = {}
        self.losses: list[Any] = []  # detached scalar tensors, converted at exit
        self.loss_values: list[float] = []
        self.steps = 0
        self.backward_steps = 0  # calls of backward, the step count of a job without an optimizer
        self.rank: int | None = None
        self.recording = False
        # remedy id -> the sites where its change took effect; only for remedies whose change can go
        # unused (persistent workers on a loader iterated once keep idle processes, nothing more).
        self.exercised: dict[str, set[str | None]] = {}

    def active(self, rid: str) -> Spec | None:
        """The spec of ``rid`` when it was requested and not refused."""
        return None if rid in self.refused else self.specs.get(rid)

    def refuse(self, rid: str, reason: str) -> None:
        """Refuse ``rid`` for this process: recorded, printed once per job, never applied."""
        if rid in self.refused:
            return
        self.refused[rid] = reason
        said = os.environ.get(ENV_SAID, "").split(",")
        if rid not in said:
            say(f"remedy {rid} refused: {reason} (the job runs without it)")
            os.environ[ENV_SAID] = ",".join([*filter(None, said), rid])

    def broken(self, ids: tuple[str, ...], exc: BaseException) -> None:
        """Our own code failed: refuse what it was doing, the job goes on without it."""
        for rid in ids:
            if self.active(rid):
                self.refuse(rid, f"torchdoctor error: {type(exc).__name__}: {exc}")

    def skip(self, rid: str, reason: str) -> None:
        self.skipped.setdefault(rid, reason)

    def did(self, rid: str, target: str, site: str | None, set_: dict[str, Any], was: dict[str, Any],
            library: str | None = None, entry_call: str | None = None, library_site: str | None = None) -> None:
        entry = {"id": rid, "target": target, "site": site, "set": set_, "was": was}
        if library and not site:
            entry["library"] = library  # an installed package made the call: its settings, not a diff
            if entry_call:
                entry["entry"] = entry_call  # the library function the user's code called (NeuralNet.fit)
        if len(self.applied) >= 200 or any({k: v for k, v in e.items() if k != "library_site"} == entry
                                            for e in self.applied):
            return
        if library and not site and library_site:
            entry["library_site"] = library_site  # the library's own line: the first one is where it is built
        self.applied.append(entry)

    def track(self, rid: str) -> None:
        """``rid`` says where its change took effect (``exercised_at``); its other sites are marked."""
        self.exercised.setdefault(rid, set())

    def exercised_at(self, rid: str, site: str | None) -> None:
        self.exercised.setdefault(rid, set()).add(site)

    def _applied_record(self) -> list[dict[str, Any]]:
        used = self.exercised
        return [dict(e, exercised=e["site"] in used[e["id"]]) if e["id"] in used else e for e in self.applied]

    def _finish_losses(self) -> None:
        if not self.losses:
            return
        pending, self.losses = self.losses, []
        try:
            import torch

            # One stacked copy: a single host sync instead of one .item() per step.
            self.loss_values.extend(torch.stack([t.reshape(()).float() for t in pending]).cpu().tolist())
        except Exception:
            # One loss that does not stack with the others (another device, a tensor subclass) costs only
            # its own value.
            self.loss_values.extend(_value(t) for t in pending)

    def record(self) -> dict[str, Any] | None:
        """This process's record, or None when it has nothing to say."""
        self._finish_losses()
        if not (self.applied or self.refused or self.skipped or self.loss_values or self.steps
                or self.backward_steps):
            return None
        return {
            "pid": os.getpid(),
            "rank": self.rank,
            "requested": self.requested,
            "applied": self._applied_record(),
            "refused": [{"id": k, "reason": v} for k, v in self.refused.items()],
            "skipped": [{"id": k, "reason": v} for k, v in self.skipped.items()
                        if k not in {a["id"] for a in self.applied}],
            "losses": self.loss_values,
            "steps": self.steps or self.backward_steps,
        }

    def write(self) -> None:
        """Write the record under the run directory (atomic); never raises."""
        try:
            run_dir = os.environ.get(ENV_RUN_DIR)
            record = self.record()
            if not run_dir or record is None:
                return
            folder = os.path.join(run_dir, RECORDS_DIR)
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, f"pid{os.getpid()}.json")
            tmp = f"{path}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(record, f)
            os.replace(tmp, path)
        except Exception as exc:
            say(f"remedies: could not write the record: {type(exc).__name__}: {exc}")


RUNTIME = Runtime()


def user_site() -> str | None:
    """"file:line" of the user's call that led here, past torch, torchdoctor and the shims; None
    when an installed library made the call (a diff must not edit a library's file)."""
    return _creation_site(2).user


def creation_site(called: str | None = None) -> Site:
    """Where the call that led here came from: the user's line, or the library that made it.
    `called`: the constructor's class name, so a library that only wraps the user's own call
    (Lightning's DataLoader.__init__ wrapper) leaves it the user's (callsite.creation_site)."""
    return _creation_site(2, called)


def _creation_site(depth: int, called: str | None = None) -> Site:
    torch_mod = sys.modules.get("torch")
    torch_dir = os.path.dirname(getattr(torch_mod, "__file__", "") or "/nonexistent") + os.sep
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # Our own wrappers and the probe's; the bundled demo (torchdoctor/workloads) is user code.
    ours = (os.path.join(package, "remedies") + os.sep, os.path.join(package, "probe") + os.sep)
    return walk_out(caller_frame(depth), lambda name: name.startswith(torch_dir) or name.startswith(ours),
                    called=called)


def cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def local_world_size() -> int:
    """Ranks on this host: LOCAL_WORLD_SIZE (torchrun), else the process group's size (a launcher
    such as mp.spawn that sets nothing is single-node), else 1."""
    text = os.environ.get("LOCAL_WORLD_SIZE", "")
    if text.isdigit() and int(text) > 0:
        return int(text)
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return max(1, int(dist.get_world_size()))
    except Exception:
        pass
    return 1


def local_rank() -> int:
    text = os.environ.get("LOCAL_RANK", "")
    if text.isdigit():
        return int(text)
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()) % local_world_size()
    except Exception:
        pass
    return 0


def _value(t: Any) -> float:
    """One recorded loss as a float; NaN where it has none to give."""
    try:
        return float(t.detach().reshape(()).float().cpu().item())
    except Exception:
        return float("nan")
