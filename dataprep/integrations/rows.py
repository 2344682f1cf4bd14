"""Every column of a compiled manifest, memory-mapped, for consumers that build whole records.

The training loader maps only the columns it needs (:class:`manifests.column_cache.ManifestColumns`);
samplers that hand trainers Lhotse cuts need all of them (languages, task, ``extra``,
sample rate, channels). :class:`ManifestRows` converts the manifest once into an uncompressed
Arrow IPC file (``<cache dir>/<content hash>.rows.v1.arrow``, built in 65,536-row record
batches, so memory stays bounded whatever the corpus size) and maps it; a batch's rows are
read as one-row slices of the mapped batches: no Parquet row group is decoded per batch, and
opening takes constant time.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from manifests.column_cache import open_or_build_cache, write_ipc_file
from manifests.errors import DataprepError

#: layout version of the row cache files
ROWS_CACHE_VERSION = 1
#: rows per record batch of the cache (bounded memory while building)
ROWS_PER_BATCH = 65_536


class ManifestRows:
    """All columns of a compiled manifest, mapped from the row cache (see the module docstring)."""

    def __init__(self, table: pa.Table, source: str) -> None:
        self.table = table
        self.source = source
        self.num_rows = table.num_rows
        self._batches = table.to_batches()  # zero-copy views of the mapped record batches
        self._starts = np.cumsum([0] + [b.num_rows for b in self._batches])
        self._columns: dict[int, list[_Column]] = {}  # per record batch, made on first use

    @classmethod
    def open(cls, manifest: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None) -> ManifestRows:
        """Open (building on first use, under a file lock) the mapped rows of ``manifest``."""
        table = open_or_build_cache(manifest, cache_dir, f"rows.v{ROWS_CACHE_VERSION}.arrow", _open, build_rows_cache,
                                    "the row cache")
        return cls(table, str(manifest))

    def records(self, rows: npt.ArrayLike) -> list[dict[str, Any]]:
        """Manifest rows ``rows`` (row numbers), in that order, as dicts of column values.

        Values are read straight from the mapped buffers with numpy (offsets, values, validity
        bits): no Arrow compute kernel runs (their one-time initialization alone costs more than
        a second), no column is concatenated, only the asked rows become Python objects.
        """
        idx = np.asarray(rows, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_rows):
            raise DataprepError(f"{self.source}: row {int(idx.max())} asked for, the manifest has {self.num_rows} rows "
                                "(plan made from another manifest?)")
        batch = np.searchsorted(self._starts, idx, side="right") - 1
        local = (idx - self._starts[batch]).tolist()
        names = self.table.schema.names
        out: list[dict[str, Any]] = []
        for b, i in zip(batch.tolist(), local):
            cols = self._columns.get(b)
            if cols is None:
                cols = self._columns[b] = [_Column(c) for c in self._batches[b].columns]
            out.append({n: c.value(i) for n, c in zip(names, cols)})
        return out


class _Column:
    """One mapped Arrow array (string, integer or floating point) read per value with numpy."""

    def __init__(self, arr: pa.Array) -> None:
        bufs = arr.buffers()
        off = arr.offset
        self.off = off
        self.bits = None if arr.null_count == 0 or bufs[0] is None else np.frombuffer(bufs[0], dtype=np.uint8)
        self.is_str = pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)
        if self.is_str:
            width = np.int64 if pa.types.is_large_string(arr.type) else np.int32
            self.offsets = np.frombuffer(bufs[1], dtype=width)[off:off + len(arr) + 1]
            self.data = memoryview(bufs[2]) if bufs[2] is not None else memoryview(b"")
        elif pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type):
            self.values = np.frombuffer(bufs[1], dtype=arr.type.to_pandas_dtype())[off:off + len(arr)]
        else:
            raise DataprepError(f"manifest column of type {arr.type} is not supported by the row cache")

    def value(self, i: int) -> Any:
        if self.bits is not None:
            j = i + self.off
            if not (self.bits[j >> 3] >> (j & 7)) & 1:
                return None
        if self.is_str:
            return str(self.data[self.offsets[i]:self.offsets[i + 1]], "utf-8")
        return self.values[i].item()


def build_rows_cache(manifest: str | os.PathLike[str], path: Path) -> None:
    """Write the row cache of ``manifest`` to ``path`` atomically, one record batch at a time."""
    try:
        pf = pq.ParquetFile(manifest)
    except (OSError, pa.ArrowInvalid) as exc:
        raise DataprepError(f"{manifest}: not a readable Parquet file ({exc})") from None
    schema = pf.schema_arrow.remove_metadata()
    write_ipc_file(path, schema, pf.iter_batches(batch_size=ROWS_PER_BATCH))


def _open(path: Path, num_rows: int) -> pa.Table | None:
    """The mapped table, or ``None`` when the file is missing or not a whole cache."""
    try:
        with pa.memory_map(str(path), "r") as source:
            table = pa.ipc.open_file(source).read_all()
    except (OSError, pa.ArrowInvalid):
        return None
    return table if table.num_rows == num_rows else None
