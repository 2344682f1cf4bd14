"""Columns held in memory behind the interface of spill files
(:class:`manifests.spill.SpillFiles`: append, read whole, by range, by runs, mapped): the
store of a corpus that fits the memory limit, so one code path serves a corpus held in memory
(nothing written) and one spilled to disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bucketing.batching import run_positions
from manifests.spill import SpillFiles


class HeldColumns(SpillFiles):
    """The columns of :class:`manifests.spill.SpillFiles` held in memory (nothing written): the
    store of a corpus that fits (appended arrays are copied: a caller may reuse its buffers)."""

    def __init__(self) -> None:
        super().__init__(Path())
        self._cols: dict[str, list[npt.NDArray[Any]]] = {}

    def append(self, name: str, values: npt.NDArray[np.generic]) -> None:
        self._cols.setdefault(name, []).append(np.array(values, copy=True))

    def read(self, name: str, dtype: type) -> npt.NDArray[np.generic]:
        parts = self._cols.get(name)
        if not parts:
            return np.empty(0, dtype=dtype)
        if len(parts) > 1:
            parts[:] = [np.concatenate(parts)]
        return parts[0].astype(dtype, copy=False)

    def read_range(self, name: str, dtype: type, start: int, stop: int) -> npt.NDArray[np.generic]:
        return self.read(name, dtype)[start:stop]

    def map(self, name: str, dtype: type) -> npt.NDArray[np.generic]:
        return self.read(name, dtype)

    def remove(self, *names: str) -> None:
        for name in names:
            self._cols.pop(name, None)

    def written_bytes(self) -> int:
        return 0

    def read_runs(self, name: str, dtype: type, starts: npt.NDArray[np.int64],
                  sizes: npt.NDArray[np.int64]) -> npt.NDArray[Any]:
        return self.read(name, dtype)[run_positions(starts, sizes)]
