"""Post-import hooks: run a callback right after a module finishes importing.

The probe must not import torch itself (a process that never uses torch pays nothing), so it
waits for the job to import it. ``when_imported("torch", fn)`` calls ``fn(module)`` once torch's
own ``__init__`` has run, from inside the importing statement. The finder removes itself after
the last pending hook fired, so later imports are not slowed down.

A module that is still running when its hook is asked for (it imported torch, whose hook asks) is
handed over half-built; ``when_class`` then waits for the class it defines (``when_subclassed``),
and ``when_whole`` for the module's body to finish.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

Callback = Callable[[ModuleType], None]
_pending: dict[str, list[Callback]] = {}


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Meta-path finder that delegates to the other finders and wraps the loader's exec_module."""

    def __init__(self) -> None:
        self._busy: set[str] = set()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _pending or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.discard(fullname)
        loader = getattr(spec, "loader", None)
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return None
        _wrap_exec_module(loader, fullname)
        return spec


def _wrap_exec_module(loader: importlib.abc.Loader, fullname: str) -> None:
    original = loader.exec_module

    def exec_module(module: ModuleType) -> None:
        if getattr(module, "__name__", None) != fullname:  # a loader shared with other modules
            original(module)
            return
        # Leave the loader as we found it before running the module body (nested imports may reuse it).
        loader.__dict__.pop("exec_module", None)
        original(module)
        _fire(fullname, module)

    loader.exec_module = exec_module  # type: ignore[method-assign]


_finder = _PostImportFinder()


def _fire(fullname: str, module: ModuleType) -> None:
    for callback in _pending.pop(fullname, []):
        callback(module)
    if not _pending and _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


def when_imported(fullname: str, callback: Callback) -> None:
    """Call ``callback(module)`` after ``fullname`` is imported (now, if it already is).

    The callback must not raise: wrap it (the probe records its own errors).
    """
    module = sys.modules.get(fullname)
    if module is not None:
        callback(module)
        return
    _pending.setdefault(fullname, []).append(callback)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def when_whole(fullname: str, callback: Callback) -> None:
    """As ``when_imported``, but a module still running (it imported torch, whose hook asked) is
    awaited: ``callback(module)`` runs once its body has run, when the import system sets it on its
    package, before the importing statement binds any name from it. safetensors.torch imported
    before torch (isort's order) had no save_file yet when the probe asked. A top-level module, or
    one whose package is not a plain module, is handed over as it is. The callback must not raise."""
    module = sys.modules.get(fullname)
    spec = getattr(module, "__spec__", None)
    package, _, child = fullname.rpartition(".")
    parent = sys.modules.get(package) if package else None
    if module is None or not getattr(spec, "_initializing", False) or parent is None or type(parent) is not ModuleType:
        when_imported(fullname, callback)
        return
    _set_on[(package, child)] = [*_set_on.get((package, child), []), callback]
    parent.__class__ = _Announcing


# (package, child) -> callbacks waiting for the child module to be set on its package.
_set_on: dict[tuple[str, str], list[Callback]] = {}


class _Announcing(ModuleType):
    """A package's class while a child module it holds is still running: setting the child on it
    (the import system's last act for the child) calls the callbacks waiting, then the package is a
    plain module again once none waits."""

    def __setattr__(self, name: str, value: Any) -> None:
        ModuleType.__setattr__(self, name, value)
        waiting = _set_on.pop((self.__name__, name), None)
        if waiting is None:
            return
        if not any(key[0] == self.__name__ for key in _set_on):
            ModuleType.__setattr__(self, "__class__", ModuleType)
        for callback in waiting:
            callback(value)


# base -> (the hook we installed, [(module, name, callback)]).
_waiting: dict[type, tuple[Any, list[tuple[str, str, Callable[[type], None]]]]] = {}


def when_subclassed(base: type, module: str, name: str, callback: Callable[[type], None]) -> None:
    """Call ``callback(cls)`` once, when the class ``module.name`` is defined as a subclass of
    ``base`` (a module still running when the hook went in defines it later). ``base`` keeps its own
    ``__init_subclass__``, or the one it inherits, for every subclass, and gets it back once every
    class waited for came, unless someone else put theirs in place meanwhile. The callback must not
    raise."""
    entry = _waiting.get(base)
    if entry is not None and base.__dict__.get("__init_subclass__") is entry[0]:
        entry[1].append((module, name, callback))
        return
    own = base.__dict__.get("__init_subclass__")
    waiters = [(module, name, callback)]

    def __init_subclass__(cls: type, **kwargs: Any) -> None:
        if own is not None:
            own.__get__(None, cls)(**kwargs)
        else:
            super(base, cls).__init_subclass__(**kwargs)  # type: ignore[misc]
        came = [w for w in waiters if w[0] == cls.__module__ and w[1] == cls.__qualname__]
        if not came:
            return
        waiters[:] = [w for w in waiters if w not in came]
        if not waiters and base.__dict__.get("__init_subclass__") is hook:
            if _waiting.get(base, (None,))[0] is hook:
                del _waiting[base]
            if own is None:
                del base.__init_subclass__  # type: ignore[misc]
            else:
                base.__init_subclass__ = own  # type: ignore[method-assign]
        for _, _, fn in came:
            fn(cls)

    hook = classmethod(__init_subclass__)
    _waiting[base] = (hook, waiters)
    base.__init_subclass__ = hook  # type: ignore[assignment,method-assign]


def when_class(fullname: str, name: str, base: type, callback: Callable[[type], None]) -> None:
    """Call ``callback(cls)`` once the class ``fullname.name``, a subclass of ``base``, exists: when
    its module has been imported, or, for a module still running then (it imported torch, whose hook
    asked: torchdata's StatefulDataLoader imported before torch), when it defines the class. The
    callback must not raise."""
    def imported(module: ModuleType) -> None:
        try:
            cls = getattr(module, name, None)
            if cls is None:
                when_subclassed(base, module.__name__, name, callback)
        except Exception:  # a module or base we cannot read or hook: nothing to wait for
            return
        if cls is not None:
            callback(cls)

    when_imported(fullname, imported)
