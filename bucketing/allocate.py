"""Allocation: which bucket each utterance trains in (vectorized with ``np.searchsorted``).

Flexible (the default): buckets are ordered by duration bin, then token sub-bin. A row
(d, t) starts at the first duration bin with ``max_duration >= d`` and takes, in that bin and
then each later one, the first sub-bin with ``max_tokens >= t``: a row with unusually many
tokens moves to a longer bin, never dropped; one with more tokens than every bucket from its
bin on goes to the last bucket, whose ``max_tokens`` is raised to hold it (reported; never
for the rows a grid was fitted on). Only rows outside the duration grid are left out
(reasons ``min_duration``, ``max_duration``).

Strict (NeMo's ``strict_2d``): a row may only use the sub-bins of its own duration bin;
rows beyond them or beyond the grid are dropped with reason ``exceeds_bucket``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from bucketing.budget import budget_source, padded_budget_batch_sizes
from bucketing.fit import FitResult, Grid, grid_to_buckets
from manifests.buckets_file import BucketSpec


@dataclass(frozen=True)
class Allocation:
    """Bucket per row (``-1`` = left out) and what was left out, by reason."""

    bucket: npt.NDArray[np.int32]
    dropped: dict[str, npt.NDArray[np.int64]] = field(default_factory=dict)  # reason -> rows
    moved: int = 0  # rows placed in a later duration bin than their duration needs
    max_tokens: npt.NDArray[np.int64] | None = None  # per bucket, after any raise
    raised: int = 0  # rows that made the last bucket's max_tokens grow

    @property
    def num_dropped(self) -> int:
        return int(sum(v.shape[0] for v in self.dropped.values()))

    def counts(self, num_buckets: int) -> npt.NDArray[np.int64]:
        """Rows per bucket."""
        b = self.bucket[self.bucket >= 0]
        return np.bincount(b, minlength=num_buckets).astype(np.int64)


def _duration_layout(grid: Grid) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """Duration-bin bounds and the first bucket of each bin (plus an end sentinel)."""
    first = np.flatnonzero(np.append(True, grid.duration_bin[1:] != grid.duration_bin[:-1]))
    return grid.max_duration[first], np.append(first, grid.num_buckets).astype(np.int64)


#: Most cells of a lookup table that replaces a binary search (:func:`bin_of`, the token
#: table of :func:`allocate`); beyond it they fall back to ``np.searchsorted``.
_MAX_TABLE = 1 << 22


def bin_of(values: npt.NDArray[np.float64], bounds: npt.NDArray[np.float64]) -> npt.NDArray[np.int32]:
    """``np.searchsorted(bounds, values, side="left")`` (bounds ascending, distinct), exactly,
    in int32, several times faster on many values.

    A table over equal cells no wider than half the smallest gap between bounds gives each
    value's count of bounds below its cell's left edge, off by at most one (a cell holds at
    most one bound, rounding moves a value at most into a neighbouring cell); one comparison
    each way corrects it. Falls back to ``np.searchsorted`` when the table would be large.
    """
    v = np.asarray(values, dtype=np.float64)
    nb = int(bounds.shape[0])
    finite = bool(nb) and bool(np.isfinite(bounds).all())
    lo, hi = (float(bounds[0]), float(bounds[-1])) if finite else (0.0, 0.0)
    gap = float(np.diff(bounds).min()) if nb > 1 else max(hi - lo, 1.0)
    # cells far wider than the rounding of values near the bounds (else: a binary search)
    usable = finite and gap > 1e-9 * max(abs(lo), abs(hi))
    cells = int(np.ceil((hi - lo) / (gap / 2))) + 2 if usable else _MAX_TABLE + 1
    if cells > _MAX_TABLE or v.shape[0] < 4 * cells:
        return np.searchsorted(bounds, v, side="left").astype(np.int32)
    step = gap / 2
    edges = lo - step + step * np.arange(cells + 1)
    table = np.searchsorted(bounds, edges, side="left").astype(np.int32)
    c = (v - (lo - step)) * (1.0 / step)
    np.clip(c, 0, cells, out=c)  # below / above the grid: the first / last cell (nan: last)
    c[np.isnan(c)] = cells
    j = table[c.astype(np.int32)]
    del c
    ext = np.append(bounds, np.inf)  # ext[nb] = inf: nothing above the last bound moves up
    j += ext[j] < v
    prev = np.append(-np.inf, bounds)  # prev[j] = bounds[j - 1]
    j -= prev[j] >= v
    return j


def allocate(
    duration: npt.ArrayLike,
    num_tokens: npt.ArrayLike | None,
    grid: Grid,
    strict: bool = False,
) -> Allocation:
    """Allocate rows to the buckets of ``grid`` (see the module docstring for the rule).

    Invariant: every row gets exactly one bucket or exactly one drop reason; an allocated
    row never exceeds its bucket's bounds (``max_tokens`` of the last bucket may be raised
    in flexible mode, and the raised value is returned).
    """
    d = np.asarray(duration, dtype=np.float64)
    n = d.shape[0]
    t = np.zeros(n, dtype=np.int32) if num_tokens is None else np.asarray(num_tokens)
    if not np.issubdtype(t.dtype, np.integer):
        t = t.astype(np.int64)
    dbounds, first = _duration_layout(grid)
    nd = dbounds.shape[0]
    max_tokens = grid.max_tokens.astype(np.int64).copy()
    bin_max_t = max_tokens[first[1:] - 1]  # last sub-bin of each duration bin

    j = bin_of(d, dbounds)
    bucket = np.full(n, -1, dtype=np.int32)
    dropped: dict[str, npt.NDArray[np.int64]] = {}
    lo = float(grid.min_duration[0]) if grid.num_buckets else float("nan")
    below = d < lo if np.isfinite(lo) else np.zeros(n, dtype=bool)
    beyond = j >= nd
    inside = ~(below | beyond)
    jc = np.minimum(j, nd - 1)
    fits = t <= bin_max_t[jc]
    fits &= inside
    del jc
    moved = 0
    raised = 0
    if strict:
        over = inside & ~fits
        if below.any():
            dropped["min_duration"] = np.flatnonzero(below)
        bad = beyond | over
        if bad.any():
            dropped["exceeds_bucket"] = np.flatnonzero(bad)
    else:
        if below.any():
            dropped["min_duration"] = np.flatnonzero(below)
        if beyond.any():
            dropped["max_duration"] = np.flatnonzero(beyond)
        over = np.flatnonzero(inside & ~fits)
        if over.shape[0]:
            jo, to = j[over], t[over]
            placed = np.zeros(over.shape[0], dtype=bool)
            for k in range(1, nd):  # loop over bins: move rows one bin on at a time
                cand = ~placed & (jo + k < nd)
                if not cand.any():
                    break
                ok = cand & (to <= bin_max_t[np.minimum(jo + k, nd - 1)])
                jo[ok] += k
                placed |= ok
            moved = int(placed.sum())
            j[over] = jo
            rest = over[~placed]
            if rest.shape[0]:  # more tokens than any bucket from its bin on: last bucket grows
                j[rest] = nd - 1
                max_tokens[-1] = max(int(max_tokens[-1]), int(t[rest].max()))
                bin_max_t[-1] = max_tokens[-1]
                raised = int(rest.shape[0])
            fits = inside
    # first sub-bin of bin j holding t: one search over (bin, tokens) keys, ascending by
    # design; a (bin, tokens) table when it is small (every placed row has t <= its bin's max)
    big = int(max(max_tokens.max(initial=0), t.max(initial=0))) + 1
    keys = grid.duration_bin.astype(np.int64) * big + max_tokens
    t_lo = int(t.min(initial=0))
    span = int(max_tokens.max(initial=0)) - t_lo + 1
    if nd and t_lo >= 0 and nd * span <= _MAX_TABLE and nd * span <= n:
        cell = np.arange(nd, dtype=np.int64)[:, None] * big + (t_lo + np.arange(span))[None, :]
        table = np.searchsorted(keys, cell.ravel(), side="left").astype(np.int32)
        k = np.minimum(j, nd - 1)  # rows beyond the grid are not written
        k *= span
        k += np.minimum(t, t_lo + span - 1) - t_lo  # rows that do not fit are not written
        np.copyto(bucket, table[k], where=fits)
    else:
        rows = np.flatnonzero(fits)
        bucket[rows] = np.searchsorted(keys, j[rows].astype(np.int64) * big + t[rows], side="left")
    return Allocation(bucket=bucket, dropped=dropped, moved=moved, max_tokens=max_tokens, raised=raised)


def fitted_spec(fit: FitResult, max_tokens: npt.NDArray[np.int64] | None, counts: npt.NDArray[np.int64],
                seconds: npt.NDArray[np.float64], dropped: dict[str, int], moved: int, *, strict: bool,
                max_duration_budget: float | None, max_frames_budget: int | None, max_tokens_budget: int | None,
                frame_shift: float, manifest_hash: str | None) -> BucketSpec:
    """``buckets.json``'s content from a fit and what its allocation gave: the token bounds
    after any raise, rows and seconds per bucket (seconds summed in row order), rows left out
    per reason and rows moved to a longer bin (:func:`bucketing.fit_passes.fit_blocks`)."""
    grid = fit.grid
    if max_tokens is not None:
        grid = Grid(grid.max_duration, max_tokens, grid.min_duration, grid.duration_bin, grid.token_bin)
    budgets = dict(max_duration_budget=max_duration_budget, max_frames_budget=max_frames_budget,
                   max_tokens_budget=max_tokens_budget)
    sizes = padded_budget_batch_sizes(grid.max_duration, grid.max_tokens, frame_shift=frame_shift, **budgets)
    report = fit.report()
    report["allocation"] = "strict" if strict else "flexible"
    report["dropped"] = {k: int(v) for k, v in sorted(dropped.items())}
    report["moved"] = int(moved)
    if manifest_hash is not None:
        report["manifest_hash"] = manifest_hash
    return BucketSpec(
        buckets=grid_to_buckets(grid, sizes, counts, seconds),
        batch_size_source=budget_source(frame_shift=frame_shift, **budgets),
        fit=report,
    )


def largest_rows(rows: npt.NDArray[np.int64], key: npt.NDArray[Any], count: int) -> npt.NDArray[np.int64]:
    """Positions of the ``count`` rows of largest ``key``, ties to the larger row number (the
    set ``np.lexsort((rows, key))[-count:]`` picks): those above the threshold in position
    order, then the tied ones by row number. O(n): a partition, no sort of the bucket."""
    kth = rows.shape[0] - count
    threshold = np.partition(key, kth)[kth]
    above = np.flatnonzero(key > threshold)
    need = count - above.shape[0]
    tied = np.flatnonzero(key == threshold)
    tied = tied[np.argsort(rows[tied], kind="stable")]
    return np.concatenate([above, tied[tied.shape[0] - need:]]).astype(np.int64, copy=False)


def carry_tails(
    bucket: npt.NDArray[np.integer],
    duration: npt.NDArray[np.floating],
    num_tokens: npt.NDArray[np.integer] | None,
    batch_sizes: npt.ArrayLike,
    max_tokens: npt.ArrayLike,
    duration_bin: npt.ArrayLike,
    across_bins: bool = False,
    max_tail_fraction: float = 0.5,
) -> tuple[npt.NDArray[np.int32], int]:
    """Fill the next bucket with each bucket's leftover rows instead of a small last batch.

    Buckets are visited in order (duration bin, then token sub-bin). Bucket ``k``'s rows beyond
    a multiple of its batch size (``n_k mod batch_size_k``, counting rows carried in) move to
    the first later bucket whose ``max_tokens`` holds them; every later bucket holds their
    duration, since bins only grow. By default only the token sub-bins of the same duration
    bin take them (``across_bins=False``: the duration, hence audio padding, is untouched);
    with ``across_bins`` the next duration bins do too. The rows carried are those nearest
    the next bucket: most tokens when it is the next token sub-bin of the same duration bin,
    longest otherwise (ties by row number, so the result is deterministic). Rows no allowed
    bucket holds stay.

    Only tails of at most ``max_tail_fraction`` of a batch are carried (default 0.5: a batch
    less than half full is what drags the mean batch size down; a fuller one is kept, as
    carrying it costs padding). Fewer, fuller batches, at the price of a little token
    padding for the carried rows (LibriSpeech 100 h, 30×2, 600 s: mean batch 42.5 -> 43.2,
    token padding 3.31% -> 3.32%; carrying every tail: 43.6 and 3.37%; across bins too:
    44.5 and 3.73%, and audio padding grows on small corpora such as Common Voice id/ps). Invariant: every row stays allocated to a bucket
    that holds it; rows left out (``-1``) stay out. Returns (buckets, rows carried).
    """
    b = np.asarray(bucket, dtype=np.int32).copy()
    bs = np.asarray(batch_sizes, dtype=np.int64)
    mt = np.asarray(max_tokens, dtype=np.int64)
    dbin = np.asarray(duration_bin)
    nb = bs.shape[0]
    t = np.zeros(b.shape[0], dtype=np.int64) if num_tokens is None else np.asarray(num_tokens)
    d = np.asarray(duration, dtype=np.float64)
    # rows grouped by bucket, row order inside (int16 keys: numpy radix-sorts them)
    order = np.argsort(b.astype(np.int16) if nb < 2**15 - 1 else b, kind="stable")
    starts = np.searchsorted(b[order], np.arange(nb + 1))
    incoming: list[list[npt.NDArray[np.int64]]] = [[] for _ in range(nb)]
    for k in range(nb - 1):  # a loop over buckets; the rows inside are arrays
        members = np.concatenate([order[starts[k]:starts[k + 1]], *incoming[k]]).astype(np.int64)
        pick, target = tail_moves(members, t[members], d[members], k, bs, mt, dbin, across_bins, max_tail_fraction)
        for j in np.unique(target[target >= 0]):
            rows = members[pick[target == j]]
            incoming[int(j)].append(rows)
            b[rows] = j
    carried = int((b != np.asarray(bucket)).sum())  # a row may be carried on more than once
    return b, carried


def tail_moves(members: npt.NDArray[np.int64], t: npt.NDArray[np.integer], d: npt.NDArray[np.floating], k: int,
               bs: npt.NDArray[np.int64], mt: npt.NDArray[np.int64], dbin: npt.NDArray[Any], across_bins: bool = False,
               max_tail_fraction: float = 0.5, size: int | None = None
               ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """One step of :func:`carry_tails`: bucket ``k``'s ``members`` (row numbers, ``t`` / ``d``
    theirs) -> (positions into ``members`` of the tail rows, the bucket each moves to, -1: stays).
    Reads one bucket only (what an out-of-core planner holds). ``size``: the bucket's rows in
    all when ``members`` holds only its :func:`tail_candidates` and the rows carried in (the
    same moves: no row outside them can be carried)."""
    nb = bs.shape[0]
    tail = int((members.shape[0] if size is None else size) % bs[k])
    if k >= nb - 1 or tail == 0 or tail > max_tail_fraction * bs[k]:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    key = t if dbin[k + 1] == dbin[k] else d
    pick = largest_rows(members, key, tail)  # positions into members
    target = np.full(tail, -1, dtype=np.int64)
    last = nb if across_bins else int(np.searchsorted(dbin, dbin[k], side="right"))
    for j in range(k + 1, last):  # first later bucket holding the tokens; all hold the duration
        free = (target < 0) & (t[pick] <= mt[j])
        target[free] = j
        if (target >= 0).all():
            break
    return pick, target


@dataclass(frozen=True)
class Assignment:
    """Where every row trains: the allocation, then the carried bucket tails.

    ``bucket`` (int32, -1 = left out) is what batches are formed from; ``max_tokens`` the
    per-bucket token bounds the allocation used (raised where flexible allocation had to);
    ``carried`` counts the rows moved by :func:`carry_tails`; ``carry`` says if it ran.
    """

    allocation: Allocation
    bucket: npt.NDArray[np.int32]
    max_tokens: npt.NDArray[np.int64]
    carried: int
    carry: bool


def fills_steps(counts: npt.NDArray[np.int64], batch_sizes: npt.NDArray[np.int64], world_size: int) -> bool:
    """Every non-empty bucket (``counts`` rows, before tails are carried) fills at least one
    step of ``world_size`` batches: :func:`assign`'s rule for carrying tails at a world size."""
    full = counts > 0
    return bool((counts[full] >= world_size * batch_sizes[full]).all())


def assign(
    duration: npt.NDArray[np.floating],
    num_tokens: npt.NDArray[np.integer],
    grid: Grid,
    batch_sizes: npt.ArrayLike,
    *,
    strict: bool = False,
    carry: bool = True,
    world_size: int | None = None,
) -> Assignment:
    """Allocate rows to buckets, then carry bucket tails (never with ``strict``).

    With ``world_size``, tails are carried only when every non-empty bucket fills at least
    one step of ``world_size`` batches (the planner's rule: smaller buckets are placed by its
    own fallbacks); without it, always (the padding report's rule).
    """
    alloc = allocate(duration, num_tokens, grid, strict=strict)
    max_tokens = alloc.max_tokens if alloc.max_tokens is not None else grid.max_tokens
    bs = np.asarray(batch_sizes, dtype=np.int64)
    carry = carry and not strict
    if carry and world_size is not None:
        carry = fills_steps(np.bincount(alloc.bucket[alloc.bucket >= 0], minlength=bs.shape[0]), bs, world_size)
    bucket, carried = alloc.bucket, 0
    if carry:
        bucket, carried = carry_tails(bucket, duration, num_tokens, bs, max_tokens, grid.duration_bin)
    return Assignment(allocation=alloc, bucket=bucket, max_tokens=np.asarray(max_tokens), carried=carried, carry=carry)


def tail_candidates(members: npt.NDArray[np.int64], t: npt.NDArray[np.integer], d: npt.NDArray[np.floating], k: int,
                    bs: npt.NDArray[np.int64], dbin: npt.NDArray[Any], max_tail_fraction: float = 0.5
                    ) -> npt.NDArray[np.int64]:
    """Positions into bucket ``k``'s ``members`` of the rows :func:`tail_moves` may carry on,
    whichever rows join the bucket: the ``max_tail_fraction`` of a batch (at most) ranked
    first by the tail's key (tokens toward the next token sub-bin, else duration; ties to the
    larger row number). Kept block by block (the candidates of the candidates and a block's
    rows are those of all rows), they are all a streamed carry needs of a bucket."""
    nb = bs.shape[0]
    most = int(max_tail_fraction * bs[k]) if k < nb - 1 else 0
    if members.shape[0] <= most:
        return np.arange(members.shape[0], dtype=np.int64)
    if most == 0:
        return np.empty(0, np.int64)
    return largest_rows(members, t if dbin[k + 1] == dbin[k] else d, most)


def merge_tail_candidates(kept: tuple[npt.NDArray[Any], ...], block: tuple[npt.NDArray[Any], ...], k: int,
                          bs: npt.NDArray[np.int64], dbin: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], ...]:
    """Bucket ``k``'s :func:`tail_candidates` kept so far and a block's rows of it (each a tuple
    of arrays: row numbers, tokens, durations, then any columns carried along) -> the
    candidates of both, the same columns: those of all the rows seen (a streamed pass keeps
    half a batch per bucket, never the bucket)."""
    m = tuple(np.concatenate([a, b]) for a, b in zip(kept, block))
    keep = tail_candidates(m[0], m[1], m[2], k, bs, dbin)
    return tuple(x[keep] for x in m)
