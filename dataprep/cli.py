"""The ``dataprep`` command line. Each ``commands_*`` module registers its commands on ``app``."""

from __future__ import annotations

from dataprep.cli_app import app
from dataprep import commands_prep  # noqa: F401  (train-tokenizer, compile)
from dataprep import commands_report  # noqa: F401  (stats, filter)
from dataprep import commands_buckets  # noqa: F401  (fit-buckets, padding)
from dataprep import commands_plan  # noqa: F401  (plan-batches, simulate)
from dataprep import commands_train  # noqa: F401  (train, export nemo|lhotse)
from dataprep import commands_oom  # noqa: F401  (oomptimize)

__all__ = ["app", "main"]


def main() -> None:
    app()


if __name__ == "__main__":
    main()
