"""Writing compiled manifests and rejects files: Parquet (zstd) with the content hash, kind,
schema version and provenance in the schema metadata.

A frame is written with :func:`write_manifest` / :func:`write_rejects`; a stream too large
for memory with :func:`write_parquet_stream` (same bytes, memory about one row group). Every
write is atomic (:func:`manifests.atomic_files.atomic_path`) and records its hash as verified
(:func:`manifests.hash_cache.remember_verified`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from manifests.storage import is_url, name
from manifests.atomic_files import atomic_path
from manifests.content_hash import ContentHasher
from manifests.hash_cache import remember_verified
from manifests.rebatch import Rebatcher
from manifests.schema import (
    CONTAINER_POLARS_SCHEMA,
    CORPUS_COLUMN,
    MODALITY_COLUMN,
    META_CONTENT_HASH,
    META_KIND,
    META_PROVENANCE,
    META_SCHEMA_VERSION,
    POLARS_SCHEMA,
    REJECTS_POLARS_SCHEMA,
    conform,
    has_containers,
    has_corpus,
    has_modality,
    manifest_schema,
    rejects_schema,
    schema_version,
)


#: rows per Parquet row group of a manifest or rejects file


ROW_GROUP_ROWS = 1 << 20


def file_metadata(content_hash: str, kind: str, provenance: Mapping[str, Any] | None,
                   version: int) -> dict[bytes, bytes]:
    return {
        META_SCHEMA_VERSION: str(version).encode(),
        META_CONTENT_HASH: content_hash.encode(),
        META_KIND: kind.encode(),
        META_PROVENANCE: json.dumps(dict(provenance or {}), sort_keys=True).encode(),
    }


@dataclass
class StreamWritten:
    """What :func:`write_parquet_stream` wrote: the content hash and the number of rows."""

    content_hash: str
    rows: int


def write_parquet_stream(
    make_tables: Callable[[], Iterable[pa.Table | pa.RecordBatch]],
    path: str | os.PathLike[str],
    schema: pa.Schema,
    kind: str,
    provenance: Mapping[str, Any] | None = None,
    *,
    row_group_size: int = ROW_GROUP_ROWS,
) -> StreamWritten:
    """Write the rows ``make_tables()`` yields as one Parquet file, atomically, in bounded memory.

    ``make_tables`` is called twice (the content hash goes into the schema metadata, which a
    Parquet writer fixes when it opens: first pass hashes, second writes) and must yield the same
    rows both times. Rows are cast to ``schema`` and written in row groups of exactly
    ``row_group_size`` rows (the last shorter), zstd: the bytes equal ``pq.write_table`` of the
    whole table with that row group size. Memory: about one row group.
    """
    hasher = ContentHasher(schema)
    for t in make_tables():
        hasher.update(t.cast(schema) if t.schema != schema else t)
    content_hash = hasher.hexdigest()
    full = schema.with_metadata(file_metadata(content_hash, kind, provenance, schema_version(schema)))
    with atomic_path(path) as tmp:
        with RowGroupWriter(tmp, full, row_group_size) as writer:
            for t in make_tables():
                writer.write(t)
        rows = writer.rows
        if rows != hasher.rows:
            raise AssertionError(f"{path}: the second pass gave {rows} rows, the first {hasher.rows}")
    remember_verified(path, content_hash)
    return StreamWritten(content_hash, rows)


class RowGroupWriter:
    """A Parquet file (zstd) written from tables pushed in any split, as row groups of exactly
    ``row_group_size`` rows (the last shorter; one empty group for no rows): the bytes of
    ``pq.write_table`` of the whole table. ``schema`` carries the file's metadata; pushed
    tables are cast to it. Memory: about one row group. Use as a context manager."""

    def __init__(self, path: str | os.PathLike[str], schema: pa.Schema, row_group_size: int = ROW_GROUP_ROWS) -> None:
        self.schema, self.size = schema, row_group_size
        self._writer = pq.ParquetWriter(path, schema, compression="zstd")
        self._groups = Rebatcher(row_group_size)
        self.rows = 0

    def write(self, table: pa.Table | pa.RecordBatch) -> None:
        """Append rows."""
        for group in self._groups.push(table):
            self._flush(group)

    def _flush(self, group: pa.Table) -> None:
        group = pa.Table.from_arrays([c.combine_chunks() for c in group.columns], names=group.schema.names)
        self._writer.write_table(group.cast(self.schema), row_group_size=self.size)
        self.rows += group.num_rows

    def close(self) -> None:
        """Write the last row group and the footer."""
        last = self._groups.rest()
        if last is not None:
            self._flush(last)
        if self.rows == 0:  # pq.write_table writes one empty row group for an empty table
            self._writer.write_table(self.schema.empty_table(), row_group_size=self.size)
        self._writer.close()

    def __enter__(self) -> RowGroupWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:
            self._writer.close()


def output_schemas(kind: str, containers: bool, corpus: bool,
                   modality: bool = False) -> tuple[dict[str, pl.DataType], pa.Schema]:
    """The polars and Arrow schemas of a ``"manifest"`` or ``"rejects"`` file, with or without
    the container columns, ``corpus`` and ``modality`` (what :func:`write_manifest` /
    :func:`write_rejects` write for a frame with rows in containers / naming their corpus /
    holding text rows)."""
    base = POLARS_SCHEMA if kind == "manifest" else REJECTS_POLARS_SCHEMA
    schema = {**base, **(CONTAINER_POLARS_SCHEMA if containers else {}), **({CORPUS_COLUMN: pl.String()} if corpus else {}),
              **({MODALITY_COLUMN: pl.String()} if modality else {})}
    return schema, (manifest_schema if kind == "manifest" else rejects_schema)(containers, corpus, modality)


def _write_parquet(
    df: pl.DataFrame,
    path: str | os.PathLike[str],
    schema: pa.Schema,
    kind: str,
    provenance: Mapping[str, Any] | None,
    row_group_size: int = ROW_GROUP_ROWS,
) -> str:
    table = df.to_arrow().cast(schema)
    return write_parquet_stream(lambda: [table], path, schema, kind, provenance,
                                row_group_size=row_group_size).content_hash


def write_manifest(
    df: pl.DataFrame, path: str | os.PathLike[str], provenance: Mapping[str, Any] | None = None,
    *, row_group_size: int = ROW_GROUP_ROWS,
) -> str:
    """Write a compiled manifest atomically; return its content hash.

    ``df`` is conformed to :data:`MANIFEST_SCHEMA` (column order and dtypes), plus the container
    columns (schema version 2) when any row has a ``container``. For a manifest too large for
    memory, stream it with :func:`write_parquet_stream` (same bytes).
    """
    schema, arrow = output_schemas("manifest", has_containers(df), has_corpus(df), has_modality(df))
    return _write_parquet(conform(df, schema), path, arrow, "manifest", provenance, row_group_size)


def write_rejects(
    df: pl.DataFrame, path: str | os.PathLike[str], provenance: Mapping[str, Any] | None = None,
    *, row_group_size: int = ROW_GROUP_ROWS,
) -> str:
    """Write a rejects file (manifest columns + ``reason`` + ``detail``, plus the container
    columns when any row has a ``container``) atomically."""
    schema, arrow = output_schemas("rejects", has_containers(df), has_corpus(df), has_modality(df))
    return _write_parquet(conform(df, schema), path, arrow, "rejects", provenance, row_group_size)


def default_rejects_path(output: str | os.PathLike[str]) -> Path:
    """Where a command writing ``output`` puts its rejected rows by default:
    ``<output stem>.rejects.parquet`` next to it (``kept.parquet`` -> ``kept.rejects.parquet``)."""
    if is_url(os.fspath(output)):  # a store URL keeps its scheme (Path would make s3://b s3:/b)
        text = os.fspath(output)
        return text[: len(text) - len(name(text))] + Path(name(text)).stem + ".rejects.parquet"  # type: ignore[return-value]
    out = Path(output)
    return out.with_name(out.stem + ".rejects.parquet")


def reasons_count(rejects: pl.DataFrame) -> dict[str, int]:
    """Rejected rows per ``reason``, sorted by reason (empty for no rows)."""
    return dict(sorted(rejects.group_by("reason").len().iter_rows())) if rejects.height else {}
