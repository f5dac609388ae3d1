"""Constructor wrappers that change keyword arguments and leave no trace in the job's output.

The wrapper's code is compiled under the probe's shim file name, so warnings raised inside torch
with ``stacklevel=2`` still name the user's line, and the probe's excepthook drops the wrapper's
frame from tracebacks (see ``torchdoctor.probe.shims``). Like the probe's shims it is invisible to
torch.compile (``torchdoctor.probe.unseen``): traced by Dynamo it calls the constructor unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from torchdoctor.probe import unseen
from torchdoctor.probe.shims import SHIM_FILENAME

Call = tuple[tuple[Any, ...], dict[str, Any]]
# adjust(args, kwargs) -> None (call unchanged) or (changed call, plain call); the plain call is the
# user's own, normalised (e.g. a parameter generator turned into a list so it can be used twice).
Adjust = Callable[[tuple[Any, ...], dict[str, Any]], "tuple[Call, Call] | None"]

_TEMPLATE = """
def kwargs_shim(orig, adjust, rejected, failed, compiling):
    def shim(*args, **kwargs):
        if compiling():
            return orig(*args, **kwargs)
        try:
            plan = adjust(args, kwargs)
        except Exception as exc:
            failed(exc)
            plan = None
        if plan is None:
            return orig(*args, **kwargs)
        (new_args, new_kwargs), (args, kwargs) = plan
        if rejected is None:
            return orig(*new_args, **new_kwargs)
        try:
            return orig(*new_args, **new_kwargs)
        except Exception as exc:
            rejected(exc)
        return orig(*args, **kwargs)
    return shim
"""
_namespace: dict[str, Any] = {}
exec(compile(_TEMPLATE, SHIM_FILENAME, "exec"), _namespace)


def kwargs_shim(
    orig: Callable[..., Any],
    adjust: Adjust,
    rejected: Callable[[BaseException], None] | None,
    failed: Callable[[BaseException], None],
) -> Callable[..., Any]:
    """Wrap ``orig`` so that ``adjust`` may change its arguments.

    ``failed`` gets an exception of ``adjust`` itself (the call then goes through unchanged).
    With ``rejected`` set, a call that raises with the changed arguments is retried once with the
    user's own, after ``rejected(exc)`` records why: only for constructors that have no side
    effects before they validate (never DDP, whose constructor runs collectives).
    """
    shim = _namespace["kwargs_shim"](orig, adjust, rejected, failed, unseen.compiling())
    unseen.hide_all(adjust, rejected, failed)
    return functools.update_wrapper(unseen.hide(shim, recursive=False), orig)
