"""Spill files: append-only raw binary columns on disk, the default memory budget, and a heap
that keeps freed memory while a bounded-memory command runs (:func:`retained_heap`).

Commands that must run in memory bounded by a budget, not by the corpus, append NumPy columns
here block by block and read them back whole, by range, by runs or memory-mapped, or sorted
in bounded memory (:func:`sorted_runs`). A corpus that fits the budget keeps the same columns
in memory (:class:`SpillFiles` with ``memory``): nothing is written to disk.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from manifests.arrow_views import string_buffers
from manifests.atomic_files import make_owned_dir, sweep_stale_temps
from manifests.errors import DataprepError


def default_memory_limit() -> int:
    """Half of the machine's physical memory (bytes)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) // 2
    except (ValueError, OSError, AttributeError):
        return 4 << 30


def check_free_disk(where: Path, need: int, what: str) -> None:
    """Refuse in one line, before ``what`` is written, when the file system of ``where`` has
    fewer than ``need`` bytes free for it (a run that fills the disk fails late)."""
    free = shutil.disk_usage(where).free
    if free < need:
        raise DataprepError(f"{where}: {what} need about {need / 2**30:.2f} GiB of disk, only "
                            f"{free / 2**30:.2f} GiB free there; free some, or write to a larger disk")


#: glibc ``mallopt`` parameters and defaults (malloc.h): blocks served by mmap at most (0: none)
#: and the free heap top kept before it is given back.
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_DEFAULT_TRIM, _DEFAULT_MMAP_MAX = 128 * 1024, 65536


def spill_dir(out_dir: str | os.PathLike[str]) -> Path:
    """A fresh spill directory next to ``out_dir`` (same disk), the one every command that spills
    uses; the caller removes it with :func:`remove_spill`. Named ``.<name>.<pid>.*.spill`` and
    holding an owner file (:func:`manifests.atomic_files.make_owned_dir`): the folders of killed
    runs (``kill -9``) next to it are swept first. A parent that cannot hold it: one line."""
    target = Path(out_dir).resolve()
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        sweep_stale_temps(target)
        return make_owned_dir(target, ".spill")
    except OSError as exc:
        raise DataprepError(f"{parent}: cannot make the spill directory there ({exc.strerror}); "
                            "spill files go next to the output (or the manifest)") from None


def remove_spill(root: Path) -> None:
    """Remove a spill directory made by :func:`spill_dir` and everything in it."""
    shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def retained_heap() -> Iterator[None]:
    """Inside, glibc serves big blocks from the heap and keeps what is freed for the next ones;
    on leaving, mmap is allowed again and the heap's free top given back (``malloc_trim``).

    Outside, glibc maps every block above its mmap threshold (at most 32 MiB) afresh and
    unmaps it when freed, so each new one is faulted in and zeroed by the kernel: a planner
    that frees and allocates bucket-sized arrays (40 MiB and more per column from about 5M
    rows a bucket) paid 17 s of 124 s CPU at 100M rows zeroing pages (``perf``: the kernel's
    ``clear_page_erms``), 0.8 s of 9.4 s at 10M. Freed blocks are reused, so the peak grows
    little (100M: 0.77 -> 0.86 GiB with the other changes of that measurement). Without
    glibc (musl, macOS): nothing changes. Process-wide while inside (other threads too); after
    it, glibc keeps its default thresholds fixed rather than adjusting them (any ``mallopt``
    turns that off): a command's process is unaffected, a long-lived caller allocates as glibc
    starts out."""
    try:
        libc = ctypes.CDLL(None)
        mallopt, trim = libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError):
        yield
        return
    mallopt(_M_MMAP_MAX, 0)
    mallopt(_M_TRIM_THRESHOLD, 1 << 30)
    try:
        yield
    finally:
        mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
        mallopt(_M_TRIM_THRESHOLD, _DEFAULT_TRIM)
        trim(0)


@contextlib.contextmanager
def system_arrow_pool() -> Iterator[None]:
    """Inside, Arrow allocates from the system allocator (glibc: big blocks mapped and unmapped
    when freed, the rest given back by ``malloc_trim``) instead of its default pool (mimalloc),
    which keeps what a pass over a manifest freed (its decoded pages and taken columns) beside
    the columns that pass keeps: a plan held in memory peaks 5-10% lower (2M rows: 0.35 ->
    0.32 GiB), in the same time. Process-wide while inside."""
    before = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(before)


def give_back_memory(heap: bool = True) -> None:
    """Hand freed memory back to the system: Arrow's pool's (the blocks of a pass over a
    manifest) and, with ``heap``, glibc's free heap (``malloc_trim``; not inside
    :func:`retained_heap`, which keeps it for reuse on purpose)."""
    pa.default_memory_pool().release_unused()
    if heap:
        try:
            ctypes.CDLL(None).malloc_trim(0)
        except (OSError, AttributeError):
            pass


class SpillFiles:
    """Append-only raw binary columns (one file per name) under ``root``, or, with ``memory``
    (a dict, name -> chunks, shared by every :class:`SpillFiles` of one spill), the same
    columns held in memory as lists of byte chunks: same API, same results, nothing on disk.
    Appending to a column not open in this object starts it afresh (as a file opened "wb");
    whole-column reads in memory are read-only views."""

    def __init__(self, root: Path, memory: dict[str, list[npt.NDArray[np.uint8]]] | None = None) -> None:
        self.root = root
        self.memory = memory
        self._open: dict[str, BinaryIO | None] = {}
        self._bytes: dict[str, int] = {}
        self._records: dict[str, np.dtype[Any]] = {}
        self._reserved: dict[str, tuple[npt.NDArray[np.uint8], int]] = {}  # in memory: buffer, bytes filled

    @property
    def in_memory(self) -> bool:
        return self.memory is not None

    def reserve(self, name: str, nbytes: int) -> None:
        """Start column ``name`` afresh with room for ``nbytes`` bytes: in memory, one buffer its
        appends fill (read whole without joining chunks; pages never filled take no memory)
        until one overflows it, then chunks as usual. On disk: nothing."""
        if self.memory is None:
            return
        self._open[name] = None
        self.memory[name] = []
        self._reserved[name] = (np.empty(max(0, int(nbytes)), np.uint8), 0)

    def append(self, name: str, values: npt.NDArray[np.generic]) -> None:
        if self.memory is not None:
            if name not in self._open:
                self._open[name] = None
                self.memory[name] = []
            got = self._reserved.get(name)
            if got is not None:
                buf, at = got
                b = np.ascontiguousarray(values).view(np.uint8).reshape(-1)
                if at + b.shape[0] <= buf.shape[0]:
                    buf[at:at + b.shape[0]] = b
                    self._reserved[name] = (buf, at + b.shape[0])
                    self.memory[name][:] = [buf[:at + b.shape[0]]]
                    return
                del self._reserved[name]  # overflowed: chunks from here on
            a = np.array(values, copy=True, order="C")  # the caller may reuse its array
            if a.size:
                self.memory[name].append(a.view(np.uint8).reshape(-1))
            return
        f = self._open.get(name)
        if f is None:
            f = self._open[name] = open(self.root / name, "wb")
        np.ascontiguousarray(values).tofile(f)

    def _size(self, name: str) -> int | None:
        """Bytes of column ``name``; None when absent."""
        if self.memory is not None:
            chunks = self.memory.get(name)
            return None if chunks is None else sum(c.shape[0] for c in chunks)
        path = self.root / name
        return path.stat().st_size if path.exists() else None

    def _whole(self, name: str) -> npt.NDArray[np.uint8]:
        """Column ``name`` in memory as one read-only chunk (chunks joined once)."""
        chunks = self.memory[name]  # type: ignore[index]
        if len(chunks) != 1:
            chunks[:] = [np.concatenate(chunks) if chunks else np.zeros(0, np.uint8)]
        chunks[0].flags.writeable = False
        return chunks[0]

    def _bytes_at(self, name: str, start: int, count: int) -> npt.NDArray[np.uint8]:
        """Bytes ``start:start + count`` of column ``name`` in memory, a fresh array."""
        out = np.empty(count, np.uint8)
        at = 0
        for c in self.memory[name]:  # type: ignore[index]
            n = c.shape[0]
            if start < at + n and start + count > at:
                lo, hi = max(start, at), min(start + count, at + n)
                out[lo - start:hi - start] = c[lo - at:hi - at]
            at += n
        return out

    def _append_bytes(self, name: str, values: pa.Array) -> npt.NDArray[np.int64]:
        """Append the UTF-8 bytes of ``values`` to ``name.data``; returns each string's start
        and the end: ``n + 1`` offsets into the file."""
        arr = values.cast(pa.large_string())
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        n = len(arr)
        base = self._bytes.get(name, 0)
        if n == 0:
            return np.full(1, base, np.int64)
        off, data = string_buffers(arr)
        if off[-1] > off[0]:
            self.append(name + ".data", data[off[0]:off[-1]])
        self._bytes[name] = base + int(off[-1] - off[0])
        return off - off[0] + base

    def append_strings(self, name: str, values: pa.Array) -> None:
        """Append strings as ``name.off`` (int64 CSR offsets: a leading 0, then each string's
        end over the whole file) and ``name.data`` (their UTF-8 bytes)."""
        if name not in self._bytes:
            self._bytes[name] = 0
            self.append(name + ".off", np.zeros(1, np.int64))
        off = self._append_bytes(name, values)
        if off.shape[0] > 1:
            self.append(name + ".off", off[1:])

    def append_records(self, name: str, keys: npt.NDArray[np.generic], values: pa.Array) -> None:
        """Append (key, string) pairs as ``name.rec`` (each key beside its string's start in
        ``name.data``, packed: :func:`record_dtype`; :meth:`close` ends it with one record of
        the total) and ``name.data`` (the strings' UTF-8 bytes): a range of pairs is one read of
        records and one of bytes (:meth:`read_record_range`), not three."""
        dt = self._records.setdefault(name, record_dtype(keys.dtype))
        off = self._append_bytes(name, values)
        if off.shape[0] > 1:
            rec = np.empty(off.shape[0] - 1, dtype=dt)
            rec["key"], rec["off"] = keys, off[:-1]
            self.append(name + ".rec", rec)

    def close(self) -> None:
        for name, dt in self._records.items():  # each record file ends with the total
            end = np.zeros(1, dtype=dt)
            end["off"] = self._bytes.get(name, 0)
            self.append(name + ".rec", end)
        self._records.clear()
        for f in self._open.values():
            if f is not None:
                f.close()
        self._open.clear()
        self._reserved.clear()
        self._bytes.clear()

    def written_bytes(self) -> int:
        """Bytes in the files directly under ``root`` (their sizes; in memory: the columns')."""
        if self.memory is not None:
            return sum(c.shape[0] for chunks in self.memory.values() for c in chunks)
        return sum(e.stat().st_size for e in os.scandir(self.root) if e.is_file(follow_symlinks=False))

    def remove(self, *names: str) -> None:
        """Delete the columns ``names`` (closed first where open; a missing one is no error):
        only files this object's owner spilled under ``root``."""
        for name in names:
            f = self._open.pop(name, None)
            if f is not None:
                f.close()
            self._reserved.pop(name, None)
            if self.memory is not None:
                self.memory.pop(name, None)
            else:
                (self.root / name).unlink(missing_ok=True)

    def read(self, name: str, dtype: type) -> npt.NDArray[np.generic]:
        if self.memory is not None:
            return self._whole(name).view(dtype) if name in self.memory else np.empty(0, dtype=dtype)
        path = self.root / name
        return np.fromfile(path, dtype=dtype) if path.exists() else np.empty(0, dtype=dtype)

    def read_range(self, name: str, dtype: type, start: int, stop: int) -> npt.NDArray[np.generic]:
        """Items ``start:stop`` of a column, read into memory (no mapping stays resident)."""
        size = np.dtype(dtype).itemsize
        if self.memory is not None:
            return self._bytes_at(name, start * size, (stop - start) * size).view(dtype)
        return np.fromfile(self.root / name, dtype=dtype, count=stop - start, offset=start * size)

    def map(self, name: str, dtype: type) -> npt.NDArray[np.generic]:
        if not self._size(name):
            return np.empty(0, dtype=dtype)
        if self.memory is not None:
            return self._whole(name).view(dtype)
        return np.memmap(self.root / name, dtype=dtype, mode="r")

    def read_runs(self, name: str, dtype: type, starts: npt.NDArray[np.int64],
                  sizes: npt.NDArray[np.int64]) -> npt.NDArray[Any]:
        """Items ``starts[i] : starts[i] + sizes[i]`` of a column for every ``i``, concatenated:
        one ``preadv`` per run into the result. No mapping: a mapped file's pages come in
        folios of up to 2 MiB, so scattered reads through a mapping hold most of the file."""
        item = np.dtype(dtype).itemsize
        total = int(sizes.sum())
        if self.memory is not None:
            if total == 0:
                return np.empty(0, dtype=dtype)
            first = np.zeros(sizes.shape[0], dtype=np.int64)
            np.cumsum(sizes[:-1], out=first[1:])
            at = np.arange(total, dtype=np.int64) + np.repeat(np.asarray(starts, np.int64) - first, sizes)
            return self._whole(name).view(dtype)[at]
        out = np.empty(total, dtype=dtype)
        if out.shape[0] == 0:
            return out
        view = memoryview(out.view(np.uint8))
        fd = os.open(self.root / name, os.O_RDONLY)
        try:
            at = 0
            for start, size in zip((starts * item).tolist(), (sizes * item).tolist()):
                done = 0
                while done < size:  # a short read only at the end of a file, which is an error
                    got = os.preadv(fd, [view[at + done:at + size]], start + done)
                    if got <= 0:
                        raise OSError(f"{self.root / name}: short read at byte {start + done}")
                    done += got
                at += size
        finally:
            os.close(fd)
        return out

    def _truncate(self, name: str, size: int) -> None:
        """Keep the first ``size`` bytes of column ``name``; in memory, the chunks past them freed
        (a chunk mostly cut off is copied, so memory shrinks with the column)."""
        if self.memory is None:
            os.truncate(self.root / name, size)
            return
        kept, at = [], 0
        for c in self.memory[name]:
            if at >= size:
                break
            n = min(c.shape[0], size - at)
            kept.append(c[:n] if 2 * n > c.shape[0] else c[:n].copy())
            at += n
        self.memory[name] = kept

    def count_strings(self, name: str) -> int:
        """How many strings ``name`` holds (see :meth:`append_strings`; 0 when absent)."""
        size = self._size(name + ".off")
        return 0 if size is None else max(0, size // 8 - 1)

    def read_string_runs(self, name: str, starts: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64]) -> pa.Array:
        """The strings ``starts[i] : starts[i] + sizes[i]`` of ``name`` (see
        :meth:`append_strings`) for every ``i``, concatenated, as a string array."""
        ends = self.read_runs(name + ".off", np.int64, starts, sizes + 1)  # each run's offsets and its end
        return self._strings_of_runs(name + ".data", ends, sizes)

    def count_records(self, name: str, key_dtype: type) -> tuple[int, int]:
        """Pairs in ``name`` (see :meth:`append_records`; closed) and the bytes of their strings."""
        rec, data = self._size(name + ".rec"), self._size(name + ".data")  # no bytes: no data file
        n = rec // record_dtype(np.dtype(key_dtype)).itemsize - 1 if rec is not None else 0
        return max(0, n), data or 0

    def read_record_range(self, name: str, key_dtype: type, start: int,
                          stop: int) -> tuple[npt.NDArray[Any], pa.LargeStringArray]:
        """Pairs ``start:stop`` of ``name`` (see :meth:`append_records`): their keys (a view of
        the records read) and strings; one read of records, one of bytes."""
        rec = self.read_range(name + ".rec", record_dtype(np.dtype(key_dtype)), start, stop + 1)
        lo, hi = int(rec["off"][0]), int(rec["off"][-1])
        data = self.read_range(name + ".data", np.uint8, lo, hi) if hi > lo else np.zeros(1, np.uint8)
        off = rec["off"] - lo if lo else np.ascontiguousarray(rec["off"])  # a copy either way: records are packed
        strings = pa.LargeStringArray.from_buffers(stop - start, pa.py_buffer(off), pa.py_buffer(data))
        return rec["key"][:-1], strings

    def cut_records(self, name: str, key_dtype: type, start: int) -> None:
        """Drop pairs ``start:`` of ``name`` from its files (closed), keeping the offset that
        ends the pairs before: what reads pairs below ``start`` needs."""
        dt = record_dtype(np.dtype(key_dtype))
        end = int(self.read_range(name + ".rec", dt, start, start + 1)["off"][0])
        self._truncate(name + ".rec", (start + 1) * dt.itemsize)
        if self._size(name + ".data") is not None:  # no bytes ever appended: no data file
            self._truncate(name + ".data", end)

    def _strings_of_runs(self, data: str, ends: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64]) -> pa.Array:
        """The strings of runs of ``sizes[i]`` strings whose ``sizes[i] + 1`` byte offsets into
        file ``data`` (each run's starts, then its end) are concatenated in ``ends``."""
        first = np.zeros(sizes.shape[0] + 1, dtype=np.int64)
        np.cumsum(sizes + 1, out=first[1:])
        lo, hi = ends[first[:-1]], ends[first[1:] - 1]
        data = self.read_runs(data, np.uint8, lo, hi - lo)
        # offsets into data: each run's own offsets, shifted to where its bytes land
        shift = np.zeros(sizes.shape[0], dtype=np.int64)
        np.cumsum((hi - lo)[:-1], out=shift[1:])
        keep = np.ones(ends.shape[0], dtype=bool)
        keep[first[1:] - 1] = False  # each run's end offset (the next run's start, or the total)
        off = np.empty(int(sizes.sum()) + 1, dtype=np.int64)
        off[:-1] = (ends - np.repeat(lo - shift, sizes + 1))[keep]
        off[-1] = data.shape[0]
        buf = data if data.shape[0] else np.zeros(1, np.uint8)
        return pa.LargeStringArray.from_buffers(off.shape[0] - 1, pa.py_buffer(off), pa.py_buffer(buf)).cast(pa.string())

    def read_strings(self, name: str) -> pa.Array:
        """All strings of ``name`` (see :meth:`append_strings`): a string array (int32 offsets
        while the bytes fit, else large_string), no copy of the bytes."""
        off = self.read(name + ".off", np.int64)
        if off.shape[0] == 0:
            return pa.array([], pa.string())
        data = pa.py_buffer(self.read(name + ".data", np.uint8) if off[-1] else np.zeros(1, np.uint8))
        n = off.shape[0] - 1
        if off[-1] < 2**31:
            return pa.StringArray.from_buffers(n, pa.py_buffer(off.astype(np.int32)), data)
        return pa.LargeStringArray.from_buffers(n, pa.py_buffer(off), data)

def record_dtype(key: np.dtype[Any]) -> np.dtype[Any]:
    """A record of :meth:`SpillFiles.append_records`: a key, then an int64 byte offset (packed)."""
    return np.dtype([("key", key), ("off", np.int64)])


#: Bit pattern of +inf: every finite non-negative float64 has a smaller one, and order of the
#: patterns (as int64) is the order of the values.
_FINITE_END = 0x7FF0000000000000
#: Cells of one histogram pass of :func:`sorted_runs`.
_CELL_BITS = 16


def sorted_runs(files: SpillFiles, name: str, count: int, max_rows: int) -> Iterator[npt.NDArray[np.float64]]:
    """The ``count`` finite non-negative float64 values of column ``name``, ascending, as
    consecutive arrays of at most ``max_rows`` values (an external sort).

    Values are ranged by their bit patterns (ordered as the values): a range of at most
    ``max_rows`` values is read in one pass and sorted; a larger one is split by a histogram
    pass over 2**16 sub-ranges, recursively, down to single values (a run of one value needs
    no sort). Memory: ``max_rows`` values (8 bytes each) plus one block; passes over the file: one per
    range, so ``count / max_rows`` at least. Every run sorts equal values together, so a
    running sum over the runs equals ``np.cumsum(np.sort(values))``."""
    max_rows = max(int(max_rows), 1)
    yield from _runs(files, name, count, max_rows, 0, _FINITE_END, count)


def _bits_blocks(files: SpillFiles, name: str, count: int, block: int) -> Iterator[npt.NDArray[np.int64]]:
    for a in range(0, count, block):
        yield files.read_range(name, np.float64, a, min(a + block, count)).view(np.int64)


def _runs(files: SpillFiles, name: str, count: int, max_rows: int, lo: int, hi: int, n: int
          ) -> Iterator[npt.NDArray[np.float64]]:
    """Sorted runs of the ``n`` values whose bit patterns lie in ``[lo, hi)``."""
    if n == 0:
        return
    if hi - lo == 1:  # one value: no sort, no read
        value = np.asarray([lo], dtype=np.int64).view(np.float64)[0]
        for a in range(0, n, max_rows):
            yield np.full(min(max_rows, n - a), value)
        return
    block = max(min(max_rows, 1 << 20), 1 << 10)
    if n <= max_rows:
        run = np.empty(n, dtype=np.int64)  # filled in place, sorted in place: 8 bytes a value
        at = 0
        for b in _bits_blocks(files, name, count, block):
            sel = b[(b >= lo) & (b < hi)]
            run[at:at + sel.shape[0]] = sel
            at += sel.shape[0]
        run.sort()
        yield run.view(np.float64)
        return
    shift = max(0, (hi - lo - 1).bit_length() - _CELL_BITS)
    cells = ((hi - lo - 1) >> shift) + 1
    hist = np.zeros(cells, dtype=np.int64)
    for b in _bits_blocks(files, name, count, block):
        sel = b[(b >= lo) & (b < hi)]
        hist += np.bincount((sel - lo) >> shift, minlength=cells)
    cum = np.cumsum(hist)
    i = 0
    while i < cells:  # a loop over ranges: consecutive cells holding at most max_rows values
        before = int(cum[i - 1]) if i else 0
        j = max(int(np.searchsorted(cum, before + max_rows, side="right")), i + 1)
        a, b = lo + (i << shift), min(lo + (j << shift), hi)
        yield from _runs(files, name, count, max_rows, a, b, int(cum[j - 1]) - before)
        i = j
