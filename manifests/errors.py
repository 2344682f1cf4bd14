"""The one exception family users see: a one-line message naming the file (and line).

:func:`os_error_line` words any :class:`OSError` at a path as that one line (a full disk, a
read-only file system, a permission, a name too long, ...): the CLI's error boundary and the
atomic writer (:mod:`manifests.atomic_files`) both use it, so every OS error reads the same.
"""

from __future__ import annotations

import errno
import os


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


class OutputError(DataprepError, OSError):
    """The operating system refused to write an output (full disk, read-only file system,
    permission, ...); the message names the output as the user gave it."""


#: what an errno means for the user, where the system's wording is not enough
_HINTS = {
    errno.ENOSPC: "no space left on the device; nothing was half-written: free some, or write to a larger disk",
    errno.EDQUOT: "no space left on the device (disk quota exceeded); nothing was half-written: free some, "
                  "or write to a larger disk",
    errno.EROFS: "read-only file system; write somewhere writable",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENAMETOOLONG: "file name too long",
    errno.ENOTDIR: "a part of the path is not a folder",
    errno.EEXIST: "exists and is not a folder (one is needed here)",
    errno.EISDIR: "is a directory; give a file path",
    errno.ENOENT: "no such file or directory",
    errno.EFBIG: "file too large for the file system",
    errno.ELOOP: "too many levels of symbolic links",
}


def os_error_line(exc: OSError, path: str | os.PathLike[str] | None = None) -> str:
    """One line for ``exc``: ``PATH: what went wrong`` (``path`` where given, else the
    error's own file name), never the error's multi-line text."""
    where = path if path is not None else exc.filename
    what = _HINTS.get(exc.errno) if exc.errno is not None else None
    if what is None:
        what = (exc.strerror or str(exc) or type(exc).__name__).splitlines()[0] if exc.args else type(exc).__name__
        what = what[0].lower() + what[1:] if what[:1].isupper() and what[1:2].islower() else what
    return f"{os.fsdecode(where)}: {what}" if where is not None else what
