"""A progress bar over ranks on stderr (rich), shown only on an interactive terminal."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def rank_progress(total: int, label: str, enabled: bool | None = None) -> Iterator[Callable[[int], None]]:
    """A callback advancing a bar of `total` ranks; a no-op off a terminal, when disabled or for one rank."""
    show = (sys.stderr.isatty() if enabled is None else enabled) and total > 1
    if not show:
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)
