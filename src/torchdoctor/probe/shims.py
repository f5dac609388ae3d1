"""Wrappers around torch functions that leave no trace in the job's output.

A *shim* replaces a torch function or method and calls probe callbacks around the original.
Two things would otherwise make a job behave visibly differently under the probe:

- ``warnings.warn(..., stacklevel=2)`` inside the original would point at the shim instead of
  the user's line. The shim's code object is compiled under a file name containing
  "importlib" and "_bootstrap", which CPython's warning machinery treats as an internal frame
  and skips (both the C and the pure-Python implementation, 3.8-3.13), so the warning names
  the same user line as without the probe.
- an exception raised by the original would show one extra traceback frame. ``install_excepthook``
  drops shim frames from uncaught-exception tracebacks, so the printed traceback is identical.

Callbacks never let an exception escape: a failing callback is recorded in ``errors.ERRORS``
and the original is still called with the original arguments.

torch.compile sees neither (``unseen``): a shim traced by Dynamo calls the original at once
(``is_compiling()`` folds to True, so the callbacks add nothing to the graph), and the frames of the
shim and of its callbacks are never handed to Dynamo when torch calls them eagerly.
"""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Callable
from typing import Any

from torchdoctor.probe import unseen

# Contains "importlib" and "_bootstrap" on purpose: see the module docstring.
SHIM_FILENAME = "<torchdoctor probe shim: importlib._bootstrap-transparent>"

_SKIP = object()  # "before" failed: do not call "after"
FAILED = object()  # passed to "after" as the result when the original raised

_TEMPLATE = """
def around(orig, before, after, failed, skip, failed_result, compiling):
    def shim(*args, **kwargs):
        if compiling():
            return orig(*args, **kwargs)
        try:
            token = before(args)
        except Exception as exc:
            failed(exc)
            token = skip
        result = failed_result
        try:
            result = orig(*args, **kwargs)
            return result
        finally:
            if token is not skip:
                try:
                    after(token, args, result)
                except Exception as exc:
                    failed(exc)
    return shim


def before_only(orig, before, failed, compiling):
    def shim(*args, **kwargs):
        if compiling():
            return orig(*args, **kwargs)
        try:
            before(args)
        except Exception as exc:
            failed(exc)
        return orig(*args, **kwargs)
    return shim


def before_call(orig, before, failed, compiling):
    def shim(*args, **kwargs):
        if compiling():
            return orig(*args, **kwargs)
        try:
            before(args, kwargs)
        except Exception as exc:
            failed(exc)
        return orig(*args, **kwargs)
    return shim
"""

_namespace: dict[str, Any] = {}
exec(compile(_TEMPLATE, SHIM_FILENAME, "exec"), _namespace)

Before = Callable[[tuple[Any, ...]], Any]
After = Callable[[Any, tuple[Any, ...], Any], None]


def around(
    orig: Callable[..., Any], before: Before, after: After, failed: Callable[[BaseException], None]
) -> Callable[..., Any]:
    """Shim calling ``token = before(args)``, the original, then ``after(token, args, result)``.

    ``result`` is ``FAILED`` when the original raised (the exception then propagates unchanged).
    """
    shim = _namespace["around"](orig, before, after, failed, _SKIP, FAILED, unseen.compiling())
    unseen.hide_all(before, after, failed)
    return functools.update_wrapper(unseen.hide(shim, recursive=False), orig)


def before_only(
    orig: Callable[..., Any], before: Before, failed: Callable[[BaseException], None]
) -> Callable[..., Any]:
    """Cheapest shim: ``before(args)`` then the original (used on hot tensor methods)."""
    shim = _namespace["before_only"](orig, before, failed, unseen.compiling())
    unseen.hide_all(before, failed)
    return functools.update_wrapper(unseen.hide(shim, recursive=False), orig)


def before_call(
    orig: Callable[..., Any], before: Callable[[tuple[Any, ...], dict[str, Any]], None],
    failed: Callable[[BaseException], None],
) -> Callable[..., Any]:
    """``before(args, kwargs)`` then the original: for callbacks that read keyword arguments."""
    shim = _namespace["before_call"](orig, before, failed, unseen.compiling())
    unseen.hide_all(before, failed)
    return functools.update_wrapper(unseen.hide(shim, recursive=False), orig)


def picklable_as(shim: Callable[..., Any], owner: Any, name: str) -> Callable[..., Any]:
    """``shim``, named as what it replaces (``owner.name``), so that pickle finds it there:
    ``Pool.map(torch.load, files)`` or a loader function handed to spawned DataLoader workers
    pickles the function by module and name, and the original's would point at another object."""
    module = getattr(owner, "__name__", None)
    if isinstance(module, str):
        shim.__module__, shim.__qualname__ = module, name
    return shim


def _strip(tb: types.TracebackType | None) -> types.TracebackType | None:
    """Copy of traceback ``tb`` without shim frames."""
    kept = []
    while tb is not None:
        if tb.tb_frame.f_code.co_filename != SHIM_FILENAME:
            kept.append(tb)
        tb = tb.tb_next
    out = None
    for entry in reversed(kept):
        out = types.TracebackType(out, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return out


def strip_exception(exc: BaseException | None, _seen: set[int] | None = None) -> None:
    """Drop shim frames from ``exc``, its cause/context chain and exception-group members."""
    seen = _seen if _seen is not None else set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc.__traceback__ = _strip(exc.__traceback__)
        for member in getattr(exc, "exceptions", ()) or ():
            if isinstance(member, BaseException):
                strip_exception(member, seen)
        if exc.__cause__ is not None:
            strip_exception(exc.__cause__, seen)
        exc = exc.__context__


def install_excepthook() -> None:
    """Wrap ``sys.excepthook`` so uncaught tracebacks look exactly as without the probe."""
    previous = sys.excepthook

    def excepthook(etype: type[BaseException], value: BaseException, tb: types.TracebackType | None) -> None:
        try:
            strip_exception(value)
            tb = value.__traceback__
        except Exception:  # never lose the user's traceback because of the probe
            pass
        previous(etype, value, tb)

    sys.excepthook = excepthook
