"""The fit, once for every size: equal-occupancy bins (:mod:`bucketing.fit`) and the
allocation (:mod:`bucketing.allocate`) from rows fed block by block, held in a column store:
:class:`HeldColumns` in memory, or spill files (:class:`manifests.spill.SpillFiles`) for a
corpus over the memory limit. The same floats either way, at any block size (no sample).

Passes: 1. the blocks: checks, rows outside the caps counted, durations and tokens stored;
2. the durations ascending (:func:`manifests.spill.sorted_runs`, ranges of at most
``sort_rows``): quartiles, fence, the running sum at the last row of each distinct duration
(``np.cumsum`` continued run to run), searched by :func:`bucketing.fit.duration_bounds`;
3. the (duration bin, token count) cells, seconds summed in row order (``np.add.at``);
4. the allocation, block by block, seconds per bucket summed in row order. Rows of duration 0
(text-only) weigh no seconds: no cap applies, their tokens join the shortest bin's cells.
Memory: one block, a range of the sort, the cells, the per-bucket totals (plus the store when
held). Spilled: 16 bytes of disk per row plus 16 per distinct duration.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from bucketing.allocate import Allocation, allocate, fitted_spec
from bucketing.fit import (DEFAULT_OUTLIER_FENCE, DEFAULT_TOKEN_FENCE, NO_ROWS, FitResult, Grid, TokenCells,
                           check_fences, duration_bounds, finish_fit, merge_sparse_bins, overflow_level_runs,
                           quartile_ranks, tukey_fence)
from manifests.buckets_file import BucketSpec
from bucketing.held_columns import HeldColumns
from manifests.spill import SpillFiles, sorted_runs

#: Bytes of working memory per row of a block (Arrow columns, NumPy copies, masks, allocation).
BLOCK_BYTES_PER_ROW = 160
#: Bytes per value held by a range of the sort (8: the values, filled and sorted in place;
#: the rest a margin for what else is alive).
SORT_BYTES_PER_ROW = 16
#: Fewest values per range of the sort, whatever the limit (each range is one pass).
MIN_SORT_ROWS = 256
#: rows per block of passes 3 and 4 over columns held in memory (the most a spilled fit's block has)
HELD_BLOCK_ROWS = 1 << 20


@dataclass
class AllocationTotals:
    """What the allocation gave, summed over blocks: rows and seconds per bucket (seconds in
    row order), rows and seconds left out per reason, rows moved, token bounds after any raise."""

    counts: npt.NDArray[np.int64]
    seconds: npt.NDArray[np.float64]
    max_tokens: npt.NDArray[np.int64]
    dropped: dict[str, int] = field(default_factory=dict)
    dropped_seconds: dict[str, float] = field(default_factory=dict)
    moved: int = 0

    @property
    def num_dropped(self) -> int:
        return sum(self.dropped.values())

    @classmethod
    def of(cls, grid: Grid) -> AllocationTotals:
        """Nothing added yet, for ``grid``'s buckets."""
        nb = grid.num_buckets
        return cls(np.zeros(nb, np.int64), np.zeros(nb, np.float64), grid.max_tokens.astype(np.int64))

    def drop(self, reason: str, rows: int, seconds: float) -> None:
        if rows:
            self.dropped[reason] = self.dropped.get(reason, 0) + rows
            self.dropped_seconds[reason] = self.dropped_seconds.get(reason, 0.0) + seconds

    def add(self, al: Allocation, d: npt.NDArray[np.float64]) -> None:
        """The :func:`bucketing.allocate.allocate` of a block of rows (durations ``d``, s), after
        the previous blocks."""
        ok = al.bucket >= 0
        self.counts += np.bincount(al.bucket[ok], minlength=self.counts.shape[0])
        np.add.at(self.seconds, al.bucket[ok], d[ok])  # in row order, as np.bincount's weights
        for reason, rows in al.dropped.items():
            self.drop(reason, int(rows.shape[0]), float(d[rows].sum()))
        self.moved += al.moved
        if al.max_tokens is not None:
            self.max_tokens = np.maximum(self.max_tokens, al.max_tokens)


def block_rows(memory_limit: int) -> int:
    """Rows per block of the manifest and of the spill files for ``memory_limit`` bytes."""
    return int(min(max(memory_limit // (4 * BLOCK_BYTES_PER_ROW), 1 << 10), HELD_BLOCK_ROWS))


def sort_rows(memory_limit: int, block: int) -> int:
    """Values per range of the sort of pass 2 for ``memory_limit`` bytes and blocks of ``block`` rows."""
    return max(memory_limit // SORT_BYTES_PER_ROW - block, MIN_SORT_ROWS)


Blocks = Iterable[tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]]


@dataclass(frozen=True)
class Passes:
    """Where the rows are held and in what pieces: ``files`` (:class:`HeldColumns` or spill
    files), ``block`` rows per block of passes 3 and 4, ``sort_rows`` values per range of pass 2."""

    files: SpillFiles
    block: int
    sort_rows: int

    @classmethod
    def held(cls, num_rows: int) -> Passes:
        """Everything in memory, one sorted range; passes 3 and 4 walk it in blocks of at most
        :data:`HELD_BLOCK_ROWS` rows, so their temporaries stay a block's, not the corpus's."""
        return cls(HeldColumns(), min(max(num_rows, 1), HELD_BLOCK_ROWS), max(num_rows, MIN_SORT_ROWS))


def fit_grid(blocks: Blocks, passes: Passes, *, num_buckets: int, num_subbuckets: int, min_duration: float | None,
             max_duration: float | None, outlier_fence: float | None, token_fence: float | None
             ) -> tuple[FitResult, _Scan]:
    """Passes 1-3 (module docstring) over ``blocks`` of (durations s, tokens): the fitted grid
    and what the scan saw. Raises :class:`ValueError` for bad durations or options."""
    if num_buckets < 1 or num_subbuckets < 1:
        raise ValueError("num_buckets and num_subbuckets must be >= 1")
    files, block = passes.files, passes.block
    scan = _scan(blocks, files, min_duration, max_duration)
    files.close()
    check_fences(outlier_fence, token_fence)
    if scan.n_in == 0:
        raise ValueError(NO_ROWS)
    n_bulk, overflow_from, over = _sorted_pass(files, scan.n_in, passes.sort_rows, block, outlier_fence)
    files.close()
    dbounds, notes = duration_bounds(files.map("dv", np.float64), files.map("dcum", np.float64), num_buckets,
                                     scan.n_in - n_bulk, overflow_from, over, outlier_fence)
    cells = _token_cells(files, scan, dbounds, block, token_fence is not None and num_subbuckets > 1,
                         int(over.shape[0]))
    caps = (scan.below, scan.above, float(files.map("below", np.float64).sum() / 3600.0),
            float(files.map("above", np.float64).sum() / 3600.0))
    fit = finish_fit(dbounds, notes, cells, scan.num_rows, caps, num_buckets, num_subbuckets, min_duration,
                     outlier_fence, token_fence, scan.n_in - n_bulk, overflow_from, int(over.shape[0]))
    return fit, scan


def fit_blocks(blocks: Blocks, passes: Passes, *, num_buckets: int, num_subbuckets: int,
               min_duration: float | None, max_duration: float | None, strict: bool,
               max_duration_budget: float | None, max_frames_budget: int | None, max_tokens_budget: int | None,
               frame_shift: float, manifest_hash: str | None, outlier_fence: float | None,
               token_fence: float | None) -> tuple[BucketSpec, AllocationTotals]:
    """``buckets.json``'s content from ``blocks`` of (durations s, tokens): fit (passes 1-3),
    allocate (pass 4), size batches by the padded budget; and the allocation's totals."""
    fit, scan = fit_grid(blocks, passes, num_buckets=num_buckets, num_subbuckets=num_subbuckets,
                         min_duration=min_duration, max_duration=max_duration, outlier_fence=outlier_fence,
                         token_fence=token_fence)
    alloc = _allocate(passes.files, scan, fit.grid, strict, passes.block)
    if min_duration is not None:
        alloc.drop("min_duration", scan.below, scan.below_seconds)
    alloc.drop("exceeds_bucket" if strict else "max_duration", scan.above, scan.above_seconds)
    spec = fitted_spec(fit, alloc.max_tokens, alloc.counts, alloc.seconds, alloc.dropped, alloc.moved,
                       strict=strict, max_duration_budget=max_duration_budget, max_frames_budget=max_frames_budget,
                       max_tokens_budget=max_tokens_budget, frame_shift=frame_shift, manifest_hash=manifest_hash)
    return spec, alloc


def _columns(duration: npt.ArrayLike, num_tokens: npt.ArrayLike | None, num_subbuckets: int
             ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """Durations and tokens as arrays (zeros when 1D without tokens), of one length."""
    d = np.asarray(duration, dtype=np.float64)
    if num_tokens is None:
        if num_subbuckets > 1:
            raise ValueError("num_tokens is required for 2D fitting (num_subbuckets > 1)")
        return d, np.zeros(d.shape[0], dtype=np.int64)
    t = np.asarray(num_tokens, dtype=np.int64)
    if d.shape != t.shape:
        raise ValueError("duration and num_tokens have different lengths")
    return d, t


def fit_buckets(duration: npt.ArrayLike, num_tokens: npt.ArrayLike | None, num_buckets: int = 30,
                num_subbuckets: int = 2, min_duration: float | None = None, max_duration: float | None = None, *,
                outlier_fence: float | None = DEFAULT_OUTLIER_FENCE,
                token_fence: float | None = DEFAULT_TOKEN_FENCE) -> FitResult:
    """The equal-occupancy grid of columns in memory (:func:`fit_grid`, one block):
    ``num_buckets`` duration bins x ``num_subbuckets`` token sub-bins; ``num_tokens`` may be
    None for 1D. Caps (s, inclusive) and fences (k, None = off): :mod:`bucketing.fit`."""
    d, t = _columns(duration, num_tokens, num_subbuckets)
    return fit_grid([(d, t)], Passes.held(d.shape[0]), num_buckets=num_buckets, num_subbuckets=num_subbuckets,
                    min_duration=min_duration, max_duration=max_duration, outlier_fence=outlier_fence,
                    token_fence=token_fence)[0]


def fit_spec(duration: npt.ArrayLike, num_tokens: npt.ArrayLike | None, *, num_buckets: int = 30,
             num_subbuckets: int = 2, min_duration: float | None = None, max_duration: float | None = None,
             strict: bool = False, max_duration_budget: float | None = 600.0, max_frames_budget: int | None = None,
             max_tokens_budget: int | None = None, frame_shift: float = 0.01, manifest_hash: str | None = None,
             outlier_fence: float | None = DEFAULT_OUTLIER_FENCE, token_fence: float | None = DEFAULT_TOKEN_FENCE
             ) -> tuple[BucketSpec, AllocationTotals]:
    """:func:`fit_blocks` of columns in memory (one block): the content of ``buckets.json`` and
    the allocation's totals."""
    d, t = _columns(duration, num_tokens, num_subbuckets)
    return fit_blocks([(d, t)], Passes.held(d.shape[0]), num_buckets=num_buckets, num_subbuckets=num_subbuckets,
                      min_duration=min_duration, max_duration=max_duration, strict=strict,
                      max_duration_budget=max_duration_budget, max_frames_budget=max_frames_budget,
                      max_tokens_budget=max_tokens_budget, frame_shift=frame_shift, manifest_hash=manifest_hash,
                      outlier_fence=outlier_fence, token_fence=token_fence)


@dataclass
class _Scan:
    num_rows: int = 0
    n_in: int = 0  # rows within the caps (stored as d, t)
    below: int = 0
    above: int = 0
    below_seconds: float = 0.0
    above_seconds: float = 0.0
    t_min: int = 0
    t_max: int = 0
    n_text: int = 0  # rows of duration 0 (text-only; stored as their tokens, "t0")


def _scan(blocks: Blocks, files: SpillFiles, min_duration: float | None, max_duration: float | None) -> _Scan:
    """Pass 1: checks, caps, the store of d and t. A bad duration stops the storing, not the
    reading (a reader may raise for what it sees later, first)."""
    s = _Scan()
    bad = False
    t_min, t_max = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    for d, t in blocks:
        s.num_rows += d.shape[0]
        if bad:
            continue
        if not np.isfinite(d).all() or (d < 0).any():
            bad = True
            continue
        text = d == 0
        if text.any():
            files.append("t0", t[text])
            s.n_text += int(text.sum())
            t_min, t_max = min(t_min, int(t[text].min())), max(t_max, int(t[text].max()))
            d, t = d[~text], t[~text]
        below = d < min_duration if min_duration is not None else None
        above = d > max_duration if max_duration is not None else None
        keep = None
        for mask, col in ((below, "below"), (above, "above")):
            if mask is not None and mask.any():
                files.append(col, d[mask])
                setattr(s, col, getattr(s, col) + int(mask.sum()))
                setattr(s, f"{col}_seconds", getattr(s, f"{col}_seconds") + float(d[mask].sum()))
                keep = ~mask if keep is None else keep & ~mask
        if keep is not None:
            d, t = d[keep], t[keep]
        if d.shape[0]:
            files.append("d", d)
            files.append("t", t)
            s.n_in += d.shape[0]
            t_min, t_max = min(t_min, int(t.min())), max(t_max, int(t.max()))
    if bad:
        raise ValueError("durations must be finite and > 0 (0: text-only rows)")
    s.t_min, s.t_max = (t_min, t_max) if s.n_in or s.n_text else (0, 0)
    return s


def _sorted_pass(files: SpillFiles, n_in: int, sort_rows: int, block: int, outlier_fence: float | None
                 ) -> tuple[int, float | None, npt.NDArray[np.float64]]:
    """Pass 2: (rows within the fence, the fence or None, the overflow bins' bounds) as
    Tukey's fence and :func:`bucketing.fit.merge_sparse_bins` give them, and the spill of each distinct
    duration within the fence (``dv``) with the running sum of the sorted durations at its
    last row (``dcum``). Rows beyond the fence are only read for their bins' longest."""
    p1, p3 = quartile_ranks(n_in)
    q1 = q3 = None
    fence = math.inf if outlier_fence is None else None  # None: not known yet
    pos = 0
    prefix = np.zeros(1, dtype=np.float64)
    pending: tuple[float, float] | None = None  # the last distinct value seen, its run may go on
    n_bulk = n_in
    longest: dict[int, float] = {}  # overflow level -> its longest row so far (rows come sorted)
    count: dict[int, int] = {}  # overflow level -> its rows so far
    for run in sorted_runs(files, "d", n_in, sort_rows):
        for a in range(0, run.shape[0], block):  # a block at a time: temporaries stay small
            x = run[a:a + block]
            if q1 is None and pos <= p1 < pos + x.shape[0]:
                q1 = x[p1 - pos]
            if q3 is None and pos <= p3 < pos + x.shape[0]:
                q3 = x[p3 - pos]
                if fence is None:
                    fence = tukey_fence(q1, q3, outlier_fence)
            keep = x.shape[0] if fence is None else int(np.searchsorted(x, fence, side="right"))
            if keep and n_bulk == n_in:
                xs = x[:keep]
                cum = np.cumsum(np.concatenate([prefix, xs]))[1:]
                if pending is not None and pending[0] != xs[0]:
                    files.append("dv", np.asarray([pending[0]]))
                    files.append("dcum", np.asarray([pending[1]]))
                last = np.flatnonzero(xs[1:] != xs[:-1])
                files.append("dv", xs[last])
                files.append("dcum", cum[last])
                pending = (float(xs[-1]), float(cum[-1]))
                prefix = cum[-1:]
            if keep < x.shape[0]:
                if n_bulk == n_in:
                    n_bulk = pos + keep
                levels, top, rows = overflow_level_runs(x[keep:], float(fence))  # type: ignore[arg-type]
                longest.update(zip(levels.tolist(), top.tolist()))
                for level, n in zip(levels.tolist(), rows.tolist()):
                    count[level] = count.get(level, 0) + n
            pos += x.shape[0]
    if pending is not None:
        files.append("dv", np.asarray([pending[0]]))
        files.append("dcum", np.asarray([pending[1]]))
    if n_bulk < n_in:
        levels = sorted(longest)
        bounds = merge_sparse_bins(np.asarray([longest[k] for k in levels], dtype=np.float64),
                                   np.asarray([count[k] for k in levels], dtype=np.int64))
        return n_bulk, float(fence), bounds  # type: ignore[arg-type]
    return n_in, None, np.empty(0)


def _token_cells(files: SpillFiles, s: _Scan, dbounds: npt.NDArray[np.float64], block: int, fenced: bool,
                 overflow_bins: int) -> TokenCells:
    """Pass 3: the (duration bin, token count) cells, seconds summed in row order."""
    nd = int(dbounds.shape[0])
    span = s.t_max - s.t_min + 1
    dense = nd * span <= max(block, 1 << 16)  # dense cells no larger than a block
    keys = np.arange(nd * span, dtype=np.int64) if dense else np.empty(0, np.int64)
    w = np.zeros(keys.shape[0], dtype=np.float64)
    c = np.zeros(keys.shape[0], dtype=np.int64)
    hold = -1
    for d, t in _stored(files, s, block):
        dbin = np.searchsorted(dbounds, d, side="left").astype(np.int64)
        if fenced and overflow_bins:
            up = t[dbin < nd - overflow_bins]
            hold = max(hold, int(up.max())) if up.shape[0] else hold
        key = dbin * span + (t - s.t_min)
        if not dense:
            new = np.setdiff1d(np.unique(key), keys, assume_unique=True)
            if new.shape[0]:
                merged = np.union1d(keys, new)
                at = np.searchsorted(merged, keys)
                w2, c2 = np.zeros(merged.shape[0]), np.zeros(merged.shape[0], np.int64)
                w2[at], c2[at] = w, c
                keys, w, c = merged, w2, c2
            key = np.searchsorted(keys, key)
        np.add.at(w, key, d)  # sequential in row order, as np.bincount's weights
        c += np.bincount(key, minlength=keys.shape[0])
    present = np.flatnonzero(c)
    h = None if not fenced else (s.t_max if not overflow_bins else hold)
    return TokenCells(keys[present], w[present], c[present], s.t_min, span, h)


def _stored(files: SpillFiles, s: _Scan, block: int) -> Iterator[tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]]:
    """The stored rows in blocks: those within the caps, then the text-only rows (duration 0)."""
    for a in range(0, s.n_in, block):
        yield (files.read_range("d", np.float64, a, min(a + block, s.n_in)),
               files.read_range("t", np.int64, a, min(a + block, s.n_in)))
    for a in range(0, s.n_text, block):
        t = files.read_range("t0", np.int64, a, min(a + block, s.n_text))
        yield np.zeros(t.shape[0], np.float64), t


def _allocate(files: SpillFiles, s: _Scan, grid: Grid, strict: bool, block: int) -> AllocationTotals:
    """Pass 4: the allocation of the stored rows, block by block (it is per row)."""
    out = AllocationTotals.of(grid)
    for d, t in _stored(files, s, block):
        out.add(allocate(d, t, grid, strict=strict), d)
    return out
