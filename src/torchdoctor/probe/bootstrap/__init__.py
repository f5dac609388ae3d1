"""Hook point run at interpreter start-up in every process of a ``torchdoctor run`` job.

``activate()`` is called by the bootstrap ``sitecustomize`` when ``TORCHDOCTOR_RUN_DIR`` is set.
It applies remedies named in ``TORCHDOCTOR_REMEDIES`` (``torchdoctor.remedies.apply(ids)``, when
that function exists) and arms the probe for when the job imports torch. It never imports torch.
"""

from __future__ import annotations

import os
from types import ModuleType

from torchdoctor.probe import imphook
from torchdoctor.probe.config import ENV_REMEDIES, ProbeConfig
from torchdoctor.probe.errors import ERRORS

when_imported = imphook.when_imported  # public: remedies may register their own post-import hooks


def activate() -> None:
    """Arm this process: remedies first (they may change settings the probe then records), then the probe."""
    config = ProbeConfig.from_env()
    if config is None:
        return
    remedies = [r.strip() for r in os.environ.get(ENV_REMEDIES, "").split(",") if r.strip()]
    if remedies or os.environ.get("TORCHDOCTOR_AB_RECORD"):  # fix's A/B arms record losses, even with none
        _apply_remedies(remedies)
    imphook.when_imported("torch", lambda module: _on_torch_imported(module, config))


def _apply_remedies(ids: list[str]) -> None:
    try:
        from torchdoctor import remedies
    except ImportError:
        return
    apply = getattr(remedies, "apply", None)
    if apply is None:
        return
    try:
        apply(ids)
    except Exception as exc:
        ERRORS.record("remedies.apply", exc)


def _load_pack(torch_module: ModuleType) -> None:
    try:
        from torchdoctor.probe import compile_cache

        compile_cache.load(torch_module)
    except Exception as exc:
        ERRORS.record("cache.load", exc)


def _on_torch_imported(torch_module: ModuleType, config: ProbeConfig) -> None:
    if os.environ.get("TORCHDOCTOR_CACHE_PACK"):  # `run --cache FILE`
        # Once Dynamo is imported: before the job compiles anything, and only in the processes that
        # compile (not in DataLoader workers, which import torch but not Dynamo).
        imphook.when_imported("torch._dynamo", lambda _: _load_pack(torch_module))
    try:
        from torchdoctor.probe.core import install

        install(config)
    except Exception as exc:
        ERRORS.record("probe.install", exc)
