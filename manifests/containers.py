"""Audio inside containers: tar shards indexed in place, NeMo's brace syntax, ranged reads.

A tar member is addressed by (tar path, byte offset of its data, size): :func:`index_tar` lists
them from the headers alone (the data is skipped, never read), :func:`read_range` fetches one
member with a single ``pread`` and :class:`RangeFile` is a read-only, seekable file object over
a byte range of a file (what ``soundfile`` needs to read a header in place, without extracting
the member or reading all of it). :func:`expand_braces` expands NeMo's sharded-path syntax
(``audio__OP_0..7_CL_.tar`` = ``audio_{0..7}.tar``).
"""

from __future__ import annotations

import io
import os
import re
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO

from manifests import storage, store_facts, store_scan

from manifests.errors import DataprepError

#: audio file extensions recognised inside WebDataset / Shar tars
AUDIO_EXTENSIONS: tuple[str, ...] = ("flac", "wav", "mp3", "opus", "ogg", "sph", "aiff", "aif")

_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")


#: Most paths one brace pattern may name (a typo such as ``{0..999999999}``, not a corpus).
MAX_BRACE_PATHS = 2**20


def _first_brace(pattern: str) -> tuple[str, list[str] | tuple[int, int, int], str] | None:
    """(head, items or (lo, hi, zero-pad width) of a range, tail) of the first brace; None if none."""
    start = pattern.find("{")
    if start < 0:
        return None
    end = pattern.find("}", start)
    if end < 0:
        raise DataprepError(f"{pattern}: unbalanced brace")
    body, head, tail = pattern[start + 1:end], pattern[:start], pattern[end + 1:]
    m = _RANGE.match(body)
    if m:
        width = len(m.group(1)) if m.group(1).startswith("0") and len(m.group(1)) > 1 else 0
        return head, (int(m.group(1)), int(m.group(2)), width), tail
    return head, body.split(","), tail


def _brace_count(pattern: str) -> int:
    """How many paths ``pattern`` names, counted without expanding it (items are counted as
    plain text: a brace inside a list item is not multiplied)."""
    n = 1
    while (parts := _first_brace(pattern)) is not None:
        _, items, pattern = parts
        n *= abs(items[1] - items[0]) + 1 if isinstance(items, tuple) else len(items)
        if n > MAX_BRACE_PATHS:
            break
    return n


def _check_brace_count(pattern: str) -> None:
    """Refuse, before anything is allocated, a pattern naming more paths than :data:`MAX_BRACE_PATHS`
    or than the entries of the folder its first brace lies in (the files that exist)."""
    count = _brace_count(pattern)
    if count > MAX_BRACE_PATHS:
        raise DataprepError(f"{pattern}: names more than {MAX_BRACE_PATHS} paths (a typo in a brace range?)")
    folder = os.path.dirname(pattern[:pattern.find("{")]) or "."
    if count > 1 and not storage.is_url(pattern) and os.path.isdir(folder):
        with os.scandir(folder) as it:
            entries = sum(1 for _ in zip(range(count), it))
        if count > entries:
            raise DataprepError(f"{pattern}: names {count} paths but {folder} holds only {entries} entries "
                                "(a typo in a brace range?)")


def expand_braces(pattern: str) -> list[str]:
    """NeMo's sharded paths: ``_OP_``/``_CL_`` stand for ``{``/``}``; ``{0..7}`` is a range
    (zero-padded like its bounds when they are), ``{a,b}`` a list; several braces multiply.
    A pattern naming more paths than :data:`MAX_BRACE_PATHS`, or than the entries of the folder
    of its first brace, is refused (:class:`DataprepError`) before it is expanded."""
    pattern = pattern.replace("_OP_", "{").replace("_CL_", "}")
    _check_brace_count(pattern)
    return _expand(pattern)


def _expand(pattern: str) -> list[str]:
    parts = _first_brace(pattern)
    if parts is None:
        return [pattern]
    head, items, tail = parts
    if isinstance(items, tuple):
        lo, hi, width = items
        items = [str(i).zfill(width) for i in (range(lo, hi + 1) if lo <= hi else range(lo, hi - 1, -1))]
    return [e for item in items for e in _expand(head + item + tail)]


def expand_paths(patterns: Sequence[str]) -> list[str]:
    """Every pattern of ``patterns`` expanded by :func:`expand_braces`, in order."""
    return [p for pat in patterns for p in expand_braces(str(pat))]


@dataclass
class TarIndex:
    """Members of one tar: name -> (offset of the data, size), in tar order.

    ``truncated``: names whose data runs past the end of the file (a cut-off tar);
    ``problem``: a one-line reason the tar could not be read to its end, or has no
    end-of-archive block where its members end (cut at a member boundary or inside a header:
    members after the cut are lost); ``None`` if it was read to a proper end.
    ``trailing``: a one-line reason when bytes other than zeros follow the end-of-archive block
    (tars joined end to end: readers stop at the first end block, the members after it are not
    read); ``others``: entries that are neither regular files nor folders (symlinks, hard links,
    devices), as (position, name, kind); ``positions``: each regular member's position among
    all non-folder entries (to merge the two lists in tar order).
    """

    path: str
    names: list[str] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    truncated: set[str] = field(default_factory=set)
    problem: str | None = None
    trailing: str | None = None
    others: list[tuple[int, str, str]] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)

    def lookup(self) -> dict[str, int]:
        """Member name -> position in :attr:`names` (the first of repeated names)."""
        out: dict[str, int] = {}
        for i, n in enumerate(self.names):
            out.setdefault(n, i)
        return out

    def duplicates(self) -> set[str]:
        """Names held by more than one regular member."""
        seen: set[str] = set()
        return {n for n in self.names if n in seen or seen.add(n)}  # type: ignore[func-returns-value]


def _kind(info: tarfile.TarInfo) -> str:
    return ("symlink" if info.issym() else "hard link" if info.islnk() else "device" if info.isdev()
            else "fifo" if info.isfifo() else "special entry")


def _open(path: str | os.PathLike[str], buffer_size: int = 1 << 16) -> IO[bytes]:
    """A local file, or an object read by range requests of ``buffer_size`` bytes."""
    return storage.open_input(path, buffer_size) if storage.is_url(os.fspath(path)) else open(path, "rb")


def _end_problem(path: str | os.PathLike[str], offset: int, members: int) -> str | None:
    """Why the tar has no end-of-archive block (a 512-byte block of zeros) at ``offset``; None if it has."""
    with _open(path, 4096) as fh:
        fh.seek(offset)
        block = fh.read(512)
    if len(block) == 512 and block.count(0) == 512:
        return None
    what = "ends" if not block else "has an unreadable header"
    return f"{what} at byte {offset} after {members} members without an end-of-archive block (cut or damaged)"


#: leading bytes of compressed files (gzip, bzip2, xz, zstd): a compressed tar has no member at a byte offset
_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd"}


def _refuse_compressed(path: str | os.PathLike[str]) -> None:
    """One line when ``path`` is a compressed tar: members are read in place by byte range."""
    try:
        with _open(path, 4096) as fh:
            head = fh.read(6)
    except OSError:
        return  # index_tar says why it cannot be read
    kind = next((k for magic, k in _COMPRESSED.items() if head.startswith(magic)), None)
    if kind is not None:
        raise DataprepError(f"{path}: a {kind}-compressed tar: members are read in place by byte offset, which "
                            "compression prevents; decompress it first (e.g. gunzip -c X.tar.gz > X.tar)")


def _trailing_problem(path: str | os.PathLike[str], end: int) -> str | None:
    """Why bytes after the end-of-archive block at ``end`` matter (not all zeros); None if they are zeros."""
    with _open(path) as fh:
        fh.seek(end)
        at = end
        while chunk := fh.read(1 << 20):
            if chunk.count(0) != len(chunk):
                first = at + next(i for i, b in enumerate(chunk) if b)
                return (f"has data at byte {first} after its end-of-archive block at byte {end} "
                        "(tars joined end to end?): the members there are not read")
            at += len(chunk)
    return None


def index_tar(path: str | os.PathLike[str]) -> TarIndex:
    """The regular-file members of a tar and where their data lies, from the headers only.

    A member whose data runs past the end of the file is listed and flagged ``truncated``;
    a header that cannot be parsed, or a missing end-of-archive block, stops the listing with
    ``problem`` set; data after the end-of-archive block sets ``trailing``; links and other
    non-file entries go to ``others``. A compressed tar is refused (:class:`DataprepError`).
    """
    if storage.is_url(os.fspath(path)):
        return _index_url(os.fspath(path))
    return _index_tar(path)


def _index_url(url: str) -> TarIndex:
    """:func:`index_tar` of a tar in a store, remembered under its ETag / version (a rerun on an
    unchanged tar reads none of its headers again)."""
    info = storage.known_info(url)
    hit = store_facts.cache_get("tar-index", url, info)
    if hit is not None:
        return TarIndex(url, hit["names"], hit["offsets"], hit["sizes"], set(hit["truncated"]), hit["problem"],
                        hit["trailing"], [tuple(o) for o in hit["others"]], hit["positions"])  # type: ignore[misc]
    idx = _index_tar(url)
    store_facts.cache_put("tar-index", url, info, {
        "names": idx.names, "offsets": idx.offsets, "sizes": idx.sizes, "truncated": sorted(idx.truncated),
        "problem": idx.problem, "trailing": idx.trailing, "others": idx.others, "positions": idx.positions})
    return idx


def _index_tar(path: str | os.PathLike[str]) -> TarIndex:
    _refuse_compressed(path)
    idx = TarIndex(os.fspath(path))
    pos = 0
    try:
        size = storage.known_info(path).size
        # a URL's headers are read by range requests sized to the members (storage.open_scan)
        with (store_scan.open_scan(os.fspath(path)) if storage.is_url(os.fspath(path)) else open(path, "rb")) as fh, \
                tarfile.open(fileobj=fh, mode="r:") as tf:
            while True:
                try:
                    info = tf.next()
                except tarfile.ReadError as exc:
                    idx.problem = f"unreadable tar header after {len(idx.names)} members ({exc})"
                    break
                if info is None:
                    idx.problem = _end_problem(path, tf.offset, pos)
                    if idx.problem is None:
                        idx.trailing = _trailing_problem(path, tf.offset + 512)
                    break
                if info.isdir():
                    continue
                if not info.isreg():
                    idx.others.append((pos, info.name, _kind(info)))
                    pos += 1
                    continue
                idx.names.append(info.name)
                idx.offsets.append(info.offset_data)
                idx.sizes.append(info.size)
                idx.positions.append(pos)
                pos += 1
                if info.offset_data + info.size > size:
                    idx.truncated.add(info.name)
    except storage.StoreError:
        raise  # the store failed (after its retries): one line, not a broken tar
    except (tarfile.ReadError, OSError, EOFError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        idx.problem = idx.problem or (f"not a readable tar ({msg})" if not idx.names
                                      else f"unreadable after {len(idx.names)} members ({msg})")
    return idx


def read_range(fd: int, offset: int, size: int) -> bytes:
    """``size`` bytes at ``offset`` of the open file ``fd`` (one ``pread``; short only at EOF)."""
    data = os.pread(fd, size, offset)
    if len(data) < size:  # a pread may return less on some filesystems: finish it
        parts = [data]
        got = len(data)
        while got < size:
            more = os.pread(fd, size - got, offset + got)
            if not more:
                break
            parts.append(more)
            got += len(more)
        data = b"".join(parts)
    return data


class RangeFile(io.RawIOBase):
    """Read-only, seekable view of ``size`` bytes at ``offset`` of the open file ``fd`` (pread:
    no shared file position, so views of one descriptor may be used from several threads).

    The first ``head`` bytes are fetched with one ``pread`` when the view is made: a header
    parser's many small reads are then served from memory; reads past them ``pread`` again.
    """

    def __init__(self, fd: int, offset: int, size: int, head: int = 1 << 16) -> None:
        super().__init__()
        self._fd, self._start, self._size, self._pos = fd, offset, size, 0
        self._head = os.pread(fd, min(size, head), offset) if head > 0 else b""

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def read(self, size: int = -1) -> bytes:
        n = self._size - self._pos if size is None or size < 0 else min(size, self._size - self._pos)
        if n <= 0:
            return b""
        end = self._pos + n
        if end <= len(self._head):
            data = self._head[self._pos:end]
        else:
            data = os.pread(self._fd, n, self._start + self._pos)
        self._pos += len(data)
        return data

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)
