"""Spill files: append-only raw binary columns on disk, and the default memory budget.

Commands that must run in memory bounded by a budget, not by the corpus, append NumPy columns
here block by block and read them back whole, by range or memory-mapped.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

import numpy as np
import numpy.typing as npt
import pyarrow as pa


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
        self._bytes: dict[str, int] = {}

    def append(self, name: str, values: npt.NDArray[np.generic]) -> None:
        f = self._open.get(name)
        if f is None:
            f = self._open[name] = open(self.root / name, "wb")
        np.ascontiguousarray(values).tofile(f)

    def append_strings(self, name: str, values: pa.Array) -> None:
        """Append strings as ``name.off`` (int64 CSR offsets: a leading 0, then each string's
        end over the whole file) and ``name.data`` (their UTF-8 bytes)."""
        arr = values.cast(pa.large_string())
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        n = len(arr)
        off = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset:arr.offset + n + 1]
        base = self._bytes.get(name)
        if base is None:
            base = 0
            self.append(name + ".off", np.zeros(1, np.int64))
        if n:
            data = arr.buffers()[2]
            if off[-1] > off[0]:
                self.append(name + ".data", np.frombuffer(data, dtype=np.uint8)[off[0]:off[-1]])
            self.append(name + ".off", off[1:] - off[0] + base)
        self._bytes[name] = base + int(off[-1] - off[0]) if n else base

    def close(self) -> None:
        for f in self._open.values():
            f.close()
        self._open.clear()
        self._bytes.clear()

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

    def gather_strings(self, name: str, positions: npt.NDArray[np.int64]) -> pa.Array:
        """The strings of ``name`` at ``positions`` (any order, repeats allowed) as a string
        array, gathered through mappings held only meanwhile: memory is the pages near each
        position (the kernel maps up to 64 KiB around each one touched), not the files'.
        (Arrow's ``take`` over the mapped files would touch every page.)"""
        off = self.map(name + ".off", np.int64)
        data = self.map(name + ".data", np.uint8)
        a, b = np.asarray(off[positions]), np.asarray(off[positions + 1])
        del off
        lens = b - a
        new_off = np.zeros(positions.shape[0] + 1, dtype=np.int64)
        np.cumsum(lens, out=new_off[1:])
        idx = np.repeat(a - new_off[:-1], lens) + np.arange(int(new_off[-1]), dtype=np.int64)
        buf = np.asarray(data[idx]) if idx.shape[0] else np.zeros(1, np.uint8)
        del data, idx
        arr = pa.LargeStringArray.from_buffers(positions.shape[0], pa.py_buffer(new_off), pa.py_buffer(buf))
        return arr.cast(pa.string())
