"""Atomic file writes, the writer's temporary-file litter and advisory file locks.

Every file the toolchain writes goes through :func:`atomic_path`: the data is written to a
temporary file in the destination folder (``.<name>.<pid>.*.tmp``) and renamed over the
target, so a crash never leaves a half-written manifest, rejects file or plan; the next write
next to it sweeps a killed writer's litter (:func:`sweep_stale_temps`). A target that is not a
regular file is never replaced (:func:`output_kind`): a character device or a pipe
(``/dev/null``, ``/dev/full``, ``/dev/stdout``) and the process's own stdout / stderr are
written through once the data is complete; a block device or a socket is refused. An OS error
at the output (full disk, read-only file system, permission, ...) is one line naming it
(:class:`manifests.errors.OutputError`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import socket
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from manifests.errors import ManifestError, OutputError, os_error_line


def current_umask() -> int:
    """The process umask (read without changing it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = current_umask()


def temp_prefix(target: Path) -> str:
    """Name prefix of this process's temporary files and folders for ``target``:
    ``.<name>.<pid>.`` (the pid lets the next run tell a killed writer's litter from a live one's)."""
    return f".{target.name}.{os.getpid()}."


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # another user's process (or not a pid we can ask about): leave its files
    return True


#: the file every spill folder holds (:func:`make_owned_dir`): who made it, so a later run
#: removes only folders this tool made, on this machine, for a process no longer running
OWNER_FILE = ".dataprep-owner"


def make_owned_dir(target: str | os.PathLike[str], suffix: str) -> Path:
    """A fresh private folder ``.<name>.<pid>.*<suffix>`` next to ``target`` holding
    :data:`OWNER_FILE` (this host and pid): what :func:`sweep_stale_temps` removes once its
    process is gone (a ``kill -9``)."""
    t = Path(target)
    staging = Path(tempfile.mkdtemp(prefix=temp_prefix(t), suffix=".tmp", dir=t.parent))  # swept as a temp
    (staging / OWNER_FILE).write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}) + "\n")
    folder = staging.with_name(staging.name.removesuffix(".tmp") + suffix)
    os.rename(staging, folder)  # a kill at any point leaves a temp or an owned folder, both swept
    return folder


def _owned_here(folder: Path, pid: int) -> bool:
    """Whether ``folder`` carries this tool's owner file naming this host and ``pid``."""
    try:
        owner = json.loads((folder / OWNER_FILE).read_text())
        return bool(owner["host"] == socket.gethostname() and owner["pid"] == pid)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def sweep_stale_temps(target: str | os.PathLike[str],
                      suffixes: tuple[str, ...] = (".tmp", ".spool", ".old", ".spill")) -> int:
    """Remove the temporary files / folders a killed writer of ``target`` left next to it
    (``.<name>.<pid>.*<suffix>`` whose pid is no longer running on this machine; a ``.spill``
    folder only when it carries :data:`OWNER_FILE` naming this host and that pid); returns how
    many. Called before every atomic write and spill, so litter lasts only until the next run."""
    t = Path(target)
    removed = 0
    if not t.parent.is_dir():
        return 0
    for p in t.parent.glob(f".{glob_escape(t.name)}.*"):
        rest = p.name[len(t.name) + 2:]
        pid_text, _, tail = rest.partition(".")
        if not pid_text.isdigit() or not tail.endswith(suffixes) or _pid_alive(int(pid_text)):
            continue
        if tail.endswith(".spill") and not (p.is_dir() and not p.is_symlink() and _owned_here(p, int(pid_text))):
            continue
        with contextlib.suppress(OSError):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
            removed += 1
    return removed


def glob_escape(name: str) -> str:
    """``name`` with glob metacharacters escaped."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Flush a written file's bytes to disk."""
    with open(path, "rb+") as fh:
        os.fsync(fh.fileno())


#: errors of writing data that no input read raises: the body's error is the output's
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})


def _std_stream(st: os.stat_result) -> int | None:
    """The descriptor (1, 2) of this process's stdout / stderr when ``st`` is that file."""
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            other = os.fstat(fd)
            if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
                return fd
    return None


def output_kind(path: str | os.PathLike[str], option: str | None = None) -> str:
    """How an output at ``path`` is written: ``"file"`` (a new or regular file: temporary file
    and rename) or ``"through"`` (a character device, a pipe, or this process's stdout /
    stderr: written into, never replaced). An existing directory, a block device or a
    socket: one line (``option`` names the flag in it)."""
    label = os.fsdecode(path) + (f": {option}" if option else "")
    name = label + ": "
    try:
        st = os.stat(path)  # links followed: /dev/stdout is the file or pipe it names
    except FileNotFoundError:
        return "file"
    except OSError as exc:
        raise OutputError(os_error_line(exc, label)) from None
    if stat.S_ISREG(st.st_mode):
        return "through" if _std_stream(st) is not None else "file"
    if stat.S_ISDIR(st.st_mode):
        raise ManifestError(f"{name}is an existing directory; give a file path")
    if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
        return "through"
    kind = "a block device" if stat.S_ISBLK(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "special"
    raise ManifestError(f"{name}is {kind}, not a regular file; refusing to write to it (give a file path)")


def _write_through(tmp: Path, target: Path) -> None:
    """Copy the finished ``tmp`` into ``target`` (a device, a pipe, our stdout), no rename."""
    st = os.stat(target)
    fd = _std_stream(st)
    with open(tmp, "rb") as src:
        if fd is not None:  # our own stdout / stderr: after what was printed, through our descriptor
            (sys.stdout if fd == 1 else sys.stderr).flush()
            while block := src.read(1 << 20):
                view = memoryview(block)
                while view:
                    view = view[os.write(fd, view):]
            return
        with open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], *, fsync: bool = True) -> Iterator[Path]:
    """Yield a temporary path for ``path``; on success rename it over ``path`` (or write it
    through, :func:`output_kind`).

    On an exception the temporary file is removed and ``path`` is left untouched; an OS error
    at the output (the body's, when it names the temporary file or is a full disk / read-only
    file system, and every one of the rename) is raised as one line naming ``path``
    (:class:`manifests.errors.OutputError`).
    ``fsync=False``: the caller flushes the file before the rename (e.g. many files at once,
    :func:`fsync_file` from several threads: a flush of the disk's journal serves them all).
    """
    target = Path(path)
    through = output_kind(target) == "through"
    try:
        if through:  # never litter /dev: the data waits in the temporary folder
            fd, tmp = tempfile.mkstemp(prefix=f"dataprep-{os.getpid()}.", suffix=".tmp")
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            sweep_stale_temps(target)
            fd, tmp = tempfile.mkstemp(prefix=temp_prefix(target), suffix=".tmp", dir=target.parent)
        os.close(fd)
    except OSError as exc:
        raise OutputError(os_error_line(exc, target)) from None
    tmp_path = Path(tmp)
    try:
        try:
            yield tmp_path
        except OSError as exc:
            if isinstance(exc, OutputError) or not (exc.filename in (tmp, str(tmp_path))
                                                    or (exc.filename is None and exc.errno in _WRITE_ERRNOS)):
                raise
            raise OutputError(os_error_line(exc, target)) from None
        try:
            if through:
                _write_through(tmp_path, target)
                return
            if fsync:
                fsync_file(tmp_path)
            os.chmod(tmp_path, 0o666 & ~_UMASK)  # mkstemp makes 0600; outputs are ordinary files
            os.replace(tmp_path, target)
        except OSError as exc:
            raise OutputError(os_error_line(exc, target)) from None
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_json(obj: Any, path: str | os.PathLike[str]) -> None:
    """Write ``obj`` as indented, key-sorted JSON, atomically (byte-stable for equal input)."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


@contextlib.contextmanager
def file_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """Exclusive advisory lock on ``path`` (POSIX ``flock``), created with its folder. Where
    there is no lock (not POSIX, a read-only folder) it does nothing: the callers publish
    atomically anyway, so a lost lock only costs duplicated work."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fh = open(path, "a+b")
    except OSError:
        yield
        return
    with fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
