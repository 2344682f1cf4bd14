"""Text corpora and conversations of an ``input_cfg`` blend, as NeMo's adapters read them.

``txt`` (a row per non-blank line: the answer), ``txt_jsonl`` (its ``text_field``), ``txt_pair``
(the i-th source and target lines: context the source, answer the target), ``nemo_sft_jsonl``
(a conversation: context ``system`` and the ``User`` turns, answer the others, joined by a
space) and ``multimodal_conversation`` (:func:`iter_conversations`: at most one audio turn).
Rows in the rejects schema plus ``modality``; a text row: ``audio_path`` null, ``duration``
0.0; ``text`` the answer, the context in ``extra`` under :data:`CONTEXT_KEY` (compile counts
its tokens too); ``lang`` the leaf's ``language`` (pairs: ``target_language``, ``source_lang``
the source's). ``id``: ``<file name>:<line>`` (the path where names repeat; a conversation's
own). Blank lines are no rows; a line only one file of a pair has, bad JSON, a missing field
and non-UTF-8 are rejects naming ``file:line``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from manifests.containers import expand_paths
from manifests.errors import ManifestError

from manifests.readers._jsonl import SORTED_OBJECT_SQL, _key_path, _parse_errors, _query, _sql_str
from manifests.readers._lines import iter_lines
from manifests.readers._normalize import resolve_paths
from manifests.schema import MODALITY_COLUMN, REJECTS_POLARS_SCHEMA, conform

#: NeMo's data types for text-only corpora this reader takes
TEXT_TYPES = ("txt", "txt_jsonl", "txt_pair", "nemo_sft_jsonl")
#: NeMo's multimodal conversations (text turns and at most one audio turn a row here)
CONVERSATION_TYPES = ("multimodal_conversation",)
#: ``extra`` key of a text row's context (prompt) text: its tokens count with the answer's
CONTEXT_KEY = "context"
#: the NeMo SFT role whose turns are context (every other role answers), as NeMo's default prompt
SFT_USER = "User"


def _ids(paths: list[str]) -> dict[str, str]:
    """The id prefix of each file: its name, or its path where names repeat."""
    names = [Path(p).name for p in paths]
    return {p: n if names.count(n) == 1 else p for p, n in zip(paths, names)}


def _rows(lines: pl.DataFrame, path: str, prefix: str, text: pl.Expr, lang: str | None,
          extra: pl.Expr | None = None, reason: pl.Expr | None = None, detail: pl.Expr | None = None,
          source_lang: str | None = None) -> pl.DataFrame:
    """Reader rows of ``lines`` (lineno, line, utf8_error, ...) of ``path``."""
    where = pl.format("{}:{}", pl.lit(path), pl.col("lineno"))
    bad_utf8 = pl.col("utf8_error").is_not_null()
    df = lines.with_columns(
        pl.format("{}:{}", pl.lit(prefix), pl.col("lineno")).alias("id"),
        where.alias("origin"),
        text.alias("text"),
        pl.lit(0.0).alias("duration"),
        pl.lit(lang, pl.String).alias("lang"),
        pl.lit(source_lang, pl.String).alias("source_lang"),
        pl.lit(lang if source_lang is not None else None, pl.String).alias("target_lang"),
        (extra if extra is not None else pl.lit(None, pl.String)).alias("extra"),
        pl.when(bad_utf8).then(pl.lit("non_utf8")).otherwise(reason if reason is not None else pl.lit(None, pl.String))
        .alias("reason"),
        pl.when(bad_utf8).then(pl.format("{}: {}", where, pl.col("utf8_error")))
        .otherwise(detail if detail is not None else pl.lit(None, pl.String)).alias("detail"),
        pl.lit("text").alias(MODALITY_COLUMN),
    )
    return conform(df, {**REJECTS_POLARS_SCHEMA, MODALITY_COLUMN: pl.String()})


def _context_json(context: pl.Expr) -> pl.Expr:
    """``{"context": ...}`` as JSON text where the context is non-empty, else null."""
    return pl.when(context.is_not_null() & (context != "")).then(
        pl.struct(context.alias(CONTEXT_KEY)).struct.json_encode())


def iter_txt(paths: list[str], language: str | None, chunk_rows: int) -> Iterator[pl.DataFrame]:
    """``txt``: one row per non-blank line, the line (without its terminator) the answer."""
    for path, prefix in _ids(paths).items():
        for lines in iter_lines(Path(path), chunk_rows):
            yield _rows(lines, path, prefix, pl.col("line").str.strip_chars(), language)


def _json_rows(paths: list[str], select: str, chunk_rows: int) -> Iterator[tuple[str, str, pl.DataFrame]]:
    """Each JSONL chunk of ``paths`` parsed by DuckDB: (path, id prefix, lines joined with ``select``'s
    columns and the parse errors' reason / detail)."""
    con = duckdb.connect()
    try:
        for path, prefix in _ids(paths).items():
            for lines in iter_lines(Path(path), chunk_rows):
                parsed = _query(con, lines, select)
                df = lines.join(parsed, on="lineno", how="left", maintain_order="left")
                errors = _parse_errors(df, path).rename({"reason": "perr", "detail": "pdetail"})
                yield path, prefix, df.join(errors, on="lineno", how="left", maintain_order="left")
    finally:
        con.close()


def _first(*checks: tuple[pl.Expr, str, pl.Expr]) -> tuple[pl.Expr, pl.Expr]:
    """(reason, detail) of the first check that holds (the parser's first)."""
    reason: pl.Expr = pl.col("perr")
    detail: pl.Expr = pl.col("pdetail")
    for cond, code, msg in reversed(checks):
        hit = pl.col("perr").is_null() & cond.fill_null(False)
        reason = pl.when(hit).then(pl.lit(code)).otherwise(reason)
        detail = pl.when(hit).then(msg).otherwise(detail)
    return reason, detail


def iter_txt_jsonl(paths: list[str], language: str | None, text_field: str,
                   chunk_rows: int) -> Iterator[pl.DataFrame]:
    """``txt_jsonl``: one row per line, the answer its ``text_field`` (a string); the other fields
    in ``extra``."""
    patch = _sql_str(json.dumps({text_field: None}))
    select = (f"json_extract_string(o, {_key_path(text_field)}) AS t, json_type(o, {_key_path(text_field)}) AS tt, "
              f"CASE WHEN o IS NOT NULL THEN {SORTED_OBJECT_SQL.format(rest=f'json_merge_patch(o, {patch})')} END AS ex")
    for path, prefix, df in _json_rows(paths, select, chunk_rows):
        where = pl.format("{}:{}", pl.lit(path), pl.col("lineno"))
        reason, detail = _first(
            (pl.col("tt").is_null() | (pl.col("tt") == "NULL"), "missing_field",
             pl.format("{}: missing field '{}'", where, pl.lit(text_field))),
            (pl.col("tt") != "VARCHAR", "malformed_line",
             pl.format("{}: field '{}' is not a string (got {})", where, pl.lit(text_field), pl.col("tt"))))
        yield _rows(df, path, prefix, pl.when(pl.col("tt") == "VARCHAR").then(pl.col("t")), language,
                    pl.col("ex"), reason, detail)


def _sft_select() -> str:
    """DuckDB columns of a ``nemo_sft_jsonl`` line: the field types, the answer and the object with
    its context added (:data:`CONTEXT_KEY`, the system prompt and the user turns)."""
    turns = "json_extract(o, '$.conversations[*]')"
    user = f"json_extract_string(t, '$.from') = '{SFT_USER}'"
    joined = ("array_to_string(list_transform(list_filter(" + turns + ", lambda t: {cond}), "
              "lambda t: json_extract_string(t, '$.value')), ' ')")
    system = "CASE WHEN json_type(o, '$.system') = 'VARCHAR' THEN json_extract_string(o, '$.system') END"
    ctx = f"trim(concat_ws(' ', {system}, {joined.format(cond=user)}))"
    rest = f"CASE WHEN {ctx} <> '' THEN json_merge_patch(o, json_object('{CONTEXT_KEY}', {ctx})) ELSE o END"
    return f"""
    json_type(o, '$.conversations') AS ct,
    json_type(o, '$.system') AS st,
    list_bool_or(list_transform({turns},
        lambda t: json_type(t, '$.value') IS DISTINCT FROM 'VARCHAR'
               OR json_type(t, '$.from') IS DISTINCT FROM 'VARCHAR')) AS bad_turn,
    {joined.format(cond=f"NOT ({user})")} AS ans,
    CASE WHEN o IS NOT NULL THEN {SORTED_OBJECT_SQL.format(rest=rest)} END AS ex
"""


def iter_nemo_sft(paths: list[str], language: str | None, chunk_rows: int) -> Iterator[pl.DataFrame]:
    """``nemo_sft_jsonl``: one row per conversation (module docstring); the whole object kept in
    ``extra`` (the turns a trainer formats), the context added under :data:`CONTEXT_KEY`."""
    for path, prefix, df in _json_rows(paths, _sft_select(), chunk_rows):
        where = pl.format("{}:{}", pl.lit(path), pl.col("lineno"))
        reason, detail = _first(
            (pl.col("ct").is_null() | (pl.col("ct") == "NULL"), "missing_field",
             pl.format("{}: missing field 'conversations'", where)),
            (pl.col("ct") != "ARRAY", "malformed_line",
             pl.format("{}: field 'conversations' is not a list (got {})", where, pl.col("ct"))),
            (pl.col("bad_turn"), "malformed_line",
             pl.format("{}: a turn of 'conversations' lacks a string 'from' or 'value'", where)),
            (pl.col("st").is_not_null() & (pl.col("st") != "NULL") & (pl.col("st") != "VARCHAR"), "malformed_line",
             pl.format("{}: field 'system' is not a string (got {})", where, pl.col("st"))))
        yield _rows(df, path, prefix, pl.col("ans"), language, pl.col("ex"), reason, detail)


def _conversation_select(tags: dict[str, Any]) -> str:
    """DuckDB columns of a ``multimodal_conversation`` line: field types, the audio turns (count,
    the first's value / duration / offset), the answer and the object with its context added."""
    turns = "json_extract(o, '$.conversations[*]')"
    kind = "json_extract_string(t, '$.type')"
    audio = f"list_filter({turns}, lambda t: {kind} = 'audio')"
    texts = ("array_to_string(list_transform(list_filter(" + turns + ", lambda t: " + kind + " = 'text' AND ({cond})), "
             "lambda t: json_extract_string(t, '$.value')), ' ')")
    user = f"json_extract_string(t, '$.from') = '{SFT_USER}'"
    first = f"({turns})[1]"
    lead = []  # NeMo's adapter prepends these tags as text turns
    if tags.get("system_prompt"):
        lead.append(f"CASE WHEN lower(json_extract_string({first}, '$.from')) IS DISTINCT FROM 'system' "
                    f"THEN {_sql_str(str(tags['system_prompt']))} END")
    if tags.get("context"):
        lead.append(f"CASE WHEN json_extract_string({first}, '$.type') = 'audio' AND "
                    f"json_extract_string({first}, '$.from') = '{SFT_USER}' THEN {_sql_str(str(tags['context']))} END")
    ctx = f"trim(concat_ws(' ', {', '.join([*lead, texts.format(cond=user)])}))"
    rest = f"CASE WHEN {ctx} <> '' THEN json_merge_patch(o, json_object('{CONTEXT_KEY}', {ctx})) ELSE o END"
    return f"""
    json_type(o, '$.conversations') AS ct,
    json_type(o, '$.id') AS it, json_extract_string(o, '$.id') AS cid,
    list_bool_or(list_transform({turns},
        lambda t: json_type(t, '$.value') IS DISTINCT FROM 'VARCHAR'
               OR json_type(t, '$.from') IS DISTINCT FROM 'VARCHAR'
               OR {kind} IS NULL OR {kind} NOT IN ('text', 'audio'))) AS bad_turn,
    len({audio}) AS n_audio,
    json_extract_string({audio}[1], '$.value') AS audio,
    json_extract_string({audio}[1], '$.duration') AS dur, json_type({audio}[1], '$.duration') AS dur_t,
    json_extract_string({audio}[1], '$.offset') AS off, json_type({audio}[1], '$.offset') AS off_t,
    {texts.format(cond=f"NOT ({user})")} AS ans,
    CASE WHEN o IS NOT NULL THEN {SORTED_OBJECT_SQL.format(rest=rest)} END AS ex
"""


def _number(col: str, typ: str) -> pl.Expr:
    """A JSON number field: null where absent, NaN where not a number (refused by the caller)."""
    t = pl.col(typ)
    return pl.when(t.is_null() | (t == "NULL")).then(None).otherwise(
        pl.col(col).cast(pl.Float64, strict=False).fill_null(float("nan")))


def iter_conversations(paths: list[str], language: str | None, tags: dict[str, Any],
                       chunk_rows: int) -> Iterator[pl.DataFrame]:
    """``multimodal_conversation`` (NeMo JSONL, audio paths relative to the manifest's folder):
    a row per conversation, its ``id`` the line's; with one audio turn an audio row (its path,
    ``offset``, ``duration``: probed where absent), with none a text row; more is a
    ``malformed_line`` reject. Context: the ``User`` text turns, after the ``system_prompt`` tag
    (unless the first turn is the system's) and the ``context`` tag (when the first turn is the
    user's audio), as NeMo's adapter prepends them; the answer: the other text turns."""
    select = _conversation_select(tags)
    for path, prefix, df in _json_rows(paths, select, chunk_rows):
        where = pl.format("{}:{}", pl.lit(path), pl.col("lineno"))
        dur, off = _number("dur", "dur_t"), _number("off", "off_t")
        reason, detail = _first(
            (pl.col("ct").is_null() | (pl.col("ct") == "NULL"), "missing_field",
             pl.format("{}: missing field 'conversations'", where)),
            (pl.col("ct") != "ARRAY", "malformed_line",
             pl.format("{}: field 'conversations' is not a list (got {})", where, pl.col("ct"))),
            (pl.col("it").is_null() | (pl.col("it") != "VARCHAR"), "missing_field",
             pl.format("{}: missing string field 'id'", where)),
            (pl.col("bad_turn"), "malformed_line",
             pl.format("{}: a turn lacks a string 'from' or 'value', or its 'type' is not text or audio", where)),
            (pl.col("n_audio") > 1, "malformed_line",
             pl.format("{}: {} audio turns: a row holds one (split the conversation)", where, pl.col("n_audio"))),
            (dur.is_nan() | off.is_nan(), "malformed_line",
             pl.format("{}: an audio turn's 'duration' or 'offset' is not a number", where)))
        rows = _rows(df, path, prefix, pl.col("ans"), language, pl.col("ex"), reason, detail)
        audio = pl.col("n_audio") == 1
        base = str(Path(path).parent.resolve())
        yield rows.with_columns(df.select(
            pl.when(pl.col("it") == "VARCHAR").then(pl.col("cid"))
            .otherwise(pl.format("{}:{}", pl.lit(prefix), pl.col("lineno"))).alias("id"),
            pl.when(audio).then(resolve_paths(pl.col("audio"), base)).alias("audio_path"),
            pl.when(audio).then(off).alias("offset"),
            pl.when(audio).then(dur).otherwise(0.0).alias("duration"),
            pl.when(audio).then(pl.lit("audio")).otherwise(pl.lit("text")).alias(MODALITY_COLUMN),
        ))


def _zip_lines(source: str, target: str, chunk_rows: int) -> Iterator[pl.DataFrame]:
    """The lines of two files joined by line number (``s_*`` / ``t_*`` columns, null where one
    file has no such non-blank line), in chunks of about ``chunk_rows``."""
    its = (iter_lines(Path(source), chunk_rows), iter_lines(Path(target), chunk_rows))
    held = [pl.DataFrame(schema={"lineno": pl.Int64, "line": pl.String, "utf8_error": pl.String})] * 2
    done = [False, False]
    while True:
        for k in (0, 1):
            while not done[k] and held[k].height < chunk_rows:
                nxt = next(its[k], None)
                if nxt is None:
                    done[k] = True
                else:
                    held[k] = pl.concat([held[k], nxt])
        if not held[0].height and not held[1].height:
            return
        ends = [held[k]["lineno"].max() if not done[k] else None for k in (0, 1)]
        upto = min((e for e in ends if e is not None), default=None)
        take = [held[k].filter(pl.col("lineno") <= upto) if upto is not None else held[k] for k in (0, 1)]
        held = [held[k].filter(pl.col("lineno") > upto) if upto is not None else held[k].clear() for k in (0, 1)]
        a, b = (t.rename({c: f"{p}_{c}" for c in ("line", "utf8_error")}) for t, p in zip(take, "st"))
        yield a.join(b, on="lineno", how="full", coalesce=True).sort("lineno")


def iter_txt_pair(sources: list[str], targets: list[str], source_language: str | None,
                  target_language: str | None, chunk_rows: int) -> Iterator[pl.DataFrame]:
    """``txt_pair``: the i-th source and target lines as one row (context the source, answer the
    target); a line only one file has is a ``missing_field`` reject."""
    prefixes = _ids(sources)
    for source, target in zip(sources, targets):
        for df in _zip_lines(source, target, chunk_rows):
            where = pl.format("{}:{}", pl.lit(source), pl.col("lineno"))
            twhere = pl.format("{}:{}", pl.lit(target), pl.col("lineno"))
            reason, detail = _first(
                (pl.col("s_utf8_error").is_not_null(), "non_utf8", pl.format("{}: {}", where, pl.col("s_utf8_error"))),
                (pl.col("t_utf8_error").is_not_null(), "non_utf8", pl.format("{}: {}", twhere, pl.col("t_utf8_error"))),
                (pl.col("t_line").is_null(), "missing_field",
                 pl.format("{}: no target line (blank or past the end of {})", where, pl.lit(Path(target).name))),
                (pl.col("s_line").is_null(), "missing_field",
                 pl.format("{}: no source line (blank or past the end of {})", twhere, pl.lit(Path(source).name))))
            df = df.with_columns(pl.lit(None, pl.String).alias("perr"), pl.lit(None, pl.String).alias("pdetail"),
                                 pl.lit(None, pl.String).alias("utf8_error"))
            yield _rows(df, source, prefixes[source], pl.col("t_line").str.strip_chars(), target_language,
                        _context_json(pl.col("s_line").str.strip_chars()), reason, detail,
                        source_lang=source_language)


def iter_text_leaf(leaf: Any, *, chunk_rows: int) -> Iterator[pl.DataFrame]:
    """The rows of a blend's text corpus (a ``manifests.readers._blend.Leaf``: not imported,
    it imports this module), brace paths expanded; a pair's expanded lists match one to one."""
    paths, lang = expand_paths(list(leaf.paths)), leaf.text.get("language")
    if leaf.type == "txt_pair":
        targets = expand_paths(list(leaf.targets))
        if len(targets) != len(paths):
            raise ManifestError(f"corpus {leaf.corpus}: {len(targets)} target files for {len(paths)} source files")
        frames = iter_txt_pair(paths, targets, leaf.text.get("source_language"), leaf.text.get("target_language"),
                               chunk_rows)
    elif leaf.type == "txt":
        frames = iter_txt(paths, lang, chunk_rows)
    elif leaf.type == "txt_jsonl":
        frames = iter_txt_jsonl(paths, lang, leaf.text_field, chunk_rows)
    elif leaf.type in CONVERSATION_TYPES:
        frames = iter_conversations(paths, lang, leaf.tags, chunk_rows)
    else:
        frames = iter_nemo_sft(paths, lang, chunk_rows)
    for frame in frames:
        if frame.height:
            yield frame


def text_options(kind: str, item: dict[str, Any]) -> dict[str, Any]:
    """The options of a text leaf this reader uses (``language`` ...), from its ``input_cfg`` item."""
    keys = {"txt": ("language",), "txt_jsonl": ("language",), "nemo_sft_jsonl": ("language",),
            "multimodal_conversation": ("language",), "txt_pair": ("source_language", "target_language")}[kind]
    return {k: item[k] for k in keys if item.get(k) is not None}
