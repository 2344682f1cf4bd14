"""``torchrun --nproc-per-node N -m dataprep.training PLAN --manifest ...``: one training rank
per process, with the options of ``dataprep train`` (``python -m dataprep.training`` runs
the same command without torchrun, spawning ``--nproc`` ranks itself).

Only the ``train`` command is built here, from :func:`dataprep.cli.train.train_cmd`; that
command imports :mod:`dataprep.training` lazily and nothing in :mod:`dataprep.cli` imports
this module, so the library is loaded once (this file runs as ``__main__``, the library
modules under their own names).
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    """Parse ``argv`` (default: ``sys.argv[1:]``) as ``dataprep train``'s arguments and run it."""
    import typer

    from dataprep.cli.train import train_cmd

    cli = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode="rich")
    cli.command("train")(train_cmd)
    cli(args=sys.argv[1:] if argv is None else argv, prog_name="dataprep.training")


if __name__ == "__main__":
    main()
