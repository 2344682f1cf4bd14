"""Progress bars on stderr (rich), quiet when stderr is not a terminal unless forced."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from dataprep.cli.app import err


@contextlib.contextmanager
def progress_counter(description: str, total: int | None = None) -> Iterator[Callable[..., None]]:
    """Yield ``advance(n, description=None)``; shows a bar (or a counter when ``total`` is
    unknown) on stderr, only when stderr is a terminal."""
    columns = [SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn()]
    with Progress(*columns, console=err, transient=True, disable=not err.is_terminal) as bar:
        task = bar.add_task(description, total=total)

        def advance(n: int, description: str | None = None) -> None:
            bar.update(task, advance=n, description=description or bar.tasks[0].description)

        yield advance
