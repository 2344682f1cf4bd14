"""The one exception family users see: a one-line message naming the file (and line)."""


class DataprepError(Exception):
    """An error in the user's input or options. ``str(exc)`` is one line; the CLI prints it
    as ``error: ...`` and exits with status 2, never with a traceback."""


class ManifestError(DataprepError, ValueError):
    """A manifest, plan or buckets file that cannot be used."""


class OptionError(DataprepError, ValueError):
    """An option (a field of an options object: ``PlanOptions``, ``TrainConfig``,
    ``OomOptions``, ...) out of its range. ``field`` names it; the CLI shows the flag instead
    (``--world-size: must be >= 1, got 0``)."""

    def __init__(self, field: str, problem: str) -> None:
        self.field, self.problem = field, problem
        super().__init__(f"{field}: {problem}")
