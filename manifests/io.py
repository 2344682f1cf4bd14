"""Atomic Parquet/JSON writes, manifest reading and content hashing.

Every file the toolchain writes goes through :func:`atomic_path`: the data is written to a
temporary file in the destination folder and renamed over the target, so a crash never
leaves a half-written manifest, rejects file or plan.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from manifests.errors import ManifestError
from manifests.schema import (
    MANIFEST_SCHEMA,
    META_CONTENT_HASH,
    META_KIND,
    META_PROVENANCE,
    META_SCHEMA_VERSION,
    POLARS_SCHEMA,
    REJECTS_POLARS_SCHEMA,
    REJECTS_SCHEMA,
    SCHEMA_VERSION,
    conform,
)


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it over ``path`` on success.

    On an exception the temporary file is removed and ``path`` is left untouched.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp_path, 0o666 & ~_UMASK)  # mkstemp makes 0600; outputs are ordinary files
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_json(obj: Any, path: str | os.PathLike[str]) -> None:
    """Write ``obj`` as indented, key-sorted JSON, atomically (byte-stable for equal input)."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def table_hash(table: pa.Table) -> str:
    """SHA-256 of a table's data (schema and values, not file metadata), as hex.

    Computed over the Arrow IPC stream of the table without schema metadata, in row
    chunks, so equal data gives the equal hash whatever the Parquet writer or row groups.
    """
    table = table.replace_schema_metadata(None).combine_chunks()
    digest = hashlib.sha256()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=1 << 16):
            writer.write_batch(batch)
    digest.update(sink.getvalue())
    return digest.hexdigest()


def _write_parquet(
    df: pl.DataFrame,
    path: str | os.PathLike[str],
    schema: pa.Schema,
    kind: str,
    provenance: Mapping[str, Any] | None,
) -> str:
    table = df.to_arrow().cast(schema)
    content_hash = table_hash(table)
    meta = {
        META_SCHEMA_VERSION: str(SCHEMA_VERSION).encode(),
        META_CONTENT_HASH: content_hash.encode(),
        META_KIND: kind.encode(),
        META_PROVENANCE: json.dumps(dict(provenance or {}), sort_keys=True).encode(),
    }
    table = table.replace_schema_metadata(meta)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd", row_group_size=1 << 20)
    return content_hash


def write_manifest(
    df: pl.DataFrame, path: str | os.PathLike[str], provenance: Mapping[str, Any] | None = None
) -> str:
    """Write a compiled manifest atomically; return its content hash.

    ``df`` is conformed to :data:`MANIFEST_SCHEMA` (column order and dtypes).
    """
    return _write_parquet(conform(df, POLARS_SCHEMA), path, MANIFEST_SCHEMA, "manifest", provenance)


def write_rejects(
    df: pl.DataFrame, path: str | os.PathLike[str], provenance: Mapping[str, Any] | None = None
) -> str:
    """Write a rejects file (manifest columns + ``reason`` + ``detail``) atomically."""
    return _write_parquet(conform(df, REJECTS_POLARS_SCHEMA), path, REJECTS_SCHEMA, "rejects", provenance)


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Schema version, content hash, kind and provenance of a file we wrote."""
    try:
        meta = pq.read_schema(path).metadata or {}
    except (OSError, pa.ArrowInvalid) as exc:
        raise ManifestError(f"{path}: not a readable Parquet file ({exc})") from None
    return {
        "schema_version": int(meta.get(META_SCHEMA_VERSION, b"0")),
        "content_hash": meta.get(META_CONTENT_HASH, b"").decode(),
        "kind": meta.get(META_KIND, b"").decode(),
        "provenance": json.loads(meta.get(META_PROVENANCE, b"{}")),
    }


def read_manifest(path: str | os.PathLike[str], columns: list[str] | None = None) -> pl.DataFrame:
    """Read a compiled manifest; raise :class:`ManifestError` (one line) if it is not one."""
    meta = read_metadata(path)
    if meta["kind"] not in ("manifest", "rejects"):
        raise ManifestError(f"{path}: not a compiled manifest (run `dataprep compile` first)")
    if meta["schema_version"] > SCHEMA_VERSION:
        raise ManifestError(
            f"{path}: schema version {meta['schema_version']} is newer than this tool's {SCHEMA_VERSION}"
        )
    return pl.read_parquet(path, columns=columns)


def manifest_hash(path: str | os.PathLike[str]) -> str:
    """The content hash recorded in a compiled manifest's metadata."""
    return str(read_metadata(path)["content_hash"])


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file's bytes, as hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
