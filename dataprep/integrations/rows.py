"""Every column of a compiled manifest, memory-mapped, for consumers that build whole records.

The loader maps only its columns (:class:`manifests.column_cache.ColumnCache`); Lhotse cuts and
``dataprep lookup`` need all of them. :class:`ManifestRows` converts the manifest once into an
uncompressed Arrow IPC file (``<cache dir>/<content hash>.rows.v3.arrow``) of record batches of
exactly ``batch_rows`` rows (the last shorter: row ``r`` is in batch ``r // batch_rows``) and a
buffer index beside it (``.rows.v3.index.npy``: per batch and column, byte position and size of
its validity, values/offsets and string data buffers). Opening reads the footer, the last batch
and the index header (constant time in the corpus); a read gathers each column's values from
the mapping, checked against their buffers' sizes, without fetching a record batch.
The build streams a block at a time (memory: a block) under the column cache's rules (one
builder under a file lock; the index written, then the data file renamed into place; version,
content hash, rows, batch size and an id shared with the index recorded and checked on open; a
pair that fails is logged and rebuilt).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from manifests.atomic_files import atomic_path
from manifests.column_cache import (
    CACHE_BATCH_ROWS,
    CacheInvalid,
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

#: layout version of the row cache files (3: batches of a fixed size, a buffer index beside the file)
ROWS_CACHE_VERSION = 3
#: rows per record batch of the cache: the build holds one such block (as the column cache's)
ROWS_PER_BATCH = CACHE_BATCH_ROWS
#: schema metadata key of the row cache's facts (version, manifest content hash, rows, batch_rows, index_id)
ROWS_META = "dataprep.rows_cache"
#: index header: magic, layout version, data file bytes, record batches, columns, index id (an int64 each)
_MAGIC = 0x52574958  # "RWIX"
_HEADER = 6

log = logging.getLogger(__name__)


def index_path(path: Path) -> Path:
    """The buffer index beside the row cache file ``path``."""
    return path.with_name(path.name.removesuffix(".arrow") + ".index.npy")


class ManifestRows:
    """All columns of a compiled manifest, mapped from the row cache (see the module docstring)."""

    def __init__(self, mapped: pa.Buffer, schema: pa.Schema, index: npt.NDArray[np.int64], batch_rows: int,
                 num_rows: int, path: Path, source: str) -> None:
        self._mapped = mapped
        self._bytes = np.frombuffer(mapped, dtype=np.uint8)
        self.schema = schema.remove_metadata()
        self._index = index  # (batches, columns, 6): validity, values/offsets, data: (byte position, size)
        self.batch_rows = batch_rows
        self.num_rows = num_rows
        self.path = path
        self.source = source

    @classmethod
    def open(cls, manifest: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None) -> ManifestRows:
        """Open (building on first use, under a file lock) the mapped rows of ``manifest``."""
        return open_or_build_cache(manifest, cache_dir, f"rows.v{ROWS_CACHE_VERSION}.arrow",
                                   lambda path: _open(path, str(manifest)), build_rows_cache, "the row cache")

    def records(self, rows: npt.ArrayLike, columns: list[str] | None = None) -> list[dict[str, Any]]:
        """Manifest rows ``rows`` (row numbers), in that order, as dicts of ``columns`` (None: all).

        Each column is one numpy gather over the mapping (positions from the buffer index):
        no Arrow kernel runs, no record batch is built, only the asked values become Python
        objects. A position outside its buffer (a damaged cache) is a one-line error.
        """
        idx = np.asarray(rows, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_rows):
            raise DataprepError(f"{self.source}: row {int(idx.max())} asked for, the manifest has {self.num_rows} rows "
                                "(plan made from another manifest?)")
        names = self.schema.names if columns is None else columns
        batch, local = np.divmod(idx, self.batch_rows)
        values = [self._column(self.schema.get_field_index(n), batch, local) for n in names]
        return [dict(zip(names, row)) for row in zip(*values)] if names else [{} for _ in range(idx.size)]

    def _column(self, c: int, batch: npt.NDArray[np.int64], local: npt.NDArray[np.int64]) -> list[Any]:
        typ = self.schema.field(c).type
        ent = self._index[batch, c]  # (rows, 6)
        has_bits = ent[:, 0] >= 0
        valid = np.ones(local.shape[0], dtype=bool)
        if has_bits.any():
            bit_at = np.where(has_bits, ent[:, 0] + (local >> 3), 0)
            self._inside(bit_at + 1, np.where(has_bits, ent[:, 0] + ent[:, 1], 1))
            valid = ~has_bits | ((self._bytes[bit_at] >> (local & 7)) & 1).astype(bool)
        local = np.where(valid, local, 0)  # a null's slot is not read: row 0 of a buffer that may be empty
        where, size = np.where(valid, ent[:, 2], 0), np.where(valid, ent[:, 3], 0)
        if pa.types.is_string(typ) or pa.types.is_large_string(typ):
            width = 8 if pa.types.is_large_string(typ) else 4
            self._inside(np.where(valid, where + (local + 2) * width, 0), size + where)
            pos = (where + local * width)[:, None] + np.arange(2 * width)
            lo = np.frombuffer(np.ascontiguousarray(self._bytes[pos]),
                               dtype=np.int64 if width == 8 else np.int32).reshape(-1, 2).astype(np.int64)
            lo[~valid] = 0
            data = np.where(valid, np.maximum(ent[:, 4], 0), 0)
            start, stop = data + lo[:, 0], data + lo[:, 1]
            self._inside(stop, data + np.where(valid, ent[:, 5], 0), lo[:, 0] <= lo[:, 1])
            mv = memoryview(self._mapped)
            out: list[Any] = [str(mv[a:z], "utf-8") for a, z in zip(start.tolist(), stop.tolist())]
        elif pa.types.is_integer(typ) or pa.types.is_floating(typ):
            dtype = np.dtype(typ.to_pandas_dtype())
            self._inside(np.where(valid, where + (local + 1) * dtype.itemsize, 0), size + where)
            pos = (where + local * dtype.itemsize)[:, None] + np.arange(dtype.itemsize)
            out = np.frombuffer(np.ascontiguousarray(self._bytes[pos]), dtype=dtype).tolist()
        else:
            raise DataprepError(f"manifest column of type {typ} is not supported by the row cache")
        for i in np.flatnonzero(~valid).tolist():
            out[i] = None
        return out

    def _inside(self, end: npt.NDArray[np.int64], limit: npt.NDArray[np.int64],
                ok: npt.NDArray[np.bool_] | None = None) -> None:
        """Refuse (one line) a read ending past its buffer (``limit``) or the mapping."""
        bad = (end > limit) | (end > self._bytes.shape[0])
        if ok is not None:
            bad |= ~ok
        if bad.any():
            raise DataprepError(f"{self.path}: the row cache of {self.source} is damaged (a value outside its "
                                "buffer); delete it and it is rebuilt")


def build_rows_cache(manifest: str | os.PathLike[str], path: Path, *, batch_rows: int = ROWS_PER_BATCH) -> None:
    """Write the row cache of ``manifest`` at ``path`` and its buffer index (``path``'s name starts
    with the manifest's content hash), streaming the manifest ``batch_rows`` rows at a time: every
    column as the manifest stores it, one record batch of exactly ``batch_rows`` rows per block
    (the last shorter). The index is written first and the data file renamed into place last,
    both tagged with one random id. Files of older layouts for the same manifest are removed."""
    schema = with_cache_facts(_manifest_schema(manifest), ROWS_META, ROWS_CACHE_VERSION, path, manifest)
    index_id = secrets.randbits(62)
    schema = schema.with_metadata({ROWS_META: json.dumps(
        {**json.loads(schema.metadata[ROWS_META.encode()]), "batch_rows": batch_rows, "index_id": index_id},
        sort_keys=True)})
    blocks = iter_manifest(manifest, None, batch_rows)
    building = path.with_name(f".{path.name}.building")
    try:
        # a block spanning two Parquet row groups is joined (one block's copy): one batch per block
        write_ipc_file(building, schema, (t.combine_chunks().to_batches()[0] for t in blocks if t.num_rows))
        index = _buffer_index(building, index_id)
        with atomic_path(index_path(path), fsync=False) as tmp, open(tmp, "wb") as f:
            np.save(f, index, allow_pickle=False)
        os.replace(building, path)
    finally:
        if building.exists():
            building.unlink()
    remove_older_versions(path, [f"rows.v{old}.arrow" for old in range(1, ROWS_CACHE_VERSION)])


def _buffer_index(path: Path, index_id: int) -> npt.NDArray[np.int64]:
    """The header and, per record batch and column, the (byte position, size) of its validity,
    values/offsets and data buffers in the file at ``path`` (-1, 0 where absent)."""
    source = pa.memory_map(str(path), "r")
    mapped = source.read_buffer()
    reader = pa.ipc.open_file(mapped)
    n, cols = reader.num_record_batches, len(reader.schema)
    out = np.full((n, cols, 6), -1, dtype=np.int64)
    out[:, :, 1::2] = 0
    for b in range(n):
        for c, arr in enumerate(reader.get_batch(b).columns):
            if arr.offset:
                raise DataprepError(f"{path}: an IPC column read back with an offset")
            for k, buf in enumerate(arr.buffers()[:3]):
                if buf is not None:
                    out[b, c, 2 * k:2 * k + 2] = buf.address - mapped.address, buf.size
            if arr.null_count == 0:
                out[b, c, 0:2] = -1, 0
    header = np.asarray([_MAGIC, ROWS_CACHE_VERSION, mapped.size, n, cols, index_id], dtype=np.int64)
    return np.concatenate([header, out.ravel()])


def _manifest_schema(manifest: str | os.PathLike[str]) -> pa.Schema:
    """The manifest's columns as the row cache stores them (the Parquet footer's, no metadata)."""
    try:
        return pq.read_schema(manifest).remove_metadata()
    except (OSError, pa.ArrowInvalid) as exc:
        raise DataprepError(f"{manifest}: not a readable Parquet file ({exc})") from None


def _read(path: Path, manifest: str) -> ManifestRows:
    """The mapped rows: the file's footer and facts, the last batch's rows and the index's
    header and shape checked against them (:func:`check_cache_facts`; no value read). Raises
    ``FileNotFoundError`` or :class:`CacheInvalid`."""
    try:
        mapped = pa.memory_map(str(path), "r").read_buffer()
        reader = pa.ipc.open_file(mapped)  # the footer only
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowInvalid) as exc:
        raise not_whole("file", exc) from None
    facts = check_cache_facts(reader.schema, ROWS_META, ROWS_CACHE_VERSION, None, path, [], nulls=True)
    size, rows, n = facts.get("batch_rows"), facts["rows"], reader.num_record_batches
    if type(size) is not int or size < 1:
        raise CacheInvalid(f"records a batch size of {str(size)[:40]}")
    if n != -(-rows // size) or (n and reader.get_batch(n - 1).num_rows != rows - (n - 1) * size):
        raise CacheInvalid(f"holds {n} record batches, not {rows} rows in batches of {size}")
    try:
        index = np.load(index_path(path), mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise CacheInvalid("its buffer index is missing") from None
    except (OSError, ValueError) as exc:
        raise CacheInvalid(f"its buffer index is unreadable ({str(exc)[:80]})") from None
    cols = len(reader.schema)
    want = [_MAGIC, ROWS_CACHE_VERSION, mapped.size, n, cols, facts.get("index_id")]
    if index.dtype != np.int64 or index.ndim != 1 or index.shape[0] != _HEADER + n * cols * 6 \
            or index[:_HEADER].tolist() != want:
        raise CacheInvalid("its buffer index is not the one written with it")
    return ManifestRows(mapped, reader.schema, index[_HEADER:].reshape(n, cols, 6), size, rows, path, manifest)


def _open(path: Path, manifest: str) -> ManifestRows | None:
    """The mapped rows, or ``None`` when the file is missing or not a whole, current row cache
    of ``manifest`` (then logged with the reason, and rebuilt by the caller)."""
    return open_or_none(lambda: _read(path, manifest), path, "the row cache", log)
