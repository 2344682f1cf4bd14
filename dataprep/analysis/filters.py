"""Named outlier filters on a compiled manifest: kept rows, rejected rows with a reason.

Pure: a polars frame and :class:`Thresholds` in, a :class:`FilterResult` out. No I/O.
Filters, in the order that decides a rejected row's ``reason`` (its FIRST failing filter):
``max_tps``, ``min_tps`` (tokens / second), ``min_duration``, ``max_duration`` (seconds),
``min_tokens``, ``max_tokens`` (tokens incl. prompt); ``max_X`` fails when the value is above
it, ``min_X`` when below: bounds are inclusive for kept rows (``tps == max_tps`` is kept).
A null or NaN value fails every filter set on its column; filters left ``None`` are not
applied. Text-only rows (``modality`` text: no audio, duration 0, no TPS) pass the TPS and
duration filters, as NeMo's duration filter passes text; the token filters apply to them.
Every rule is row by row, so a manifest filtered block by block
(:func:`dataprep.analysis.stats_and_filter.filter_manifest`) gives the whole frame's rows and
its :class:`FilterSummary` adds up. Invariants: ``kept.height + rejected.height == df.height``;
kept rows keep the input order; rejected rows too.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

import polars as pl

from manifests.errors import DataprepError, OptionError
from manifests.options import check_int, check_number

#: (filter name, column, comparison that FAILS a row), in reason-priority order.
FILTERS: tuple[tuple[str, str, str], ...] = (
    ("max_tps", "tps", ">"),
    ("min_tps", "tps", "<"),
    ("min_duration", "duration", "<"),
    ("max_duration", "duration", ">"),
    ("min_tokens", "num_tokens", "<"),
    ("max_tokens", "num_tokens", ">"),
)
FILTER_NAMES: tuple[str, ...] = tuple(f[0] for f in FILTERS)

#: Decimal places of the value shown in ``detail`` (more if rounding would hide the failure).
DETAIL_DECIMALS = 3


@dataclass(frozen=True)
class Thresholds:
    """Filter bounds; ``None`` = filter not applied. tps in tokens/s, durations in s."""

    max_tps: float | None = None
    min_tps: float | None = None
    min_duration: float | None = None
    max_duration: float | None = None
    min_tokens: int | None = None
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in FILTER_NAMES:
            if name.endswith("_tokens"):
                check_int(name, getattr(self, name), ge=0, le=None, optional=True)
            else:
                check_number(name, getattr(self, name), ge=0, optional=True)
        for lo, hi in (("min_tps", "max_tps"), ("min_duration", "max_duration"), ("min_tokens", "max_tokens")):
            a, b = getattr(self, lo), getattr(self, hi)
            if a is not None and b is not None and a > b:
                raise OptionError(lo, f"{a:g} is above the maximum {b:g}: every row would be rejected")

    def active(self) -> list[tuple[str, str, str, float]]:
        """``(name, column, failing op, value)`` of the filters that are set, in priority order."""
        return [(n, c, op, getattr(self, n)) for n, c, op in FILTERS if getattr(self, n) is not None]

    def to_json(self) -> dict[str, Any]:
        """The set thresholds only, for provenance."""
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class FilterCount:
    """One filter: its bound, rows failing it at all, rows rejected with it as the reason."""

    name: str
    column: str
    op: str
    value: float
    failed: int  # rows that fail this filter (a row may fail several)
    rejected: int  # rows whose reason is this filter (the first one they fail)


@dataclass(frozen=True)
class FilterResult:
    """Kept rows (input columns, input order) and rejected rows (+ ``reason``, ``detail``)."""

    kept: pl.DataFrame
    rejected: pl.DataFrame
    counts: tuple[FilterCount, ...]
    rows_in: int

    def to_json(self) -> dict[str, Any]:
        return self.summary().to_json()

    def summary(self) -> FilterSummary:
        """The counts without the rows."""
        return FilterSummary(self.rows_in, self.kept.height, self.rejected.height, self.counts)


@dataclass(frozen=True)
class FilterSummary:
    """What the filters did to a whole manifest, summed over its blocks: rows in, kept,
    rejected and the per-filter counts. ``a + b``: the summary of both blocks (same filters)."""

    rows_in: int
    kept: int
    rejected: int
    counts: tuple[FilterCount, ...]

    def __add__(self, other: FilterSummary) -> FilterSummary:
        if [c.name for c in self.counts] != [c.name for c in other.counts]:
            raise ValueError("FilterSummary: cannot add summaries of different filters")
        return FilterSummary(self.rows_in + other.rows_in, self.kept + other.kept, self.rejected + other.rejected,
                             tuple(replace(a, failed=a.failed + b.failed, rejected=a.rejected + b.rejected)
                                   for a, b in zip(self.counts, other.counts)))

    def to_json(self) -> dict[str, Any]:
        return {"rows_in": self.rows_in, "kept": self.kept, "rejected": self.rejected,
                "filters": [asdict(c) for c in self.counts]}


def _fmt_threshold(x: float) -> str:
    return f"{x:g}" if float(f"{x:g}") == x else repr(float(x))


#: columns a text-only row has no value of (its filters pass it)
AUDIO_COLUMNS = ("tps", "duration")


def _fails(column: str, op: str, value: float, text: pl.Expr) -> pl.Expr:
    v = pl.col(column).cast(pl.Float64)
    cmp = v > value if op == ">" else v < value
    fails = (v.is_null() | v.is_nan() | cmp).fill_null(True)
    return fails & ~text if column in AUDIO_COLUMNS else fails


def _detail(name: str, column: str, op: str, value: float) -> pl.Expr:
    """``"tps 31.2 > 25"``: the row's value (rounded, unless rounding hides the failure)."""
    v = pl.col(column).cast(pl.Float64)
    rounded = v.round(DETAIL_DECIMALS)
    still_fails = rounded > value if op == ">" else rounded < value
    shown = (
        pl.when(still_fails)
        .then(rounded.cast(pl.String).str.replace(r"\.0$", ""))
        .otherwise(v.cast(pl.String))
    )
    compared = pl.concat_str([pl.lit(f"{column} "), shown, pl.lit(f" {op} {_fmt_threshold(value)}")])
    return (
        pl.when(v.is_null())
        .then(pl.lit(f"{column} is missing"))
        .when(v.is_nan())
        .then(pl.lit(f"{column} is NaN"))
        .otherwise(compared)
    )


def apply_filters(df: pl.DataFrame, thresholds: Thresholds) -> FilterResult:
    """Split ``df`` into kept and rejected rows (see the module docstring for the rules).

    Only the columns of the set filters are needed. ``rejected`` has ``df``'s columns plus
    ``reason`` (a filter name) and ``detail`` (one line like ``"tps 31.2 > 25"``).
    """
    # A rejects file read back as input: its old verdict is not ours to keep.
    df = df.drop(["reason", "detail"], strict=False)
    active = thresholds.active()
    missing = sorted({c for _, c, _, _ in active if c not in df.columns})
    if missing:
        raise DataprepError(f"manifest lacks column(s) {', '.join(missing)} needed by the filters")
    if not active:
        empty = df.head(0).with_columns(pl.lit(None, pl.String).alias("reason"), pl.lit(None, pl.String).alias("detail"))
        return FilterResult(kept=df, rejected=empty, counts=(), rows_in=df.height)

    fail_cols = [f"__fail_{name}" for name, _, _, _ in active]
    reason: pl.Expr = pl.lit(None, pl.String)
    detail: pl.Expr = pl.lit(None, pl.String)
    # Build when-chains from the lowest priority up, so the first failing filter wins.
    for (name, column, op, value), fc in reversed(list(zip(active, fail_cols))):
        reason = pl.when(pl.col(fc)).then(pl.lit(name)).otherwise(reason)
        detail = pl.when(pl.col(fc)).then(_detail(name, column, op, value)).otherwise(detail)

    text = (pl.col("modality") == "text").fill_null(False) if "modality" in df.columns else pl.lit(False)
    marked = df.with_columns(
        [_fails(c, op, v, text).alias(fc) for (_, c, op, v), fc in zip(active, fail_cols)]
    ).with_columns(reason.alias("reason"))

    sums = marked.select(
        [pl.col(fc).sum().alias(f"f{i}") for i, fc in enumerate(fail_cols)]
        + [(pl.col("reason") == name).sum().alias(f"r{i}") for i, (name, _, _, _) in enumerate(active)]
    ).row(0, named=True)
    counts = tuple(
        FilterCount(
            name=name, column=column, op=op, value=float(value),
            failed=int(sums[f"f{i}"] or 0), rejected=int(sums[f"r{i}"] or 0),
        )
        for i, (name, column, op, value) in enumerate(active)
    )

    is_rejected = pl.col("reason").is_not_null()
    kept = marked.filter(~is_rejected).select(df.columns)
    # detail strings only for the (few) rejected rows
    rejected = marked.filter(is_rejected).with_columns(detail.alias("detail")).select([*df.columns, "reason", "detail"])
    if kept.height + rejected.height != df.height or sum(c.rejected for c in counts) != rejected.height:
        raise AssertionError(
            f"conservation broken: {df.height} rows in, {kept.height} kept + {rejected.height} rejected"
        )
    return FilterResult(kept=kept, rejected=rejected, counts=counts, rows_in=df.height)
