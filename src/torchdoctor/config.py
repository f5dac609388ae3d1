"""User control of the rules: which to ignore and the thresholds to use.

Sources, merged in this order (later ones add to earlier ones):

1. a configuration file: ``--config FILE``, else the first of ``torchdoctor.toml`` (top-level
   keys) or ``pyproject.toml`` with a ``[tool.torchdoctor]`` table found from the current
   directory upwards. In one directory ``torchdoctor.toml`` wins over ``pyproject.toml``; the
   search stops at the filesystem root or at a directory holding ``.git`` (searched itself);
2. ``--ignore ID,...`` on the command line (adds to the file's ``ignore``).

Keys::

    ignore = ["DL-7", "HO-5"]
    [thresholds]            # [tool.torchdoctor.thresholds] in pyproject.toml
    "*" = {warn_pct = 10}
    "DL-2" = {warn_pct = 8, crit_pct = 30, min_pct = 1}

The result is a ``RuleConfig`` (rules/engine.py defines what the engine does with it). Problems
never stop an analysis: an unknown rule id, key or threshold name is a one-line warning naming the
file and the key; a file that is not valid TOML (or cannot be read) is a one-line error naming the
file, and the analysis continues with the defaults.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .report.model import ErrorEntry
from .rules.engine import THRESHOLD_NAMES, RuleConfig

try:
    import tomllib  # Python 3.11+
except ModuleNotFoundError:  # Python 3.10: the same parser as a package, when installed
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ModuleNotFoundError:
        tomllib = None  # type: ignore[assignment]

CONFIG_FILE = "torchdoctor.toml"
PYPROJECT = "pyproject.toml"
TABLE = "[tool.torchdoctor"  # the text a pyproject.toml holds when it configures torchdoctor
KEYS = ("ignore", "thresholds")
ALL_RULES = "*"
CLI = "--ignore"  # the "file" named by warnings about the command line's rule ids


@dataclass
class LoadedConfig:
    """The effective configuration, where it came from, and what was wrong with it."""

    rules: RuleConfig = field(default_factory=RuleConfig)
    file: str | None = None
    warnings: list[ErrorEntry] = field(default_factory=list)
    errors: list[ErrorEntry] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """``{"file": path or None, "ignore": [...], "thresholds": {...}}`` (the report's ``config``)."""
        return {"file": self.file, **self.rules.to_dict()}

    @property
    def is_default(self) -> bool:
        return self.file is None and not self.rules.ignore and not self.rules.thresholds


def known_rules() -> dict[str, str]:
    """Registered rule ids by their upper-case spelling (ids are matched case-insensitively)."""
    from . import rules

    rules.load_all()
    return {rid.upper(): rid for rid in rules.REGISTRY}


def find_config(start: str) -> str | None:
    """The configuration file that applies in directory ``start`` (see the module docstring)."""
    here = os.path.abspath(start)
    while True:
        own = os.path.join(here, CONFIG_FILE)
        if os.path.isfile(own):
            return own
        pyproject = os.path.join(here, PYPROJECT)
        if os.path.isfile(pyproject) and _mentions_table(pyproject):
            return pyproject
        parent = os.path.dirname(here)
        if parent == here or os.path.exists(os.path.join(here, ".git")):
            return None
        here = parent


def _mentions_table(path: str) -> bool:
    """Whether ``path`` may hold ``[tool.torchdoctor]``: a pyproject without it is not ours to parse
    (a broken pyproject that never mentions torchdoctor is not our error to report)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return False
    return TABLE in text or "tool.torchdoctor" in text


def load(path: str, known: dict[str, str] | None = None) -> LoadedConfig:
    """Read and validate one configuration file (any name; ``pyproject.toml`` uses its table)."""
    out = LoadedConfig(file=path)
    if tomllib is None:
        out.errors.append(ErrorEntry(path, "reading TOML needs Python 3.11 or the tomli package; "
                                           "using the defaults"))
        return out
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as e:
        out.errors.append(ErrorEntry(path, f"cannot read the configuration: {e.strerror or e}; "
                                           "using the defaults"))
        return out
    except tomllib.TOMLDecodeError as e:
        out.errors.append(ErrorEntry(path, f"not valid TOML ({e}); using the defaults"))
        return out
    table: Any = doc
    prefix = ""
    if os.path.basename(path) == PYPROJECT:
        table = doc.get("tool", {}).get("torchdoctor") if isinstance(doc.get("tool"), dict) else None
        prefix = "tool.torchdoctor."
        if table is None:
            out.warnings.append(ErrorEntry(path, "no [tool.torchdoctor] table: nothing configured"))
            return out
    if not isinstance(table, dict):
        out.warnings.append(ErrorEntry(path, f"{prefix.rstrip('.') or 'document'} is not a table: ignored"))
        return out
    known = known if known is not None else known_rules()
    for key in table:
        if key not in KEYS:
            out.warnings.append(ErrorEntry(path, f"unknown key '{prefix}{key}' ignored "
                                                 f"(known: {', '.join(KEYS)})"))
    ignore = _ignore_list(table.get("ignore", []), path, f"{prefix}ignore", known, out.warnings)
    thresholds = _thresholds(table.get("thresholds", {}), path, f"{prefix}thresholds", known, out.warnings)
    out.rules = RuleConfig(ignore=frozenset(ignore), thresholds=thresholds)
    return out


def _ignore_list(value: Any, path: str, key: str, known: dict[str, str],
                 warnings: list[ErrorEntry]) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        warnings.append(ErrorEntry(path, f"'{key}' must be a list of rule ids: ignored"))
        return []
    return _rule_ids(value, path, key, known, warnings)


def _rule_ids(ids: Iterable[str], path: str, key: str, known: dict[str, str],
              warnings: list[ErrorEntry]) -> list[str]:
    """The registered spelling of each id; unknown ones are dropped with a warning."""
    out = []
    for rid in ids:
        rid = rid.strip()
        if not rid:
            continue
        if rid.upper() in known:
            out.append(known[rid.upper()])
        else:
            warnings.append(ErrorEntry(path, f"{key + ': ' if key else ''}unknown rule id '{rid}' ignored"))
    return out


def _thresholds(value: Any, path: str, key: str, known: dict[str, str],
                warnings: list[ErrorEntry]) -> dict[str, dict[str, float]]:
    """``{rule id or "*": {name: percent}}``, each entry checked; a bad one is dropped with a warning."""
    if not isinstance(value, dict):
        warnings.append(ErrorEntry(path, f"'{key}' must be a table of rule ids: ignored"))
        return {}
    out: dict[str, dict[str, float]] = {}
    for rid, entry in value.items():
        where = f"{key}.{rid}"
        if rid != ALL_RULES and rid.upper() not in known:
            warnings.append(ErrorEntry(path, f"{key}: unknown rule id '{rid}' ignored"))
            continue
        if not isinstance(entry, dict):
            warnings.append(ErrorEntry(path, f"'{where}' must be a table such as {{warn_pct = 10}}: ignored"))
            continue
        values = _threshold_values(entry, path, where, warnings)
        if values:
            out[rid if rid == ALL_RULES else known[rid.upper()]] = values
    return out


def _threshold_values(entry: dict, path: str, where: str, warnings: list[ErrorEntry]) -> dict[str, float]:
    values: dict[str, float] = {}
    for name, v in entry.items():
        if name not in THRESHOLD_NAMES:
            warnings.append(ErrorEntry(path, f"unknown key '{where}.{name}' ignored "
                                             f"(known: {', '.join(THRESHOLD_NAMES)})"))
        elif isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 100:
            warnings.append(ErrorEntry(path, f"'{where}.{name}' must be a percentage from 0 to 100, "
                                             f"got {v!r}: ignored"))
        else:
            values[name] = float(v)
    warn, crit = values.get("warn_pct"), values.get("crit_pct")
    if warn is not None and crit is not None and warn > crit:
        warnings.append(ErrorEntry(path, f"'{where}': warn_pct {warn:g} above crit_pct {crit:g}: "
                                         "both ignored"))
        del values["warn_pct"], values["crit_pct"]
    return values


def resolve(config_file: str | None = None, ignore: str | Iterable[str] | None = None,
            start: str | None = None) -> LoadedConfig:
    """The effective configuration: ``config_file`` (else the one found from ``start``, default
    the current directory) plus the ``ignore`` ids of the command line (a comma list or ids)."""
    known = known_rules()
    path = config_file or find_config(start or os.getcwd())
    out = load(path, known) if path else LoadedConfig()
    if ignore:
        ids = ignore.split(",") if isinstance(ignore, str) else list(ignore)
        extra = _rule_ids(ids, CLI, "", known, out.warnings)
        if extra:
            out.rules = RuleConfig(ignore=out.rules.ignore | frozenset(extra), thresholds=out.rules.thresholds)
    return out


# The configuration of the running command (set by cli.main for its duration), for the code paths
# that build reports without an explicit configuration (`fix` picks remedies from a report).
_active: LoadedConfig | None = None


def active() -> LoadedConfig:
    """The configuration of the running command; the defaults outside of one."""
    return _active if _active is not None else LoadedConfig()


@contextlib.contextmanager
def activated(loaded: LoadedConfig) -> Iterator[LoadedConfig]:
    """Make ``loaded`` the configuration of the running command for the duration of the block."""
    global _active
    previous, _active = _active, loaded
    try:
        yield loaded
    finally:
        _active = previous
