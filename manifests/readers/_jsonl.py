"""NeMo JSONL and Lhotse cuts JSONL(.gz): line blocks parsed by DuckDB's JSON functions.

No Python object per line: lines arrive as Arrow strings (:mod:`._lines`), DuckDB validates
and extracts fields vectorized; Python touches only lines that fail to parse (to word the
message).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from manifests.readers._lines import LineBlock, iter_line_blocks, iter_lines
from manifests.readers._normalize import base_dir_for, finish

#: The remaining top-level keys, as a JSON object with sorted keys (null when none).
SORTED_OBJECT_SQL = (
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
    parts.append("CASE WHEN o IS NOT NULL THEN " + SORTED_OBJECT_SQL.format(rest=f"json_merge_patch(o, {patch})") + " END AS extra")
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


#: Most extra keys the single-parse struct holds; rows with others take the general path.
MAX_STRUCT_KEYS = 256
_WS_SQL = "' ' || chr(9) || chr(10) || chr(13)"


def _value_sql(j: str) -> tuple[str, str]:
    """SQL for (string value, JSON type name) of a field's JSON text ``j`` (NULL: absent/null).

    Strings are unquoted by slicing unless they hold an escape; other values keep their
    JSON text (numbers as written, minified), as ``json_extract_string`` gives them.
    """
    value = (f"CASE WHEN starts_with({j}, '\"') THEN (CASE WHEN contains({j}, '\\') "
             f"THEN json_extract_string({j}::JSON, '$') ELSE substring({j}, 2, length({j}) - 2) END) ELSE {j} END")
    typ = f"CASE WHEN starts_with({j}, '\"') THEN 'VARCHAR' ELSE json_type({j}::JSON) END"
    return value, typ


@dataclass
class _StructQuery:
    """The single-parse NeMo query: each object line parsed once by ``from_json`` into a
    struct of JSON texts holding the mapped keys and every extra key seen so far.

    Over ``chunk(lineno, line, ks)`` (``ks``: the line's keys, NULL if not valid JSON) it
    yields ``ok`` (parsed here), then ``<field>``, ``<field>__t`` and ``extra`` as the
    general path does. A line is ``ok`` when it is a JSON object with distinct keys, all
    of them in the struct.
    """

    fields: dict[str, str]
    extra_keys: list[str] = field(default_factory=list)
    sql: str = ""

    def add_keys(self, con: duckdb.DuckDBPyConnection, keys: list[str]) -> None:
        """Widen the struct with ``keys`` (new, not clashing case-insensitively; capped)."""
        taken = {k.lower() for k in [*self.fields.values(), *self.extra_keys]}
        new = []
        for k in sorted(set(keys)):
            if k.lower() not in taken and len(self.extra_keys) + len(new) < MAX_STRUCT_KEYS:
                taken.add(k.lower())
                new.append(k)
        if new or not self.sql:
            self.extra_keys = sorted(self.extra_keys + new)
            self.sql = self._build(con)

    def _build(self, con: duckdb.DuckDBPyConnection) -> str:
        mapped = list(self.fields.values())
        struct = _sql_str(json.dumps({k: "JSON" for k in [*mapped, *self.extra_keys]}))
        raw = ", ".join(f"s[{_sql_str(k)}]::VARCHAR AS j{i}" for i, k in enumerate(mapped))
        cols = []
        for i, name in enumerate(self.fields):
            value, typ = _value_sql(f"j{i}")
            cols.append(f'{value} AS "{name}", {typ} AS "{name}__t"')
        quoted = [r[0] for r in con.execute("SELECT to_json(unnest(?::VARCHAR[]))", [self.extra_keys]).fetchall()]
        parts = [f"CASE WHEN list_contains(ks, {_sql_str(k)}) THEN {_sql_str(q + ':')} || "
                 f"coalesce(s[{_sql_str(k)}]::VARCHAR, 'null') END" for k, q in zip(self.extra_keys, quoted)]
        extra = (f"nullif('{{' || concat_ws(',', {', '.join(parts)}) || '}}', '{{}}')" if parts
                 else "NULL::VARCHAR")
        return (
            f"WITH b AS (SELECT lineno, ok, ks, CASE WHEN ok THEN from_json(line, {struct}) END AS s FROM chunk), "
            f"c AS (SELECT lineno, ok, {raw}, CASE WHEN ok THEN {extra} END AS extra FROM b) "
            f"SELECT lineno, ok, {', '.join(cols)}, extra FROM c"
        )

    def _ok(self, block: LineBlock, ks: pa.ChunkedArray) -> npt.NDArray[np.bool_]:
        """Rows this query parses: objects (``{`` first) with valid JSON, distinct keys, all
        in the struct. Vectorized over the flattened key lists (DuckDB's list_distinct and
        list_has_all cost microseconds a row)."""
        ks = ks.combine_chunks()
        known = pa.array([*self.fields.values(), *self.extra_keys], pa.string())
        ok = ks.is_valid().to_numpy(zero_copy_only=False) & block.starts_with(b"{")
        flat = pc.list_flatten(ks)
        if len(flat):
            parents = pc.list_parent_indices(ks).to_numpy()
            pos = pc.index_in(flat, value_set=known)
            unknown = pos.is_null().to_numpy(zero_copy_only=False)
            ok[parents[unknown]] = False
            codes = np.sort(parents.astype(np.int64) * len(known) + pos.fill_null(0).to_numpy())
            dup = np.flatnonzero(codes[1:] == codes[:-1])
            ok[codes[dup] // len(known)] = False
        return ok

    def run(self, con: duckdb.DuckDBPyConnection, block: LineBlock) -> pl.DataFrame:
        """Parse one block; keys seen for the first time widen the struct first."""
        con.register("lines", block.table())
        try:
            ks = con.sql("SELECT TRY(json_keys(line)) AS ks FROM lines").to_arrow_table()["ks"]
        finally:
            con.unregister("lines")
        keys = pc.unique(pc.list_flatten(ks)).to_pylist()
        known = set(self.fields.values()) | set(self.extra_keys)
        if not self.sql or any(k not in known for k in keys):
            self.add_keys(con, [k for k in keys if k not in known])
        table = block.table(len(block)).append_column("ks", ks.combine_chunks()).append_column(
            "ok", pa.array(self._ok(block, ks)))
        table = pa.Table.from_batches(table.to_batches(max_chunksize=8192), schema=table.schema)
        con.register("chunk", table)
        try:
            return con.sql(self.sql).pl()
        finally:
            con.unregister("chunk")


def _slow_rows(con: duckdb.DuckDBPyConnection, block: LineBlock, idx: np.ndarray, fields: dict[str, str],
               origin_prefix: str) -> pl.DataFrame:
    """Rows ``idx`` of ``block`` through the general per-field query (several parses a line).

    The single-parse query leaves these: malformed or non-object lines, non-UTF-8 lines,
    objects with duplicate keys (the first occurrence wins) or with keys the struct lacks.
    """
    chunk = pl.DataFrame({
        "lineno": block.lineno[idx],
        "line": pl.Series([block.line(int(i)) for i in idx], dtype=pl.String),
        "utf8_error": pl.Series([block.utf8_errors.get(int(i)) for i in idx], dtype=pl.String),
    })
    select = _fields_select(fields, list(fields.values()))
    return _assemble(chunk, _query(con, chunk, select), list(fields), origin_prefix)


def iter_nemo(
    path: Path, *, text_field: str, audio_root: str | Path | None, chunk_rows: int
) -> Iterator[pl.DataFrame]:
    """NeMo JSONL: one row per non-blank line; ids derived from ``audio_filepath`` + ``offset``.

    Each line is parsed once (DuckDB ``from_json`` into a struct, see :class:`_StructQuery`); lines that
    it cannot take go the general path (:func:`_slow_rows`).
    """
    fields = dict(NEMO_FIELDS, text=text_field)
    labels = dict(fields, id="id", sample_rate="sample_rate", channels="channels")
    base = base_dir_for(path, audio_root)
    query = _StructQuery(fields)
    names = ["origin", "reason", "detail", "extra", *[c for f in fields for c in (f, f"{f}__t")]]
    prefix = str(path)
    con = duckdb.connect()
    try:
        for block in iter_line_blocks(path, chunk_rows):
            parsed = query.run(con, block)
            if not np.array_equal(parsed["lineno"].to_numpy(), block.lineno):
                raise AssertionError("DuckDB changed the row order")  # preserve_insertion_order is on
            raw = parsed.with_columns(
                pl.format("{}:{}", pl.lit(prefix), pl.col("lineno")).alias("origin"),
                pl.lit(None, pl.String).alias("reason"), pl.lit(None, pl.String).alias("detail"),
            )
            slow = np.flatnonzero(~parsed["ok"].to_numpy())
            if len(slow):
                others = _slow_rows(con, block, slow, fields, prefix)
                cols = ["lineno", *names]
                raw = pl.concat([raw.filter(pl.col("ok")).select(cols), others.select(cols)],
                                how="vertical_relaxed").sort("lineno")
            yield finish(raw.select(names), base_dir=base, labels=labels, require_audio=True)
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
        tx := json_extract_string(s, '$.text'), lg := json_extract_string(s, '$.language')))) AS sups,
    json_extract_string(o, '$.custom.source_lang') AS source_lang, json_type(o, '$.custom.source_lang') AS source_lang__t,
    json_extract_string(o, '$.custom.target_lang') AS target_lang, json_type(o, '$.custom.target_lang') AS target_lang__t,
    json_extract_string(o, '$.custom.taskname') AS task, json_type(o, '$.custom.taskname') AS task__t
"""
_LHOTSE_MAPPED = ["id", "start", "duration", "channel", "recording", "supervisions", "type", "custom"]
#: keys of ``custom`` read into columns (NeMo's names) or recomputed by compile (``num_tokens``)
_LHOTSE_CUSTOM_MAPPED = ["source_lang", "target_lang", "taskname", "num_tokens"]


def _sorted_union_sql(a: str, b: str) -> str:
    """SQL of the JSON objects ``a`` and ``b`` as one (``b``'s keys win), keys sorted as
    :data:`SORTED_OBJECT_SQL` writes them, null values kept (a merge patch would drop them);
    NULL when both are empty."""
    pa = f"list_zip(json_keys({a}), json_extract({a}, '$.*'))"
    pb = f"list_zip(json_keys({b}), json_extract({b}, '$.*'))"
    pairs = f"list_concat(list_filter({pa}, lambda x: NOT list_contains(json_keys({b}), x[1])), {pb})"
    return (f"CASE WHEN len({pairs}) = 0 THEN NULL ELSE '{{' || array_to_string(list_transform(list_sort({pairs}), "
            "lambda x: to_json(x[1]) || ':' || x[2]::VARCHAR), ',') || '}' END")


def _parsed(con: duckdb.DuckDBPyConnection, chunk: pl.DataFrame, select: str, path: Path) -> pl.DataFrame:
    """A chunk of lines with ``select``'s fields and the parse errors' ``reason`` / ``detail``."""
    parsed = _query(con, chunk, select)
    df = chunk.select("lineno", "line", "utf8_error").join(parsed, on="lineno", how="left", maintain_order="left")
    return df.join(_parse_errors(df, str(path)), on="lineno", how="left", maintain_order="left")


def iter_lhotse(path: Path, *, audio_root: str | Path | None, chunk_rows: int,
                source_types: tuple[str, ...] = ("file",)) -> Iterator[pl.DataFrame]:
    """Lhotse cuts JSONL(.gz): one row per cut, inline ``recording`` with a ``file`` source
    (``source_types``: the Shar reader also accepts ``shar``, audio stored in the shard's tar).

    text = the supervisions' texts joined by a space in start order; lang = the first
    (by start) supervision's language; offset = cut ``start``; channels from ``channel``;
    ``source_lang`` / ``target_lang`` / task from ``custom`` (NeMo's names: ``taskname``). ``extra``
    = the cut's other top-level keys and the rest of ``custom`` (flattened, ``num_tokens`` left out:
    compile counts it again), so ``dataprep pack --layout shar`` round-trips every field.
    """
    labels = {"id": "id", "audio": "recording.sources[0].source", "offset": "start", "duration": "duration",
              "sample_rate": "recording.sampling_rate", "channels": "channel", "text": "supervisions[].text",
              "lang": "language", "source_lang": "custom.source_lang", "target_lang": "custom.target_lang",
              "task": "custom.taskname"}
    patch = _sql_str(json.dumps({k: None for k in _LHOTSE_MAPPED}))
    cpatch = _sql_str(json.dumps({k: None for k in _LHOTSE_CUSTOM_MAPPED}))
    custom = (f"CASE WHEN json_type(o, '$.custom') = 'OBJECT' THEN json_merge_patch(json_extract(o, '$.custom'), "
              f"{cpatch}) ELSE '{{}}' END")
    rest = _sorted_union_sql(f"json_merge_patch(o, {patch})", custom)
    select = _LHOTSE_SELECT + f", CASE WHEN o IS NOT NULL THEN {rest} END AS extra"
    base = base_dir_for(path, audio_root)
    con = duckdb.connect()
    try:
        for chunk in iter_lines(path, chunk_rows):
            df = _parsed(con, chunk, select, path)
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
            bad_source = pl.col("source_type").is_not_null() & ~pl.col("source_type").is_in(list(source_types))
            df = df.with_columns(
                pl.when(pl.col("reason").is_not_null()).then(pl.col("reason"))
                .when(bad_type | bad_source).then(pl.lit("malformed_line")).alias("reason"),
                pl.when(pl.col("reason").is_not_null()).then(pl.col("detail"))
                .when(bad_type).then(pl.format("{}: cut type {} is not supported", pl.col("origin"), pl.col("cut_type")))
                .when(bad_source).then(
                    pl.format("{}: recording source type '{}' is not supported (only {})",
                              pl.col("origin"), pl.col("source_type"),
                              pl.lit(", ".join(f"'{t}'" for t in source_types))))
                .alias("detail"),
            )
            yield finish(df, base_dir=base, labels=labels, require_audio=True)
    finally:
        con.close()


_RECORDING_SELECT = """
    json_extract_string(o, '$.id') AS rec_id,
    json_extract_string(o, '$.sources[0].source') AS rec_audio,
    json_extract_string(o, '$.sources[0].type') AS rec_source_type,
    json_extract_string(o, '$.sampling_rate') AS rec_rate, json_type(o, '$.sampling_rate') AS rec_rate__t,
    CAST(coalesce(json_array_length(o, '$.channel_ids'), 1) AS VARCHAR) AS rec_channels,
    TRY_CAST(json_extract_string(o, '$.duration') AS DOUBLE) AS rec_duration
"""
_SUPERVISION_SELECT = """
    json_extract_string(o, '$.id') AS id, json_type(o, '$.id') AS id__t,
    json_extract_string(o, '$.recording_id') AS recording_id,
    json_extract_string(o, '$.start') AS offset, json_type(o, '$.start') AS offset__t,
    json_extract_string(o, '$.duration') AS duration, json_type(o, '$.duration') AS duration__t,
    json_extract_string(o, '$.text') AS text, json_type(o, '$.text') AS text__t,
    json_extract_string(o, '$.language') AS lang, json_type(o, '$.language') AS lang__t,
    CAST(CASE json_type(o, '$.channel') WHEN 'ARRAY' THEN json_array_length(o, '$.channel') ELSE 1 END AS VARCHAR)
        AS channels,
    CASE WHEN json_type(o, '$.channel') IN ('UBIGINT', 'BIGINT') THEN CAST(json_extract(o, '$.channel') AS BIGINT)
        END AS sup_channel,
    json_extract_string(o, '$.custom.source_lang') AS source_lang, json_type(o, '$.custom.source_lang') AS source_lang__t,
    json_extract_string(o, '$.custom.target_lang') AS target_lang, json_type(o, '$.custom.target_lang') AS target_lang__t,
    json_extract_string(o, '$.custom.taskname') AS task, json_type(o, '$.custom.taskname') AS task__t
"""
_SUPERVISION_MAPPED = ["id", "recording_id", "start", "duration", "text", "language", "channel", "custom"]
#: seconds a supervision may end past its recording's ``duration`` (rounding), else ``segment_out_of_range``
RECIPE_END_TOLERANCE = 1e-3


def _supervision_select() -> str:
    """The supervision fields and ``extra``: the supervision's other keys with its ``custom`` keys
    flattened beside them (where Lhotse keeps a cut's custom fields: ``pnc``, ... reach the
    trainer; the languages and ``taskname`` are columns), and an integer ``channel`` (left
    out again by :func:`_mono_channel_dropped` when the recording has one channel)."""
    patch = _sql_str(json.dumps({k: None for k in _SUPERVISION_MAPPED}))
    cpatch = _sql_str(json.dumps({k: None for k in _LHOTSE_CUSTOM_MAPPED}))
    custom = (f"CASE WHEN json_type(o, '$.custom') = 'OBJECT' THEN json_merge_patch(json_extract(o, '$.custom'), "
              f"{cpatch}) ELSE '{{}}' END")
    channel = ("CASE WHEN json_type(o, '$.channel') IN ('UBIGINT', 'BIGINT') "
               "THEN json_object('channel', json_extract(o, '$.channel')) ELSE '{}' END")
    rest = _sorted_union_sql(f"json_merge_patch(o, {patch})", f"json_merge_patch({custom}, {channel})")
    return _SUPERVISION_SELECT + f", CASE WHEN o IS NOT NULL THEN {rest} END AS extra"


def _recordings(path: Path, con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """A recordings manifest as a lookup (read whole, as Kaldi's lookup files): one row per
    recording id (the first wins); lines that do not parse are left out (their supervisions
    are rejected naming the recording)."""
    frames = [_query(con, chunk, _RECORDING_SELECT).filter(pl.col("ok") & (pl.col("jt") == "OBJECT"))
              for chunk in iter_lines(path, 1 << 20)]
    if not frames:
        return pl.DataFrame(schema={"rec_id": pl.String, "rec_audio": pl.String, "rec_source_type": pl.String,
                                    "rec_rate": pl.String, "rec_rate__t": pl.String, "rec_channels": pl.String})
    recs = pl.concat(frames).drop("lineno", "ok", "jt")
    return recs.filter(pl.col("rec_id").is_not_null()).unique("rec_id", keep="first", maintain_order=True)


def _mono_channel_dropped(extra: pl.Expr, mono: pl.Expr) -> pl.Expr:
    """``extra`` (sorted, compact JSON) without its integer ``channel`` key where ``mono``: channel
    0 of a one-channel recording is the file itself. Inside a JSON string a quote is escaped, so
    ``"channel":`` after ``{`` or ``,`` is a key."""
    key = r'"channel":-?\d+'
    dropped = (extra.str.replace(f"^\\{{{key}\\}}$", "").str.replace(f",{key}", "")
               .str.replace(f"^\\{{{key},", "{"))
    return pl.when(mono & extra.str.contains('"channel":', literal=True)).then(
        pl.when(dropped != "").then(dropped)).otherwise(extra)


def iter_lhotse_recipe(supervisions: Path, recordings: Path, *, audio_root: str | Path | None,
                       chunk_rows: int) -> Iterator[pl.DataFrame]:
    """A Lhotse recipe's ``supervisions.jsonl(.gz)`` with its ``recordings.jsonl(.gz)`` (what
    ``lhotse prepare`` writes): one row per supervision, cut from its recording (``audio_path``
    = the recording's file source, ``offset`` = the supervision's ``start``). A supervision
    whose recording is absent, or has no file source, is a ``missing_field`` /
    ``malformed_line`` reject; one that starts before its recording or ends past its
    ``duration`` (beyond :data:`RECIPE_END_TOLERANCE`), or names a channel the recording lacks,
    is ``segment_out_of_range``. ``source_lang`` / ``target_lang`` / task from ``custom`` (NeMo's
    names); ``speaker``, ``gender``, the rest of ``custom``... go to ``extra`` (``custom``
    flattened, as a cut's), with ``channel`` when the recording has several.
    """
    labels = {"id": "id", "audio": "recordings[recording_id].sources[0].source", "offset": "start",
              "duration": "duration", "sample_rate": "recordings[recording_id].sampling_rate",
              "channels": "channel", "text": "text", "lang": "language", "source_lang": "custom.source_lang",
              "target_lang": "custom.target_lang", "task": "custom.taskname"}
    select = _supervision_select()
    base = base_dir_for(recordings, audio_root)
    con = duckdb.connect()
    try:
        recs = _recordings(recordings, con)
        for chunk in iter_lines(supervisions, chunk_rows):
            df = _parsed(con, chunk, select, supervisions)
            df = df.join(recs, left_on="recording_id", right_on="rec_id", how="left", maintain_order="left")
            origin = pl.format("{}:{}", pl.lit(str(supervisions)), pl.col("lineno"))
            no_rec = pl.col("ok").fill_null(False) & pl.col("rec_audio").is_null() & pl.col("rec_source_type").is_null()
            bad_source = pl.col("rec_source_type").is_not_null() & (pl.col("rec_source_type") != "file")
            start = pl.col("offset").cast(pl.Float64, strict=False)
            end = start + pl.col("duration").cast(pl.Float64, strict=False)
            outside = pl.col("rec_duration").is_not_null() & (
                (start < 0) | (end > pl.col("rec_duration") + RECIPE_END_TOLERANCE)).fill_null(False)
            no_channel = (pl.col("sup_channel") >= pl.col("rec_channels").cast(pl.Int64, strict=False)).fill_null(False)
            mono = pl.col("rec_channels").cast(pl.Int64, strict=False).fill_null(1) <= 1
            df = df.with_columns(
                _mono_channel_dropped(pl.col("extra"), mono).alias("extra"),
                pl.when(pl.col("reason").is_null() & outside).then(pl.lit("segment_out_of_range"))
                .when(pl.col("reason").is_null() & no_channel).then(pl.lit("segment_out_of_range"))
                .otherwise(pl.col("reason")).alias("reason"),
                pl.when(pl.col("reason").is_null() & outside).then(pl.format(
                    "{}: supervision {} s + {} s lies outside its recording '{}' ({} s)", origin, pl.col("offset"),
                    pl.col("duration"), pl.col("recording_id"), pl.col("rec_duration")))
                .when(pl.col("reason").is_null() & no_channel).then(pl.format(
                    "{}: supervision channel {} of recording '{}', which has {} channel(s)", origin,
                    pl.col("sup_channel"), pl.col("recording_id"), pl.col("rec_channels")))
                .otherwise(pl.col("detail")).alias("detail"),
            )
            df = df.with_columns(
                origin.alias("origin"),
                pl.col("rec_audio").alias("audio"),
                pl.when(pl.col("rec_audio").is_not_null()).then(pl.lit("VARCHAR")).alias("audio__t"),
                pl.col("rec_rate").alias("sample_rate"), pl.col("rec_rate__t").alias("sample_rate__t"),
                pl.when(pl.col("channels").is_not_null()).then(pl.lit("BIGINT")).alias("channels__t"),
                pl.when(pl.col("reason").is_not_null()).then(pl.col("reason"))
                .when(bad_source).then(pl.lit("malformed_line"))
                .when(no_rec).then(pl.lit("missing_field")).alias("reason"),
                pl.when(pl.col("reason").is_not_null()).then(pl.col("detail"))
                .when(bad_source).then(pl.format("{}: recording {} has source type '{}' (only 'file' is read)",
                                                 origin, pl.col("recording_id"), pl.col("rec_source_type")))
                .when(no_rec).then(pl.format("{}: recording '{}' is not in {}", origin,
                                             pl.col("recording_id").fill_null("<none>"), pl.lit(str(recordings))))
                .alias("detail"),
            )
            yield finish(df, base_dir=base, labels=labels, require_audio=True)
    finally:
        con.close()
