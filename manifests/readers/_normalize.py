"""From raw extracted fields to rows of the rejects schema: types, paths, ids, reasons.

Every reader produces a *raw* frame: ``origin``, optional ``reason`` / ``detail`` set by the
parser (malformed line, non-UTF-8), ``extra``, and for each field in :data:`FIELDS` a String
value column ``<field>`` plus a type column ``<field>__t`` naming the source type
(``VARCHAR``, ``DOUBLE``, ``BIGINT``, ``ARRAY``, ``NULL``, ...; null = field absent).
:func:`finish` turns it into :data:`manifests.schema.REJECTS_POLARS_SCHEMA` rows, vectorized.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import duckdb
import polars as pl

from manifests.storage import is_url
from manifests.schema import REJECTS_POLARS_SCHEMA, conform

NUMBER_FIELDS = ("offset", "duration", "sample_rate", "channels")
STRING_FIELDS = ("id", "audio", "text", "lang", "source_lang", "target_lang", "task")
FIELDS = STRING_FIELDS + NUMBER_FIELDS
NUMERIC_TYPES = ("DOUBLE", "BIGINT", "UBIGINT", "HUGEINT", "UHUGEINT", "INTEGER", "FLOAT")


def _value_preview(col: str) -> pl.Expr:
    v = pl.col(col)
    return pl.when(v.str.len_chars() > 40).then(v.str.slice(0, 37) + "...").otherwise(v)


def _fmt3(values: pl.Series) -> pl.Series:
    """``f"{x:.3f}"`` for each value, exactly as Python rounds it (DuckDB's fmt printf)."""
    frame = pl.DataFrame({"x": values})  # noqa: F841 (scanned by DuckDB)
    con = duckdb.connect()
    try:
        return con.sql("SELECT printf('%.3f', x) AS s FROM frame").pl()["s"]
    finally:
        con.close()


def resolve_paths(raw: pl.Expr, base: str) -> pl.Expr:
    """Absolute audio paths: absolute paths and URLs kept, relative ones joined to ``base``."""
    base = base.rstrip("/")
    keep = raw.str.starts_with("/") | raw.str.contains("://", literal=True)
    return pl.when(keep).then(raw).otherwise(pl.lit(base + "/") + raw.str.strip_prefix("./"))


def finish(
    raw: pl.DataFrame,
    *,
    base_dir: str,
    labels: Mapping[str, str],
    require_audio: bool,
) -> pl.DataFrame:
    """Typed, checked rows in the rejects schema, in the order of ``raw``.

    ``labels`` names each field as the source spells it (for messages). A row's ``reason``
    is the first problem found: the parser's, then a missing audio path (if
    ``require_audio``), a missing text, a wrongly typed field, no id to be had.
    """
    cols = {}
    for name in FIELDS:
        cols[name] = pl.col(name) if name in raw.columns else pl.lit(None, pl.String)
        t = f"{name}__t"
        cols[t] = pl.col(t) if t in raw.columns else pl.lit(None, pl.String)
    for name in ("reason", "detail", "extra"):
        cols[name] = pl.col(name) if name in raw.columns else pl.lit(None, pl.String)
    df = raw.select(pl.col("origin"), *[e.cast(pl.String).alias(k) for k, e in cols.items()])

    absent = {f: pl.col(f"{f}__t").is_null() | (pl.col(f"{f}__t") == "NULL") for f in FIELDS}
    checks: list[tuple[pl.Expr, str, pl.Expr]] = []
    if require_audio:
        checks.append((absent["audio"], "missing_field", pl.lit(f"missing field '{labels['audio']}'")))
    checks.append((absent["text"], "missing_field", pl.lit(f"missing field '{labels['text']}'")))
    numbers = {}
    for f in NUMBER_FIELDS:
        t = pl.col(f"{f}__t")
        as_float = pl.col(f).cast(pl.Float64, strict=False)
        is_num = t.is_in(NUMERIC_TYPES) | ((t == "VARCHAR") & as_float.is_not_null())
        numbers[f] = pl.when(is_num).then(as_float)
        msg = (
            pl.when(t == "VARCHAR")
            .then(pl.format("field '{}' is not a number ('{}')", pl.lit(labels[f]), _value_preview(f)))
            .otherwise(pl.format("field '{}' is not a number (got {})", pl.lit(labels[f]), t))
        )
        checks.append((~absent[f] & ~is_num, "malformed_line", msg))
    for f in STRING_FIELDS:
        t = pl.col(f"{f}__t")
        msg = pl.format("field '{}' is not a string (got {})", pl.lit(labels[f]), t)
        checks.append((~absent[f] & (t != "VARCHAR"), "malformed_line", msg))
    strings = {f: pl.when(pl.col(f"{f}__t") == "VARCHAR").then(pl.col(f)) for f in STRING_FIELDS}
    checks.append(
        (strings["id"].is_null() & strings["audio"].is_null(), "missing_field",
         pl.lit(f"no '{labels['id']}' and no '{labels['audio']}' to derive an id from"))
    )

    reason: pl.Expr = pl.col("reason")
    detail: pl.Expr = pl.col("detail")
    # Built from the last check backwards so that the *first* failing check wins.
    for cond, code, msg in reversed(checks):
        reason = pl.when(pl.col("reason").is_null() & cond.fill_null(False)).then(pl.lit(code)).otherwise(reason)
        detail = (
            pl.when(pl.col("reason").is_null() & cond.fill_null(False))
            .then(pl.format("{}: {}", pl.col("origin"), msg))
            .otherwise(detail)
        )
    out = df.with_columns(
        strings["id"].alias("id"),
        strings["audio"].alias("audio_raw"),
        strings["text"].alias("text"),
        *[strings[f].alias(f) for f in ("lang", "source_lang", "target_lang", "task")],
        *[numbers[f].alias(f) for f in NUMBER_FIELDS],
        reason.alias("reason"),
        detail.alias("detail"),
    )
    out = out.with_columns(
        pl.coalesce("lang", "target_lang", "source_lang").alias("lang"),
        pl.col("sample_rate").round(0).cast(pl.Int32, strict=False),
        pl.col("channels").round(0).cast(pl.Int16, strict=False),
        resolve_paths(pl.col("audio_raw"), base_dir).alias("audio_path"),
    )
    need_id = out["id"].is_null() & out["audio_raw"].is_not_null()
    if need_id.any():
        # as NeMo: a row with an explicit offset (even 0) is a segment, distinct from its whole file
        explicit = ~out.select(absent["offset"].alias("a"))["a"]
        with_offset = need_id & explicit
        suffix = pl.Series("s", [None] * out.height, dtype=pl.String)
        if with_offset.any():
            suffix = pl.when(pl.lit(with_offset)).then(pl.lit("#") + pl.lit(_fmt3(out["offset"])))
            suffix = out.select(suffix.alias("s"))["s"]
        out = out.with_columns(
            pl.when(pl.lit(need_id))
            .then(pl.col("audio_raw") + pl.lit(suffix).fill_null(""))
            .otherwise(pl.col("id"))
            .alias("id")
        )
    return conform(out, REJECTS_POLARS_SCHEMA)


def relabel(frames: Iterable[pl.DataFrame], local: str, source: str) -> Iterator[pl.DataFrame]:
    """``frames`` read from ``local`` (a store object's local copy) with ``origin``, ``detail``
    and the container columns (a Hugging Face Parquet holds its audio) naming ``source`` (the
    URL the user gave) instead; unchanged when the two are the same."""
    for frame in frames:
        if local == source:
            yield frame
            continue
        yield frame.with_columns(pl.col(c).str.replace_all(local, source, literal=True)
                                 for c in ("origin", "detail", "audio_path", "container") if c in frame.columns)


def base_dir_for(source: Path, audio_root: str | Path | None) -> str:
    """The folder relative audio paths resolve against: ``audio_root`` or the source's folder."""
    if audio_root is not None and is_url(str(audio_root)):
        return str(audio_root).rstrip("/")
    base = Path(audio_root) if audio_root is not None else source.parent
    return str(base.expanduser().resolve())


def corpus_from_extra(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with a string ``corpus`` field of ``extra`` moved to the ``corpus`` column (where
    the row has none): the key every writer gives a row's corpus (NeMo lines, cut ``custom``,
    WebDataset ``.json``), so a packed or exported blend reads back with its corpora. Rows
    without one are untouched; a frame without any is returned as it is (no column added)."""
    if "extra" not in frame.columns:
        return frame
    has = frame["extra"].str.contains('"corpus"', literal=True).fill_null(False)
    if not has.any():
        return frame
    own = frame["corpus"] if "corpus" in frame.columns else pl.Series("corpus", [None] * frame.height, pl.String)
    pick = pl.DataFrame({"extra": frame["extra"], "take": has & own.is_null()})  # noqa: F841 (scanned by DuckDB)
    con = duckdb.connect()
    try:
        moved = con.sql(
            "SELECT CASE WHEN take AND json_type(extra, '$.corpus') = 'VARCHAR' THEN json_extract_string(extra, '$.corpus') "
            "END AS c, CASE WHEN take AND json_type(extra, '$.corpus') = 'VARCHAR' THEN "
            "nullif(CAST(json_merge_patch(extra, '{\"corpus\":null}') AS VARCHAR), '{}') ELSE extra END AS e "
            "FROM pick").pl()
    finally:
        con.close()
    return frame.with_columns(pl.coalesce(own, moved["c"]).alias("corpus"), moved["e"].alias("extra"))
