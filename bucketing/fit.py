"""Equal-occupancy bucket fitting, 1D and 2D. Units: seconds (float64), tokens incl. the prompt.

Duration bins, and token sub-bins inside each, hold about the same seconds of audio, computed
exactly over all rows. Bounds are inclusive upper bounds taken from values in the data,
strictly increasing, never empty or duplicated (ties or skew give fewer bins).

Fences (Q3 + k × IQR; ``outlier_fence`` k = 3, ``token_fence`` k = 2; ``None`` turns one off,
and a fence is not applied where Q1 == Q3): rows beyond the duration fence ``f`` go to overflow
buckets, one per ``(f r^(k-1), f r^k]`` that holds rows (``r`` = :data:`OVERFLOW_RATIO`, a bin
of one row joined to a neighbour: :func:`merge_sparse_bins`); token outliers of a duration bin
are moved by flexible allocation to a later bin, never dropped. A bin spanning more than
:data:`OVERFLOW_RATIO` times its lower bound is split where each part keeps at least
:data:`SPLIT_MIN_SHARE` of a bin's audio (:func:`split_wide_bins`), so a grid may hold more
bins than asked (a note says so). docs/buckets.md gives the reasons and figures.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from manifests.buckets_file import Bucket, BucketSpec
from manifests.errors import ManifestError

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

#: Default duration fence of the overflow bin: Q3 + k × IQR with k = 3 (Tukey's "far out").
DEFAULT_OUTLIER_FENCE = 3.0
#: Default token fence of the top sub-bins: k = 2 (measured trade-off, see the module docstring).
DEFAULT_TOKEN_FENCE = 2.0


def equal_occupancy_cuts(cum_weight: F64, num_bins: int) -> I64:
    """Split sorted distinct values into at most ``num_bins`` bins of near-equal weight.

    ``cum_weight[i]`` is the total weight (seconds) of all rows whose value is <= the i-th
    distinct value (non-decreasing, last = total). Returns the index of each bin's last
    distinct value: strictly increasing, ending at ``len(cum_weight) - 1``. Greedy with
    rebalancing: bin k aims at an equal share of what bins 0..k-1 left over, choosing the
    closer of the two neighbouring cut points, and leaves one distinct value at least to each
    remaining bin. Deterministic; O(num_bins log n).
    """
    n = int(cum_weight.shape[0])
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    bins = max(1, min(int(num_bins), n))
    total = float(cum_weight[-1])
    cuts: list[int] = []
    prev = -1
    done = 0.0
    for k in range(bins - 1):
        remaining = bins - k
        target = done + (total - done) / remaining
        i = int(np.searchsorted(cum_weight, target, side="left"))
        if i > 0 and i < n and abs(cum_weight[i - 1] - target) <= abs(cum_weight[i] - target):
            i -= 1
        i = max(i, prev + 1)
        i = min(i, n - remaining)  # leave one distinct value to every remaining bin
        cuts.append(i)
        prev = i
        done = float(cum_weight[i])
    cuts.append(n - 1)
    return np.asarray(cuts, dtype=np.int64)


@dataclass(frozen=True)
class Grid:
    """A fitted bucket grid, one entry per bucket, ordered by duration bin then token sub-bin.

    ``max_duration`` (s) and ``max_tokens`` are inclusive upper bounds; ``min_duration`` is
    the exclusive lower bound of the bucket's duration bin (the previous bin's bound), or, for
    the first bin, the inclusive ``--min-duration`` cap (NaN when there is none).
    """

    max_duration: F64
    max_tokens: I64
    min_duration: F64
    duration_bin: npt.NDArray[np.int32]
    token_bin: npt.NDArray[np.int32]

    @property
    def num_buckets(self) -> int:
        return int(self.max_duration.shape[0])

    @property
    def num_duration_bins(self) -> int:
        return int(self.duration_bin[-1]) + 1 if self.num_buckets else 0


@dataclass(frozen=True)
class FitResult:
    """The grid plus what the fit saw: rows outside the caps are counted, never hidden."""

    grid: Grid
    num_rows: int
    below_min: int = 0  # rows shorter than the --min-duration cap
    above_max: int = 0  # rows longer than the --max-duration cap
    below_min_hours: float = 0.0
    above_max_hours: float = 0.0
    requested: tuple[int, int] = (0, 0)  # (num_buckets, num_subbuckets) asked for
    notes: list[str] = field(default_factory=list)
    outlier_fence: float | None = None  # k of the duration fence (overflow bin), None = off
    token_fence: float | None = None  # k of the token fence (top sub-bins), None = off
    overflow_rows: int = 0  # rows beyond the duration fence, fitted as the overflow bins
    overflow_from: float | None = None  # the duration fence (s), when an overflow bin exists
    overflow_bins: int = 0  # duration bins of those rows (:func:`merge_sparse_bins`)

    def report(self) -> dict[str, Any]:
        """JSON-ready summary (stored under ``fit`` in ``buckets.json``)."""
        return {
            "method": "equal-occupancy-seconds",
            "num_buckets": self.requested[0],
            "num_subbuckets": self.requested[1],
            "num_duration_bins": self.grid.num_duration_bins,
            "num_buckets_fitted": self.grid.num_buckets,
            "num_rows": self.num_rows,
            "outside_caps": {
                "min_duration": {"rows": self.below_min, "hours": round(self.below_min_hours, 6)},
                "max_duration": {"rows": self.above_max, "hours": round(self.above_max_hours, 6)},
            },
            "outliers": {
                "duration_fence": None if self.outlier_fence is None else f"Q3 + {self.outlier_fence:g} * IQR",
                "token_fence": None if self.token_fence is None else f"Q3 + {self.token_fence:g} * IQR",
                "overflow_bin": None if self.overflow_from is None else {
                    "above_duration": round(self.overflow_from, 6), "rows": self.overflow_rows,
                    "bins": self.overflow_bins},
            },
            "notes": list(self.notes),
        }


def _fence(values: npt.NDArray[Any], cum_count: I64, k: float | None) -> float:
    """Q3 + k × IQR of a sorted distinct ``values`` with cumulative row counts; inf if off.

    Quartiles are order statistics (the first value whose cumulative count reaches 25% /
    75% of the rows). No fence (inf) where Q1 == Q3: ties leave no spread to measure.
    """
    if k is None or values.shape[0] == 0:
        return float("inf")
    n = float(cum_count[-1])
    q1, q3 = (float(values[min(int(np.searchsorted(cum_count, p * n, side="left")), values.shape[0] - 1)])
              for p in (0.25, 0.75))
    return tukey_fence(q1, q3, float(k))


def _bin_bounds(values: npt.NDArray[Any], cum_weight: F64, cum_count: I64, num_sub: int,
                fence: float | None, hold: int | None) -> I64:
    """Equal-seconds token bounds of one duration bin over its sorted distinct ``values``.

    With a ``fence`` (k), the top bound drops to the largest value within the fence when
    that stays above the sub-bin below; with ``hold``, the top bound is raised to ``hold``;
    ``num_sub == 0`` means one sub-bin at the maximum (the overflow bin).
    """
    if num_sub == 0:
        return values[-1:].astype(np.int64)
    cuts = equal_occupancy_cuts(cum_weight, num_sub)
    bounds = values[cuts].astype(np.int64)
    f = _fence(values, cum_count, fence)
    if np.isfinite(f):
        top = int(values[int(np.searchsorted(values, f, side="right")) - 1])
        if bounds.shape[0] == 1 or top > bounds[-2]:
            bounds[-1] = top
    if hold is not None:
        bounds[-1] = max(int(bounds[-1]), int(hold))
    return bounds


@dataclass(frozen=True)
class TokenCells:
    """The (duration bin, token count) cells that hold rows: ``key = bin * span + tokens - tmin``
    (ascending, distinct), the seconds of each (summed in row order, so a cell's sum does not
    depend on how the rows were read) and its rows. ``hold``: the largest token count of the
    rows up to the last equal-occupancy bin (None: no token fence). What the token sub-bins are
    fitted from, block by block (:mod:`bucketing.fit_passes`)."""

    key: I64
    seconds: F64
    rows: I64
    tmin: int
    span: int
    hold: int | None = None


def _token_subbins(cells: TokenCells, num_dbins: int, num_sub: int, fence: float | None = None,
                   overflow_bins: int = 0) -> list[I64]:
    """Per duration bin, inclusive upper token bounds of equal-seconds sub-bins.

    ``fence``: k of the outlier fence, applied to the top bound of every bin before the last
    equal-occupancy bin, whose top bound then holds every token count of the rows up to it
    (``cells.hold``). ``overflow_bins``: the last bins are overflow bins, one bucket each: their
    rows are few by definition, and a duration sort batches them best.
    """
    last = num_dbins - 1 - overflow_bins  # last equal-occupancy bin
    hold = cells.hold if fence is not None else None
    starts = np.searchsorted(cells.key, np.arange(num_dbins + 1, dtype=np.int64) * cells.span)
    out: list[I64] = []
    for j in range(num_dbins):  # loop over bins, not utterances
        lo, hi = starts[j], starts[j + 1]
        present = cells.key[lo:hi] - j * cells.span + cells.tmin
        out.append(_bin_bounds(present, np.cumsum(cells.seconds[lo:hi]), np.cumsum(cells.rows[lo:hi]),
                               0 if j > last else num_sub, fence if j < last else None,
                               hold if j == last else None))
    return out


def quartile_ranks(n: int) -> tuple[int, int]:
    """0-based ranks of Q1 and Q3 among ``n`` sorted values (the first value at 25% / 75%)."""
    return int(np.ceil(0.25 * n)) - 1, int(np.ceil(0.75 * n)) - 1


def tukey_fence(q1: float, q3: float, k: float) -> float:
    """Q3 + k × IQR; inf where Q1 == Q3 (ties leave no spread to measure)."""
    return math.inf if q3 <= q1 else float(q3 + k * (q3 - q1))


#: Overflow bins grow by this factor: the bin of a duration ``d`` beyond the fence ``f`` is
#: ``k >= 1`` with ``f r^(k-1) < d <= f r^k``. Measured on Common Voice's 44 clips beyond its
#: fence (benchmarks/bench_fill.py --baseline, docs/benchmarks.md): 1.5 balances steps about as
#: well as 2 and keeps the 2D padding ``dataprep padding`` prints within the padding goal's
#: allowance (tests/cli/test_buckets_cli.py: 2.06% < 2.1%; with 2, 2.11% in a CI run).
OVERFLOW_RATIO: float = 1.5


def overflow_level_runs(over_sorted: F64, fence: float) -> tuple[I64, F64, I64]:
    """(level, longest row (s), rows) of each overflow level that holds rows, over ascending
    durations beyond the fence (s): level ``k >= 1`` holds ``fence r^(k-1) < d <= fence r^k``
    (``r``: :data:`OVERFLOW_RATIO`). Block by block: a level's runs in consecutive blocks add up."""
    k = np.maximum(np.ceil(np.log(over_sorted / fence) / math.log(OVERFLOW_RATIO)), 1).astype(np.int64)
    ends = np.flatnonzero(np.append(k[1:] != k[:-1], True))
    return k[ends], np.asarray(over_sorted[ends], dtype=np.float64), np.diff(ends, prepend=-1)


#: An overflow bin holds at least this many rows (where that many are beyond the fence): a
#: sparser one joins the next longer bin, a sparse last bin takes in the one below. A bin of one
#: clip batches it alone: Common Voice's 160 s clip did, and joining it to the bin below took the
#: straggler at W = 8 / 32 from 3.8% / 11.8% to 2.7% / 6.0% (benchmarks/bench_fill.py
#: --baseline f590c6a).
OVERFLOW_MIN_ROWS: int = 2


def merge_sparse_bins(longest: npt.NDArray[Any], rows: npt.NDArray[Any],
                      minimum: float = OVERFLOW_MIN_ROWS) -> npt.NDArray[Any]:
    """Bounds of bins from each bin's bound and weight (bins ascending; the overflow bins: each
    non-empty level's longest row and its rows): while a bin weighs less than ``minimum``
    (:data:`OVERFLOW_MIN_ROWS` rows) and there are two bins or more, the first such joins the
    next longer one (the last: the one below). The bounds keep their type."""
    b, n = np.asarray(longest).tolist(), [float(x) for x in rows]
    while len(b) > 1 and min(n) < minimum:  # a loop over bins (a few dozen at most)
        i = next(j for j, c in enumerate(n) if c < minimum)
        j = i + 1 if i + 1 < len(b) else i - 1  # the bin it joins
        n[j] += n[i]
        b[j] = max(b[i], b[j])
        del b[i], n[i]
    return np.asarray(b, dtype=np.asarray(longest).dtype)


#: The error when the caps leave no row.
NO_ROWS = "no rows left to fit (check --min-duration / --max-duration)"


def check_fences(outlier_fence: float | None, token_fence: float | None) -> None:
    """Fences are >= 0 or None (ValueError)."""
    if (outlier_fence is not None and outlier_fence < 0) or (token_fence is not None and token_fence < 0):
        raise ValueError("outlier fences must be >= 0 (or None for no fence)")


#: Share of an equal-occupancy bin's audio that each part of a split bin keeps at least
#: (:func:`split_wide_bins`). Measured with benchmarks/bench_fill.py (docs/benchmarks.md):
#: LibriSpeech's first bin (1.41-6.43 s) splits at 4.285 s with 1/4 or 1/8 and not at all with
#: 1/2; Common Voice's (1.08-2.50 s) splits at 1.66 s with 1/8, which cost it every balance goal
#: it met at W = 8 and 0.5 points of token padding, and not at all with 1/4.
SPLIT_MIN_SHARE: float = 0.25


def split_wide_bins(values: npt.NDArray[Any], cum: F64, cuts: I64) -> I64:
    """Equal-occupancy cuts (indices into the distinct durations ``values``, ascending, with
    ``cum`` their running audio) with each bin that spans more than :data:`OVERFLOW_RATIO`
    times its lower bound (the previous bin's bound; the shortest row for the first) cut where
    that leaves parts of at most that ratio (the longest value at or under ``bound / r^k``),
    then each part that holds less than :data:`SPLIT_MIN_SHARE` of a bin's audio (the total
    over the bins) joined to the part above it, the top part to the one below
    (:func:`merge_sparse_bins`).

    Where durations are sparse (the short end of a corpus of long utterances), equal occupancy
    makes a bin span several times its lower bound: its padded-budget batches, sized for its
    bound, hold rows much shorter than that, so they are cheap (too small for balanced steps)
    and padded. Bins already narrow, or whose parts would hold little audio, stay as they are.
    A loop over bins and parts (a few dozen at most)."""
    if cuts.shape[0] == 0:
        return cuts
    share = SPLIT_MIN_SHARE * float(cum[-1]) / cuts.shape[0]
    out: list[int] = []
    for j, hi in enumerate(cuts.tolist()):
        lo = int(cuts[j - 1]) if j else -1  # the bin holds values lo + 1 .. hi
        parts = [hi]
        lower, bound = float(values[max(lo, 0)]), float(values[hi]) / OVERFLOW_RATIO
        while bound > lower:
            i = int(np.searchsorted(values, bound, side="right")) - 1
            if i <= max(lo, 0):
                break
            if i < parts[0]:
                parts.insert(0, i)
            bound /= OVERFLOW_RATIO
        start = np.array([lo] + parts[:-1])
        audio = np.asarray(cum[parts]) - np.where(start >= 0, cum[np.maximum(start, 0)], 0.0)
        out.extend(merge_sparse_bins(np.asarray(parts, dtype=np.int64), audio, share).tolist())
    return np.asarray(out, dtype=np.int64)


def duration_bounds(values: F64, cum: F64, num_buckets: int, overflow_rows: int, overflow_from: float | None,
                    overflow: F64, outlier_fence: float | None) -> tuple[F64, list[str]]:
    """Duration-bin bounds (s) and the notes about them, from the distinct durations within the
    fence (``values``, ascending; an array or a memory map) and ``cum``, the running sum of
    the sorted durations at the last row of each (``np.cumsum`` over the sorted rows, so the
    same floats however the rows were read), then the overflow bins' bounds ``overflow``
    (:func:`merge_sparse_bins`; empty without an overflow)."""
    cuts = equal_occupancy_cuts(cum, num_buckets)
    notes: list[str] = []
    if cuts.shape[0] < num_buckets:
        notes.append(f"{cuts.shape[0]} duration bins fitted of {num_buckets} asked: "
                     f"too few distinct durations or one duration holds more than a bin's share")
    split = split_wide_bins(values, cum, cuts)
    if split.shape[0] > cuts.shape[0]:
        wide = np.flatnonzero(np.diff(np.searchsorted(split, cuts, side="right"), prepend=0) > 1).tolist()
        added = split.shape[0] - cuts.shape[0]
        notes.append(f"{added} duration bin{'s' if added > 1 else ''} added by splitting "
                     + ", ".join(f"{float(values[cuts[j - 1]]) if j else float(values[0]):.2f}-"
                                 f"{float(values[cuts[j]]):.2f} s" for j in wide)
                     + f" (a bin spanning more than {OVERFLOW_RATIO:g}x, where each part holds at least "
                     f"{SPLIT_MIN_SHARE:g} of a bin's audio)")
    dbounds = np.asarray(values[split], dtype=np.float64)
    if overflow_from is not None:
        dbounds = np.append(dbounds, overflow)
        n = overflow.shape[0]
        notes.append(f"{overflow_rows} rows longer than {overflow_from:.3f} s (Q3 + {outlier_fence:g} * IQR "
                     f"of durations) fitted as " + ("an overflow duration bin" if n == 1 else
                                                    f"{n} overflow duration bins, each at most {OVERFLOW_RATIO:g} times as long as "
                                                    f"the one before,") + f" after the {num_buckets} asked")
    return dbounds, notes


def finish_fit(dbounds: F64, notes: list[str], cells: TokenCells, num_rows: int,
               caps: tuple[int, int, float, float], num_buckets: int, num_subbuckets: int,
               min_duration: float | None, outlier_fence: float | None, token_fence: float | None,
               overflow_rows: int, overflow_from: float | None, overflow_bins: int = 0) -> FitResult:
    """The grid and its :class:`FitResult` from the duration bounds and the token cells;
    ``caps``: rows below / above the caps and their hours; the last ``overflow_bins`` bounds
    are the overflow bins'."""
    nd = int(dbounds.shape[0])
    bulk_max = float(dbounds[nd - 1 - overflow_bins])
    # 1D bucketing is by duration alone: its token bounds stay the maxima of its bins
    sub = _token_subbins(cells, nd, num_subbuckets, token_fence if num_subbuckets > 1 else None, overflow_bins)
    short = [j for j, s in enumerate(sub) if s.shape[0] < num_subbuckets and dbounds[j] <= bulk_max]
    if short:
        notes.append(f"{len(short)} duration bins got fewer than {num_subbuckets} token sub-bins "
                     f"(too few distinct token counts)")
    counts = np.asarray([s.shape[0] for s in sub], dtype=np.int64)
    dur_bin = np.repeat(np.arange(nd, dtype=np.int32), counts)
    tok_bin = (np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)).astype(np.int32)
    lower = np.concatenate([[np.nan if min_duration is None else float(min_duration)], dbounds[:-1]])
    grid = Grid(
        max_duration=dbounds[dur_bin].astype(np.float64),
        max_tokens=np.concatenate(sub).astype(np.int64),
        min_duration=lower[dur_bin].astype(np.float64),
        duration_bin=dur_bin,
        token_bin=tok_bin,
    )
    return FitResult(
        grid=grid,
        num_rows=num_rows,
        below_min=caps[0],
        above_max=caps[1],
        below_min_hours=caps[2],
        above_max_hours=caps[3],
        requested=(int(num_buckets), int(num_subbuckets)),
        notes=notes,
        outlier_fence=None if outlier_fence is None else float(outlier_fence),
        token_fence=None if token_fence is None or num_subbuckets == 1 else float(token_fence),
        overflow_rows=overflow_rows,
        overflow_from=overflow_from,
        overflow_bins=overflow_bins,
    )


def grid_from_spec(spec: BucketSpec) -> Grid:
    """The grid of a ``buckets.json`` (fitted or hand-written, e.g. NeMo's duration bins).

    Duration bins are the runs of equal ``max_duration``; a missing ``max_tokens`` means
    unbounded. Raises :class:`ManifestError` if bounds are not ordered as the format requires.
    """
    b = spec.buckets
    md = np.asarray([x.max_duration for x in b], dtype=np.float64)
    big = np.iinfo(np.int32).max
    mt = np.asarray([big if x.max_tokens is None else x.max_tokens for x in b], dtype=np.int64)
    if (np.diff(md) < 0).any():
        raise ManifestError("buckets.json: max_duration must be non-decreasing in bucket order")
    new_bin = np.append(True, md[1:] != md[:-1])
    dbin = (np.cumsum(new_bin) - 1).astype(np.int32)
    if ((np.diff(mt) <= 0) & ~new_bin[1:]).any():
        raise ManifestError("buckets.json: max_tokens must increase strictly within a duration bin")
    first = np.flatnonzero(new_bin)
    tbin = (np.arange(md.shape[0]) - first[dbin]).astype(np.int32)
    lower = np.concatenate([[np.nan if b[0].min_duration is None else float(b[0].min_duration)], md[first][:-1]])
    return Grid(max_duration=md, max_tokens=mt, min_duration=lower[dbin], duration_bin=dbin, token_bin=tbin)


def grid_to_buckets(
    grid: Grid,
    batch_sizes: npt.ArrayLike | None = None,
    num_utterances: npt.ArrayLike | None = None,
    seconds: npt.ArrayLike | None = None,
) -> tuple[Bucket, ...]:
    """``Bucket`` records for ``buckets.json`` (hours rounded to 1e-6)."""
    out = []
    for i in range(grid.num_buckets):
        lo = float(grid.min_duration[i])
        out.append(
            Bucket(
                index=i,
                max_duration=float(grid.max_duration[i]),
                max_tokens=int(grid.max_tokens[i]),
                batch_size=None if batch_sizes is None else int(np.asarray(batch_sizes)[i]),
                num_utterances=None if num_utterances is None else int(np.asarray(num_utterances)[i]),
                hours=None if seconds is None else round(float(np.asarray(seconds)[i]) / 3600.0, 6),
                min_duration=None if not np.isfinite(lo) else lo,
                duration_bin=int(grid.duration_bin[i]),
                token_bin=int(grid.token_bin[i]),
            )
        )
    return tuple(out)
