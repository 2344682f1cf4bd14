"""The ``dataprep`` command line: one module per command group, each registering its
commands on :data:`dataprep.cli.app.app`. Commands parse options, call a library function
and print; everything they do can be done from Python without them."""

from __future__ import annotations

import functools
from typing import Any

import typer

from dataprep.cli import buckets  # noqa: F401  (fit-buckets, padding)
from dataprep.cli import calibrate  # noqa: F401  (calibrate)
from dataprep.cli import compile  # noqa: F401  (train-tokenizer, compile, merge)
from dataprep.cli import export  # noqa: F401  (export nemo|lhotse)
from dataprep.cli import html_report  # noqa: F401  (report)
from dataprep.cli import lookup  # noqa: F401  (lookup)
from dataprep.cli import oom  # noqa: F401  (oomptimize)
from dataprep.cli import plan  # noqa: F401  (plan-batches, simulate)
from dataprep.cli import report  # noqa: F401  (stats, filter)
from dataprep.cli import train  # noqa: F401  (train)
from dataprep.cli.app import app

__all__ = ["app", "command", "main"]


@functools.cache
def command() -> Any:
    """The click command of :data:`app`, built once per process (typer builds it anew at each
    ``app()``: about 70 ms, every option's annotation evaluated again)."""
    return typer.main.get_command(app)


def main() -> None:
    """The ``dataprep`` script: :func:`command` run on ``sys.argv``, as ``app()`` would."""
    command()()
