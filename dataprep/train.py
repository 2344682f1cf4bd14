"""Compatibility entry point: ``torchrun -m dataprep.train ...`` runs ``-m dataprep.training``.

The training code lives in :mod:`dataprep.training`; this module only forwards the command line.
"""

if __name__ == "__main__":
    from dataprep.training.__main__ import main

    main()
