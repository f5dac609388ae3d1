"""The diagnosis matrix: one module per layer, each rule citing its threshold's source."""

from __future__ import annotations

import importlib
import pkgutil

from .engine import REGISTRY, RankInputs, RuleConfig, RuleInputs, rule, run_rules


def load_all() -> None:
    """Import every rules module so its @rule functions register (idempotent)."""
    for mod in pkgutil.iter_modules(__path__):
        if mod.name not in ("engine",) and not mod.name.startswith("_"):
            importlib.import_module(f"{__name__}.{mod.name}")


def diagnose(inputs: RuleInputs, config: RuleConfig | None = None):
    load_all()
    return run_rules(inputs, config)


__all__ = ["REGISTRY", "RankInputs", "RuleConfig", "RuleInputs", "diagnose", "load_all", "rule", "run_rules"]
