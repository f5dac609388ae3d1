"""Remedies: fixes applied at start-up, without editing the user's files (`torchdoctor fix`).

``apply(ids)`` runs in every Python process of a job started by `torchdoctor run`/`fix` (the
bootstrap calls it before the job's own code, with the ids of ``TORCHDOCTOR_REMEDIES``). It
validates the ids, does what needs no torch (environment switches), and patches constructors and
flags the moment the job imports torch. A remedy whose precondition fails is refused with its
reason (printed once, recorded under the run directory); an error of ours refuses the remedy it
belongs to. The job itself always runs.

Importing this package is cheap (no torch): it runs at interpreter start-up.
"""

from __future__ import annotations

import atexit
import importlib
import os
from collections.abc import Iterable
from types import ModuleType

from .catalogue import BY_ID, REMEDIES, Remedy, Spec, parse, parse_all
from .runtime import ENV_RECORD, RUNTIME, say

__all__ = ["BY_ID", "REMEDIES", "Remedy", "Spec", "apply", "arm_recorder", "parse", "parse_all"]

_armed: list[str] = []


def _once(what: str) -> bool:
    if what in _armed:
        return False
    _armed.append(what)
    return True


# The modules that install remedies when torch is imported, in this order; each names its remedies in IDS.
INSTALLERS = ("patch_flags", "patch_data", "patch_ddp", "patch_fsdp", "patch_optim", "patch_model", "patch_checkpoint",
              "patch_matmul")


def _on_torch(torch: ModuleType) -> None:
    for module in (importlib.import_module(f"{__name__}.{name}") for name in INSTALLERS):
        try:
            module.install(torch, RUNTIME)
        except Exception as exc:
            RUNTIME.broken(module.IDS, exc)


def _when_torch(fn: object) -> None:
    from torchdoctor.probe.bootstrap import when_imported

    def guarded(torch: ModuleType) -> None:
        try:
            fn(torch)  # type: ignore[operator]
        except Exception as exc:
            say(f"remedies: {type(exc).__name__}: {exc} (the job carries on)")

    when_imported("torch", guarded)


def apply(ids: Iterable[str]) -> None:
    """Install the remedies ``ids`` ("id" or "id=value") in this process; never raises.

    Also arms the A/B loss recorder when ``TORCHDOCTOR_AB_RECORD`` is set (``torchdoctor fix``).
    """
    try:
        specs, refused = parse_all(list(ids))
        for spec in specs:
            RUNTIME.specs[spec.id] = spec
            RUNTIME.requested.append(str(spec))
        for text, why in refused.items():
            RUNTIME.requested.append(text)
            RUNTIME.refuse(text, why)
        if _once("exit"):
            atexit.register(RUNTIME.write)
        if RUNTIME.specs and _once("remedies"):
            from .patch_flags import alloc_env, debug_env_off, host_allocator

            debug_env_off(RUNTIME)
            alloc_env(RUNTIME)
            host_allocator(RUNTIME)
            _when_torch(_on_torch)
        if os.environ.get(ENV_RECORD):
            arm_recorder()
    except Exception as exc:
        say(f"remedies not applied: {type(exc).__name__}: {exc} (the job carries on)")


def arm_recorder() -> None:
    """Record the loss of every step (and stop after ``TORCHDOCTOR_AB_STEPS``) once torch is imported."""
    if not _once("recorder"):
        return
    from . import recorder

    if _once("exit"):
        atexit.register(RUNTIME.write)
    _when_torch(lambda torch: recorder.install(torch, RUNTIME))
