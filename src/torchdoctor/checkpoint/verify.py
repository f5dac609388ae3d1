"""Is a DCP checkpoint directory complete? (`torchdoctor checkpoint verify DIR`)

A DCP save (``torch.distributed.checkpoint.save`` with its FileSystemWriter) writes each rank's
shards (``__<rank>_<n>.distcp``) and then, on the coordinator, ``.metadata``: a pickle of
``Metadata`` whose ``storage_data`` maps every stored item to (file, offset, length). A save cut
short leaves no ``.metadata``, a missing or short shard, or temporary files.

``.metadata`` is untrusted input and is never unpickled with Python's loader: ``SafeUnpickler``
only builds inert records for DCP's own classes and a few torch names (``torch.Size``, dtypes,
layouts), and refuses every other global, so reading it runs no code and imports no torch.

Exit codes of the command: 0 complete, 1 torn (what is missing is named), 2 not a checkpoint or
unreadable metadata (one line).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
from dataclasses import dataclass, field
from typing import Any

METADATA = ".metadata"
MARKER = ".torchdoctor-complete"  # the commit marker (checkpoint/commit.py): written last, atomically
_SHARD = re.compile(r"^__(\d+)_(\d+)\.distcp$")
_TEMP = (".tmp", ".partial", ".incomplete")
_MAX_METADATA = 1 << 30


class NotACheckpoint(Exception):
    """The directory is not a DCP checkpoint, or its metadata cannot be read."""


class _Record:
    """An inert stand-in for one pickled object: its constructor arguments and state."""

    def __new__(cls, *args: Any, **kwargs: Any) -> _Record:
        obj = object.__new__(cls)
        obj.__dict__["_args"] = args
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        parts = state if isinstance(state, tuple) else (state,)
        for part in parts:
            if isinstance(part, dict):
                self.__dict__.update(part)


_RECORDS: dict[str, type] = {}
_ALLOWED_MODULES = ("torch.distributed.checkpoint.",)
_TORCH_NAMES = {"Size": lambda *a: tuple(a[0]) if a else ()}


def _record_type(module: str, name: str) -> type:
    key = f"{module}.{name}"
    if key not in _RECORDS:
        _RECORDS[key] = type(name, (_Record,), {"__module__": "torchdoctor.checkpoint.records"})
    return _RECORDS[key]


class SafeUnpickler(pickle.Unpickler):
    """Builds DCP metadata as inert records; refuses any other global (no code runs)."""

    def find_class(self, module: str, name: str) -> Any:
        if module.startswith(_ALLOWED_MODULES):
            if name.isupper():
                return lambda *a: a[0] if a else None  # an enum's value
            return _record_type(module, name)
        if module == "torch" and name in _TORCH_NAMES:
            return _TORCH_NAMES[name]
        if module == "torch" and re.fullmatch(r"[a-z0-9_]+", name):
            return f"torch.{name}"  # dtypes (torch.float32), layouts: names, never objects
        if module == "torch.serialization" and name == "_get_layout":
            return lambda *a: str(a[0]) if a else None
        if module in ("pathlib", "posixpath") and name in ("PosixPath", "PurePosixPath", "Path"):
            return lambda *a: os.path.join(*[str(x) for x in a]) if a else ""
        if module == "collections" and name == "OrderedDict":
            return dict
        if module == "builtins" and name in ("set", "frozenset", "tuple", "list", "dict", "slice"):
            return {"set": set, "frozenset": frozenset, "tuple": tuple, "list": list, "dict": dict,
                    "slice": slice}[name]
        raise pickle.UnpicklingError(f"refused global {module}.{name}")


def read_metadata(path: str) -> Any:
    """The unpickled (inert) Metadata record; NotACheckpoint when it cannot be read."""
    try:
        if os.path.getsize(path) > _MAX_METADATA:
            raise NotACheckpoint(f"{path}: metadata larger than {_MAX_METADATA} bytes")
        with open(path, "rb") as f:
            return SafeUnpickler(io.BytesIO(f.read())).load()
    except NotACheckpoint:
        raise
    except Exception as exc:  # any malformed or foreign pickle: one line, never a traceback
        raise NotACheckpoint(f"{path}: unreadable DCP metadata ({type(exc).__name__}: {str(exc)[:120]})") from None


@dataclass
class Verdict:
    """What ``verify`` found in one checkpoint directory."""

    path: str
    complete: bool
    problems: list[str] = field(default_factory=list)
    files: int = 0
    items: int = 0
    bytes: int = 0
    ranks: list[int] = field(default_factory=list)
    marker: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "complete": self.complete, "problems": self.problems, "files": self.files,
                "items": self.items, "bytes": self.bytes, "ranks": self.ranks, "marker": self.marker}


def _storage(md: Any) -> dict[str, int]:
    """file -> bytes it must hold at least (the largest offset + length stored in it)."""
    need: dict[str, int] = {}
    data = getattr(md, "storage_data", None)
    if not isinstance(data, dict):
        raise NotACheckpoint("metadata has no storage_data (not a FileSystemWriter checkpoint)")
    for info in data.values():
        rel = getattr(info, "relative_path", None)
        if not isinstance(rel, str) or not rel or os.path.isabs(rel) or ".." in rel.split("/"):
            raise NotACheckpoint(f"metadata names an invalid file: {str(rel)[:80]!r}")
        end = int(getattr(info, "offset", 0) or 0) + int(getattr(info, "length", 0) or 0)
        need[rel] = max(need.get(rel, 0), end)
    return need


def verify(path: str, require_marker: bool = False) -> Verdict:
    """Check one checkpoint directory; NotACheckpoint when it is not one."""
    if not os.path.isdir(path):
        raise NotACheckpoint(f"{path}: not a directory")
    names = os.listdir(path)
    shards = sorted(n for n in names if _SHARD.match(n))
    has_md = METADATA in names
    if not has_md and not shards:
        raise NotACheckpoint(f"{path}: not a DCP checkpoint (no {METADATA}, no __R_N.distcp shards)")
    v = Verdict(path, True, ranks=sorted({int(_SHARD.match(n).group(1)) for n in shards}))  # type: ignore[union-attr]
    temps = sorted(n for n in names if n.endswith(_TEMP))
    if temps:
        v.problems.append(f"temporary files left by an interrupted save: {', '.join(temps[:5])}")
    if not has_md:
        v.problems.append(f"no {METADATA}: the save did not finish (DCP writes it last, after every rank's shards)")
    else:
        md = read_metadata(os.path.join(path, METADATA))
        need = _storage(md)
        v.items = len(md.storage_data)
        v.files = len(need)
        for rel, size in sorted(need.items()):
            full = os.path.join(path, rel)
            if not os.path.isfile(full):
                v.problems.append(f"missing shard {rel} (named by the metadata)")
                continue
            got = os.path.getsize(full)
            v.bytes += got
            if got < size:
                v.problems.append(f"short shard {rel}: {got} bytes, the metadata needs {size}")
        ranks_named = {int(m.group(1)) for m in (_SHARD.match(os.path.basename(r)) for r in need) if m}
        missing_ranks = sorted(ranks_named - set(v.ranks))
        if missing_ranks:
            v.problems.append(f"no shard file of rank(s) {missing_ranks}")
    marker = os.path.join(path, MARKER)
    v.marker = os.path.isfile(marker)
    if v.marker:
        v.problems += _check_marker(path, marker)
    elif require_marker:
        v.problems.append(f"no commit marker {MARKER}: the save was not committed")
    v.complete = not v.problems
    return v


def _check_marker(path: str, marker: str) -> list[str]:
    """The marker lists every file and its size at commit time: each must still be there, whole."""
    try:
        with open(marker, encoding="utf-8") as f:
            listed = json.load(f)["files"]
        problems = []
        for rel, size in sorted(listed.items()):
            full = os.path.join(path, rel)
            if os.path.isabs(rel) or ".." in rel.split("/"):
                problems.append(f"commit marker names an invalid file: {rel[:80]!r}")
            elif not os.path.isfile(full):
                problems.append(f"{rel}: committed, now missing")
            elif os.path.getsize(full) != int(size):
                problems.append(f"{rel}: {os.path.getsize(full)} bytes, {int(size)} when committed")
        return problems
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return [f"unreadable commit marker {MARKER}"]


def _step_of(name: str) -> int | None:
    m = re.search(r"(\d+)(?!.*\d)", name)
    return int(m.group(1)) if m else None


def latest(root: str, require_marker: bool = False) -> tuple[Verdict | None, list[Verdict]]:
    """(the newest complete checkpoint under ``root``, every checkpoint checked newest first).

    Newest: the largest step number in the directory name, else the latest modification time.
    """
    found = []
    for name in os.listdir(root):
        full = os.path.join(root, name)
        if os.path.isdir(full):
            try:
                found.append(verify(full, require_marker))
            except NotACheckpoint:
                continue
    found.sort(key=lambda v: (_step_of(os.path.basename(v.path)) is not None,
                              _step_of(os.path.basename(v.path)) or 0, os.path.getmtime(v.path)), reverse=True)
    return next((v for v in found if v.complete), None), found
