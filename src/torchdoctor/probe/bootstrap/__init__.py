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


def _on_torch_imported(torch_module: ModuleType, config: ProbeConfig) -> None:
    if os.environ.get("TORCHDOCTOR_CACHE_PACK"):  # `run --cache FILE`: before the job compiles anything
        try:
            from torchdoctor.probe import compile_cache

            compile_cache.load(torch_module)
        except Exception as exc:
            ERRORS.record("cache.load", exc)
    try:
        from torchdoctor.probe.core import install

        install(config)
    except Exception as exc:
        ERRORS.record("probe.install", exc)
