"""The small tables ``dataprep report`` draws: aggregates of a manifest, its rejects, its
buckets and its plan, never its rows.

Every table is bounded by its bins, buckets, steps, ranks or groups, not by the corpus: the
page stays a few MB whatever the row count. Every section is streamed: duration, tokens and
TPS are read in blocks (the stats' passes, then one binning pass), strings grouped block by
block; the same pass feeds the buckets section and spills each row's corpus and duration for
the plan's corpus shares (:mod:`dataprep.report.stream_sections`); sections 2 and 3 are drawn
by :mod:`~dataprep.report.buckets_section` and :mod:`~dataprep.report.plan_section`. Figures
reuse :func:`dataprep.analysis.stats.stream_stats`, :func:`dataprep.analysis.padding.manifest_padding_report`,
:func:`dataprep.planning.simulate.simulate_plan` / :func:`~dataprep.planning.simulate.plan_steps_report`
and :class:`bucketing.costmodel.CostModel`.

Units: durations and hours in seconds / hours, TPS in tokens per second, shares in 0..1.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from bucketing.fit import grid_from_spec
from bucketing.held_columns import HeldColumns
from dataprep.analysis.exact import SELECT_BUDGET, ExactSums
from dataprep.analysis.stats import QUANTILES, Block, ManifestStats, stream_stats
from dataprep.planning.simulate import DEFAULT_WORLD_SIZES
from dataprep.report.buckets_section import BucketAggregates, bucket_rows, bucket_section
from dataprep.report.learn_section import StepTimeAggregates, WindowShares, step_time_aggregates, window_aggregates
from dataprep.report.plan_section import MAX_GROUPS, PlanAggregates, _r, plan_aggregates
from dataprep.report.stream_sections import SHARE_BYTES_PER_ROW, SPILL_BYTES_PER_ROW, RowBlock, share_range_rows, \
    spill_rows
from manifests.buckets_file import BucketSpec, parse_buckets, read_buckets
from manifests.content_hash import file_sha256
from manifests.errors import DataprepError, ManifestError
from manifests.hash_cache import manifest_hash, require_manifest_hash
from manifests.manifest_read import iter_manifest, manifest_num_rows, read_metadata
from manifests.options import check_int
from manifests.plan_meta import read_plan_meta
from manifests.spill import SpillFiles, check_free_disk, default_memory_limit, remove_spill, spill_dir

#: rows per block the report reads (its corpus groups' hours are summed per block: another
#: size may change their last bits)
REPORT_BLOCK_ROWS = 1 << 20
#: bins of each 1D histogram (duration, tokens, TPS), plus one overflow bin
HIST_BINS = 80
#: bins per axis of the duration x tokens histogram
GRID_BINS = 60
#: quantile (percent) that sets a histogram's upper edge (rows above it land in the overflow bin)
HIST_TOP = 99.9
#: step of the ``--max-tps`` slider (tokens/s) and its most positions
TPS_STEP = 0.5
TPS_POSITIONS = 240
#: examples kept per reject reason, and characters kept of each field
REJECT_EXAMPLES = 3
EXAMPLE_CHARS = 160
#: the source file of a row: its ``origin`` without the trailing ``:line`` (or ``:member``)
SOURCE_EXPR = pl.col("origin").fill_null("(unknown)").str.replace(r":[^:/]*$", "")


def corpus_expr(columns: Sequence[str]) -> pl.Expr:
    """The corpus of a row: its ``corpus`` column (the blend's names) where the manifest has
    one, else its source file (:data:`SOURCE_EXPR`)."""
    return pl.col("corpus").fill_null(SOURCE_EXPR) if "corpus" in columns else SOURCE_EXPR


def _zero_nan(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """``x`` with NaN as 0, infinities kept (``x`` itself, not a copy, when it holds no NaN:
    the usual case), whatever else the array holds: block by block as for a whole column."""
    nan = np.isnan(x)
    return np.where(nan, 0.0, x) if nan.any() else x


@dataclass(frozen=True)
class Histogram:
    """Counts and hours per bin ``[lo, hi)``; the last bin (``overflow``) holds rows >= its lo."""

    column: str
    bins: list[dict[str, float]]

    @classmethod
    def of(cls, column: str, values: npt.NDArray[Any], hours_of: npt.NDArray[np.float64], top: float | None,
           integer: bool = False, bins: int = HIST_BINS) -> Histogram:
        """Bins of equal width over ``[0, top]`` (``top``: the :data:`HIST_TOP` quantile): the
        whole array as one block of :class:`HistogramCounts`."""
        counts = HistogramCounts(top, integer, bins)
        counts.add(np.asarray(values, dtype=np.float64), hours_of)
        return counts.histogram(column)


def _add_seconds(acc: npt.NDArray[np.float64], idx: npt.NDArray[np.int64], seconds: npt.NDArray[np.float64]) -> None:
    """``acc[idx[i]] += seconds[i]`` in row order: block after block, the very sums a weighted
    ``np.bincount`` of the whole array gives (it adds in row order too)."""
    np.add.at(acc, idx, seconds)


class HistogramCounts:
    """Rows and seconds per bin of one :class:`Histogram`, added block by block (finite values
    only; ``hours_of``: each row's duration, 0 where unknown). Integer counts and in-order
    float sums: any split of the rows into blocks gives the same histogram."""

    def __init__(self, top: float | None, integer: bool = False, bins: int = HIST_BINS) -> None:
        self.top, self.bins = top, bins
        width = max(top, 1e-9) / bins if top is not None else 1.0
        self.width = max(1.0, math.ceil(width)) if integer else width
        self.n = np.zeros(bins + 1, np.int64)
        self.seconds = np.zeros(bins + 1, np.float64)

    def add(self, v: npt.NDArray[np.float64], hours_of: npt.NDArray[np.float64]) -> None:
        ok = np.isfinite(v)
        w = hours_of
        if not ok.all():
            v, w = v[ok], hours_of[ok]
        idx = np.minimum((np.maximum(v, 0.0) / self.width).astype(np.int64), self.bins)
        self.n += np.bincount(idx, minlength=self.bins + 1)
        _add_seconds(self.seconds, idx, w)

    def histogram(self, column: str) -> Histogram:
        if self.top is None or not self.n.any():
            return Histogram(column, [])
        n, h, width = self.n, self.seconds / 3600.0, self.width
        return Histogram(column, [{"lo": _r(i * width), "hi": _r((i + 1) * width), "n": int(n[i]), "hours": _r(h[i], 4),
                                   "overflow": i == self.bins} for i in range(self.bins + 1) if n[i]])


@dataclass(frozen=True)
class CorpusAggregates:
    """Section 1: totals, groups, distributions, the TPS cutoff and the 2D histogram."""

    manifest: str
    content_hash: str
    totals: dict[str, float]
    groups: list[dict[str, Any]]
    histograms: list[Histogram]
    tps_cut: list[dict[str, float]]
    grid2d: dict[str, Any]
    stats: ManifestStats
    #: whether corpora are named by the manifest's ``corpus`` column (else by source file)
    corpus_column: bool = False


@dataclass(frozen=True)
class Corpora:
    """Each row's corpus (its ``origin`` without the trailing ``:line`` or ``:member``) as an
    index into ``names`` (empty when not asked for), and the (corpus, lang, task) groups:
    utterances, hours, tokens. ``order``: the index into ``names`` of each code
    :meth:`CorpusGroups.add` gives (in order of first appearance)."""

    names: list[str]
    codes: npt.NDArray[np.int32]
    groups: list[dict[str, Any]]
    order: npt.NDArray[np.int32]


#: the columns the corpus groups are read from (``lang`` / ``task``: "-" where absent; ``corpus``
#: names the corpus where present, else the source file in ``origin`` does)
GROUP_COLUMNS = ("origin", "lang", "task", "corpus")


class CorpusGroups:
    """The (corpus, lang, task) groups, and optionally each row's corpus, added block by
    block (polars frames or Arrow tables with ``origin``, ``duration``, ``num_tokens`` and
    ``lang`` / ``task`` where the manifest has them). Memory: the groups of each block (a
    few rows each). Counts and tokens are exact; hours are each block's polars sum, summed
    block after block (so they may differ from one whole-column sum in the last bits, far
    below the page's 4 decimals)."""

    def __init__(self, codes: bool = True) -> None:
        self.keep_codes = codes
        self._parts: list[pl.DataFrame] = []
        self._index: dict[str, int] = {}  # corpus -> code in order of first appearance
        #: whether the rows name their corpus (a ``corpus`` column), else their source files do
        self.named = False

    def add(self, block: pa.Table | pl.DataFrame) -> npt.NDArray[np.int32] | None:
        """Group the block; with ``codes``, return its rows' corpora as codes in order of first
        appearance (:attr:`Corpora.order` maps them to the sorted names)."""
        f = block if isinstance(block, pl.DataFrame) else pl.from_arrow(block)
        assert isinstance(f, pl.DataFrame)
        self.named = self.named or "corpus" in f.columns
        keys = f.select(corpus_expr(f.columns).alias("corpus"),
                        *[(pl.col(c).cast(pl.String) if c in f.columns else pl.lit(None, pl.String)).fill_null("-")
                          .alias(c) for c in ("lang", "task")],
                        pl.col("duration").cast(pl.Float64).fill_nan(None),
                        pl.col("num_tokens").cast(pl.Float64).fill_nan(None).cast(pl.Int64))
        part = (keys.group_by("corpus", "lang", "task", maintain_order=True)
                .agg(pl.len().cast(pl.Int64).alias("utterances"), pl.col("duration").sum().alias("seconds"),
                     pl.col("num_tokens").sum().alias("tokens")))
        # A copy of the few rows: polars' string keys are views into the block's string buffer
        # (a key over 12 bytes, "cv/train.jsonl", points into it), which kept every block's
        # origins alive: 10-14 bytes a row of the corpus.
        self._parts.append(pl.DataFrame(part.to_dict(as_series=False), schema=part.schema))
        if not self.keep_codes:
            return None
        corpus = keys["corpus"]
        for name in corpus.unique(maintain_order=True).to_list():
            self._index.setdefault(name, len(self._index))
        return corpus.replace_strict(list(self._index), list(self._index.values()), return_dtype=pl.Int32).to_numpy()

    @property
    def nbytes(self) -> int:
        """Bytes of the Arrow buffers the groups kept so far hold (bounded by the groups)."""
        return sum(p.to_arrow(compat_level=pl.CompatLevel.newest()).get_total_buffer_size() for p in self._parts)

    def result(self) -> Corpora:
        """The groups, largest first (more than :data:`MAX_GROUPS`: the smallest summed into
        one ``(other: N groups)`` row), the corpora's names in order and the map of codes to
        them (no rows' codes). Source files (no ``corpus`` column) are named by the shortest
        end of their paths that tells them apart (``train.jsonl``, ``a/train.jsonl``)."""
        g = (pl.concat(self._parts)
             .group_by("corpus", "lang", "task", maintain_order=True)
             .agg(pl.col("utterances").sum(), (pl.col("seconds").sum() / 3600).alias("hours"), pl.col("tokens").sum())
             .sort(["hours", "corpus", "lang", "task"], descending=[True, False, False, False]))
        names = sorted(set(g["corpus"].to_list()))
        rows = g.to_dicts()
        if len(rows) > MAX_GROUPS:
            rest = rows[MAX_GROUPS - 1:]
            rows = rows[:MAX_GROUPS - 1] + [{"corpus": f"(other: {len(rest)} groups)", "lang": "-", "task": "-",
                                              "utterances": sum(r["utterances"] for r in rest),
                                              "hours": sum(r["hours"] or 0.0 for r in rest),
                                              "tokens": sum(r["tokens"] or 0 for r in rest)}]
        total_h = sum(r["hours"] or 0.0 for r in rows) or 1.0
        groups = [{**r, "hours": _r(r["hours"] or 0.0, 4), "tokens": int(r["tokens"] or 0),
                   "share": _r((r["hours"] or 0.0) / total_h, 4)} for r in rows]
        order = np.zeros(len(self._index), np.int32)  # first-appearance code -> index into the sorted names
        if self.keep_codes:
            order[[self._index[n] for n in names]] = np.arange(len(names), dtype=np.int32)
        if not self.named:
            short = short_paths(names)
            names = [short[n] for n in names]
            groups = [{**g, "corpus": short.get(g["corpus"], g["corpus"])} for g in groups]
        return Corpora(names, np.zeros(0, np.int32), groups, order)


def short_paths(paths: Sequence[str]) -> dict[str, str]:
    """Each path -> its shortest end (last folder levels) that no other path of ``paths`` ends
    with: distinct paths keep distinct names."""
    parts = {p: p.split("/") for p in paths}
    out: dict[str, str] = {}
    k = 1
    left = list(paths)
    while left:
        ends = {p: "/".join(parts[p][-k:]) for p in paths}
        seen: dict[str, int] = {}
        for e in ends.values():
            seen[e] = seen.get(e, 0) + 1
        rest = []
        for p in left:
            if seen[ends[p]] == 1 or k >= len(parts[p]):
                out[p] = ends[p]
            else:
                rest.append(p)
        left, k = rest, k + 1
    return out


def corpora(manifest: str | os.PathLike[str], *, codes: bool = True, block_rows: int = REPORT_BLOCK_ROWS) -> Corpora:
    """:class:`CorpusGroups` of the manifest, read in blocks of ``block_rows`` rows, with each
    row's corpus (4 bytes a row) when ``codes``."""
    present = pq.read_schema(manifest).names
    acc = CorpusGroups(codes)
    parts = [acc.add(table) for table in iter_manifest(manifest, _group_columns(present), block_rows)]
    corp = acc.result()
    if not codes:
        return corp
    got = [p for p in parts if p is not None]
    return replace(corp, codes=corp.order[np.concatenate(got)] if got else np.zeros(0, np.int32))


def _group_columns(present: Sequence[str]) -> list[str]:
    return ["duration", "num_tokens", *(c for c in GROUP_COLUMNS if c == "origin" or c in present)]


class TpsCutCounts:
    """What ``filter --max-tps X`` keeps (``tps <= X``; null / NaN TPS never kept), for X on a
    grid of :data:`TPS_STEP` tokens/s from below ``lo`` up to ``hi`` (the smallest and largest
    finite TPS; at most :data:`TPS_POSITIONS`), added block by block."""

    def __init__(self, lo: float, hi: float) -> None:
        step = max(TPS_STEP, math.ceil(hi / TPS_POSITIONS / TPS_STEP) * TPS_STEP)
        first = max(1, int(math.floor(lo / step)))  # below the smallest TPS nothing is kept
        self.xs = np.arange(first, int(math.ceil(hi / step)) + 2) * step
        self.n = np.zeros(self.xs.shape[0], np.int64)
        self.seconds = np.zeros(self.xs.shape[0], np.float64)

    def add(self, tps: npt.NDArray[np.float64], duration: npt.NDArray[np.float64]) -> None:
        ok = np.isfinite(tps)
        k = np.searchsorted(self.xs, tps[ok], side="left")  # xs[k-1] < tps <= xs[k]: kept from X = xs[k] on
        inside = k < self.xs.shape[0]
        k, d = k[inside], _zero_nan(duration[ok][inside])
        self.n += np.bincount(k, minlength=self.xs.shape[0])
        _add_seconds(self.seconds, k, d)

    def table(self, n_all: int, h_all: float) -> list[dict[str, float]]:
        """The rows, for a manifest of ``n_all`` rows and ``h_all`` hours."""
        kept, hours = np.cumsum(self.n), np.cumsum(self.seconds) / 3600.0
        return [{"max_tps": _r(x, 3), "kept": int(kk), "kept_hours": _r(h, 4), "share": _r(kk / n_all),
                 "hours_share": _r(h / h_all) if h_all else 0.0} for x, kk, h in zip(self.xs, kept, hours)]


def _hours(duration: npt.NDArray[np.float64]) -> float:
    """Hours of durations (s), NaN left out: the correctly rounded sum, as the stats total it."""
    sums = ExactSums()
    sums.add(duration[~np.isnan(duration)])
    return sums.total() / 3600.0


def tps_cut_table(tps: npt.NDArray[np.float64], duration: npt.NDArray[np.float64]) -> list[dict[str, float]]:
    """:class:`TpsCutCounts` of whole arrays (TPS in tokens/s, durations in s)."""
    t = tps[np.isfinite(tps)]
    if t.size == 0:
        return []
    cut = TpsCutCounts(float(t.min()), float(t.max()))
    cut.add(tps, duration)
    return cut.table(tps.shape[0], _hours(duration))


class GridCounts:
    """Rows per cell of a ``bins`` x ``bins`` duration x tokens grid over ``[0, d_top]`` s x
    ``[0, t_top]`` tokens (rows beyond land in the last cells), added block by block."""

    def __init__(self, d_top: float, t_top: float, bins: int = GRID_BINS) -> None:
        self.d_top, self.t_top, self.bins = max(d_top, 1e-9), max(t_top, 1.0), bins
        self.n = np.zeros(bins * bins, np.int64)

    def add(self, duration: npt.NDArray[np.float64], tokens: npt.NDArray[np.float64]) -> None:
        ok = np.isfinite(duration) & np.isfinite(tokens)
        d, t, bins = duration[ok], tokens[ok], self.bins
        i = np.minimum((np.maximum(d, 0) / (self.d_top / bins)).astype(np.int64), bins - 1)
        j = np.minimum((np.maximum(t, 0) / (self.t_top / bins)).astype(np.int64), bins - 1)
        self.n += np.bincount(i * bins + j, minlength=bins * bins)

    def table(self, spec: BucketSpec | None) -> dict[str, Any]:
        """Non-empty cells, the extent, and the bucket boxes to draw over it (clipped to it)."""
        if not self.n.any():
            return {"cells": [], "boxes": [], "max_duration": 0.0, "max_tokens": 0.0}
        d_top, t_top, bins, n = self.d_top, self.t_top, self.bins, self.n
        dw, tw = d_top / bins, t_top / bins
        cells = [{"d0": _r(c // bins * dw, 4), "d1": _r((c // bins + 1) * dw, 4), "t0": _r(c % bins * tw, 3),
                  "t1": _r((c % bins + 1) * tw, 3), "n": int(n[c])} for c in np.flatnonzero(n)]
        boxes = []
        if spec is not None:
            grid = grid_from_spec(spec)
            prev_t = 0.0
            for k, b in enumerate(spec.buckets):
                lo_d = grid.min_duration[k]
                lo_d = 0.0 if not np.isfinite(lo_d) else float(lo_d)
                if grid.token_bin[k] == 0:
                    prev_t = 0.0
                hi_t = t_top if b.max_tokens is None else float(b.max_tokens)
                if lo_d < d_top:
                    boxes.append({"bucket": k, "d0": _r(lo_d, 4), "d1": _r(min(b.max_duration, d_top), 4),
                                  "t0": _r(min(prev_t, t_top), 3), "t1": _r(min(hi_t, t_top), 3)})
                prev_t = hi_t
        return {"cells": cells, "boxes": boxes, "max_duration": _r(d_top, 4), "max_tokens": _r(t_top, 3)}


def grid_histogram(duration: npt.NDArray[np.float64], tokens: npt.NDArray[np.float64], d_top: float, t_top: float,
                   spec: BucketSpec | None, bins: int = GRID_BINS) -> dict[str, Any]:
    """:class:`GridCounts` of whole arrays, with ``spec``'s bucket boxes."""
    grid = GridCounts(d_top, t_top, bins)
    grid.add(duration, tokens)
    return grid.table(spec)


class _Extents:
    """Pass 0 of the stats (a block consumer): the smallest and largest finite TPS and the
    tokens (non-null) in all, which the binning pass needs."""

    pending = False

    def __init__(self) -> None:
        self.tps_lo, self.tps_hi, self.tokens = math.inf, -math.inf, 0

    def add(self, b: Block, pass_no: int) -> None:
        if pass_no:
            return
        t = b.tps[np.isfinite(b.tps)]
        if t.size:
            self.tps_lo, self.tps_hi = min(self.tps_lo, float(t.min())), max(self.tps_hi, float(t.max()))
        self.tokens += int(b.num_tokens[~np.isnan(b.num_tokens)].astype(np.int64).sum())

    def end_pass(self, pass_no: int) -> None:
        pass


SECTION1_COLUMNS = ["duration", "num_tokens", "tps"]


def row_block(b: Block, start: int, corpus: npt.NDArray[np.int32] | None = None) -> RowBlock:
    """What sections 2-3 read of a block: durations (NaN where unknown), tokens (0 where
    unknown), corpus codes."""
    return RowBlock(start, b.duration, _zero_nan(b.num_tokens).astype(np.int64), corpus)


def row_blocks(manifest: str | os.PathLike[str], block_rows: int = REPORT_BLOCK_ROWS) -> Iterator[RowBlock]:
    """The manifest's :class:`RowBlock` s without corpora (a pass over three numeric columns)."""
    start = 0
    for table in iter_manifest(manifest, SECTION1_COLUMNS, block_rows):
        yield row_block(Block(table), start)
        start += table.num_rows


def corpus_aggregates(manifest: str | os.PathLike[str], spec: BucketSpec | None = None, *,
                      consumers: Sequence[Callable[[RowBlock], None]] = (), codes: bool = False,
                      block_rows: int = REPORT_BLOCK_ROWS, budget: int = SELECT_BUDGET,
                      ) -> tuple[CorpusAggregates, Corpora]:
    """Section 1 of the report, and the corpora the other sections reuse of it. ``spec``
    draws the bucket grid over the 2D histogram; each of ``consumers`` is called with every
    :class:`RowBlock` of the binning pass, in order (with ``codes``, the blocks carry their
    rows' corpora: :attr:`Corpora.order` maps them to the names).

    Streamed in blocks of ``block_rows`` rows: the stats' passes (:func:`stream_stats`, each
    selection collecting at most ``budget`` values a pass), then one pass binning the
    histograms (their top is a quantile), the TPS cut and the 2D grid, grouping the rows by
    corpus, language and task, and feeding the consumers.
    Memory: a block, the bins and groups, the selected values, and what the consumers keep."""
    check_int("budget", budget, ge=1, le=None)
    if manifest_num_rows(manifest) == 0:
        raise ManifestError(f"{manifest}: the manifest has no rows")

    def blocks(columns: Sequence[str] = SECTION1_COLUMNS) -> Iterator[pa.Table]:
        return iter_manifest(manifest, list(columns), block_rows)

    ext = _Extents()
    stats = stream_stats(blocks, quantiles=(*QUANTILES[:-1], HIST_TOP, QUANTILES[-1]), consumers=[ext],
                         budget=budget)
    top = {c: stats.quantiles[c][f"p{HIST_TOP:g}"] for c in SECTION1_COLUMNS}
    hists = [HistogramCounts(top["duration"]), HistogramCounts(top["num_tokens"], integer=True),
             HistogramCounts(top["tps"])]
    cut = TpsCutCounts(ext.tps_lo, ext.tps_hi) if ext.tps_hi >= ext.tps_lo else None
    grid = GridCounts(top["duration"] or 0.0, top["num_tokens"] or 0.0)
    n = stats.utterances
    at = 0
    groups = CorpusGroups(codes)
    present = pq.read_schema(manifest).names
    for table in blocks([*SECTION1_COLUMNS, *(c for c in _group_columns(present) if c not in SECTION1_COLUMNS)]):
        corpus = groups.add(table)
        b = Block(table)
        hours_of = _zero_nan(b.duration)
        for h, c in zip(hists, SECTION1_COLUMNS):
            h.add(b.column(c), hours_of)
        if cut is not None:
            cut.add(b.tps, b.duration)
        grid.add(b.duration, b.num_tokens)
        if consumers:
            rb = row_block(b, at, corpus)
            for consume in consumers:
                consume(rb)
        at += b.height
    if at != n:
        raise ManifestError(f"{manifest}: the rows changed while the report read them")
    corp = groups.result()
    agg = CorpusAggregates(
        manifest=Path(manifest).name, content_hash=manifest_hash(manifest),
        totals={"utterances": n, "hours": _r(stats.hours, 4), "tokens": ext.tokens},
        groups=corp.groups, histograms=[h.histogram(c) for h, c in zip(hists, SECTION1_COLUMNS)],
        tps_cut=cut.table(n, stats.hours) if cut is not None else [], grid2d=grid.table(spec), stats=stats,
        corpus_column="corpus" in present)
    return agg, corp


@dataclass(frozen=True)
class RejectsAggregates:
    """Rejected rows per reason (count, hours) with a few examples each, for one rejects file."""

    file: str
    rows: int
    reasons: list[dict[str, Any]]


def rejects_aggregates(path: str | os.PathLike[str]) -> RejectsAggregates:
    """Per reason: rows, hours (rows without a duration count 0) and the first
    :data:`REJECT_EXAMPLES` examples (id, origin, detail), most frequent reason first."""
    meta = read_metadata(path)
    if meta["kind"] != "rejects":
        raise ManifestError(f"{path}: --rejects: not a rejects file (kind {meta['kind'] or 'unknown'!r}); give the "
                            "file written by --rejects of compile or filter")
    cut = EXAMPLE_CHARS
    g = (pl.scan_parquet(path)
         .group_by(pl.col("reason").fill_null("(none)"))
         .agg(pl.len().alias("rows"), (pl.col("duration").fill_nan(None).sum() / 3600).alias("hours"),
              *[pl.col(c).cast(pl.String).fill_null("").str.slice(0, cut).head(REJECT_EXAMPLES).alias(c)
                for c in ("id", "origin", "detail")])
         .sort(["rows", "reason"], descending=[True, False])
         .collect(engine="streaming"))
    reasons = [{"reason": r["reason"], "rows": int(r["rows"]), "hours": _r(r["hours"] or 0.0, 4),
                "examples": [{"id": i, "origin": o, "detail": x} for i, o, x in zip(r["id"], r["origin"], r["detail"])]}
               for r in g.to_dicts()]
    return RejectsAggregates(Path(path).name, sum(r["rows"] for r in reasons), reasons)


@dataclass(frozen=True)
class ReportData:
    """Everything the page shows; each part ``None`` when its input was not given."""

    corpus: CorpusAggregates
    rejects: list[RejectsAggregates]
    buckets: BucketAggregates | None
    plan: PlanAggregates | None
    #: a run's measured step times against the plan's prediction (``--steps``)
    step_times: StepTimeAggregates | None = None
    #: a ``--weight-window`` plan's corpus shares per window
    windows: WindowShares | None = None


def collect_report(
    manifest: str | os.PathLike[str],
    *,
    rejects: Sequence[str | os.PathLike[str]] = (),
    buckets: str | os.PathLike[str] | None = None,
    plan: str | os.PathLike[str] | None = None,
    world_sizes: Sequence[int] = DEFAULT_WORLD_SIZES,
    memory_limit: int | None = None,
    block_rows: int = REPORT_BLOCK_ROWS,
    steps: str | os.PathLike[str] | None = None,
    cost_model: str | os.PathLike[str] | None = None,
) -> ReportData:
    """The aggregates of a manifest and, when given, its rejects, buckets and plan.

    A plan must be of this manifest (content hash) and, when ``buckets`` is given too, of
    that buckets file (SHA-256); without ``buckets`` the plan's own buckets are shown.
    Memory: blocks of ``block_rows`` rows and what each section keeps (bounded by its bins,
    buckets, sample and steps), the padding report's (bounded by ``memory_limit``: held or
    spilled as ``dataprep padding``'s), and with a plan ranges of rows (:func:`share_range_rows` of
    ``memory_limit`` bytes, default half the machine's) for the corpus shares, held in memory
    when every row's share fits the limit (:data:`SPILL_BYTES_PER_ROW` +
    :data:`SHARE_BYTES_PER_ROW` a row), else read back from spill files next to the manifest
    (:data:`SPILL_BYTES_PER_ROW` a row of disk, removed at the end). ``steps`` (a step log of a
    run of the plan) and ``cost_model``: :func:`step_time_aggregates`; a plan with weight windows
    gets its :class:`WindowShares`."""
    if (steps is not None or cost_model is not None) and plan is None:
        raise DataprepError("--steps / --cost-model: need --plan (the plan the run trained on)")
    if cost_model is not None and steps is None:
        raise DataprepError("--cost-model: needs --steps (the measured step times it is set against)")
    if any(w < 1 for w in world_sizes):
        raise DataprepError(f"world sizes must be >= 1, got {list(world_sizes)}")
    check_int("memory_limit", memory_limit, ge=1, le=2**62, optional=True)
    check_int("block_rows", block_rows, ge=1, le=2**40)
    limit = memory_limit if memory_limit is not None else default_memory_limit()
    meta = read_plan_meta(plan) if plan is not None else None
    spec, spec_name = None, None
    if buckets is not None:
        spec, spec_name = read_buckets(buckets), Path(buckets).name
        if meta is not None and file_sha256(buckets) != meta.buckets_file.sha256:
            raise ManifestError(f"{buckets}: --buckets: is not the buckets file the plan was made with "
                                f"({meta.buckets_file.file}, sha256 {meta.buckets_file.sha256[:12]}...)")
    elif meta is not None:
        spec = parse_buckets({"buckets": meta.buckets}, f"{plan}/plan.json")
        spec_name = f"{meta.buckets_file.file} (from the plan)"
    if meta is not None:
        require_manifest_hash(manifest, meta.manifest.content_hash, f"the plan's manifest ({meta.manifest.file})")
    rejected = [rejects_aggregates(p) for p in rejects]
    n = manifest_num_rows(manifest)
    brows = bucket_rows(n, spec) if spec is not None else None
    consumers: list[Callable[[RowBlock], None]] = [brows.add] if brows is not None else []
    root = None
    files: SpillFiles | None = None
    windows: WindowShares | None = None
    try:
        if meta is not None and plan is not None:
            if n * (SPILL_BYTES_PER_ROW + SHARE_BYTES_PER_ROW) <= limit:  # held: nothing spilled
                files = HeldColumns()
            else:
                root = spill_dir(manifest)
                check_free_disk(root, n * SPILL_BYTES_PER_ROW, "the report's spill files (rows' corpora and "
                                "durations, planned rows)")
                files = SpillFiles(root)
            held = files
            consumers.append(lambda b: spill_rows(held, b))
        corpus, corp = corpus_aggregates(manifest, spec, consumers=consumers, codes=files is not None,
                                         block_rows=block_rows)
        section2 = (bucket_section(brows, spec, manifest, lambda: row_blocks(manifest, block_rows),
                                   name=spec_name or "", memory_limit=limit)
                    if brows is not None and spec is not None else None)
        section3 = None
        if files is not None and meta is not None and plan is not None:
            files.close()
            section3 = plan_aggregates(plan, meta, corp, files, n, limit, world_sizes, manifest=manifest)
            windows = window_aggregates(plan, meta, corp.order, corp.names, files, n, share_range_rows(limit),
                                        section3.targets)
        times = step_time_aggregates(plan, steps, cost_model) if steps is not None and plan is not None else None
    finally:
        if root is not None:
            remove_spill(root)
    return ReportData(corpus=corpus, rejects=rejected, buckets=section2, plan=section3, step_times=times,
                      windows=windows)

