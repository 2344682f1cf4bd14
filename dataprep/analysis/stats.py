"""Manifest statistics: totals, per language, quantiles, TPS by duration bin, threshold counts.

Pure: blocks (polars or Arrow) with ``duration`` (s), ``num_tokens`` (incl. prompt), ``tps``
(tokens / s), optionally ``lang`` / ``corpus`` / ``modality``, a :class:`ManifestStats` out.
:func:`stream_stats` takes the blocks again for each pass (usually two), holding one block,
the groups' aggregates and a bounded number of selected values; :func:`compute_stats`: one block.

Quantiles interpolate linearly between order statistics selected exactly
(:mod:`dataprep.analysis.exact`): each equals ``numpy.percentile`` / polars over the whole
column; hours are correctly rounded sums. Nulls and NaNs are ignored by the quantiles (a null
TPS still counts in its group's size, as polars counts it); none selected gives ``None``.
Text-only rows (``modality`` text: duration 0, no TPS) count everywhere but in the duration
figures (quantiles, bins, thresholds); with an ``audio_token_rate``, token-equivalents
(:mod:`bucketing.token_equivalents`) get totals and quantiles too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from dataprep.analysis.exact import (SELECT_BUDGET, ExactSums, OrderSelector, float_keys, numpy_percentiles, numpy_ranks,
                                   polars_quantile, polars_ranks)
from bucketing.token_equivalents import token_equivalents
from manifests.arrow_views import null_mask, numeric_values

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
    #: modality -> {"utterances", "hours", "tokens"}; empty unless the manifest has a ``modality`` column
    modalities: dict[str, dict[str, float]] = field(default_factory=dict)
    #: with an audio token rate: {"audio_token_rate", "total", "audio", "text", "quantiles": {"p0": ...}}
    token_equivalents: dict[str, Any] = field(default_factory=dict)

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
            **({"modalities": {m: {k: (r(v) if k == "hours" else v) for k, v in f.items()}
                               for m, f in self.modalities.items()}} if self.modalities else {}),
            **({"token_equivalents": {k: ({q: r(x) for q, x in v.items()} if k == "quantiles" else v)
                                      for k, v in self.token_equivalents.items()}} if self.token_equivalents else {}),
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
    d = np.asarray(duration, dtype=np.float64)
    idx = np.zeros(d.shape, np.int64)
    for edge in edges[1:-1]:  # a few edges: comparisons beat a binary search per value
        idx += d >= edge
    return idx


class BlockConsumer(Protocol):
    """Something else computed in the same passes over the blocks (the plots' aggregates)."""

    def add(self, block: Block, pass_no: int) -> None: ...

    def end_pass(self, pass_no: int) -> None: ...

    @property
    def pending(self) -> bool: ...


class Block:
    """One block of a manifest's rows as NumPy columns: ``duration`` (s), ``num_tokens`` and
    ``tps`` (tokens/s) as float64 with NaN where null or NaN, plus the ``lang`` / ``corpus``
    columns (Arrow, dictionary-encoded or plain strings); the order-preserving keys of each
    numeric column are computed once."""

    def __init__(self, table: pa.Table | pl.DataFrame) -> None:
        if isinstance(table, pl.DataFrame):
            table = table.to_arrow()
        names = table.column_names
        missing = [c for c in _QUANTILE_COLUMNS if c not in names]
        if missing:
            raise ValueError(f"manifest frame lacks column(s) {', '.join(missing)}")
        self.height = table.num_rows
        self.duration, self.duration_null = _floats(table.column("duration"))
        mod = table.column("modality") if "modality" in names else None
        #: text-only rows: their duration (0) is no audio's, so NaN in ``duration`` (the raw in ``seconds``)
        self.text = np.zeros(self.height, bool) if mod is None else \
            pc.fill_null(pc.equal(mod, "text"), False).to_numpy(zero_copy_only=False)
        self.has_modality = mod is not None
        self.seconds = self.duration
        if self.text.any():
            self.duration = np.where(self.text, math.nan, self.duration)
        self.num_tokens, _ = _floats(table.column("num_tokens"))
        self.tps, _ = _floats(table.column("tps"))
        self.lang = table.column("lang") if "lang" in names else None
        self.corpus = table.column("corpus") if "corpus" in names else None
        self._keys: dict[str, npt.NDArray[np.uint64]] = {}
        self._bins: dict[tuple[float, ...], npt.NDArray[np.int64]] = {}

    def column(self, name: str) -> npt.NDArray[np.float64]:
        return {"duration": self.duration, "num_tokens": self.num_tokens, "tps": self.tps}[name]

    def duration_bins(self, edges: Sequence[float]) -> npt.NDArray[np.int64]:
        """:func:`duration_bin_index` of every row (-1 where the duration is null or NaN),
        computed once per block for the stats and the plots."""
        key = tuple(edges)
        if key not in self._bins:
            ok = ~np.isnan(self.duration)
            bins = np.full(self.height, -1, np.int64)
            bins[ok] = duration_bin_index(self.duration[ok], key)
            self._bins[key] = bins
        return self._bins[key]

    def keys(self, name: str) -> npt.NDArray[np.uint64]:
        """:func:`~dataprep.analysis.exact.float_keys` of every row of a numeric column (NaN rows: garbage)."""
        if name not in self._keys:
            x = self.column(name)
            self._keys[name] = float_keys(np.where(np.isnan(x), 0.0, x))
        return self._keys[name]


def _floats(col: pa.ChunkedArray) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    """(values as float64 with NaN for null, where null)."""
    null = null_mask(col)
    return numeric_values(col, np.float64, math.nan), np.zeros(len(col), bool) if null is None else null


class _Codes:
    """Codes of string groups (null -> "(none)") in order of first appearance over the blocks."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._index: dict[str, int] = {}

    def _add(self, name: str) -> int:
        self._index[name] = len(self.names)
        self.names.append(name)
        return self._index[name]

    def of(self, col: pa.ChunkedArray | None, height: int) -> npt.NDArray[np.int64]:
        """Each row's code (a dictionary-encoded column costs its dictionary, not its rows)."""
        if col is None:  # no such column: every row is "(none)"
            if not height:
                return np.empty(0, np.int64)
            return np.full(height, self._index[_NO_LANG] if _NO_LANG in self._index else self._add(_NO_LANG), np.int64)
        parts = []
        for chunk in col.chunks:
            if not pa.types.is_dictionary(chunk.type):
                chunk = pc.dictionary_encode(chunk)
            values = [*chunk.dictionary.to_pylist(), None]
            idx = numeric_values(chunk.indices, np.int64, len(values) - 1)
            lut = np.full(len(values), -1, np.int64)
            new = []
            for k in np.flatnonzero(np.bincount(idx, minlength=len(values))):
                name = _NO_LANG if values[k] is None else str(values[k])
                if name in self._index:
                    lut[k] = self._index[name]
                else:
                    new.append(k)
            if len(new) > 1:  # first appearance decides their order
                uniq, first = np.unique(idx, return_index=True)
                at = dict(zip(uniq.tolist(), first.tolist()))
                new.sort(key=lambda k: at[int(k)])
            for k in new:
                name = _NO_LANG if values[k] is None else str(values[k])
                lut[k] = self._index[name] if name in self._index else self._add(name)
            parts.append(lut[idx])
        return np.concatenate(parts) if parts else np.empty(0, np.int64)


_CMP = {">": np.greater, ">=": np.greater_equal, "<": np.less, "<=": np.less_equal}


class StatsAccumulator:
    """The figures of :class:`ManifestStats`, over passes of the same blocks (see
    :func:`stream_stats`): pass 0 counts, sums (exact) and histograms; later passes select
    the quantiles' order statistics exactly. Memory: bounded by the groups (languages,
    corpora, bins) and ``budget`` collected values, never by the rows."""

    def __init__(self, edges: Sequence[float] = DURATION_BIN_EDGES,
                 thresholds: Sequence[tuple[str, str, float]] = DEFAULT_THRESHOLDS,
                 quantiles: Sequence[float] = QUANTILES, budget: int = SELECT_BUDGET,
                 audio_token_rate: float | None = None) -> None:
        for _, op, _ in thresholds:
            if op not in _CMP:
                raise ValueError(f"threshold operator {op!r} is not one of {', '.join(_CMP)}")
        self.edges, self.thresholds, self.quantiles = tuple(edges), tuple(thresholds), tuple(quantiles)
        self.nbins = len(self.edges) - 1
        self.rows = 0
        self.langs, self.corpora = _Codes(), _Codes()
        self.lang_rows = np.zeros(0, np.int64)
        self.lang_tps_nulls = np.zeros(0, np.int64)
        self.bin_rows = np.zeros(self.nbins, np.int64)
        self.bin_tps_nulls = np.zeros(self.nbins, np.int64)
        #: clean durations per (lang, bin): totals, per language and per bin are sums of these
        self.seconds = ExactSums()
        self.corpus_rows = np.zeros(0, np.int64)
        self.corpus_tokens = np.zeros(0, np.int64)
        self.corpus_seconds = ExactSums()  # raw durations: a NaN makes the corpus's hours NaN
        self.has_corpus = False
        self.over = np.zeros(len(self.thresholds), np.int64)
        self.columns = {c: OrderSelector(budget) for c in _QUANTILE_COLUMNS}
        self.lang_tps = OrderSelector(budget)
        self.bin_tps = OrderSelector(budget)
        self.has_modality = False
        self.modality_rows = np.zeros(2, np.int64)  # audio, text
        self.modality_tokens = np.zeros(2, np.int64)
        self.modality_seconds = ExactSums()
        self.rate = audio_token_rate
        self.te = OrderSelector(budget)
        self.te_sums = np.zeros(2, np.int64)  # audio rows', text rows'
        self._selectors = [*self.columns.values(), self.lang_tps, self.bin_tps, self.te]

    @property
    def pending(self) -> bool:
        return any(s.pending for s in self._selectors)

    def add(self, b: Block, pass_no: int) -> None:
        """One block of pass ``pass_no`` (0: the counting pass)."""
        lang = self.langs.of(b.lang, b.height)
        d, tps = b.duration, b.tps
        d_ok, tps_ok = ~np.isnan(d), ~np.isnan(tps)
        bins = b.duration_bins(self.edges)
        for c, sel in self.columns.items():
            ok = ~np.isnan(b.column(c))
            sel.add_keys(b.keys(c)[ok])
        self.lang_tps.add_keys(b.keys("tps")[tps_ok], lang[tps_ok])
        both = d_ok & tps_ok
        self.bin_tps.add_keys(b.keys("tps")[both], bins[both])
        tok = ~np.isnan(b.num_tokens)
        te = None
        if self.rate is not None:
            te_ok = tok & ~np.isnan(b.seconds)
            te = token_equivalents(np.where(te_ok, b.seconds, 0.0), np.where(te_ok, b.num_tokens, 0), self.rate)
            self.te.add_keys(float_keys(te[te_ok].astype(np.float64)))
        if pass_no:
            return
        text = b.text.astype(np.int64)
        self.has_modality = self.has_modality or b.has_modality
        self.modality_rows += np.bincount(text, minlength=2)
        self.modality_tokens = _add_counts(self.modality_tokens, text[tok], 2, weights=b.num_tokens[tok].astype(np.int64))
        self.modality_seconds.add(b.seconds[~b.duration_null], text[~b.duration_null])
        if te is not None:
            self.te_sums = _add_counts(self.te_sums, text[te_ok], 2, weights=te[te_ok])
        self.rows += b.height
        ng = len(self.langs.names)
        self.lang_rows = _add_counts(self.lang_rows, lang, ng)
        self.lang_tps_nulls = _add_counts(self.lang_tps_nulls, lang[~tps_ok], ng)
        self.bin_rows += np.bincount(bins[d_ok], minlength=self.nbins)
        self.bin_tps_nulls += np.bincount(bins[d_ok & ~tps_ok], minlength=self.nbins)
        self.seconds.add(d[d_ok], lang[d_ok] * self.nbins + bins[d_ok])
        for i, (col, op, value) in enumerate(self.thresholds):
            with np.errstate(invalid="ignore"):
                self.over[i] += int(np.count_nonzero(_CMP[op](b.column(col), value)))
        if b.corpus is not None:
            self.has_corpus = True
            corpus = self.corpora.of(b.corpus, b.height)
            nc = len(self.corpora.names)
            self.corpus_rows = _add_counts(self.corpus_rows, corpus, nc)
            raw = ~b.duration_null
            self.corpus_seconds.add(b.seconds[raw], corpus[raw])
            self.corpus_tokens = _add_counts(self.corpus_tokens, corpus[tok], nc,
                                             weights=b.num_tokens[tok].astype(np.int64))

    def end_pass(self, pass_no: int) -> None:
        for s in self._selectors:
            s.end_pass()
        if pass_no:
            return
        for c, sel in self.columns.items():
            n = int(sel.counts()[0])
            if n:
                sel.request({0: [r for lo, hi, _ in numpy_ranks(n, self.quantiles) for r in (lo, hi)]})
            else:
                sel.request({})
        counts = self.lang_tps.counts()
        self.lang_tps.request({g: _polars_wanted(int(counts[g]), int(self.lang_tps_nulls[g]), (0.5,))
                               for g in range(min(counts.shape[0], len(self.langs.names)))})
        counts = self.bin_tps.counts()
        self.bin_tps.request({g: _polars_wanted(int(counts[g]), int(self.bin_tps_nulls[g]), _BIN_QUANTILES)
                              for g in range(min(counts.shape[0], self.nbins))})
        n = int(self.te.counts()[0]) if self.te.counts().shape[0] else 0
        self.te.request({0: [r for lo, hi, _ in numpy_ranks(n, self.quantiles) for r in (lo, hi)]} if n else {})

    def result(self) -> ManifestStats:
        """The figures, once no pass is pending."""
        nb, n = self.nbins, self.rows
        quant: dict[str, dict[str, float | None]] = {}
        for c, sel in self.columns.items():
            m = int(sel.counts()[0]) if sel.counts().shape[0] else 0
            if m:
                qv: list[float | None] = list(numpy_percentiles(
                    (sel.value(0, lo), sel.value(0, hi), w) for lo, hi, w in numpy_ranks(m, self.quantiles)))
            else:
                qv = [None] * len(self.quantiles)
            quant[c] = {f"p{q}": v for q, v in zip(self.quantiles, qv)}
        langs = []
        for g in sorted(range(len(self.langs.names)), key=lambda g: self.langs.names[g]):
            med = _polars_value(self.lang_tps, g, 0.5, self.lang_tps_nulls[g])
            langs.append(LanguageStats(self.langs.names[g], int(self.lang_rows[g]),
                                       self.seconds.total(range(g * nb, (g + 1) * nb)) / 3600.0, med))
        ng = len(self.langs.names)
        bins = []
        for i, label in enumerate(bin_labels(self.edges)):
            p10, p50, p90 = (_polars_value(self.bin_tps, i, q, self.bin_tps_nulls[i]) for q in _BIN_QUANTILES)
            bins.append(DurationBinStats(label=label, lo=float(self.edges[i]), hi=float(self.edges[i + 1]),
                                         count=int(self.bin_rows[i]),
                                         hours=self.seconds.total(range(i, ng * nb, nb)) / 3600.0,
                                         tps_p10=p10, tps_median=p50, tps_p90=p90))
        corpora = tuple(CorpusStats(name, int(self.corpus_rows[c]), self.corpus_seconds.total(c) / 3600.0,
                                    int(self.corpus_tokens[c])) for c, name in enumerate(self.corpora.names))
        modalities = {name: {"utterances": int(self.modality_rows[k]), "hours": self.modality_seconds.total(k) / 3600.0,
                             "tokens": int(self.modality_tokens[k])}
                      for k, name in enumerate(("audio", "text"))} if self.has_modality else {}
        te: dict[str, Any] = {}
        if self.rate is not None:
            m = int(self.te.counts()[0]) if self.te.counts().shape[0] else 0
            tq = list(numpy_percentiles((self.te.value(0, lo), self.te.value(0, hi), w)
                                        for lo, hi, w in numpy_ranks(m, self.quantiles))) if m else [None] * len(self.quantiles)
            te = {"audio_token_rate": self.rate, "total": int(self.te_sums.sum()), "audio": int(self.te_sums[0]),
                  "text": int(self.te_sums[1]), "quantiles": {f"p{q}": v for q, v in zip(self.quantiles, tq)}}
        return ManifestStats(
            utterances=n, hours=self.seconds.total(range(ng * nb)) / 3600.0, languages=tuple(langs),
            quantiles=quant, tps_by_duration=tuple(bins),
            thresholds=tuple(ThresholdCount(column=col, op=op, value=float(value), count=int(self.over[i]),
                                            fraction=(int(self.over[i]) / n if n else 0.0))
                             for i, (col, op, value) in enumerate(self.thresholds)),
            corpora=corpora if self.has_corpus else (), modalities=modalities, token_equivalents=te,
        )


#: the TPS quantiles of each duration bin (p10, median, p90)
_BIN_QUANTILES = (0.10, 0.5, 0.90)


def _add_counts(acc: npt.NDArray[np.int64], codes: npt.NDArray[np.int64], groups: int,
                weights: npt.NDArray[np.int64] | None = None) -> npt.NDArray[np.int64]:
    """``acc`` (grown to ``groups``) plus the rows (or integer ``weights``) per code, exactly."""
    if acc.shape[0] < groups:
        acc = np.concatenate([acc, np.zeros(groups - acc.shape[0], np.int64)])
    if codes.size:
        if weights is None:
            acc += np.bincount(codes, minlength=groups)
        else:  # int64 adds: exact whatever the totals (a float bincount would round beyond 2**53)
            np.add.at(acc, codes, weights)
    return acc


def _polars_wanted(nonnull: int, nulls: int, qs: Sequence[float]) -> list[int]:
    if not nonnull:
        return []
    return [r for q in qs for r in polars_ranks(nonnull, nulls, q)[:2]]


def _polars_value(sel: OrderSelector, group: int, q: float, nulls: int) -> float | None:
    counts = sel.counts()
    nonnull = int(counts[group]) if group < counts.shape[0] else 0
    if not nonnull:
        return None
    ranks = polars_ranks(nonnull, int(nulls), q)
    return polars_quantile(sel.value(group, ranks[0]), sel.value(group, ranks[1]), ranks)


def stream_stats(
    blocks: Callable[[], Iterable[pa.Table | pl.DataFrame]],
    edges: Sequence[float] = DURATION_BIN_EDGES,
    thresholds: Sequence[tuple[str, str, float]] = DEFAULT_THRESHOLDS,
    quantiles: Sequence[float] = QUANTILES,
    *,
    budget: int = SELECT_BUDGET,
    consumers: Sequence[BlockConsumer] = (),
    audio_token_rate: float | None = None,
) -> ManifestStats:
    """:func:`compute_stats` of the rows ``blocks()`` yields (Arrow tables or polars frames), in memory bounded by one block,
    the groups and ``budget`` values, whatever the row count.

    ``blocks`` is called once per pass (usually two) and must yield the same rows each time,
    in any split. ``consumers`` see every block of every pass too (the plots' aggregates).
    """
    acc = StatsAccumulator(edges, thresholds, quantiles, budget, audio_token_rate)
    pass_no = 0
    while True:
        for df in blocks():
            b = Block(df)
            acc.add(b, pass_no)
            for c in consumers:
                c.add(b, pass_no)
        acc.end_pass(pass_no)
        for c in consumers:
            c.end_pass(pass_no)
        pass_no += 1
        if not (acc.pending or any(c.pending for c in consumers)):
            return acc.result()


def compute_stats(
    df: pl.DataFrame,
    edges: Sequence[float] = DURATION_BIN_EDGES,
    thresholds: Sequence[tuple[str, str, float]] = DEFAULT_THRESHOLDS,
    quantiles: Sequence[float] = QUANTILES,
) -> ManifestStats:
    """Statistics of a compiled manifest frame (one block of :func:`stream_stats`).

    Parameters
    ----------
    df : frame with ``duration`` (s), ``num_tokens``, ``tps`` (tokens/s) and optionally ``lang``
        and ``corpus``.
    edges : increasing duration bin edges in seconds; ``inf`` as the last edge for an open bin.
    thresholds : ``(column, op, value)`` with op one of ``>``, ``>=``, ``<``, ``<=``.
    quantiles : levels in percent (0..100).

    Invariants: ``sum(lang.utterances) == utterances`` and ``sum(bin.count)`` = the audio rows
    (every row when the frame has no ``modality``).
    """
    return stream_stats(lambda: [df], edges, thresholds, quantiles)
