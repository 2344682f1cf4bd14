"""The typer application object and the error boundary shared by every command module.

Command modules (``dataprep/cli/*.py``) register on :data:`app`; ``dataprep.cli``
imports them all. Commands parse options and call a library function, nothing more.
"""

from __future__ import annotations

import functools
import math
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from rich.console import Console

from manifests.errors import DataprepError

app = typer.Typer(
    name="dataprep",
    help=(
        "Offline data preparation for speech model training: compile manifests, measure "
        "durations / tokens / TPS, filter outliers, fit 2D buckets, size batches and "
        "compile rank-synchronized batch schedules that any trainer reads."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

#: Tables and reports go to stdout; progress and errors to stderr.
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

F = TypeVar("F", bound=Callable[..., Any])


def _terminated(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second TERM kills at once
    sys.exit(128 + signum)


def _exit_on_sigterm() -> Any:
    """While a command runs, SIGTERM (a scheduler's kill, ``timeout``) exits through Python's
    normal unwinding (status 143), so every ``finally`` runs: temporary files and spool folders
    are removed and child ranks stopped (SIGKILL cannot be caught: the next run sweeps its
    litter). Returns the previous handler (``None`` off the main thread, where none is set)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.signal(signal.SIGTERM, _terminated)
    return signal.SIG_DFL if previous is None else previous  # None: a handler not set from Python


def user_errors(fn: F) -> F:
    """Turn :class:`DataprepError` (and missing files) into ``error: ...`` and exit 2; SIGTERM
    into a clean exit (status 143) that removes temporary files."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        previous = _exit_on_sigterm()
        try:
            return fn(*args, **kwargs)
        except DataprepError as exc:
            err.print(f"[bold red]error:[/] {exc}", markup=True)
            raise typer.Exit(2) from None
        except FileNotFoundError as exc:
            err.print(f"[bold red]error:[/] {exc.filename or exc}: no such file", markup=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            err.print("interrupted")
            sys.exit(130)
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)

    return wrapper  # type: ignore[return-value]


def check_range(option: str, value: float | int | None, *, ge: float | None = None, gt: float | None = None,
                le: float | None = None) -> None:
    """Refuse an option value outside its range (and any NaN / infinity) with one line,
    ``error: --option: must be ...``, exit 2 (through :func:`user_errors`). ``None`` (not given) passes."""
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise DataprepError(f"{option}: must be a finite number, got {value}")
    if ge is not None and value < ge:
        raise DataprepError(f"{option}: must be >= {ge:g}, got {value:g}")
    if gt is not None and value <= gt:
        raise DataprepError(f"{option}: must be > {gt:g}, got {value:g}")
    if le is not None and value > le:
        raise DataprepError(f"{option}: must be <= {le:g}, got {value:g}")


def alias(option: str, value: Any, old: str, old_value: Any) -> Any:
    """The value of ``option`` given under it or under its hidden old name ``old`` (one line if both)."""
    if old_value is None:
        return value
    if value is not None:
        raise DataprepError(f"{old} is the old name of {option}: give one of them")
    return old_value


def parse_world_sizes(option: str, text: str) -> list[int]:
    """``"8,32,128"`` -> ``[8, 32, 128]``; one line for anything else (every size >= 1)."""
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise DataprepError(f"{option}: expected integers, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise DataprepError(f"{option}: expected integers >= 1, got {text!r}")
    return sizes
