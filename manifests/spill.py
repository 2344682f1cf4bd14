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
