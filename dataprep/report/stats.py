"""Manifest statistics: totals, per language, quantiles, TPS by duration bin, threshold counts.

Pure: a polars frame with (at least) ``duration`` (s), ``num_tokens`` (tokens incl. prompt),
``tps`` (tokens / s) and ``lang`` in, a :class:`ManifestStats` out. No I/O.

Quantiles use linear interpolation between order statistics (numpy's default), so every
figure equals ``numpy.percentile`` / ``statistics.median`` over the same column. Nulls and
NaNs are ignored by the quantiles; an empty selection gives ``None``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

#: Quantile levels reported for duration, num_tokens and tps, in percent.
QUANTILES: tuple[int, ...] = (0, 1, 5, 25, 50, 75, 95, 99, 100)

#: Duration bin edges (s) for "TPS by duration": [0,2), [2,5), ... [40, inf).
DURATION_BIN_EDGES: tuple[float, ...] = (0.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, math.inf)

#: Default "common thresholds" counted in every report: (column, op, value).
DEFAULT_THRESHOLDS: tuple[tuple[str, str, float], ...] = (
    ("tps", ">", 25.0),
    ("duration", ">", 40.0),
    ("duration", "<", 0.5),
)

#: Decimal places kept in the JSON report (figures are exact in the dataclass).
JSON_DECIMALS = 4

_QUANTILE_COLUMNS = ("duration", "num_tokens", "tps")
_NO_LANG = "(none)"


@dataclass(frozen=True)
class LanguageStats:
    """One language: utterance count, total hours, median TPS (tokens/s)."""

    lang: str
    utterances: int
    hours: float
    median_tps: float | None


@dataclass(frozen=True)
class CorpusStats:
    """One corpus of a many-corpora manifest: utterances, hours, tokens (incl. prompt)."""

    corpus: str
    utterances: int
    hours: float
    tokens: int


@dataclass(frozen=True)
class DurationBinStats:
    """TPS inside one duration bin ``lo <= duration < hi`` (seconds)."""

    label: str
    lo: float
    hi: float  # math.inf for the last bin
    count: int
    hours: float
    tps_p10: float | None
    tps_median: float | None
    tps_p90: float | None


@dataclass(frozen=True)
class ThresholdCount:
    """How many rows satisfy ``column op value`` (e.g. ``tps > 25``), and which fraction."""

    column: str
    op: str
    value: float
    count: int
    fraction: float

    @property
    def name(self) -> str:
        return f"{self.column} {self.op} {_num(self.value)}"


@dataclass(frozen=True)
class ManifestStats:
    """Everything ``dataprep stats`` reports. Durations in seconds, hours = Σ duration / 3600."""

    utterances: int
    hours: float
    languages: tuple[LanguageStats, ...]
    #: column -> {"p0": ..., "p50": ..., "p100": ...}
    quantiles: dict[str, dict[str, float | None]]
    tps_by_duration: tuple[DurationBinStats, ...]
    thresholds: tuple[ThresholdCount, ...]
    extra: dict[str, Any] = field(default_factory=dict)
    corpora: tuple[CorpusStats, ...] = ()  # empty unless the manifest has a ``corpus`` column

    def to_json(self, decimals: int = JSON_DECIMALS) -> dict[str, Any]:
        """A JSON-ready dict with floats rounded to ``decimals`` places (deterministic)."""

        def r(x: float | None) -> float | None:
            if x is None or not math.isfinite(x):
                return None
            v = round(float(x), decimals)
            return 0.0 if v == 0 else v  # no "-0.0"

        return {
            "totals": {"utterances": self.utterances, "hours": r(self.hours)},
            "languages": {
                s.lang: {"utterances": s.utterances, "hours": r(s.hours), "median_tps": r(s.median_tps)}
                for s in self.languages
            },
            "quantiles": {col: {k: r(v) for k, v in qs.items()} for col, qs in self.quantiles.items()},
            "tps_by_duration": [
                {
                    "bin": b.label,
                    "min_duration": r(b.lo),
                    "max_duration": r(b.hi),  # None = unbounded
                    "count": b.count,
                    "hours": r(b.hours),
                    "tps_p10": r(b.tps_p10),
                    "tps_median": r(b.tps_median),
                    "tps_p90": r(b.tps_p90),
                }
                for b in self.tps_by_duration
            ],
            "thresholds": {t.name: {"count": t.count, "fraction": r(t.fraction)} for t in self.thresholds},
            **({"corpora": [{"corpus": c.corpus, "utterances": c.utterances, "hours": r(c.hours), "tokens": c.tokens}
                            for c in self.corpora]} if self.corpora else {}),
            **self.extra,
        }


def _num(x: float) -> str:
    """Short human form of a threshold or bin edge: 25.0 -> '25', 0.5 -> '0.5'."""
    return f"{x:g}"


def bin_labels(edges: Sequence[float] = DURATION_BIN_EDGES) -> list[str]:
    """Labels like ``0-2``, ``2-5`` ... ``40+`` for consecutive edges (seconds)."""
    return [f"{_num(lo)}+" if math.isinf(hi) else f"{_num(lo)}-{_num(hi)}" for lo, hi in zip(edges[:-1], edges[1:])]


def duration_bin_index(duration: np.ndarray, edges: Sequence[float] = DURATION_BIN_EDGES) -> np.ndarray:
    """Bin index of each duration: ``i`` such that ``edges[i] <= d < edges[i+1]`` (int64).

    Durations below ``edges[0]`` go to bin 0; the last bin is open-ended when its edge is inf.
    """
    inner = np.asarray(edges[1:-1], dtype=np.float64)
    return np.searchsorted(inner, np.asarray(duration, dtype=np.float64), side="right").astype(np.int64)


def _clean(col: str) -> pl.Expr:
    """A float column with NaN turned to null, so quantiles skip it."""
    c = pl.col(col).cast(pl.Float64)
    return pl.when(c.is_nan()).then(None).otherwise(c)


def _opt(x: Any) -> float | None:
    return None if x is None else float(x)


def compute_stats(
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
