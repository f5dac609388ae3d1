"""Where the user's code created an object: the call site a permanent fix edits.

Shared by the probe (where a DataLoader, optimizer or DDP was created) and the remedies (where
a remedy changed one). A frame is *internal* (torch, torchdoctor's probe/remedies, their
`<torchdoctor ...>` shims), a *library's* (an installed package: a `site-packages` or
`dist-packages` path), the *standard library's* (transparent: `functools`, `runpy`...) or the
*user's* (an IPython cell or `python -c` too, with no file to edit). When a library made
the call for the user (Hugging Face's Trainer builds the DataLoader, accelerate rebuilds it,
Lightning re-creates it with a distributed sampler), the site that a diff may edit is not the
library's line: `Site.user` is then None and `Site.library` names the package, so the advice
goes through that library's own settings instead of a patch to an installed file.
"""

from __future__ import annotations

import functools
import linecache
import os
import re
import sys
import sysconfig
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import CodeType, FrameType

_LIBRARY_DIRS = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")


def _stdlib_dirs() -> tuple[str, ...]:
    dirs = set()
    for key in ("stdlib", "platstdlib"):
        try:
            d = sysconfig.get_paths()[key]
        except (KeyError, OSError):
            continue
        dirs.add(os.path.realpath(d) + os.sep)
        dirs.add(d.rstrip(os.sep) + os.sep)
    return tuple(sorted(dirs))


_STDLIB = _stdlib_dirs()


def _script_dirs() -> tuple[str, ...]:
    """Where console scripts are installed (``<venv>/bin``, ``~/.local/bin`` for ``pip --user``)."""
    dirs = set()
    for scheme in (None, f"{os.name}_user"):
        try:
            d = (sysconfig.get_paths(scheme) if scheme else sysconfig.get_paths())["scripts"]
        except (KeyError, OSError, ValueError):
            continue
        dirs.update({os.path.realpath(d), d.rstrip(os.sep)})
    return tuple(sorted(dirs))


_SCRIPTS = _script_dirs()


@functools.lru_cache(maxsize=64)
def is_console_script(path: str) -> bool:
    """pip's (or uv's) stub for a package's console script: ``yolo train ...`` runs ``<venv>/bin/yolo``,
    which only calls ``ultralytics.cfg.entrypoint()``. No line of the user's, so a loader built under it
    is the package's, not "built inside entrypoint(), which <venv>/bin/yolo:8 calls". Told by place and
    by look (a few lines that import the entry point and ``sys.exit(...)`` it): a user's own script
    copied into ``/usr/local/bin`` (a Docker image's scripts directory) stays the user's."""
    if not _SCRIPTS or os.path.realpath(os.path.dirname(path)) not in _SCRIPTS and os.path.dirname(path) not in _SCRIPTS:
        return False
    try:
        with open(path, "rb") as f:
            text = f.read(2049)
    except OSError:
        return False
    return len(text) <= 2048 and b"sys.exit(" in text and b"__main__" in text and text.count(b"\n") <= 20


@dataclass(frozen=True)
class Site:
    """Where a constructor was called from.

    user: "file:line" of the user's own call, when the user's code made it (directly, or through
    the standard library); None when a library made it. library: the top-level package the
    user's code called into (the outermost library frame), None for a direct call. library_site:
    the nearest library frame's "file:line" (where the call was made). caller: the user's line
    that led into the library (trainer.train()), if any. entry: the library function that line
    called (timm's `create_loader`), and entry_params its parameter names, so that advice can set
    a constructor's argument through the function that forwards it.
    """

    user: str | None = None
    library: str | None = None
    library_site: str | None = None
    caller: str | None = None
    entry: str | None = None
    entry_params: tuple[str, ...] = ()


def editable_site(site: Site, target: str, keys: Iterable[str]) -> tuple[str, str | None]:
    """(callable, "file:line") a permanent change to `keys` edits: the user's own `target(...)` call,
    or, for an object a library built, the user's call of the library function when that function
    takes every key itself (timm's `create_loader(..., num_workers=...)`); else (target, None)."""
    if site.user:
        return target, site.user
    if site.caller and site.entry and set(keys) <= set(site.entry_params):
        return site.entry.rpartition(".")[2], site.caller
    return target, None


def library_of(path: str) -> str | None:
    """The installed package a source file belongs to ("transformers"), None for other files."""
    if f"torchdoctor{os.sep}workloads{os.sep}" in path:
        return None  # the bundled demo jobs are the user's code wherever they are installed
    for marker in _LIBRARY_DIRS:
        i = path.rfind(marker)
        if i >= 0:
            rest = path[i + len(marker):]
            top = rest.split(os.sep, 1)[0]
            return top.removesuffix(".py") or None
    return None


@functools.lru_cache(maxsize=1)
def _distributions() -> dict[str, list[str]]:
    """Top-level package -> the installed distributions that provide it (read once, when asked)."""
    try:
        from importlib.metadata import packages_distributions

        return dict(packages_distributions())
    except Exception:
        return {}


def display_name(top: str) -> str:
    """What a user calls the package ``library_of`` named: the one installed distribution that
    provides a differently named top-level package ("recipes" -> "torchtune": its built-in recipes
    live there), else ``top``. For text only: settings tables stay keyed by ``library_of``'s name."""
    dists = sorted(set(_distributions().get(top) or ()))
    if len(dists) == 1 and _normal(dists[0]) != _normal(top):
        return dists[0]
    return top


def _normal(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def package_relative(path: str) -> str:
    """An installed package's file from its package on (``mmengine/logging/message_hub.py:346``);
    any other path as it is."""
    path = path.replace("\\", "/")
    for root in ("/site-packages/", "/dist-packages/"):
        path = path.rpartition(root)[2]
    return path


def is_stdlib(path: str) -> bool:
    """The standard library's file, or a frozen module of it (`<frozen runpy>` on 3.11+)."""
    if path.startswith("<frozen "):
        return True
    return bool(_STDLIB) and path.startswith(_STDLIB) and library_of(path) is None


def creation_site(frame: FrameType | None, internal: Callable[[str], bool], limit: int = 60,
                  called: str | None = None) -> Site:
    """Walk out from `frame` past internal frames: the first user frame, or the library that called.

    `called`: the constructor's name ("DataLoader"). A library frame between the user's line and the
    constructor may only wrap it (Lightning patches DataLoader.__init__ to record its arguments):
    when the user's line itself calls `called(`, the call is the user's.
    """
    library = library_site = None
    entry: CodeType | None = None
    for f, lib in _outer_frames(frame, internal, limit):
        name = f.f_code.co_filename
        here = f"{name}:{f.f_lineno}"
        if lib is None:
            if library is None or (called and _line_calls(name, f.f_lineno, called)):
                return Site(user=here)
            return Site(library=library, library_site=library_site, caller=here, entry=_qualname(entry),
                        entry_params=_params(entry))
        # The library the user called into (the outermost before the user's frame) is the one
        # whose settings the user controls: transformers' Trainer, even when accelerate's code,
        # which the Trainer calls, built the loader. Its site is the nearest library frame.
        library = lib
        library_site = library_site or here
        if entry is None or not _passes_through(f.f_code):
            entry = f.f_code
    return Site(library=library, library_site=library_site)


def _outer_frames(frame: FrameType | None, internal: Callable[[str], bool],
                  limit: int) -> Iterator[tuple[FrameType, str | None]]:
    """(frame, its library or None for the user's code) walking out from `frame`, past internal frames."""
    for _ in range(limit):
        if frame is None:
            return
        name = frame.f_code.co_filename
        # `<torchdoctor ...>`: our own shims' code objects. Other `<...>` names (an IPython cell,
        # `python -c`) are the user's code, with no file a diff could edit.
        if not (internal(name) or name.startswith("<torchdoctor") or is_stdlib(name) or is_console_script(name)):
            yield frame, library_of(name)
        frame = frame.f_back


def user_frames(frame: FrameType | None, internal: Callable[[str], bool], n: int = 2, limit: int = 60) -> list[str]:
    """The first `n` frames of the user's own code walking out from `frame`, as "file:line (function)":
    a call made inside a helper is also found in the loop that called the helper. A library between
    two of them is named on the outer one ("lightning's Trainer.fit() at train.py:45"): the user's
    validation_step is called by the library function their line called."""
    out: list[str] = []
    via = ""  # the library function between this user frame and the previous one, if any
    for f, lib in _outer_frames(frame, internal, limit):
        if len(out) >= n:
            break
        if lib is not None:
            if via and _passes_through(f.f_code):
                continue  # a decorator's wrapper around the library function already named
            entry = _qualname(f.f_code)
            via = f"{lib}'s {entry}() at " if entry else f"{lib} at "  # the outermost one wins
        else:
            func = _qualname(f.f_code)
            out.append((via if out else "") + f"{f.f_code.co_filename}:{f.f_lineno}" + (f" ({func})" if func else ""))
            via = ""
    return out


_CO_VARARGS, _CO_VARKEYWORDS = 0x04, 0x08  # inspect's code flags (inspect itself is not imported here)


def _passes_through(code: CodeType) -> bool:
    """A wrapper that takes only ``*args``/``**kwargs`` (a decorator's: Keras wraps ``Model.fit`` in
    ``filter_traceback.<locals>.error_handler``): the function it wraps names the call, not it."""
    return (code.co_argcount + code.co_kwonlyargcount == 0
            and bool(code.co_flags & (_CO_VARARGS | _CO_VARKEYWORDS)))


def _qualname(code: CodeType | None) -> str | None:
    if code is None or code.co_name.startswith("<"):  # a module body or a lambda names no function
        return None
    return getattr(code, "co_qualname", code.co_name)  # co_qualname: Python 3.11+


def _params(code: CodeType | None) -> tuple[str, ...]:
    """The function's named parameters (positional and keyword-only), from its code object alone."""
    if code is None:
        return ()
    return code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]


def _line_calls(path: str, lineno: int, name: str) -> bool:
    """Whether the source line calls `name(` (a call spanning lines reports its first line; an alias,
    `DDP(model)` for DistributedDataParallel, does not match and the call reads as the library's)."""
    return re.search(rf"\b{re.escape(name)}\s*\(", linecache.getline(path, lineno)) is not None


def caller_frame(depth: int) -> FrameType | None:
    """The frame `depth` levels above the caller of this function."""
    try:
        return sys._getframe(depth + 1)
    except ValueError:
        return None
