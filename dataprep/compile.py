"""``dataprep compile``: sources -> one compiled manifest + one rejects file.

Per chunk of source rows (vectorized polars): validate text and durations, probe audio
headers where needed, count tokens; then across all sources reject duplicate ids (the
first occurrence wins). Every input row ends in exactly one of the two outputs.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import polars as pl

from dataprep import __version__
from dataprep.probe import probe_headers
from dataprep.tokenize import Tokenizers
from manifests.errors import DataprepError
from manifests.io import file_sha256
from manifests.readers import iter_source
from manifests.schema import POLARS_SCHEMA, REJECTS_POLARS_SCHEMA, conform

ProbeMode = Literal["auto", "always", "never"]

#: internal column: global input row number, keeps outputs in input order
_ROW = "__row"


@dataclass
class CompileOptions:
    """How sources become a manifest. Durations in seconds."""

    prompt_tokens: int = 0
    fmt: str = "auto"
    text_field: str = "text"
    audio_root: str | None = None
    probe: ProbeMode = "auto"  # auto: header only where the source has no duration
    probe_threads: int = 8
    tokenizer_threads: int = 0  # 0 = all cores
    mismatch_tolerance: float = 0.05  # s, for --probe always on whole-file rows
    chunk_rows: int = 500_000
    strict: bool = False


@dataclass
class CompileResult:
    manifest: pl.DataFrame
    rejects: pl.DataFrame
    rows_in: int
    reasons: dict[str, int] = field(default_factory=dict)
    provenance: dict[str, object] = field(default_factory=dict)


def source_fingerprint(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a source file, or of a directory's files (names and contents, sorted)."""
    p = Path(path)
    if p.is_dir():
        digest = hashlib.sha256()
        for f in sorted(q for q in p.rglob("*") if q.is_file()):
            digest.update(f.relative_to(p).as_posix().encode() + b"\0" + file_sha256(f).encode())
        return digest.hexdigest()
    return file_sha256(p)


def _reject(df: pl.DataFrame, mask: pl.Expr, reason: str, detail: pl.Expr) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Split ``df`` into (rows kept, rows rejected with ``reason``/``detail``)."""
    flagged = df.with_columns(mask.fill_null(False).alias("__bad"))
    bad = flagged.filter(pl.col("__bad")).with_columns(
        pl.lit(reason).alias("reason"), detail.alias("detail")
    ).drop("__bad")
    return flagged.filter(~pl.col("__bad")).drop("__bad"), bad


def _at(problem: pl.Expr | str) -> pl.Expr:
    """``origin: problem`` as a one-line detail."""
    prob = pl.lit(problem) if isinstance(problem, str) else problem
    return pl.concat_str([pl.col("origin"), pl.lit(": "), prob])


def _fmt(expr: pl.Expr, decimals: int = 3) -> pl.Expr:
    return expr.round(decimals).cast(pl.String)


def process_chunk(
    chunk: pl.DataFrame,
    tokenizers: Tokenizers,
    opts: CompileOptions,
    on_probe: Callable[[int], None] | None = None,
) -> tuple[pl.DataFrame, list[pl.DataFrame]]:
    """Validate, probe and tokenize one chunk of reader rows. Returns (accepted, rejects)."""
    rejects: list[pl.DataFrame] = [chunk.filter(pl.col("reason").is_not_null())]
    df = chunk.filter(pl.col("reason").is_null())

    df, bad = _reject(df, pl.col("text").is_null() | (pl.col("text").str.strip_chars() == ""), "empty_text",
                      _at("empty text"))
    rejects.append(bad)
    d = pl.col("duration")
    df, bad = _reject(df, d.is_not_null() & (d.is_nan() | d.is_infinite() | (d <= 0)), "invalid_duration",
                      _at(pl.concat_str([pl.lit("duration "), d.cast(pl.String), pl.lit(" s is not a positive number")])))
    rejects.append(bad)
    o = pl.col("offset").fill_null(0.0)
    df, bad = _reject(df, o.is_nan() | o.is_infinite() | (o < 0), "invalid_duration",
                      _at(pl.concat_str([pl.lit("offset "), pl.col("offset").cast(pl.String), pl.lit(" s is negative or not a number")])))
    rejects.append(bad)
    df = df.with_columns(pl.col("offset").fill_null(0.0))
    df, bad = _reject(df, d.is_null() & pl.col("audio_path").is_null(), "missing_field",
                      _at("no duration and no audio path to probe"))
    rejects.append(bad)

    df, probe_rejects = _probe(df, opts, on_probe)
    rejects.extend(probe_rejects)

    lang_for_tokens = pl.coalesce(pl.col("target_lang"), pl.col("lang"))
    langs = df.select(lang_for_tokens).to_series()  # a Series: no Python str per row
    pieces = tokenizers.count(df["text"].to_list(), langs, opts.tokenizer_threads)
    df = df.with_columns(pl.Series("__pieces", pieces))
    df, bad = _reject(df, pl.col("__pieces") < 0, "no_tokenizer",
                      _at(pl.concat_str([pl.lit("no tokenizer for language "), lang_for_tokens.fill_null("<none>")])))
    rejects.append(bad.drop("__pieces"))
    df = df.with_columns(
        (pl.col("__pieces") + opts.prompt_tokens).cast(pl.Int32).alias("num_tokens"),
    ).with_columns((pl.col("num_tokens") / pl.col("duration")).alias("tps")).drop("__pieces")
    return df, [r for r in rejects if r.height]


def _probe(
    df: pl.DataFrame, opts: CompileOptions, on_probe: Callable[[int], None] | None
) -> tuple[pl.DataFrame, list[pl.DataFrame]]:
    """Read audio headers where needed; fill duration, sample_rate, channels."""
    if opts.probe == "never":
        df, bad = _reject(df, pl.col("duration").is_null(), "missing_field",
                          _at("no duration in the source and --probe never"))
        return df, [bad]
    need = pl.col("audio_path").is_not_null() & (
        pl.col("duration").is_null() | pl.lit(opts.probe == "always")
    )
    paths = df.filter(need)["audio_path"].unique(maintain_order=True).to_list()
    if not paths:
        return df, []
    info = probe_headers(paths, threads=opts.probe_threads, on_progress=on_probe)
    df = df.join(info, on="audio_path", how="left", maintain_order="left", suffix="__p")
    df = df.with_columns(
        pl.when(need).then(pl.col("sample_rate__p")).otherwise(pl.col("sample_rate")).alias("sample_rate"),
        pl.when(need).then(pl.col("channels__p")).otherwise(pl.col("channels")).alias("channels"),
    ).drop("sample_rate__p", "channels__p")
    rejects = []
    df, bad = _reject(df, need & pl.col("probe_reason").is_not_null(), "__probe", _at(pl.col("probe_detail")))
    rejects.append(bad.with_columns(pl.col("probe_reason").alias("reason")))
    fd, o, d = pl.col("file_duration"), pl.col("offset"), pl.col("duration")
    df = df.with_columns(pl.when(d.is_null()).then(fd - o).otherwise(d).alias("duration"))
    tol = opts.mismatch_tolerance
    df, bad = _reject(df, fd.is_not_null() & ((d <= 0) | (o + d > fd + tol)), "segment_out_of_range",
                      _at(pl.concat_str([pl.lit("segment "), _fmt(o), pl.lit("+"), _fmt(d),
                                         pl.lit(" s exceeds the audio ("), _fmt(fd), pl.lit(" s)")])))
    rejects.append(bad)
    if opts.probe == "always":
        df, bad = _reject(df, fd.is_not_null() & (o == 0) & ((d - fd).abs() > tol), "duration_mismatch",
                          _at(pl.concat_str([pl.lit("manifest says "), _fmt(d), pl.lit(" s, audio header says "),
                                             _fmt(fd), pl.lit(" s")])))
        rejects.append(bad)
    drop = ["file_duration", "probe_reason", "probe_detail"]
    return df.drop(drop), [r.drop(drop) for r in rejects]


def _reject_duplicates(accepted: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Keep each id's first row (in input order); reject the others naming the first."""
    first_origin = pl.col("origin").first().over("id")
    return _reject(
        accepted,
        ~pl.col("id").is_first_distinct(),
        "duplicate_id",
        _at(pl.concat_str([pl.lit("duplicate id "), pl.col("id"), pl.lit(" (first at "), first_origin, pl.lit(")")])),
    )


def iter_rows(sources: Sequence[str | os.PathLike[str]], opts: CompileOptions) -> Iterator[pl.DataFrame]:
    """Reader chunks of every source in order, numbered with a global input row index."""
    start = 0
    for src in sources:
        if not Path(src).exists():
            raise DataprepError(f"{src}: no such file or directory")
        for chunk in iter_source(src, opts.fmt, text_field=opts.text_field, audio_root=opts.audio_root,
                                 chunk_rows=opts.chunk_rows):
            yield chunk.with_columns(pl.int_range(start, start + chunk.height, dtype=pl.Int64).alias(_ROW))
            start += chunk.height


def compile_sources(
    sources: Sequence[str | os.PathLike[str]],
    tokenizers: Tokenizers,
    opts: CompileOptions | None = None,
    *,
    on_chunk: Callable[[int], None] | None = None,
    on_probe: Callable[[int], None] | None = None,
) -> CompileResult:
    """Compile ``sources`` into (manifest, rejects). Invariant: rows_in = kept + rejected.

    With ``opts.strict`` the first problem (in input order) raises :class:`DataprepError`
    with its one-line detail ("file:line: problem") instead of becoming a reject row.
    """
    opts = opts or CompileOptions()
    accepted: list[pl.DataFrame] = []
    rejected: list[pl.DataFrame] = []
    rows_in = 0
    for chunk in iter_rows(sources, opts):
        rows_in += chunk.height
        ok, bad = process_chunk(chunk, tokenizers, opts, on_probe)
        if opts.strict and bad:
            first = pl.concat(bad, how="vertical_relaxed").sort(_ROW).row(0, named=True)
            raise DataprepError(str(first["detail"]))
        accepted.append(ok)
        rejected.extend(bad)
        if on_chunk:
            on_chunk(chunk.height)
    manifest, rejects = assemble(accepted, rejected, opts)
    if manifest.height + rejects.height != rows_in:
        raise AssertionError(f"conservation broken: {rows_in} in, {manifest.height} kept, {rejects.height} rejected")
    reasons = dict(sorted(rejects.group_by("reason").len().iter_rows())) if rejects.height else {}
    provenance = compile_provenance(sources, tokenizers, opts)
    return CompileResult(manifest=manifest, rejects=rejects, rows_in=rows_in, reasons=reasons,
                         provenance=provenance)


def assemble(
    accepted: Sequence[pl.DataFrame], rejected: Sequence[pl.DataFrame], opts: CompileOptions,
    *, keep_row: bool = False,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(manifest, rejects) from processed chunks: duplicate ids rejected (first in input order
    wins), both sorted by the global input row. ``keep_row`` keeps the ``__row`` column.

    Rows of one id must all be in ``accepted`` (a shard by id holds every copy of its ids).
    """
    row_schema = {_ROW: pl.Int64()}
    template = pl.DataFrame(schema={**REJECTS_POLARS_SCHEMA, **row_schema})
    all_ok = pl.concat([template.select(accepted[0].columns) if accepted else template] + list(accepted),
                       how="vertical_relaxed").sort(_ROW)
    all_ok, dups = _reject_duplicates(all_ok)
    if opts.strict and dups.height:
        raise DataprepError(str(dups.sort(_ROW).row(0, named=True)["detail"]))
    rejected = [*rejected, dups]
    rejects = pl.concat([conform(r, {**REJECTS_POLARS_SCHEMA, **row_schema}) for r in rejected] or
                        [template], how="vertical_relaxed").sort(_ROW)
    extra = row_schema if keep_row else {}
    return conform(all_ok, {**POLARS_SCHEMA, **extra}), conform(rejects, {**REJECTS_POLARS_SCHEMA, **extra})


def compile_provenance(
    sources: Sequence[str | os.PathLike[str]], tokenizers: Tokenizers, opts: CompileOptions
) -> dict[str, object]:
    """What a compiled manifest records about its inputs (Parquet metadata)."""
    return {
        "tool": f"speech-dataprep {__version__}",
        "sources": [{"path": str(s), "sha256": source_fingerprint(s)} for s in sources],
        "tokenizers": tokenizers.hashes,
        "prompt_tokens": opts.prompt_tokens,
        "probe": opts.probe,
        "text_field": opts.text_field,
    }
