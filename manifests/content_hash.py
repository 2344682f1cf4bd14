"""The content hash of a table's values (its definition: :class:`ContentHasher`) and a
file's byte SHA-256.

The content hash is of values (schema and rows), never of layout: equal rows hash equal
whatever their chunking, string layout or Parquet row groups. Recomputing it from a file
streams one hash block (:data:`HASH_BLOCK_ROWS` rows) at a time.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from manifests.arrow_views import string_buffers
from manifests.errors import ManifestError
from manifests.rebatch import Rebatcher


#: rows per block of the content hash (the last block of a table may be shorter)


HASH_BLOCK_ROWS = 1 << 16


_HASH_DOMAIN = b"speech_dataprep content hash v2\n"


_CANONICAL_TYPES = {pa.large_string(): pa.string(), pa.string_view(): pa.string(), pa.large_binary(): pa.binary(),
                    pa.binary_view(): pa.binary()}


def _canonical_type(t: pa.DataType) -> pa.DataType:
    return _CANONICAL_TYPES.get(t, t)


class ContentHasher:
    """Incremental content hash of a table's VALUES (schema and rows, not layout or metadata).

    Definition (hex SHA-256), so any tool can recompute it::

        "speech_dataprep content hash v2\n"
        for each field: utf8(name) + b"\0" + str(type) + b"\n"     (large_string/string_view -> string)
        for each consecutive block of 65,536 rows (the last one shorter), for each column:
            validity: np.packbits(is_valid)                  (1 bit per row, MSB first)
            values, nulls filled:  fixed width: fill_null(0) as little-endian numpy bytes
                                   string/binary: fill_null("") then int64 offsets - offsets[0]
                                   (little-endian, rows + 1 of them) and the data bytes they span
        the total number of rows as 8 bytes little-endian

    Equal values give the equal hash whatever the chunking, slicing, bytes under null slots,
    string vs large_string layout or Parquet row groups; ``update`` may be fed any split.
    """

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self._digest = hashlib.sha256(_HASH_DOMAIN)
        for f in schema:
            self._digest.update(f.name.encode() + b"\0" + str(_canonical_type(f.type)).encode() + b"\n")
        self._blocks = Rebatcher(HASH_BLOCK_ROWS)
        self.rows = 0

    def update(self, table: pa.Table | pa.RecordBatch) -> None:
        """Add the next rows (columns in schema order, same names)."""
        if table.schema.names != self.schema.names:
            raise ValueError(f"columns {table.schema.names} differ from the hasher's {self.schema.names}")
        for block in self._blocks.push(table):
            self._block(block)

    def _block(self, block: pa.Table) -> None:
        for column in block.columns:
            arr = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
            self._column(arr)
        self.rows += block.num_rows

    def _column(self, arr: pa.Array) -> None:
        d = self._digest
        valid = arr.is_valid().to_numpy(zero_copy_only=False)
        d.update(np.packbits(valid).tobytes())
        t = arr.type
        if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
            arr = arr.cast(pa.large_binary() if pa.types.is_binary_view(t) else pa.large_string())
            t = arr.type
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
            offsets, data = self._offsets(arr)
            if arr.null_count and (np.diff(offsets)[~valid] != 0).any():  # bytes under a null slot
                binary = pa.types.is_binary(t) or pa.types.is_large_binary(t)
                offsets, data = self._offsets(pc.fill_null(arr, b"" if binary else ""))
            d.update((offsets - offsets[0]).astype("<i8", copy=False).tobytes())
            if offsets[-1] > offsets[0]:
                d.update(data[int(offsets[0]): int(offsets[-1])])
        elif pa.types.is_boolean(t):
            d.update(pc.fill_null(arr, False).to_numpy(zero_copy_only=False).astype(np.uint8).tobytes())
        elif pa.types.is_integer(t) or pa.types.is_floating(t):
            values = (pc.fill_null(arr, 0) if arr.null_count else arr).to_numpy(zero_copy_only=False)
            d.update(values.astype(values.dtype.newbyteorder("<"), copy=False).tobytes())
        elif pa.types.is_null(t):
            pass
        else:
            raise TypeError(f"content hash: unsupported column type {t}")

    @staticmethod
    def _offsets(arr: pa.Array) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint8]]:
        """(int64 offsets of the array's rows, its data buffer)."""
        offsets, data = string_buffers(arr)
        return offsets.astype(np.int64), data

    def hexdigest(self) -> str:
        """The hash of every row added so far (``update`` may not be called afterwards)."""
        last = self._blocks.rest()
        if last is not None:
            self._block(last)
        self._digest.update(self.rows.to_bytes(8, "little"))
        return self._digest.hexdigest()


def table_hash(table: pa.Table) -> str:
    """Content hash of a table's values (see :class:`ContentHasher` for the definition), as hex."""
    hasher = ContentHasher(table.schema)
    hasher.update(table)
    return hasher.hexdigest()


def recompute_hash(path: str | os.PathLike[str]) -> str:
    """Content hash of a Parquet file's rows, recomputed from the values, streamed one hash
    block (:data:`HASH_BLOCK_ROWS` rows) at a time: memory about one block of rows plus a
    column page being decoded, not a row group and never the file."""
    try:
        pf = pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 20)
        hasher = ContentHasher(pf.schema_arrow.remove_metadata())
        for batch in pf.iter_batches(batch_size=HASH_BLOCK_ROWS, use_threads=False):
            hasher.update(batch)
    except (OSError, pa.ArrowException, ValueError, TypeError) as exc:
        raise ManifestError(f"{path}: rows cannot be read back ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    return hasher.hexdigest()


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file's bytes, as hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
