"""The compiled-manifest and rejects schemas.

A compiled manifest is one Parquet file, one row per utterance, in a stable row order.
Units: ``offset`` and ``duration`` in seconds (float64), ``num_tokens`` counts decoder
tokens including the fixed prompt, ``tps`` = num_tokens / duration (tokens per second).
Optional columns, each written only by a manifest with a row that has one (else the older
version's bytes and content hash): version 2, the container addressing columns
(:data:`CONTAINER_FIELDS`: audio in tar shards or Parquet files); version 3, ``corpus`` (the
corpus of a row of an ``input_cfg`` blend); version 4, ``modality`` (``"audio"`` / ``"text"``,
in a manifest holding text-only rows; absent: every row is audio). A text row has no audio
(``audio_path`` null), ``duration`` 0.0 and no ``tps``; its ``num_tokens`` counts its prompt
(context) and answer tokens.
"""

from __future__ import annotations

import polars as pl
import pyarrow as pa

#: the newest manifest schema version this tool reads and writes
SCHEMA_VERSION = 4
#: the version of a manifest with ``corpus`` and no ``modality``
SCHEMA_VERSION_CORPUS = 3
#: the version of a manifest with container columns and no ``corpus``
SCHEMA_VERSION_CONTAINERS = 2
#: the version of a manifest without container columns
SCHEMA_VERSION_LOOSE = 1

#: Parquet key-value metadata keys written by :func:`manifests.manifest_write.write_manifest`.
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
#: the corpus a row came from (schema version 3; many-corpora manifests only)
CORPUS_FIELD = pa.field("corpus", pa.string())
CORPUS_COLUMN = "corpus"
#: what a row is (schema version 4; manifests holding text-only rows only): ``"audio"`` / ``"text"``
MODALITY_FIELD = pa.field("modality", pa.string())
MODALITY_COLUMN = "modality"
MODALITIES: tuple[str, ...] = ("audio", "text")
#: every column a manifest may hold, in order (containers, then corpus, then modality)
FULL_MANIFEST_SCHEMA = pa.schema([*CONTAINER_MANIFEST_SCHEMA, CORPUS_FIELD, MODALITY_FIELD])

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
    "audio_changed",
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
FULL_POLARS_SCHEMA: dict[str, pl.DataType] = {**POLARS_SCHEMA, **CONTAINER_POLARS_SCHEMA, CORPUS_COLUMN: pl.String(),
                                              MODALITY_COLUMN: pl.String()}
FULL_REJECTS_POLARS_SCHEMA: dict[str, pl.DataType] = {**REJECTS_POLARS_SCHEMA, **CONTAINER_POLARS_SCHEMA,
                                                      CORPUS_COLUMN: pl.String(), MODALITY_COLUMN: pl.String()}
CONTAINER_REJECTS_SCHEMA = pa.schema([*REJECTS_SCHEMA, *CONTAINER_FIELDS])
FULL_REJECTS_SCHEMA = pa.schema([*CONTAINER_REJECTS_SCHEMA, CORPUS_FIELD, MODALITY_FIELD])


def _any_value(df: pl.DataFrame | pa.Table, column: str) -> bool:
    names = df.column_names if isinstance(df, pa.Table) else df.columns
    if column not in names:
        return False
    if isinstance(df, pa.Table):
        col = df.column(column)
        return bool(len(col) - col.null_count)
    return bool(df.height - df[column].null_count())


def has_containers(df: pl.DataFrame | pa.Table) -> bool:
    """Whether any row of ``df`` is addressed inside a container (a non-null ``container``)."""
    return _any_value(df, "container")


def has_corpus(df: pl.DataFrame | pa.Table) -> bool:
    """Whether any row of ``df`` names its corpus (a non-null ``corpus``)."""
    return _any_value(df, CORPUS_COLUMN)


def has_modality(df: pl.DataFrame | pa.Table) -> bool:
    """Whether any row of ``df`` says its modality (a non-null ``modality``: a manifest with text rows)."""
    return _any_value(df, MODALITY_COLUMN)


def _optional(base: pa.Schema, corpus: bool, modality: bool) -> pa.Schema:
    return pa.schema([*base, *([CORPUS_FIELD] if corpus else []), *([MODALITY_FIELD] if modality else [])])


def manifest_schema(containers: bool, corpus: bool = False, modality: bool = False) -> pa.Schema:
    """The Arrow schema of a manifest with or without container rows, ``corpus`` and ``modality``."""
    return _optional(CONTAINER_MANIFEST_SCHEMA if containers else MANIFEST_SCHEMA, corpus, modality)


def rejects_schema(containers: bool, corpus: bool = False, modality: bool = False) -> pa.Schema:
    """The Arrow schema of a rejects file with or without the container columns, ``corpus`` and ``modality``."""
    return _optional(CONTAINER_REJECTS_SCHEMA if containers else REJECTS_SCHEMA, corpus, modality)


def schema_version(schema: pa.Schema) -> int:
    """The version a file of ``schema`` is marked with: 4 with ``modality``, 3 with ``corpus``,
    2 with container columns, else 1."""
    if MODALITY_COLUMN in schema.names:
        return SCHEMA_VERSION
    if CORPUS_COLUMN in schema.names:
        return SCHEMA_VERSION_CORPUS
    return SCHEMA_VERSION_CONTAINERS if "container" in schema.names else SCHEMA_VERSION_LOOSE


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
    """``df`` without its container columns when no row has a container, without ``corpus``
    when no row has one and without ``modality`` when no row has one (the optional columns of
    versions 2, 3 and 4)."""
    if not has_corpus(df) and CORPUS_COLUMN in df.columns:
        df = df.drop(CORPUS_COLUMN)
    if not has_modality(df) and MODALITY_COLUMN in df.columns:
        df = df.drop(MODALITY_COLUMN)
    if has_containers(df):
        return df
    return df.drop([c for c in CONTAINER_COLUMNS if c in df.columns])
