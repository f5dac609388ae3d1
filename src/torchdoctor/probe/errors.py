"""Fail-safety: probe problems are logged once and recorded; the job never sees them.

A probe error is any exception raised by torchdoctor's own code inside the user's process.
It is written once per site to stderr as ``torchdoctor: ...`` and kept in ``RankFacts.probe_errors``;
the hook that raised is then skipped from then on (its site is marked broken).
"""

from __future__ import annotations

import sys

_MAX_ERRORS = 50


class ProbeErrors:
    """The probe errors of this process, one entry per site."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self.broken: set[str] = set()

    def record(self, where: str, exc: BaseException) -> None:
        """Remember the first error of site ``where`` and say so once on stderr."""
        if where in self.broken:
            return
        self.broken.add(where)
        message = f"{where}: {type(exc).__name__}: {exc}"
        if len(self.messages) < _MAX_ERRORS:
            self.messages.append(message)
        try:
            sys.stderr.write(f"torchdoctor: probe error in {message} (the job carries on unchanged)\n")
            sys.stderr.flush()
        except Exception:  # stderr closed: nothing more we can do, and the job must not notice
            pass

    def note(self, message: str) -> None:
        """Record a probe limitation that is not an exception (no stderr output)."""
        if message not in self.messages and len(self.messages) < _MAX_ERRORS:
            self.messages.append(message)

    def reset(self) -> None:
        # In place: the hooks hold `broken` by reference (hooks.BROKEN).
        self.messages.clear()
        self.broken.clear()


ERRORS = ProbeErrors()
_faults: frozenset[str] = frozenset()


def set_fault(names: str | None) -> None:
    """Arm the test-only fault injection: ``TORCHDOCTOR_PROBE_FAULT`` is a comma list of sites."""
    global _faults
    _faults = frozenset(n.strip() for n in (names or "").split(",") if n.strip())


def fault_point(where: str) -> None:
    """Raise inside probe site ``where`` when a test asked for it; free otherwise."""
    if _faults and where in _faults:
        raise RuntimeError(f"injected probe fault at {where}")
