"""Every column of a compiled manifest, memory-mapped, for consumers that build whole records.

The loader maps only its columns (:class:`manifests.column_cache.ColumnCache`); samplers
that hand out Lhotse cuts need all of them. :class:`ManifestRows` converts the manifest once
into an uncompressed Arrow IPC file (``<cache dir>/<content hash>.rows.v2.arrow``) and maps
it: a batch's rows are one-row slices, opening takes constant time in the corpus size.

The build streams :data:`ROWS_PER_BATCH` rows at a time (memory: a block, not the corpus),
under the column cache's rules: one builder under a file lock, a temporary file renamed, its
layout version, manifest content hash and rows in the schema metadata, checked with the
columns and each batch's buffers on open; a file that fails is logged and rebuilt, and an
older layout (``rows.v1``) is rebuilt, never read, and removed once the new file is written.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from manifests.arrow_views import string_buffers, validity_bits, values_view
from manifests.column_cache import (
    CACHE_BATCH_ROWS,
    check_cache_facts,
    not_whole,
    open_or_build_cache,
    open_or_none,
    remove_older_versions,
    with_cache_facts,
    write_ipc_file,
)
from manifests.errors import DataprepError
from manifests.manifest_read import iter_manifest

#: layout version of the row cache files (2: streamed build, facts recorded and checked on open)
ROWS_CACHE_VERSION = 2
#: rows per record batch of the cache: the build holds one such block (as the column cache's)
ROWS_PER_BATCH = CACHE_BATCH_ROWS
#: schema metadata key of the row cache's facts (version, manifest content hash, rows)
ROWS_META = "dataprep.rows_cache"

log = logging.getLogger(__name__)


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
        table = open_or_build_cache(manifest, cache_dir, f"rows.v{ROWS_CACHE_VERSION}.arrow",
                                    lambda path, rows: _open(path, rows, manifest), build_rows_cache, "the row cache")
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
        self.off = arr.offset
        self.bits = validity_bits(arr)
        self.is_str = pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)
        if self.is_str:
            self.offsets, data = string_buffers(arr)
            self.data = memoryview(data)
        elif pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type):
            self.values = values_view(arr, arr.type.to_pandas_dtype())
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


def build_rows_cache(manifest: str | os.PathLike[str], path: Path, *, batch_rows: int = ROWS_PER_BATCH) -> None:
    """Write the row cache of ``manifest`` to ``path`` (atomically; ``path``'s name starts with
    the manifest's content hash), streaming the manifest ``batch_rows`` rows at a time: every
    column as the manifest stores it, a record batch per block. Row cache files of older
    layouts for the same manifest are removed once this one is written."""
    schema = with_cache_facts(_manifest_schema(manifest), ROWS_META, ROWS_CACHE_VERSION, path, manifest)
    blocks = iter_manifest(manifest, None, batch_rows)
    # a block spanning two Parquet row groups is two record batches (no copy to join them)
    write_ipc_file(path, schema, (b for t in blocks for b in t.to_batches()))
    remove_older_versions(path, [f"rows.v{old}.arrow" for old in range(1, ROWS_CACHE_VERSION)])


def _manifest_schema(manifest: str | os.PathLike[str]) -> pa.Schema:
    """The manifest's columns as the row cache stores them (the Parquet footer's, no metadata)."""
    try:
        return pq.read_schema(manifest).remove_metadata()
    except (OSError, pa.ArrowInvalid) as exc:
        raise DataprepError(f"{manifest}: not a readable Parquet file ({exc})") from None


def _read(path: Path, num_rows: int, manifest: str | os.PathLike[str]) -> pa.Table:
    """The mapped table, its facts, columns and batches checked (:func:`check_cache_facts`; no
    value is read). Raises ``FileNotFoundError`` or :class:`CacheInvalid`."""
    try:
        with pa.memory_map(str(path), "r") as source:
            reader = pa.ipc.open_file(source)
            batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]  # zero-copy
            schema = reader.schema
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowInvalid) as exc:
        raise not_whole("file", exc) from None
    check_cache_facts(schema, ROWS_META, ROWS_CACHE_VERSION, _manifest_schema(manifest), path, num_rows, batches,
                      nulls=True)
    return pa.Table.from_batches(batches, schema)


def _open(path: Path, num_rows: int, manifest: str | os.PathLike[str]) -> pa.Table | None:
    """The mapped table, or ``None`` when the file is missing or not a whole, current row cache
    of ``manifest`` (then logged with the reason, and rebuilt by the caller)."""
    return open_or_none(lambda: _read(path, num_rows, manifest), path, "the row cache", log)
