"""The typer application object and the error boundary shared by every command module.

Command modules (``dataprep/cli/*.py``) register on :data:`app`; ``dataprep.cli``
imports them all. Commands parse options and call a library function, nothing more.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import types
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console, ConsoleDimensions
from rich.text import Text
from typer.core import TyperGroup

from dataprep.cli import fmt  # noqa: F401  (--help shows no type for plain flags)
from manifests.errors import DataprepError, OptionError, os_error_line
from manifests.optional import missing_dependency
from manifests.options import check_number
from manifests.units import machine_memory, parse_bytes

#: ``dataprep --help`` lists the commands in the order a corpus goes through them (README's table)
PIPELINE_ORDER = ("train-tokenizer", "compile", "merge", "pack", "stats", "filter", "report", "fit-buckets",
                  "padding", "oomptimize", "plan-batches", "simulate", "replan", "verify", "lookup", "train",
                  "calibrate", "export")


class _PipelineGroup(TyperGroup):
    """The top-level group: its commands listed in :data:`PIPELINE_ORDER` (any other last)."""

    def list_commands(self, ctx: Any) -> list[str]:
        rank = {name: i for i, name in enumerate(PIPELINE_ORDER)}
        return sorted(super().list_commands(ctx), key=lambda name: rank.get(name, len(rank)))


app = typer.Typer(
    cls=_PipelineGroup,
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

#: Width of a line written off a terminal: wide enough that no table ever cuts a figure
OFF_TERMINAL_WIDTH = 10_000


class _Console(Console):
    """A rich console as wide as its lines off a terminal (a pipe, a file, CI, Slurm; colours
    forced or not): tables keep every figure whole there instead of fitting 80 columns (or
    $COLUMNS); on a terminal, its width."""

    @property
    def size(self) -> ConsoleDimensions:
        dims = super().size
        return dims if self._on_a_terminal() else ConsoleDimensions(OFF_TERMINAL_WIDTH, dims.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size

    def _on_a_terminal(self) -> bool:
        isatty = getattr(self.file, "isatty", None)
        try:
            return bool(isatty is not None and isatty())
        except ValueError:  # a closed file
            return False


#: Tables and reports go to stdout; progress and errors to stderr. No console markup: what is
#: printed holds user text (paths, corpus names), shown as given even with ``[`` in it.
out = _Console(highlight=False, soft_wrap=True, markup=False)
err = _Console(stderr=True, highlight=False, soft_wrap=True, markup=False)


def _version() -> str:
    """The installed package's version (its metadata), else the source tree's."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("speech-dataprep")
    except PackageNotFoundError:
        from dataprep import __version__

        return __version__


def _print_version(value: bool) -> None:
    if value:
        out.print(f"speech-dataprep {_version()}")
        raise typer.Exit()


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                                help="Print the version and exit.")] = False) -> None:
    pass

F = TypeVar("F", bound=Callable[..., Any])
O = TypeVar("O")


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


def print_error(message: object) -> None:
    """Print ``error: MESSAGE`` on stderr, one line: ``message`` is shown as given (paths and
    corpus names holding ``[`` are user text, never console markup), a character that is not
    printable (a newline in a file name) as its escape."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(message))
    err.print(Text.assemble(("error:", "bold red"), " ", text))


def user_errors(fn: F) -> F:
    """Turn :class:`DataprepError` and every OS error (a missing file, a full disk, a read-only
    file system, a permission, ...) into one line ``error: ...`` and exit 2; SIGTERM into a
    clean exit (status 143) that removes temporary files."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        previous = _exit_on_sigterm()
        try:
            from dataprep.cli.urls import url_arguments  # s3:// gs:// az:// path arguments

            with _missing_extras(), url_arguments(kwargs, out.print) as local_kwargs:
                return fn(*args, **local_kwargs)
        except DataprepError as exc:
            print_error(exc)
            raise typer.Exit(2) from None
        except FileNotFoundError as exc:
            print_error(f"{exc.filename or exc}: no such file")
            raise typer.Exit(2) from None
        except OSError as exc:  # at an output, what was being written is a temp file, removed
            print_error(os_error_line(exc))
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            err.print("interrupted")
            sys.exit(130)
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)

    return wrapper  # type: ignore[return-value]


@contextlib.contextmanager
def _missing_extras() -> Iterator[None]:
    """Inside, an optional module found missing (lhotse, torch, ...: :data:`manifests.optional.INSTALL`)
    comes out as the one-line :class:`~manifests.optional.MissingDependency` naming what to install."""
    try:
        yield
    except ImportError as exc:
        missing = missing_dependency(exc, "this command")
        if missing is None:
            raise
        raise missing from None


def flag_of(field: str, flags: Mapping[str, str] | None = None) -> str:
    """The command-line flag of an options field: ``flags[field]``, else ``--field-name``."""
    return (flags or {}).get(field) or "--" + field.replace("_", "-")


@contextlib.contextmanager
def option_flags(flags: Mapping[str, str] | None = None) -> Iterator[None]:
    """Inside, an :class:`OptionError` (a library options check) comes out naming the flag
    (``flags``: field -> flag where the flag is not ``--field-name``), e.g.
    ``error: --world-size: must be >= 1, got 0``."""
    try:
        yield
    except OptionError as exc:
        raise DataprepError(f"{flag_of(exc.field, flags)}: {exc.problem}") from None


def build_options(cls: Callable[..., O], flags: Mapping[str, str] | None = None, /, **values: Any) -> O:
    """``cls(**values)``, an options object that checks its own ranges, its errors naming the
    flag (:func:`option_flags`)."""
    with option_flags(flags):
        return cls(**values)


def defaults_of(cls: type) -> Any:
    """The dataclass ``cls``'s defaults by field name (``defaults_of(TrainConfig).lr``): the CLI
    shows and uses these, so a default lives once, in the options object."""
    values = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
    return types.SimpleNamespace(**values)


def check_range(option: str, value: float | int | None, *, ge: float | None = None, gt: float | None = None,
                le: float | None = None) -> None:
    """Refuse a flag no options object holds when outside its range (and any NaN / infinity)
    with one line, ``error: --option: must be ...``, exit 2 (through :func:`user_errors`); the
    checks of :mod:`manifests.options`. ``None`` (not given) passes."""
    try:
        check_number(option, value, ge=ge, gt=gt, le=le, optional=True)
    except OptionError as exc:
        raise DataprepError(str(exc)) from None


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


def parse_memory_limit(text: str) -> int:
    """``--memory-limit``'s value (``4GiB``, ``512MB``, bytes, ``50%`` of the machine's memory) in
    bytes, or a one-line error."""
    return parse_bytes(text, machine_memory(), flag="--memory-limit", of="the machine's memory")
