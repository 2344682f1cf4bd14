"""Atomic file writes, the writer's temporary-file litter and advisory file locks.

Every file the toolchain writes goes through :func:`atomic_path`: the data is written to a
temporary file in the destination folder (``.<name>.<pid>.*.tmp``) and renamed over the
target, so a crash never leaves a half-written manifest, rejects file or plan; the next write
next to it sweeps a killed writer's litter (:func:`sweep_stale_temps`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from manifests.errors import ManifestError


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


def sweep_stale_temps(target: str | os.PathLike[str], suffixes: tuple[str, ...] = (".tmp", ".spool", ".old")) -> int:
    """Remove the temporary files / folders a killed writer of ``target`` left next to it
    (``.<name>.<pid>.*<suffix>`` whose pid is no longer running on this machine); returns how many.
    Called before every atomic write, so litter lasts only until the next run."""
    t = Path(target)
    removed = 0
    if not t.parent.is_dir():
        return 0
    for p in t.parent.glob(f".{glob_escape(t.name)}.*"):
        rest = p.name[len(t.name) + 2:]
        pid_text, _, tail = rest.partition(".")
        if not pid_text.isdigit() or not tail.endswith(suffixes) or _pid_alive(int(pid_text)):
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


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], *, fsync: bool = True) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it over ``path`` on success.

    On an exception the temporary file is removed and ``path`` is left untouched.
    ``fsync=False``: the caller flushes the file before the rename (e.g. many files at once,
    :func:`fsync_file` from several threads: a flush of the disk's journal serves them all).
    """
    target = Path(path)
    if target.is_dir():  # os.replace would fail at the very end, after the work
        raise ManifestError(f"{target}: is an existing directory; give a file path")
    target.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_temps(target)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(target), suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        if fsync:
            fsync_file(tmp_path)
        os.chmod(tmp_path, 0o666 & ~_UMASK)  # mkstemp makes 0600; outputs are ordinary files
        os.replace(tmp_path, target)
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
