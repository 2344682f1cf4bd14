"""NeMo JSONL and Lhotse cuts JSONL(.gz): line blocks parsed by DuckDB's JSON functions.

No Python object per line: lines arrive as Arrow strings (:mod:`._lines`), DuckDB validates
and extracts fields vectorized; Python touches only lines that fail to parse (to word the
message).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import duckdb
import polars as pl

from manifests.readers._lines import iter_lines
from manifests.readers._normalize import base_dir_for, finish

#: The remaining top-level keys, as a JSON object with sorted keys (null when none).
_SORTED_OBJECT = (
    "CASE WHEN {rest} IS NULL OR {rest} = '{{}}' THEN NULL ELSE '{{' || array_to_string(list_transform("
    "list_sort(list_zip(json_keys({rest}), json_extract({rest}, '$.*'))), "
    "lambda x: to_json(x[1]) || ':' || x[2]::VARCHAR), ',') || '}}' END"
)

NEMO_FIELDS = {  # our field -> NeMo key (text is set per call)
    "audio": "audio_filepath",
    "offset": "offset",
    "duration": "duration",
    "lang": "lang",
    "source_lang": "source_lang",
    "target_lang": "target_lang",
    "task": "taskname",
}


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _key_path(key: str) -> str:
    return _sql_str("$." + json.dumps(key))


def _parse_errors(chunk: pl.DataFrame, origin_prefix: str) -> pl.DataFrame:
    """reason/detail for non-UTF-8 and non-JSON lines (the only per-line Python work)."""
    bad = chunk.filter(pl.col("utf8_error").is_not_null() | ~pl.col("ok") | (pl.col("jt") != "OBJECT"))
    rows = []
    for lineno, line, uerr, ok, jt in bad.select("lineno", "line", "utf8_error", "ok", "jt").iter_rows():
        where = f"{origin_prefix}:{lineno}"
        if uerr is not None:
            rows.append((lineno, "non_utf8", f"{where}: {uerr}"))
        elif not ok:
            try:
                json.loads(line)
                msg = "malformed JSON"
            except json.JSONDecodeError as exc:
                msg = f"malformed JSON ({exc.msg} at column {exc.colno})"
            rows.append((lineno, "malformed_line", f"{where}: {msg}"))
        else:
            rows.append((lineno, "malformed_line", f"{where}: expected a JSON object, got {jt}"))
    return pl.DataFrame(rows, schema={"lineno": pl.Int64, "reason": pl.String, "detail": pl.String}, orient="row")


def _query(con: duckdb.DuckDBPyConnection, chunk: pl.DataFrame, select: str) -> pl.DataFrame:
    con.register("chunk", chunk.select("lineno", "line"))
    try:
        sql = (
            "WITH p AS (SELECT lineno, TRY_CAST(line AS JSON) AS j FROM chunk), "
            "q AS (SELECT lineno, j, json_type(j) AS jt FROM p), "
            "r AS (SELECT lineno, j IS NOT NULL AS ok, jt, CASE WHEN jt = 'OBJECT' THEN j END AS o FROM q) "
            f"SELECT lineno, ok, jt, {select} FROM r"
        )
        return con.sql(sql).pl()
    finally:
        con.unregister("chunk")


def _fields_select(fields: dict[str, str], remove: list[str]) -> str:
    paths = "[" + ",".join(_key_path(k) for k in fields.values()) + "]"
    parts = [
        f"json_extract_string(o, {paths}) AS v",
        f"json_type(o, {paths}) AS ty",
    ]
    patch = _sql_str(json.dumps({k: None for k in remove}))
    parts.append("CASE WHEN o IS NOT NULL THEN " + _SORTED_OBJECT.format(rest=f"json_merge_patch(o, {patch})") + " END AS extra")
    return ", ".join(parts)


def _assemble(chunk: pl.DataFrame, parsed: pl.DataFrame, names: list[str], origin_prefix: str) -> pl.DataFrame:
    df = chunk.select("lineno", "line", "utf8_error").join(parsed, on="lineno", how="left", maintain_order="left")
    errors = _parse_errors(df, origin_prefix)
    df = df.join(errors, on="lineno", how="left", maintain_order="left")
    return df.with_columns(
        pl.format("{}:{}", pl.lit(origin_prefix), pl.col("lineno")).alias("origin"),
        *[pl.col("v").list.get(i, null_on_oob=True).alias(n) for i, n in enumerate(names)],
        *[pl.col("ty").list.get(i, null_on_oob=True).alias(f"{n}__t") for i, n in enumerate(names)],
    )


def iter_nemo(
    path: Path, *, text_field: str, audio_root: str | Path | None, chunk_rows: int
) -> Iterator[pl.DataFrame]:
    """NeMo JSONL: one row per non-blank line; ids derived from ``audio_filepath`` + ``offset``."""
    fields = dict(NEMO_FIELDS, text=text_field)
    select = _fields_select(fields, list(fields.values()))
    labels = dict(fields, id="id", sample_rate="sample_rate", channels="channels")
    base = base_dir_for(path, audio_root)
    con = duckdb.connect()
    try:
        for chunk in iter_lines(path, chunk_rows):
            raw = _assemble(chunk, _query(con, chunk, select), list(fields), str(path))
            yield finish(raw, base_dir=base, labels=labels, require_audio=True)
    finally:
        con.close()


_LHOTSE_SELECT = """
    json_extract_string(o, '$.id') AS id, json_type(o, '$.id') AS id__t,
    json_extract_string(o, '$.start') AS offset, json_type(o, '$.start') AS offset__t,
    json_extract_string(o, '$.duration') AS duration, json_type(o, '$.duration') AS duration__t,
    json_extract_string(o, '$.recording.sources[0].source') AS audio,
    json_type(o, '$.recording.sources[0].source') AS audio__t,
    json_extract_string(o, '$.recording.sources[0].type') AS source_type,
    json_extract_string(o, '$.type') AS cut_type,
    json_extract_string(o, '$.recording.sampling_rate') AS sample_rate,
    json_type(o, '$.recording.sampling_rate') AS sample_rate__t,
    CAST(CASE json_type(o, '$.channel') WHEN 'ARRAY' THEN json_array_length(o, '$.channel')
         WHEN 'UBIGINT' THEN 1 WHEN 'BIGINT' THEN 1
         ELSE json_array_length(o, '$.recording.channel_ids') END AS VARCHAR) AS channels,
    list_sort(list_transform(json_extract(o, '$.supervisions[*]'), lambda s: struct_pack(
        st := TRY_CAST(json_extract_string(s, '$.start') AS DOUBLE),
        tx := json_extract_string(s, '$.text'), lg := json_extract_string(s, '$.language')))) AS sups
"""
_LHOTSE_MAPPED = ["id", "start", "duration", "channel", "recording", "supervisions", "type"]


def iter_lhotse(path: Path, *, audio_root: str | Path | None, chunk_rows: int) -> Iterator[pl.DataFrame]:
    """Lhotse cuts JSONL(.gz): one row per cut, inline ``recording`` with a ``file`` source.

    text = the supervisions' texts joined by a space in start order; lang = the first
    (by start) supervision's language; offset = cut ``start``; channels from ``channel``.
    """
    labels = {"id": "id", "audio": "recording.sources[0].source", "offset": "start", "duration": "duration",
              "sample_rate": "recording.sampling_rate", "channels": "channel", "text": "supervisions[].text",
              "lang": "language", "source_lang": "source_lang", "target_lang": "target_lang", "task": "task"}
    patch = _sql_str(json.dumps({k: None for k in _LHOTSE_MAPPED}))
    select = (_LHOTSE_SELECT + ", CASE WHEN o IS NOT NULL THEN "
              + _SORTED_OBJECT.format(rest=f"json_merge_patch(o, {patch})") + " END AS extra")
    base = base_dir_for(path, audio_root)
    con = duckdb.connect()
    try:
        for chunk in iter_lines(path, chunk_rows):
            parsed = _query(con, chunk, select)
            df = chunk.select("lineno", "line", "utf8_error").join(parsed, on="lineno", how="left", maintain_order="left")
            df = df.join(_parse_errors(df, str(path)), on="lineno", how="left", maintain_order="left")
            texts = pl.col("sups").list.eval(pl.element().struct.field("tx")).list.drop_nulls()
            df = df.with_columns(
                pl.format("{}:{}", pl.lit(str(path)), pl.col("lineno")).alias("origin"),
                pl.when(texts.list.len() > 0).then(texts.list.join(" ")).alias("text"),
                pl.col("sups").list.first().struct.field("lg").alias("lang"),
                pl.when(pl.col("channels").is_not_null()).then(pl.lit("BIGINT")).alias("channels__t"),
            ).with_columns(
                pl.when(pl.col("text").is_not_null()).then(pl.lit("VARCHAR")).alias("text__t"),
                pl.when(pl.col("lang").is_not_null()).then(pl.lit("VARCHAR")).alias("lang__t"),
            )
            bad_type = pl.col("cut_type").is_not_null() & ~pl.col("cut_type").is_in(["MonoCut", "MultiCut"])
            bad_source = pl.col("source_type").is_not_null() & (pl.col("source_type") != "file")
            df = df.with_columns(
                pl.when(pl.col("reason").is_not_null()).then(pl.col("reason"))
                .when(bad_type | bad_source).then(pl.lit("malformed_line")).alias("reason"),
                pl.when(pl.col("reason").is_not_null()).then(pl.col("detail"))
                .when(bad_type).then(pl.format("{}: cut type {} is not supported", pl.col("origin"), pl.col("cut_type")))
                .when(bad_source).then(
                    pl.format("{}: recording source type '{}' is not supported (only 'file')",
                              pl.col("origin"), pl.col("source_type")))
                .alias("detail"),
            )
            yield finish(df, base_dir=base, labels=labels, require_audio=True)
    finally:
        con.close()
