"""The padding report: what each batching scheme wastes on one manifest, before training.

Padding ratio = 1 − Σ real / Σ (batch size × max in batch), for audio (seconds) and tokens; a
fixed-length scheme pads to its length. Schemes, same padded budget per batch:
``fixed-<L>s`` (batch = floor(budget / L), longer rows ``excluded``, rows in a streamed
*scatter shuffle*: :func:`scatter_part`, parts of :data:`SCATTER_ROWS`), ``1d-cumulative``
(Lhotse's ``max_duration``, each bucket shuffled on its own), ``1d-budget``, ``2d`` (the given
buckets) and ``2d-dynamic-resolution`` (frame padding left after :mod:`bucketing.dynres`, with
``frame_padding_base``, ``clamped_share``, ``fallback_share``, ``off_rate_share``).
Bucketed batches are formed by :func:`bucketing.batching.form_batches`, as the planner forms
them. Each scheme is measured one scatter part or one bucket at a time (a bucket in chunks of
whole batches, :data:`CHUNK_ROWS`) by :func:`schemes_report`, from columns in memory
(:func:`padding_report`: a sample, benchmarks) or from ``dataprep padding``'s spill
(:mod:`dataprep.analysis.stream_padding`), with the same figures.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from bucketing.packing import pack_sizes, token_equivalents
from bucketing.allocate import allocate, assign
from bucketing.batching import Batches, Cut, allocated_totals, cut_batches, form_batches_cumulative
from bucketing.bucket_order import DEFAULT_AUDIO_WEIGHT, DEFAULT_SORT_BY, DEFAULT_WINDOW, BucketGrouping, resolve_sort
from bucketing.budget import padded_budget_batch_sizes
from bucketing.dynres import (
    COMPARED_TARGETS,
    DynResConfig,
    ResolutionTotals,
    comparison_rows,
    policy_totals,
    resolution_totals,
    resolve,
)
from bucketing.fit import Grid
from bucketing.fit_passes import fit_buckets
from bucketing.held_columns import HeldColumns


@dataclass(frozen=True)
class Padding:
    """Padding figures of one set of batches (ratios in [0, 1])."""

    audio_padding: float
    token_padding: float
    num_batches: int
    mean_batch_size: float
    num_rows: int

    def to_json(self) -> dict[str, Any]:
        return {
            "audio_padding": round(self.audio_padding, 6),
            "token_padding": round(self.token_padding, 6),
            "num_batches": self.num_batches,
            "mean_batch_size": round(self.mean_batch_size, 4),
            "num_rows": self.num_rows,
        }


def _ratio(real: float, padded: float) -> float:
    return 0.0 if padded <= 0 else 1.0 - real / padded


def batch_maxima(batches: Batches, values: npt.ArrayLike) -> npt.NDArray[Any]:
    """Max of ``values`` over each batch's rows."""
    v = np.asarray(values)[batches.rows]
    if batches.num_batches == 0:
        return v[:0]
    return np.maximum.reduceat(v, batches.offsets[:-1])


def measure(
    batches: Batches,
    duration: npt.ArrayLike,
    num_tokens: npt.ArrayLike,
    fixed_audio: float | None = None,
) -> Padding:
    """Padding of ``batches`` (audio padded to the max in batch, or to ``fixed_audio`` s)."""
    d = np.asarray(duration, dtype=np.float64)
    t = np.asarray(num_tokens, dtype=np.float64)
    sizes = batches.sizes().astype(np.float64)
    dmax = np.full(batches.num_batches, fixed_audio) if fixed_audio else batch_maxima(batches, d)
    tmax = batch_maxima(batches, t)
    n = int(batches.rows.shape[0])
    return Padding(
        audio_padding=_ratio(float(d[batches.rows].sum()), float((sizes * dmax).sum())),
        token_padding=_ratio(float(t[batches.rows].sum()), float((sizes * tmax).sum())),
        num_batches=batches.num_batches,
        mean_batch_size=n / batches.num_batches if batches.num_batches else 0.0,
        num_rows=n,
    )


#: Group totals count seconds in whole microseconds: integer sums, exact whatever the order.
GROUP_TICKS_PER_SECOND = 1_000_000


def exact_bincount(group: npt.NDArray[np.integer], weights: npt.NDArray[Any],
                   num_groups: int) -> npt.NDArray[np.int64]:
    """``np.bincount`` of non-negative integer ``weights`` (an integer array, or float64 holding
    whole numbers below 2**53), exact: one float64 sum when no total can reach 2**53 (rows x
    largest weight), else split in 16-bit halves whose totals stay below it; so the result does
    not depend on the order or grouping of the rows summed (a streamed sum equals the in-memory
    one). ``group`` is best ``np.intp`` (bincount converts any other type on every call)."""
    if weights.shape[0] == 0 or float(weights.max()) * weights.shape[0] < 2**53:  # every partial sum exact
        return np.rint(np.bincount(group, weights=weights, minlength=num_groups)).astype(np.int64)
    if weights.dtype.kind == "f":
        lo = np.fmod(weights, 65536.0)
        hi = (weights - lo) / 65536.0
    else:
        lo, hi = weights & 0xFFFF, weights >> 16
    lo_sum = np.bincount(group, weights=lo, minlength=num_groups)
    hi_sum = np.bincount(group, weights=hi, minlength=num_groups)
    return (np.rint(hi_sum).astype(np.int64) << 16) + np.rint(lo_sum).astype(np.int64)


def group_padding(rows: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64], max_duration: npt.ArrayLike,
                  max_tokens: npt.ArrayLike, duration: npt.ArrayLike, num_tokens: npt.ArrayLike,
                  group_of_row: npt.NDArray[np.integer], num_groups: int) -> npt.NDArray[np.int64]:
    """Per group of rows (e.g. corpus) over batches given as ``rows`` (concatenated) and
    ``sizes`` with each batch's maxima: ``[utterances, real us, padded us, real tokens, padded
    tokens]`` (int64, shape ``(5, num_groups)``; seconds in :data:`GROUP_TICKS_PER_SECOND`
    ticks, each row's rounded); a row pads to its batch's longest. Exact integer sums: adding
    the totals of parts gives the whole's, bit for bit."""
    g = np.asarray(group_of_row)[rows].astype(np.intp, copy=False)
    ticks = GROUP_TICKS_PER_SECOND
    out = np.zeros((5, num_groups), dtype=np.int64)
    out[0] = np.bincount(g, minlength=num_groups)
    out[1] = exact_bincount(g, np.rint(np.asarray(duration, np.float64)[rows] * ticks), num_groups)
    out[2] = exact_bincount(g, np.repeat(np.rint(np.asarray(max_duration, np.float64) * ticks), sizes), num_groups)
    out[3] = exact_bincount(g, np.asarray(num_tokens)[rows], num_groups)
    out[4] = exact_bincount(g, np.repeat(np.asarray(max_tokens), sizes), num_groups)
    return out


def group_json(names: list[str], totals: npt.NDArray[np.int64], epochs: int = 1) -> list[dict[str, Any]]:
    """:func:`group_padding` totals as JSON rows: utterances and hours (per epoch), padding."""
    ticks = GROUP_TICKS_PER_SECOND
    return [{"corpus": n, "utterances": int(round(totals[0, i] / epochs)),
             "hours": round(int(totals[1, i]) / ticks / epochs / 3600, 6),
             "padding_audio": round(_ratio(int(totals[1, i]), int(totals[2, i])), 6),
             "padding_tokens": round(_ratio(int(totals[3, i]), int(totals[4, i])), 6)}
            for i, n in enumerate(names)]


#: Rows per part of the fixed schemes' scatter shuffle: ``ceil(rows / SCATTER_ROWS)`` parts.
SCATTER_ROWS = 1 << 20
#: Rows of a bucket ordered and measured at once (whole batches,
#: :meth:`bucketing.bucket_order.BucketGrouping.order_chunks`): bounds the grouping's and dynamic
#: resolution's transients; the figures do not depend on it beyond the float sums' order.
CHUNK_ROWS = 1 << 19
#: Utterances sampled for the rate-vs-duration plot.
RATE_SAMPLES = 2000


def scatter_count(num_rows: int) -> int:
    """Parts of the fixed schemes' scatter shuffle for a manifest of ``num_rows`` rows."""
    return max(1, -(-int(num_rows) // SCATTER_ROWS))


def scatter_part(rows: npt.ArrayLike, seed: int, salt: int, parts: int) -> npt.NDArray[np.int64]:
    """The part in ``[0, parts)`` each row number draws: a splitmix64 hash of the row and a key
    of ``(seed, salt)``, so a block of rows draws what the whole manifest would."""
    key = np.random.SeedSequence([seed, salt]).generate_state(1, np.uint64)[0]
    z = np.asarray(rows, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + key
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return (z % np.uint64(parts)).astype(np.int64)


def fixed_scheme(parts: Iterable[tuple[npt.NDArray[Any], npt.NDArray[Any]]], length: float, budget: float,
                 excluded: int, seed: int, salt: int, audio_token_rate: float | None = None) -> dict[str, Any]:
    """Scheme 1 (``fixed-<L>s``): the rows of at most ``length`` s, given as the parts of the
    scatter shuffle in order (each part's durations and tokens, ascending rows); each part is
    shuffled (``default_rng([seed, salt, part])``) and the parts laid end to end are cut into
    batches of ``floor(budget / length)``. Audio padding does not depend on the order (exact);
    token padding sums integers (exact). ``audio_token_rate``: also ``te_padding``, each row
    padded to ``length`` of audio and its batch's most tokens, in token-equivalents."""
    bs = max(1, int(np.floor(budget / length + 1e-9)))
    real_d, n, real_t, pad_t, batches, real_audio_te = 0.0, 0, 0, 0, 0, 0
    pending = np.empty(0, np.int64)
    for j, (d, t) in enumerate(parts):
        real_d += float(np.asarray(d, dtype=np.float64).sum())
        if audio_token_rate is not None:
            real_audio_te += int(token_equivalents(d, np.zeros(np.shape(d)[0], np.int64), audio_token_rate).sum())
        tt = np.asarray(t, dtype=np.int64)
        tt = tt[np.random.default_rng([seed, salt, j]).permutation(tt.shape[0])]
        n += tt.shape[0]
        real_t += int(tt.sum())
        tt = np.concatenate([pending, tt])
        full = tt.shape[0] // bs * bs
        if full:
            pad_t += bs * int(tt[:full].reshape(-1, bs).max(1).sum())
            batches += full // bs
        pending = tt[full:]
    if pending.shape[0]:
        pad_t += pending.shape[0] * int(pending.max())
        batches += 1
    p = Padding(audio_padding=_ratio(real_d, n * length), token_padding=_ratio(real_t, pad_t), num_batches=batches,
                mean_batch_size=n / batches if batches else 0.0, num_rows=n)
    te = {} if audio_token_rate is None else {"te_padding": round(_ratio(
        real_audio_te + real_t, n * int(token_equivalents([length], [0], audio_token_rate)[0]) + pad_t), 6)}
    return {**p.to_json(), "excluded": excluded, **te}


def memory_parts(d: npt.NDArray[np.float64], t: npt.NDArray[Any], length: float, seed: int, salt: int,
                 ) -> tuple[int, Iterator[tuple[npt.NDArray[Any], npt.NDArray[Any]]]]:
    """(rows over ``length``, the scatter parts of the others) of columns in memory (as
    :func:`fixed_scheme` reads them)."""
    rows = np.flatnonzero(d <= length)
    K = scatter_count(d.shape[0])
    part = scatter_part(rows, seed, salt, K)
    order = np.argsort(part, kind="stable")
    cut = np.searchsorted(part[order], np.arange(K + 1))

    def parts() -> Iterator[tuple[npt.NDArray[Any], npt.NDArray[Any]]]:
        for j in range(K):
            r = rows[order[cut[j]:cut[j + 1]]]
            yield d[r], t[r]

    return int(d.shape[0] - rows.shape[0]), parts()


@dataclass
class BucketedRows:
    """Rows allocated to buckets, read one bucket at a time: ``rows_of(k)`` gives bucket
    ``k``'s durations (s), tokens and corpus codes (None without corpora), ascending rows.
    ``total_d`` / ``total_t``: the allocated rows' sums (:func:`bucketing.batching.allocated_totals`);
    the allocation's figures as :class:`bucketing.allocate.Assignment`'s (drops counted)."""

    counts: npt.NDArray[np.int64]
    rows_of: Callable[[int], tuple[npt.NDArray[np.float64], npt.NDArray[Any], npt.NDArray[Any] | None]]
    total_d: float
    total_t: float
    dropped: dict[str, int] = field(default_factory=dict)
    moved: int = 0
    carried: int = 0
    max_tokens: npt.NDArray[np.int64] | None = None


def memory_buckets(bucket: npt.NDArray[np.integer], d: npt.NDArray[np.float64], t: npt.NDArray[Any],
                   codes: npt.NDArray[Any] | None, num_buckets: int) -> BucketedRows:
    """:class:`BucketedRows` of columns in memory (``bucket`` per row, -1 = left out)."""
    b = np.asarray(bucket)
    order = np.argsort(b.astype(np.int16) if num_buckets < 2**15 - 1 else b, kind="stable")
    start = np.searchsorted(b[order], np.arange(num_buckets + 1))

    def rows_of(k: int) -> tuple[npt.NDArray[np.float64], npt.NDArray[Any], npt.NDArray[Any] | None]:
        r = order[start[k]:start[k + 1]]
        return d[r], t[r], None if codes is None else codes[r]

    total_d, total_t = allocated_totals(d, t, b)
    return BucketedRows(np.diff(start).astype(np.int64), rows_of, total_d, total_t)


@dataclass
class PaddingSums:
    """Per bucket: real and padded seconds, real and padded tokens (integers), batches, rows."""

    num_buckets: int
    audio_token_rate: float | None = None  # also token-equivalents (te), real and padded

    def __post_init__(self) -> None:
        B = self.num_buckets
        self.real_te = self.pad_te = 0
        self.real_d, self.pad_d = np.zeros(B), np.zeros(B)
        self.real_t, self.pad_t = np.zeros(B, np.int64), np.zeros(B, np.int64)
        self.batches, self.rows = np.zeros(B, np.int64), np.zeros(B, np.int64)

    def add(self, k: int, d: npt.NDArray[np.float64], t: npt.NDArray[np.int64], off: npt.NDArray[np.int64]
            ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
        """Batches ``d[off[i]:off[i+1]]`` of bucket ``k``; returns their longest and most tokens."""
        lo, sizes = off[:-1], np.diff(off)
        dmax, tmax = np.maximum.reduceat(d, lo), np.maximum.reduceat(t, lo)
        self.real_d[k] += float(np.add.reduceat(d, lo).sum())
        self.pad_d[k] += float((sizes * dmax).sum())
        self.real_t[k] += int(t.sum())
        self.pad_t[k] += int((sizes * tmax).sum())
        self.batches[k] += lo.shape[0]
        self.rows[k] += d.shape[0]
        if self.audio_token_rate is not None:  # each row padded to the batch's longest audio and most tokens
            self.real_te += int(token_equivalents(d, t, self.audio_token_rate).sum())
            self.pad_te += int((sizes * token_equivalents(dmax, tmax, self.audio_token_rate)).sum())
        return dmax, tmax

    def padding(self) -> dict[str, Any]:
        n, nb = int(self.rows.sum()), int(self.batches.sum())
        te = {} if self.audio_token_rate is None else {"te_padding": round(_ratio(self.real_te, self.pad_te), 6)}
        return {**Padding(audio_padding=_ratio(float(self.real_d.sum()), float(self.pad_d.sum())),
                          token_padding=_ratio(int(self.real_t.sum()), int(self.pad_t.sum())), num_batches=nb,
                          mean_batch_size=n / nb if nb else 0.0, num_rows=n).to_json(), **te}

    def per_bucket(self) -> dict[str, npt.NDArray[Any]]:
        """Per-bucket audio/token padding, batches, rows, mean batch size and hours (arrays by bucket)."""
        pd, pt = self.pad_d, self.pad_t.astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            return {
                "audio_padding": np.where(pd > 0, 1 - self.real_d / np.where(pd > 0, pd, 1), 0.0),
                "token_padding": np.where(pt > 0, 1 - self.real_t / np.where(pt > 0, pt, 1), 0.0),
                "num_batches": self.batches,
                "num_rows": self.rows,
                "mean_batch_size": np.where(self.batches > 0, self.rows / np.maximum(self.batches, 1), 0.0),
                "hours": self.real_d / 3600.0,
            }


def _batch_offsets(n: int, size: int) -> npt.NDArray[np.int64]:
    return np.append(np.arange(0, n, size, dtype=np.int64), n)


def padding_report(
    duration: npt.ArrayLike,
    num_tokens: npt.ArrayLike,
    grid: Grid,
    batch_sizes: npt.ArrayLike,
    *,
    budget: float = 600.0,
    cumulative_budget: float | None = None,
    fixed_lengths: tuple[float, ...] = (30.0, 40.0),
    strict: bool = False,
    seed: int = 0,
    window: int | None = None,
    sort_by: str | None = None,
    audio_weight: float | None = None,
    carry: bool = True,
    dynamic_resolution: DynResConfig | None = DynResConfig(),
    corpus_of_row: npt.ArrayLike | None = None,
    corpora: Sequence[str] = (),
) -> dict[str, Any]:
    """Compare the schemes on one manifest's columns in memory (see the module docstring and
    :func:`schemes_report`).

    ``budget``: padded seconds per batch for schemes 1 and 3 (scheme 4 uses ``batch_sizes``);
    ``cumulative_budget``: real seconds per batch for scheme 2 (default: ``budget``).
    ``window`` / ``sort_by`` / ``audio_weight``: in-bucket grouping as ``form_batches`` takes
    it (None = its default). ``carry``: bucket tails fill the next bucket that holds them
    (:func:`bucketing.allocate.carry_tails`) in scheme 4, as the planner does (1D buckets
    have no token sub-bins to carry into). ``dynamic_resolution``: the rates of scheme 5
    (None leaves it out). ``corpus_of_row`` (index into ``corpora`` per row): also the 2D
    scheme's utterances, hours and padding per corpus.
    """
    d = np.asarray(duration, dtype=np.float64)
    t = np.asarray(num_tokens, dtype=np.int64)
    codes = None if corpus_of_row is None else np.asarray(corpus_of_row)
    fit1 = fit_buckets(d, None, num_buckets=grid.num_duration_bins, num_subbuckets=1).grid
    one_d = memory_buckets(allocate(d, None, fit1).bucket, d, t, None, fit1.num_buckets)
    bs = np.asarray(batch_sizes, dtype=np.int64)
    a = assign(d, t, grid, bs, strict=strict, carry=carry)
    two_d = memory_buckets(a.bucket, d, t, codes, grid.num_buckets)
    two_d.dropped = {k: int(v.shape[0]) for k, v in a.allocation.dropped.items()}
    two_d.moved, two_d.carried, two_d.max_tokens = a.allocation.moved, a.carried, a.max_tokens
    return schemes_report(int(d.shape[0]), lambda length, salt: memory_parts(d, t, length, seed, salt), fit1, one_d,
                          grid, bs, two_d, HeldColumns(), budget=budget, cumulative_budget=cumulative_budget,
                          fixed_lengths=fixed_lengths, seed=seed, window=window, sort_by=sort_by,
                          audio_weight=audio_weight, dynamic_resolution=dynamic_resolution,
                          corpora=corpora if codes is not None else None)


def schemes_report(num_rows: int, fixed_parts: Callable[[float, int], tuple[int, Iterable[Any]]], grid1: Grid,
                   one_d: BucketedRows, grid: Grid, batch_sizes: npt.NDArray[np.int64], two_d: BucketedRows,
                   store: Any, *, budget: float, cumulative_budget: float | None,
                   fixed_lengths: tuple[float, ...], seed: int, window: int | None, sort_by: str | None,
                   audio_weight: float | None, dynamic_resolution: DynResConfig | None,
                   corpora: Sequence[str] | None, audio_token_rate: float | None = None) -> dict[str, Any]:
    """The report from rows read one part or one bucket at a time, in memory or from spill
    files (the same figures either way: every sum is taken bucket by bucket, chunk by chunk).

    ``fixed_parts(length, salt)``: (rows over ``length``, the scatter parts, :func:`fixed_scheme`);
    ``grid1`` / ``one_d``: the 1D duration grid (``grid``'s duration bins, equal occupancy)
    and its rows; ``two_d``: the rows of ``grid`` (allocated, tails carried);
    ``store``: where the 2D rows' durations and rates go in batch order for the rate samples
    (``append`` / ``read_runs`` / ``close``, :class:`bucketing.held_columns.HeldColumns` or spill files).
    Batches are formed per bucket with the draws of :func:`bucketing.batching.form_batches`
    (``default_rng([seed, 2])`` for 1D, ``[seed, 3]`` for 2D), the cumulative scheme's by
    :func:`bucketing.batching.form_batches_cumulative` bucket after bucket (``[seed, 1]``).
    ``audio_token_rate``: the fixed and 2D schemes also give ``te_padding`` (token-equivalents,
    :func:`bucketing.packing.token_equivalents`)."""
    def rng(k: int) -> np.random.Generator:
        return np.random.default_rng([seed, k])

    schemes: dict[str, Any] = {}
    for i, length in enumerate(fixed_lengths):
        excluded, parts = fixed_parts(length, 10 + i)
        schemes[f"fixed-{length:g}s"] = fixed_scheme(parts, length, budget, excluded, seed, 10 + i, audio_token_rate)

    def grouping_of(rows: BucketedRows) -> BucketGrouping:
        g = BucketGrouping(resolve_sort(DEFAULT_SORT_BY if sort_by is None else sort_by, True, True),
                           DEFAULT_WINDOW if window is None else window, None,
                           DEFAULT_AUDIO_WEIGHT if audio_weight is None else audio_weight)
        return g.with_totals(rows.total_d, rows.total_t) if g.both else g

    # 1D: cumulative (a shuffle per bucket, greedy by real seconds) and padded budget
    bs1 = padded_budget_batch_sizes(grid1.max_duration, max_duration_budget=budget)
    cum, one = PaddingSums(grid1.num_buckets), PaddingSums(grid1.num_buckets)
    rng_cum, rng1, g1 = rng(1), rng(2), grouping_of(one_d)
    for k in np.flatnonzero(one_d.counts):
        d, t, _ = one_d.rows_of(int(k))
        t = t.astype(np.int64, copy=False)
        bc = form_batches_cumulative(np.zeros(d.shape[0], np.int32), d, cumulative_budget or budget, rng_cum)
        cum.add(int(k), d[bc.rows], t[bc.rows], bc.offsets)
        for p in g1.order_chunks(d.shape[0], int(bs1[k]), rng1, d, t, CHUNK_ROWS):
            one.add(int(k), d[p], t[p], _batch_offsets(p.shape[0], int(bs1[k])))
    schemes["1d-cumulative"] = {**cum.padding(), "excluded": 0}
    schemes["1d-budget"] = {**one.padding(), "excluded": 0}

    # 2D (and 2D + dynamic resolution, per corpus)
    B = grid.num_buckets
    sums, g2, rng2 = PaddingSums(B, audio_token_rate), grouping_of(two_d), rng(3)
    dyn = dynamic_resolution
    res_totals: list[ResolutionTotals] = [ResolutionTotals() for _ in range(B)]
    pol: dict[str, ResolutionTotals] = {}
    groups = None if corpora is None else np.zeros((5, len(corpora)), dtype=np.int64)
    d_max = 0.0
    for k in np.flatnonzero(two_d.counts):
        d, t, c = two_d.rows_of(int(k))
        t = t.astype(np.int64, copy=False)
        size = int(batch_sizes[k])
        for p in g2.order_chunks(d.shape[0], size, rng2, d, t, CHUNK_ROWS):
            dk, tk, off = d[p], t[p], _batch_offsets(p.shape[0], size)
            dmax, tmax = sums.add(int(k), dk, tk, off)
            if groups is not None and c is not None:
                groups += group_padding(np.arange(p.shape[0]), np.diff(off), dmax, tmax, dk, tk, c[p], len(corpora))
            if dyn is not None:
                res = resolve(dk, off, None, dyn)
                res_totals[k] = res_totals[k] + resolution_totals(dk, off, res, dyn)[0]
                for name, x in policy_totals(dk, off, dyn).items():
                    pol[name] = pol[name] + x if name in pol else x
                store.append("dyn.d", dk)
                store.append("dyn.rate", res.rate)
                d_max = max(d_max, float(dk.max()))
    store.close()
    schemes["2d"] = {**sums.padding(), "excluded": sum(two_d.dropped.values())}
    pb = sums.per_bucket()
    if dyn is not None:
        cut = cut_batches(two_d.counts, batch_sizes, rng2 if g2.grouped(True, True) else None)
        schemes["2d-dynamic-resolution"] = _dynamic_resolution_scheme(schemes["2d"], res_totals, pol, dyn, pb, store,
                                                                      cut, d_max)
    extra: dict[str, Any] = {}
    if groups is not None and corpora is not None:
        extra["per_corpus"] = group_json(list(corpora), groups)
    mt = two_d.max_tokens
    return {
        **extra,
        "num_rows": num_rows,
        "budget": budget,
        "cumulative_budget": cumulative_budget or budget,
        "seed": seed,
        "schemes": schemes,
        "dropped": dict(two_d.dropped),
        "moved": two_d.moved,
        "carried": two_d.carried,
        "per_bucket": [
            {
                "index": i,
                "duration_bin": int(grid.duration_bin[i]),
                "token_bin": int(grid.token_bin[i]),
                "max_duration": float(grid.max_duration[i]),
                "max_tokens": int(mt[i]) if mt is not None else None,
                "batch_size": int(batch_sizes[i]),
                **{k: (round(float(v[i]), 6) if v.dtype.kind == "f" else int(v[i])) for k, v in pb.items()},
            }
            for i in range(B)
        ],
    }


def packed_scheme(two_d: BucketedRows, cap: int, audio_token_rate: float) -> dict[str, Any]:
    """Scheme ``packed``: each 2D bucket's rows packed into sequences of at most ``cap``
    token-equivalents (:func:`bucketing.packing.pack_sizes`, one bucket at a time; rows over
    ``cap`` are ``excluded``). ``te_padding`` = ``token_padding``: the sequences' empty slots;
    ``audio_padding``: members padded to the longest member of their sequence."""
    real_d = pad_d = 0.0
    real_te = sequences = rows = excluded = 0
    for k in np.flatnonzero(two_d.counts):
        d, t, _ = two_d.rows_of(int(k))
        te = token_equivalents(d, t, audio_token_rate)
        ok = te <= cap
        excluded += int((~ok).sum())
        d, te = d[ok], te[ok]
        if not te.shape[0]:
            continue
        seq = pack_sizes(te, cap)
        n = int(seq.max()) + 1
        longest = np.zeros(n)
        np.maximum.at(longest, seq, d)
        real_d += float(d.sum())
        pad_d += float(longest[seq].sum())
        real_te += int(te.sum())
        sequences += n
        rows += int(te.shape[0])
    te_pad = _ratio(real_te, sequences * cap)
    return {**Padding(audio_padding=_ratio(real_d, pad_d), token_padding=te_pad, num_batches=sequences,
                      mean_batch_size=rows / sequences if sequences else 0.0, num_rows=rows).to_json(),
            "te_padding": round(te_pad, 6), "excluded": excluded, "max_tokens": cap}


def _dynamic_resolution_scheme(scheme_2d: dict[str, Any], by_bucket: list[ResolutionTotals],
                               pol: dict[str, ResolutionTotals], config: DynResConfig,
                               pb: dict[str, npt.NDArray[Any]], store: Any, cut: Cut, d_max: float) -> dict[str, Any]:
    """Scheme 5: the 2D batches featurized at their own rates; adds the per-bucket
    ``dynres_*`` arrays to ``pb``. The rate samples are read from ``store`` (rows in cut
    order) at evenly spaced positions of the batches' drawn order."""
    whole = sum(by_bucket[1:], by_bucket[0]).to_json() if by_bucket else {}
    dyn = [x.to_json() for x in by_bucket]
    for k in ("frame_padding", "clamped_share", "fallback_share", "off_rate_share"):
        pb[f"dynres_{k}"] = np.asarray([x[k] for x in dyn], dtype=np.float64)
    n = int(cut.sizes.sum())
    pos = np.linspace(0, n - 1, min(RATE_SAMPLES, n)).astype(np.int64) if n else np.zeros(0, np.int64)
    sizes = cut.sizes[cut.perm]
    off = np.concatenate([[0], np.cumsum(sizes)])
    j = np.searchsorted(off, pos, side="right") - 1
    at = cut.starts[cut.perm[j]] + (pos - off[j]) if n else pos
    one = np.ones(at.shape[0], dtype=np.int64)
    d, rate = store.read_runs("dyn.d", np.float64, at, one), store.read_runs("dyn.rate", np.float64, at, one)
    return {**scheme_2d, "audio_padding": whole.get("frame_padding", 0.0),
            **{k: whole.get(k, 0.0) for k in ("frame_padding", "frame_padding_base", "clamped_share",
                                                "fallback_share", "off_rate_share")},
            "config": config.to_json(), "compare": comparison_rows(pol),
            "rate_vs_duration": _rates(d, rate, d_max, config)}


def _rates(d: npt.NDArray[np.float64], rate: npt.NDArray[np.float64], d_max: float, config: DynResConfig,
           ) -> dict[str, Any]:
    """For the rate-vs-duration plot: the sampled (duration s, rate Hz) pairs of the
    utterances, and per constant target the rate of a batch's longest utterance on a duration
    grid (``grid`` s, up to the longest utterance ``d_max``; ``curves[F]`` Hz)."""
    grid = np.linspace(0.5, max(d_max, 1.0), 200)
    one = np.arange(grid.shape[0] + 1, dtype=np.int64)  # one utterance per batch
    curves = {str(t): np.round(resolve(grid, one, None, replace(config, target_frames=t)).rate, 3).tolist()
              for t in COMPARED_TARGETS}
    return {"duration": np.round(d, 3).tolist(), "rate": np.round(rate, 3).tolist(),
            "grid": np.round(grid, 3).tolist(), "curves": curves}
