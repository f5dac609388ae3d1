"""Keep the probe's own frames out of torch.compile's sight.

While a compiled function runs, Dynamo's frame-evaluation callback looks at every Python frame the
process starts, including the probe's hooks and shims when torch calls them from the eager parts
of a compiled region (the code around a graph break, ``.item()`` after a break, the backward of a
compiled step). Dynamo then tries to compile those frames: it meets ``sys._getframe``,
``time.perf_counter`` or ``threading.get_ident``, counts graph breaks at ``probe/hooks.py``, warns on
the job's stderr and adds frames and guards the job would not have without the probe.

``hide(fn)`` marks the code object of ``fn`` with Dynamo's per-code execution strategy
(``torch._C._dynamo.eval_frame.set_code_exec_strategy``, private; feature-detected): the frame is
never handed to Dynamo (SKIP). ``recursive=True`` (the probe's own callbacks, which only call probe
code) skips the frames they start too; a shim calls the user's torch function and passes
``recursive=False``, so what that function calls is seen by Dynamo exactly as without the probe.

Inlining is a separate path: when Dynamo *traces* a call (a module hook inside a compiled
forward, an optimizer hook inside a compiled ``step``), the strategy does not apply, so every hook
that can be traced starts with ``if is_compiling(): return`` (folded to a constant by Dynamo).

Applied as soon as torch is imported (the C functions exist without ``torch._dynamo``); a torch
without them loses nothing else, and says so once in ``probe_errors``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import CodeType
from typing import Any, TypeVar

from torchdoctor.probe.errors import ERRORS

F = TypeVar("F", bound=Callable[..., Any])

_pending: list[tuple[CodeType, bool]] = []
_hidden: set[tuple[CodeType, bool]] = set()
_missing = False  # this torch has no per-code strategy: stop trying


def _code_of(fn: Any) -> CodeType | None:
    fn = getattr(fn, "__func__", fn)  # bound methods
    code = getattr(fn, "__code__", None)
    return code if isinstance(code, CodeType) else None


def hide(fn: F, recursive: bool = True) -> F:
    """Mark ``fn``'s code so that Dynamo never evaluates its frames; returns ``fn`` unchanged."""
    code = _code_of(fn)
    if code is not None and not _missing and (code, recursive) not in _hidden:
        _pending.append((code, recursive))
        apply_pending()
    return fn


def hide_all(*fns: Any) -> None:
    """``hide`` each of ``fns`` (recursively); None entries are ignored."""
    for fn in fns:
        if fn is not None:
            hide(fn)


def apply_pending() -> None:
    """Apply the marks requested so far, once torch is imported; never raises."""
    global _missing
    torch = sys.modules.get("torch")
    if torch is None or not _pending:
        return
    try:
        eval_frame = torch._C._dynamo.eval_frame
        action, strategy = eval_frame._FrameAction, eval_frame._FrameExecStrategy
        setter = eval_frame.set_code_exec_strategy
    except Exception:
        _missing = True
        _pending.clear()
        ERRORS.note("torch.compile may trace the probe: no per-code Dynamo strategy on this torch")
        return
    while _pending:
        code, recursive = _pending.pop()
        try:
            setter(code, strategy(action.SKIP, action.SKIP if recursive else action.DEFAULT))
            _hidden.add((code, recursive))
        except Exception as exc:
            ERRORS.record("unseen", exc)
            return


def compiling() -> Callable[[], bool]:
    """``torch.compiler.is_compiling`` of the imported torch, or a function that says False."""
    compiler = getattr(sys.modules.get("torch"), "compiler", None)
    return getattr(compiler, "is_compiling", None) or _never


def _never() -> bool:
    return False


def in_job_mode(torch: Any) -> bool:
    """The job runs under a torch dispatch or torch-function mode of its own (a FlopCounterMode, a
    FakeTensorMode, ``with torch.device(...)``): any op of the probe's would run through it."""
    modes = (getattr(torch._C, "_len_torch_dispatch_stack", None), getattr(torch._C, "_len_torch_function_stack", None))
    return any(count is not None and count() for count in modes)
