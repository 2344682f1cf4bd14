"""Spill files: append-only raw binary columns on disk, and the default memory budget.

Commands that must run in memory bounded by a budget, not by the corpus, append NumPy columns
here block by block and read them back whole, by range or memory-mapped, or sorted in bounded
memory (:func:`sorted_runs`).
"""

from __future__ import annotations

import os
from pathlib import Path
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np
import numpy.typing as npt


def default_memory_limit() -> int:
    """Half of the machine's physical memory (bytes)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) // 2
    except (ValueError, OSError, AttributeError):
        return 4 << 30


class SpillFiles:
    """Append-only raw binary columns (one file per name) under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._open: dict[str, BinaryIO] = {}

    def append(self, name: str, values: npt.NDArray[np.generic]) -> None:
        f = self._open.get(name)
        if f is None:
            f = self._open[name] = open(self.root / name, "wb")
        np.ascontiguousarray(values).tofile(f)

    def close(self) -> None:
        for f in self._open.values():
            f.close()
        self._open.clear()

    def read(self, name: str, dtype: type) -> npt.NDArray[np.generic]:
        path = self.root / name
        return np.fromfile(path, dtype=dtype) if path.exists() else np.empty(0, dtype=dtype)

    def read_range(self, name: str, dtype: type, start: int, stop: int) -> npt.NDArray[np.generic]:
        """Items ``start:stop`` of a column, read into memory (no mapping stays resident)."""
        size = np.dtype(dtype).itemsize
        return np.fromfile(self.root / name, dtype=dtype, count=stop - start, offset=start * size)

    def map(self, name: str, dtype: type) -> npt.NDArray[np.generic]:
        path = self.root / name
        if not path.exists() or path.stat().st_size == 0:
            return np.empty(0, dtype=dtype)
        return np.memmap(path, dtype=dtype, mode="r")


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
