"""``python -m dataprep.cli``: the same command line as the ``dataprep`` script."""

from dataprep.cli import main

main()
