"""The compiled-manifest and rejects schemas.

A compiled manifest is one Parquet file, one row per utterance, in a stable row order.
Units: ``offset`` and ``duration`` in seconds (float64), ``num_tokens`` counts decoder
tokens including the fixed prompt, ``tps`` = num_tokens / duration (tokens per second).

Schema version 2 adds the container addressing columns (:data:`CONTAINER_FIELDS`) for audio
inside tar shards (container path, byte offset and size of the member's data) or Parquet files
(file, row group, row in the group). They are written only by manifests that hold such rows: a
manifest of loose files keeps exactly the version-1 columns (and content hash) and is marked
version 1, so files written before version 2 and after it read alike.
"""

from __future__ import annotations

import polars as pl
import pyarrow as pa

#: the newest manifest schema version this tool reads and writes
SCHEMA_VERSION = 2
#: the version of a manifest without container columns
SCHEMA_VERSION_LOOSE = 1

#: Parquet key-value metadata keys written by :func:`manifests.io.write_manifest`.
META_SCHEMA_VERSION = b"speech_dataprep.schema_version"
META_CONTENT_HASH = b"speech_dataprep.content_hash"
META_KIND = b"speech_dataprep.kind"
META_PROVENANCE = b"speech_dataprep.provenance"

MANIFEST_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("audio_path", pa.string()),
        pa.field("offset", pa.float64()),
        pa.field("duration", pa.float64()),
        pa.field("sample_rate", pa.int32()),
        pa.field("channels", pa.int16()),
        pa.field("text", pa.string()),
        pa.field("lang", pa.string()),
        pa.field("source_lang", pa.string()),
        pa.field("target_lang", pa.string()),
        pa.field("task", pa.string()),
        pa.field("num_tokens", pa.int32()),
        pa.field("tps", pa.float64()),
        pa.field("origin", pa.string()),
        pa.field("extra", pa.string()),
    ]
)

MANIFEST_COLUMNS: tuple[str, ...] = tuple(MANIFEST_SCHEMA.names)

#: container addressing (schema version 2): ``container`` is the absolute path of the tar or
#: Parquet file; tar members: ``member_offset`` / ``member_size`` = byte offset and size of the
#: member's data in the tar; Parquet rows: ``row_group`` and ``group_row`` (row inside the group).
CONTAINER_FIELDS: tuple[pa.Field, ...] = (
    pa.field("container", pa.string()),
    pa.field("member_offset", pa.int64()),
    pa.field("member_size", pa.int64()),
    pa.field("row_group", pa.int32()),
    pa.field("group_row", pa.int64()),
)
CONTAINER_COLUMNS: tuple[str, ...] = tuple(f.name for f in CONTAINER_FIELDS)
CONTAINER_POLARS_SCHEMA: dict[str, pl.DataType] = {
    "container": pl.String(),
    "member_offset": pl.Int64(),
    "member_size": pl.Int64(),
    "row_group": pl.Int32(),
    "group_row": pl.Int64(),
}
#: the manifest schema with the container columns (version 2)
CONTAINER_MANIFEST_SCHEMA = pa.schema([*MANIFEST_SCHEMA, *CONTAINER_FIELDS])

#: Polars dtypes of the manifest columns, in schema order.
POLARS_SCHEMA: dict[str, pl.DataType] = {
    "id": pl.String(),
    "audio_path": pl.String(),
    "offset": pl.Float64(),
    "duration": pl.Float64(),
    "sample_rate": pl.Int32(),
    "channels": pl.Int16(),
    "text": pl.String(),
    "lang": pl.String(),
    "source_lang": pl.String(),
    "target_lang": pl.String(),
    "task": pl.String(),
    "num_tokens": pl.Int32(),
    "tps": pl.Float64(),
    "origin": pl.String(),
    "extra": pl.String(),
}

#: A rejects file holds every manifest column (nullable: a malformed line has none) plus
#: ``reason`` (a short machine-readable code) and ``detail`` (one human-readable line).
REJECT_REASONS: tuple[str, ...] = (
    "malformed_line",
    "non_utf8",
    "missing_field",
    "invalid_duration",
    "empty_text",
    "duplicate_id",
    "missing_audio",
    "unreadable_audio",
    "duration_mismatch",
    "segment_out_of_range",
    "no_tokenizer",
    "implausible_duration",
    "truncated_audio",
    "max_tps",
    "min_tps",
    "min_duration",
    "max_duration",
    "min_tokens",
    "max_tokens",
    "exceeds_bucket",
    "missing_shard",
    "missing_member",
    "truncated_member",
    "unlisted_member",
)

REJECTS_POLARS_SCHEMA: dict[str, pl.DataType] = {
    **POLARS_SCHEMA,
    "reason": pl.String(),
    "detail": pl.String(),
}

REJECTS_SCHEMA = pa.schema(
    [f.with_nullable(True) for f in MANIFEST_SCHEMA] + [pa.field("reason", pa.string()), pa.field("detail", pa.string())]
)

#: manifest / rejects columns plus the container columns: what compile carries internally
FULL_POLARS_SCHEMA: dict[str, pl.DataType] = {**POLARS_SCHEMA, **CONTAINER_POLARS_SCHEMA}
FULL_REJECTS_POLARS_SCHEMA: dict[str, pl.DataType] = {**REJECTS_POLARS_SCHEMA, **CONTAINER_POLARS_SCHEMA}
CONTAINER_REJECTS_SCHEMA = pa.schema([*REJECTS_SCHEMA, *CONTAINER_FIELDS])


def has_containers(df: pl.DataFrame | pa.Table) -> bool:
    """Whether any row of ``df`` is addressed inside a container (a non-null ``container``)."""
    names = df.column_names if isinstance(df, pa.Table) else df.columns
    if "container" not in names:
        return False
    if isinstance(df, pa.Table):
        col = df.column("container")
        return bool(len(col) - col.null_count)
    return bool(df.height - df["container"].null_count())


def manifest_schema(containers: bool) -> pa.Schema:
    """The Arrow schema of a manifest with (version 2) or without (version 1) container rows."""
    return CONTAINER_MANIFEST_SCHEMA if containers else MANIFEST_SCHEMA


def rejects_schema(containers: bool) -> pa.Schema:
    """The Arrow schema of a rejects file with or without the container columns."""
    return CONTAINER_REJECTS_SCHEMA if containers else REJECTS_SCHEMA


def schema_version(schema: pa.Schema) -> int:
    """The version a file of ``schema`` is marked with: 2 with container columns, else 1."""
    return SCHEMA_VERSION if "container" in schema.names else SCHEMA_VERSION_LOOSE


def empty_rejects() -> pl.DataFrame:
    """A rejects frame with no rows and the full schema."""
    return pl.DataFrame(schema=REJECTS_POLARS_SCHEMA)


def conform(df: pl.DataFrame, schema: dict[str, pl.DataType] = POLARS_SCHEMA) -> pl.DataFrame:
    """Select ``schema``'s columns in order with its dtypes; absent columns become null."""
    if not df.columns:  # a select of literals alone would make one all-null row
        return pl.DataFrame(schema=schema)
    return df.select(
        [
            (pl.col(name) if name in df.columns else pl.lit(None)).cast(dtype).alias(name)
            for name, dtype in schema.items()
        ]
    )


def trim_containers(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` without its container columns when no row has a container (a version-1 frame)."""
    if has_containers(df):
        return df
    return df.drop([c for c in CONTAINER_COLUMNS if c in df.columns])
