"""The short torch.profiler window the probe records in steady state.

The window covers steps A <= s < B. It starts at the boundary that closes step A-1 and stops at
the boundary that closes step B-1, calling ``prof.step()`` in between, so the trace holds
``ProfilerStep#A`` ... ``ProfilerStep#B-1`` aligned with the probe's own step numbers.
Shapes and stacks are not recorded (``record_shapes=False``) to keep the cost and the file small.
The trace is written with ``export_chrome_trace`` to ``traces/rank{R}.json``; a detached child
compresses it to ``rank{R}.json.gz`` and analyses it (probe/postprocess.py).

Kineto writes status lines ("USDT:... profiler_start") straight to file descriptor 2; while the
probe starts and stops the profiler, fd 2 goes to a temporary file and everything but those lines
is copied back, so the job's stderr stays as it would be without the probe.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

_KINETO_LINE = re.compile(
    rb"^(USDT|STAGE|ERROR|WARNING|INFO):\d{4}-\d\d-\d\d [^\n]*\.cpp:\d+\][^\n]*\n?", re.M
)


@contextlib.contextmanager
def kineto_quiet() -> Iterator[None]:
    """Drop Kineto's own status lines from fd 2 for the duration of the block."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            rest = _KINETO_LINE.sub(b"", tmp.read())
            if rest:
                os.write(2, rest)


def _profiler_running(torch: Any) -> bool:
    if getattr(torch.autograd.profiler, "_is_profiler_enabled", False):
        return True
    enabled = getattr(torch._C._autograd, "_profiler_enabled", None)
    return bool(enabled()) if enabled is not None else False


def _record_always(step: int) -> Any:
    from torch.profiler import ProfilerAction

    return ProfilerAction.RECORD


@contextlib.contextmanager
def unshown_warnings() -> Iterator[None]:
    """Warnings raised inside are not printed, and warnings.filters is left alone.

    Not `warnings.catch_warnings()`: entering it resets the filters, and with them Python's record of
    the warnings each module has already shown, so a job's "shown once" warning (every DataLoader or
    DDP UserWarning) printed again after the window (pytorch/examples' DDP tutorial under `run`).
    """
    shown = warnings.showwarning
    warnings.showwarning = _unshown
    try:
        yield
    finally:
        warnings.showwarning = shown


def _unshown(*_args: Any, **_kwargs: Any) -> None:
    return None


# Wall seconds of steps one window profiles at most (at least one step): profiling slows a step
# and its trace grows with it, so a job of 30 s steps (LBFGS over a long sequence: 300,000 ops a
# step, a 135 MB compressed trace) has one step profiled, not three.
WINDOW_BUDGET_S = 5.0


class ProfilerWindow:
    """One torch.profiler session over steps [start, end)."""

    def __init__(self, start: int, end: int) -> None:
        self.start_step = start
        self.end_step = end
        self.prof: Any = None
        self.done = False  # the window ran (or was given up); never start it again

    @property
    def active(self) -> bool:
        return self.prof is not None

    def fit(self, recent_step_ms: list[float]) -> None:
        """Profile fewer steps when the recent ones are long (WINDOW_BUDGET_S of them at most)."""
        if not recent_step_ms:
            return
        typical_s = sorted(recent_step_ms)[len(recent_step_ms) // 2] / 1e3
        if typical_s > 0:
            self.end_step = min(self.end_step, self.start_step + max(1, int(WINDOW_BUDGET_S // typical_s)))

    def begin(self, torch: Any) -> None:
        """Start profiling; the step about to run is ``start_step``."""
        from torch.profiler import ProfilerActivity, profile

        if _profiler_running(torch):  # the job profiles itself: do not interfere
            self.done = True
            raise WindowSkipped(OWN_PROFILER, own_profiler=True)
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        # torch's own warnings about the profiler (2.11 warns that events are cleared each
        # cycle) would change the job's stderr: the probe's profiler must be silent.
        with unshown_warnings():
            prof = profile(activities=activities, record_shapes=False, schedule=_record_always)
            prof.step_num = self.start_step  # ProfilerStep#N then matches the probe's step N
            with kineto_quiet():
                prof.start()
        self.prof = prof

    def next_step(self) -> None:
        with unshown_warnings():
            self.prof.step()

    def finish(self, path: str) -> str:
        """Stop profiling and write the plain JSON trace to ``path``; return it.

        Compression and analysis happen elsewhere (probe/postprocess.py): only what needs the
        profiler's state runs on the training thread.
        """
        prof, self.prof = self.prof, None
        self.done = True
        with unshown_warnings(), kineto_quiet():
            prof.stop()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        prof.export_chrome_trace(path)
        return path

    def abort(self) -> None:
        """Stop without writing anything (another profiler needs Kineto, or steps were renumbered)."""
        prof, self.prof = self.prof, None
        self.done = True
        if prof is not None:
            with kineto_quiet():
                prof.stop()


OWN_PROFILER = "the job runs its own profiler"


class WindowSkipped(Exception):
    """The window is skipped on purpose (not a probe error); ``own_profiler``: because the job
    profiles itself (the report then points at the job's own traces)."""

    def __init__(self, reason: str, own_profiler: bool = False) -> None:
        super().__init__(reason)
        self.own_profiler = own_profiler
