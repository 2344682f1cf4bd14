"""CSV / TSV (header row) and Parquet sources: named columns mapped to manifest fields.

Column mapping: ``id``; audio from the first of ``audio_filepath``, ``audio_path``,
``path``, ``audio``; ``offset``, ``duration``, the text column (``text_field``), ``lang``,
``source_lang``, ``target_lang``, ``task`` (or ``taskname``), ``sample_rate``,
``channels``; every other column goes to ``extra``. CSV records are one line each (quoted
fields with commas and ``""`` escapes are fine; a quoted newline is not supported and shows
up as a ``malformed_line``). TSV has no quoting at all.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from manifests.errors import DataprepError
from manifests.readers._lines import iter_lines
from manifests.readers._normalize import FIELDS, base_dir_for, finish

AUDIO_COLUMNS = ("audio_filepath", "audio_path", "path", "audio")
_ALIASES = {"task": ("task", "taskname")}


def column_map(columns: Sequence[str], text_field: str, where: str) -> dict[str, str]:
    """Our field -> the source column holding it; raise when there is no text column or a
    column name is given twice (which of them holds the field cannot be told)."""
    seen: set[str] = set()
    twice = next((c for c in columns if c in seen or seen.add(c)), None)  # type: ignore[func-returns-value]
    if twice is not None:
        raise DataprepError(f"{where}: column '{twice}' appears twice in the header")
    if text_field not in columns:
        raise DataprepError(f"{where}: no '{text_field}' column (columns: {', '.join(columns)})")
    mapping = {"text": text_field}
    for name in FIELDS:
        if name == "text":
            continue
        options = AUDIO_COLUMNS if name == "audio" else _ALIASES.get(name, (name,))
        found = next((c for c in options if c in columns), None)
        if found is not None and found not in mapping.values():
            mapping[name] = found
    return mapping


def _labels(mapping: dict[str, str]) -> dict[str, str]:
    return {f: mapping.get(f, "audio_filepath" if f == "audio" else f) for f in FIELDS}


def _raw_from_columns(df: pl.DataFrame, mapping: dict[str, str], types: dict[str, str]) -> pl.DataFrame:
    """Value/type columns for mapped fields; unmapped columns as a sorted-key JSON ``extra``."""
    exprs = []
    for field, col in mapping.items():
        # lists and bytes are no field's value (the type column makes them a malformed_line)
        exprs.append(pl.col(col).cast(pl.String, strict=False).alias(field) if types[col] not in ("ARRAY", "BINARY")
                     else pl.lit(None, pl.String).alias(field))
        exprs.append(pl.when(pl.col(col).is_not_null()).then(pl.lit(types[col])).alias(f"{field}__t"))
    rest = sorted(c for c in df.columns if c not in mapping.values() and c not in ("origin", "reason", "detail"))
    # bytes have no JSON form: an unmapped binary column is kept in ``extra`` as base64 text
    fields = [pl.col(c).bin.encode("base64") if df.schema[c] == pl.Binary else pl.col(c) for c in rest]
    extra = pl.struct(fields).struct.json_encode() if rest else pl.lit(None, pl.String)
    keep = [c for c in ("origin", "reason", "detail") if c in df.columns]
    return df.select(*keep, *exprs, extra.alias("extra"))


def _split_csv_lines(lines: pl.Series, ncols: int, sep: str, quoting: bool) -> tuple[pl.DataFrame, pl.Series]:
    """Fields of each line as String columns f0..f{n-1}, and an error message (null = ok).

    Lines without a quote character are split vectorized; the others go through the csv
    module one by one (they are a minority: transcripts with the separator in them).
    """
    n = len(lines)
    names = [f"f{i}" for i in range(ncols)]
    quoted = lines.str.contains('"', literal=True) if quoting else pl.Series([False] * n)
    nsep = lines.str.count_matches(sep, literal=True)
    simple = ~quoted & (nsep == ncols - 1)
    split = (
        pl.DataFrame({"l": lines})
        .select(pl.col("l").str.split_exact(sep, ncols - 1).struct.rename_fields(names).alias("s"))
        .unnest("s")
    )
    errors: list[str | None] = [None] * n
    slow = (~simple).arg_true().to_list()
    if slow:
        cols: dict[str, list[str | None]] = {c: split[c].to_list() for c in names}
        for i in slow:
            line = lines[i]
            try:
                rows = list(csv.reader([line], delimiter=sep, strict=True,
                                       quoting=csv.QUOTE_MINIMAL if quoting else csv.QUOTE_NONE))
                fields = rows[0] if rows else []
                if len(fields) != ncols:
                    raise csv.Error(f"expected {ncols} fields, got {len(fields)}")
            except csv.Error as exc:
                errors[i] = f"malformed {'CSV' if sep == ',' else 'TSV'} record ({exc})"
                fields = [None] * ncols  # type: ignore[list-item]
            for c, v in zip(names, fields):
                cols[c][i] = v
        split = pl.DataFrame(cols, schema={c: pl.String for c in names})
    return split, pl.Series(errors, dtype=pl.String)


def iter_delimited(
    path: Path, *, sep: str, text_field: str, audio_root: str | Path | None, chunk_rows: int
) -> Iterator[pl.DataFrame]:
    """CSV (``sep=","``, quoted fields) or TSV (``sep="\\t"``, no quoting): one row per record.

    The header is the first non-blank line; ``origin`` is ``path:line`` (header = its own line).
    """
    base = base_dir_for(path, audio_root)
    quoting = sep == ","
    header: list[str] | None = None
    mapping: dict[str, str] = {}
    for chunk in iter_lines(path, chunk_rows):
        if header is None:
            first = chunk.row(0, named=True)
            if first["line"] is None:
                raise DataprepError(f"{path}:{first['lineno']}: header is not valid UTF-8")
            header = next(csv.reader([first["line"]], delimiter=sep,
                                     quoting=csv.QUOTE_MINIMAL if quoting else csv.QUOTE_NONE))
            header = [h.strip() for h in header]
            mapping = column_map(header, text_field, str(path))
            chunk = chunk.slice(1)
            if chunk.height == 0:
                continue
        fields, errors = _split_csv_lines(chunk["line"].fill_null(""), len(header), sep, quoting)
        fields.columns = header
        origin = pl.format("{}:{}", pl.lit(str(path)), chunk["lineno"])
        df = fields.with_columns(
            chunk.select(origin.alias("origin"))["origin"],
            pl.when(pl.lit(chunk["utf8_error"]).is_not_null()).then(pl.lit("non_utf8"))
            .when(pl.lit(errors).is_not_null()).then(pl.lit("malformed_line")).alias("reason"),
        )
        df = df.with_columns(
            pl.when(pl.lit(chunk["utf8_error"]).is_not_null())
            .then(pl.format("{}: {}", pl.col("origin"), pl.lit(chunk["utf8_error"])))
            .when(pl.lit(errors).is_not_null()).then(pl.format("{}: {}", pl.col("origin"), pl.lit(errors)))
            .alias("detail")
        )
        # Empty cells are absent values, except the text (an empty transcript is kept as "").
        df = df.with_columns(
            [pl.when(pl.col(c) != "").then(pl.col(c)).alias(c) for c in header if c != mapping["text"]]
        )
        types = {c: "VARCHAR" for c in header}
        raw = _raw_from_columns(df, mapping, types)
        raw = raw.with_columns(
            [pl.when(pl.col("reason").is_null()).then(pl.col(f"{f}__t")).alias(f"{f}__t") for f in mapping]
        )
        yield finish(raw, base_dir=base, labels=_labels(mapping), require_audio=False)
    if header is None:
        return


def _type_name(dtype: pl.DataType) -> str:
    if dtype.is_numeric():
        return "DOUBLE"
    if dtype == pl.String or dtype == pl.Categorical or isinstance(dtype, pl.Enum):
        return "VARCHAR"
    if dtype == pl.Boolean:
        return "BOOLEAN"
    return "ARRAY" if isinstance(dtype, (pl.List, pl.Array)) else str(dtype).upper()


def iter_parquet(
    path: Path, *, text_field: str, audio_root: str | Path | None, chunk_rows: int
) -> Iterator[pl.DataFrame]:
    """Parquet with the CSV column mapping; ``origin`` is ``path:row`` (1-based row index)."""
    base = base_dir_for(path, audio_root)
    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # noqa: BLE001 (pyarrow raises several types)
        raise DataprepError(f"{path}: not a readable Parquet file ({exc})") from None
    columns = pf.schema_arrow.names
    mapping = column_map(columns, text_field, str(path))
    row = 0
    for batch in pf.iter_batches(batch_size=chunk_rows):
        df = pl.from_arrow(batch)
        assert isinstance(df, pl.DataFrame)
        types = {c: _type_name(df.schema[c]) for c in df.columns}
        df = df.with_columns(
            pl.format("{}:{}", pl.lit(str(path)), pl.int_range(row + 1, row + 1 + df.height)).alias("origin")
        )
        row += df.height
        yield finish(_raw_from_columns(df, mapping, types), base_dir=base, labels=_labels(mapping),
                     require_audio=False)
