"""The one exception family users see: a one-line message naming the file (and line)."""


class DataprepError(Exception):
    """An error in the user's input or options. ``str(exc)`` is one line; the CLI prints it
    as ``error: ...`` and exits with status 2, never with a traceback."""


class ManifestError(DataprepError, ValueError):
    """A manifest, plan or buckets file that cannot be used."""
