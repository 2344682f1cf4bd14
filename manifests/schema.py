"""The compiled-manifest and rejects schemas.

A compiled manifest is one Parquet file, one row per utterance, in a stable row order.
Units: ``offset`` and ``duration`` in seconds (float64), ``num_tokens`` counts decoder
tokens including the fixed prompt, ``tps`` = num_tokens / duration (tokens per second).
"""

from __future__ import annotations

import polars as pl
import pyarrow as pa

SCHEMA_VERSION = 1

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
    "max_tps",
    "min_tps",
    "min_duration",
    "max_duration",
    "min_tokens",
    "max_tokens",
    "exceeds_bucket",
)

REJECTS_POLARS_SCHEMA: dict[str, pl.DataType] = {
    **POLARS_SCHEMA,
    "reason": pl.String(),
    "detail": pl.String(),
}

REJECTS_SCHEMA = pa.schema(
    [f.with_nullable(True) for f in MANIFEST_SCHEMA] + [pa.field("reason", pa.string()), pa.field("detail", pa.string())]
)


def empty_manifest() -> pl.DataFrame:
    """A manifest frame with no rows and the full schema."""
    return pl.DataFrame(schema=POLARS_SCHEMA)


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
