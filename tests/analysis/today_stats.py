"""Today's (before streaming) polars implementation of ``compute_stats``, frozen as the oracle
the streamed figures must equal (counts, quantiles and orders exactly; sums to the last bit
that polars' own summation order allows)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from dataprep.analysis.stats import (DEFAULT_THRESHOLDS, DURATION_BIN_EDGES, QUANTILES, CorpusStats, DurationBinStats,
                                   LanguageStats, ManifestStats, ThresholdCount, bin_labels, duration_bin_index)

_QUANTILE_COLUMNS = ("duration", "num_tokens", "tps")
_NO_LANG = "(none)"


def _clean(col: str) -> pl.Expr:
    """A float column with NaN turned to null, so quantiles skip it."""
    c = pl.col(col).cast(pl.Float64)
    return pl.when(c.is_nan()).then(None).otherwise(c)


def _opt(x: Any) -> float | None:
    return None if x is None else float(x)


def compute_stats_today(
    df: pl.DataFrame,
    edges: Sequence[float] = DURATION_BIN_EDGES,
    thresholds: Sequence[tuple[str, str, float]] = DEFAULT_THRESHOLDS,
    quantiles: Sequence[float] = QUANTILES,
) -> ManifestStats:
    """Statistics of a compiled manifest frame.

    Parameters
    ----------
    df : frame with ``duration`` (s), ``num_tokens``, ``tps`` (tokens/s) and optionally ``lang``.
    edges : increasing duration bin edges in seconds; ``inf`` as the last edge for an open bin.
    thresholds : ``(column, op, value)`` with op one of ``>``, ``>=``, ``<``, ``<=``.
    quantiles : levels in percent (0..100).

    Invariants: ``sum(bin.count) == utterances == sum(lang.utterances)``.
    """
    missing = [c for c in _QUANTILE_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"manifest frame lacks column(s) {', '.join(missing)}")
    clean = df.select(
        [_clean(c).alias(c) for c in _QUANTILE_COLUMNS]
        + [(pl.col("lang").cast(pl.String) if "lang" in df.columns else pl.lit(None, pl.String)).alias("lang")]
    )
    return ManifestStats(
        utterances=df.height,
        hours=float(clean["duration"].sum() or 0.0) / 3600.0,
        languages=_languages(clean),
        quantiles=_quantiles(clean, quantiles),
        tps_by_duration=_tps_by_duration(clean, edges),
        thresholds=_threshold_counts(clean, thresholds),
        corpora=corpus_stats(df) if "corpus" in df.columns else (),
    )


def corpus_stats(df: pl.DataFrame) -> tuple[CorpusStats, ...]:
    """Per corpus (``corpus`` column), in order of first appearance: utterances, hours, tokens."""
    rows = (df.group_by(pl.col("corpus").fill_null(_NO_LANG), maintain_order=True)
            .agg(pl.len().alias("n"), pl.col("duration").sum().alias("s"), pl.col("num_tokens").cast(pl.Int64).sum()
                 .alias("t")).to_dicts())
    return tuple(CorpusStats(str(r["corpus"]), int(r["n"]), float(r["s"] or 0.0) / 3600.0, int(r["t"] or 0))
                 for r in rows)


def _quantiles(clean: pl.DataFrame, quantiles: Sequence[float]) -> dict[str, dict[str, float | None]]:
    """Per column, numpy's linear-interpolation percentiles (one partition pass per column)."""
    quant: dict[str, dict[str, float | None]] = {}
    for c in _QUANTILE_COLUMNS:
        values = clean[c].drop_nulls().to_numpy()
        qv = np.percentile(values, list(quantiles)) if values.size else [None] * len(quantiles)
        quant[c] = {f"p{q}": _opt(v) for q, v in zip(quantiles, qv)}
    return quant


def _languages(clean: pl.DataFrame) -> tuple[LanguageStats, ...]:
    """Per language, sorted by language code; a missing language shows as "(none)"."""
    rows = (
        clean.group_by(pl.col("lang").fill_null(_NO_LANG))
        .agg(pl.len().alias("n"), pl.col("duration").sum().alias("seconds"), pl.col("tps").median().alias("median_tps"))
        .sort("lang")
        .to_dicts()
    )
    return tuple(LanguageStats(lang=str(r["lang"]), utterances=int(r["n"]), hours=float(r["seconds"] or 0.0) / 3600.0,
                               median_tps=_opt(r["median_tps"])) for r in rows)


def _tps_by_duration(clean: pl.DataFrame, edges: Sequence[float]) -> tuple[DurationBinStats, ...]:
    """TPS quantiles per duration bin; a null/NaN duration falls in no bin."""
    dur = clean["duration"].to_numpy()
    valid = ~np.isnan(dur.astype(np.float64))
    idx = np.full(clean.height, -1, dtype=np.int64)
    idx[valid] = duration_bin_index(dur[valid], edges)
    per_bin = {
        int(r["bin"]): r
        for r in clean.with_columns(pl.Series("bin", idx))
        .filter(pl.col("bin") >= 0)
        .group_by("bin")
        .agg(
            pl.len().alias("n"),
            pl.col("duration").sum().alias("seconds"),
            pl.col("tps").quantile(0.10, interpolation="linear").alias("p10"),
            pl.col("tps").median().alias("p50"),
            pl.col("tps").quantile(0.90, interpolation="linear").alias("p90"),
        )
        .to_dicts()
    }
    bins = []
    for i, label in enumerate(bin_labels(edges)):
        r = per_bin.get(i, {})
        bins.append(DurationBinStats(
            label=label, lo=float(edges[i]), hi=float(edges[i + 1]), count=int(r.get("n", 0)),
            hours=float(r.get("seconds") or 0.0) / 3600.0, tps_p10=_opt(r.get("p10")),
            tps_median=_opt(r.get("p50")), tps_p90=_opt(r.get("p90")),
        ))
    return tuple(bins)


_OPS = {">": pl.Expr.__gt__, ">=": pl.Expr.__ge__, "<": pl.Expr.__lt__, "<=": pl.Expr.__le__}


def _threshold_counts(clean: pl.DataFrame, thresholds: Sequence[tuple[str, str, float]]) -> tuple[ThresholdCount, ...]:
    """Rows beyond each ``(column, op, value)`` threshold (nulls never count)."""
    exprs = []
    for i, (col, op, value) in enumerate(thresholds):
        if op not in _OPS:
            raise ValueError(f"threshold operator {op!r} is not one of {', '.join(_OPS)}")
        exprs.append(_OPS[op](pl.col(col), value).fill_null(False).sum().alias(str(i)))
    row = clean.select(exprs).row(0) if exprs else ()
    n = clean.height
    return tuple(
        ThresholdCount(column=col, op=op, value=float(value), count=int(row[i]), fraction=(row[i] / n if n else 0.0))
        for i, (col, op, value) in enumerate(thresholds)
    )
