"""Forming batches inside buckets: which utterances train together.

Shared by the padding report (which predicts what training sees) and the planner (which
writes it), so both form batches the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from bucketing.bucket_order import (DEFAULT_AUDIO_WEIGHT, DEFAULT_SORT_BY, DEFAULT_WINDOW, BucketGrouping,
                                   resolve_sort)


@dataclass(frozen=True)
class Batches:
    """Batches in CSR layout.

    ``rows[offsets[i]:offsets[i+1]]`` are the manifest row numbers of batch ``i``, which
    belongs to bucket ``bucket[i]``. Batches are grouped by bucket (ascending) and, inside a
    bucket, in the order training should draw them.
    """

    bucket: npt.NDArray[np.int32]  # (num_batches,)
    offsets: npt.NDArray[np.int64]  # (num_batches + 1,), offsets[0] == 0
    rows: npt.NDArray[np.int64]  # (num_rows,)

    @property
    def num_batches(self) -> int:
        return int(self.bucket.shape[0])

    def sizes(self) -> npt.NDArray[np.int64]:
        """Utterances per batch."""
        return np.diff(self.offsets)


def gather_segments(offsets: npt.NDArray[np.int64],
                    order: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Take the CSR segments of ``offsets`` in the order ``order``: (new offsets, index of
    each new position into the old values), so ``values[index]`` is the reordered CSR."""
    sizes = offsets[1:][order] - offsets[:-1][order]
    new_off = np.zeros(order.shape[0] + 1, dtype=np.int64)
    np.cumsum(sizes, out=new_off[1:])
    return new_off, run_positions(offsets[:-1][order], sizes)


def run_positions(starts: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Every position of the runs ``starts[i] : starts[i] + sizes[i]``, run after run."""
    first = np.cumsum(sizes) - sizes
    return np.repeat(starts - first, sizes) + np.arange(int(np.sum(sizes)), dtype=np.int64)


def _small_int(values: npt.NDArray[Any], upper: int) -> npt.NDArray[Any]:
    """``values`` (0 .. upper) in the smallest signed dtype (radix sorts for <= 16 bits)."""
    for dt in (np.int8, np.int16, np.int32):
        if upper <= np.iinfo(dt).max:
            return values.astype(dt, copy=False)
    return values.astype(np.int64, copy=False)


def form_batches(
    bucket_of_row: npt.NDArray[np.integer],
    batch_sizes: npt.NDArray[np.integer],
    rng: np.random.Generator,
    num_tokens: npt.NDArray[np.integer] | None = None,
    *,
    duration: npt.NDArray[np.floating] | None = None,
    window: int = DEFAULT_WINDOW,
    sort_by: str = DEFAULT_SORT_BY,
    groups: int | None = None,
    audio_weight: float = DEFAULT_AUDIO_WEIGHT,
    rows: npt.NDArray[np.integer] | None = None,
    world_size: int | None = None,
) -> Batches:
    """Group each bucket's rows into batches of its batch size.

    Each bucket's rows are shuffled; then, when ``window > 1`` and the sort key is given,
    consecutive runs of ``window * batch_size`` shuffled rows are sorted by the key
    (``sort_by="tokens"`` uses ``num_tokens``, ``"duration"`` uses ``duration``, random
    tie-break) so a batch holds similar lengths, and the full batches of a bucket are drawn
    in a random order. ``window <= 1``, ``sort_by="none"`` or a missing key = plain shuffle.
    ``sort_by="both"`` (the default when both keys are given) groups by duration and tokens,
    choosing per window the order with the least cost (``audio_weight`` × the audio padding
    it adds + the token padding it adds, as shares of the epoch's real audio and tokens); a
    bucket of at most ``window`` batches also tries box peeling, which fits small buckets
    (a few batches) much better than any sort. There the batches' composition varies across
    epochs only through ties, as with any whole-bucket sort; their order is still random.

    Vectorized over windows and batches; the one loop runs over buckets, so each bucket's
    rows stay in cache: a radix sort groups rows by bucket, then per bucket a shuffle and,
    per sort key, one row-wise sort of its (windows × span) grid of packed words
    (:func:`_sort_in_windows`). Durations sort on a 16-bit key over their bucket's range
    (closer values tie, broken at random). 10M rows: about 2 s on one core.

    Parameters
    ----------
    bucket_of_row: bucket index per manifest row (``-1`` = not allocated, skipped).
    batch_sizes: utterances per batch, per bucket (>= 1).
    rng: the only source of randomness; equal seeds give equal batches.
    num_tokens: tokens per row (incl. prompt), the default sort key.
    duration: seconds per row, the key for ``sort_by="duration"``.
    audio_weight: see above (>= 0).
    rows: the rows to batch as a multiset (a row listed k times is batched k times: a
    weighted epoch, :mod:`bucketing.quota`); None: every allocated row once.
    world_size: balanced steps: near-equal batches per bucket that fill whole steps of this
    many ranks (:func:`cut_batches`); None: full batches and one short last batch.

    Invariant: every allocated row (every entry of ``rows``) is in exactly one batch; no batch
    exceeds its bucket's batch size; only a bucket's last batch may be smaller (``world_size``:
    a bucket's batch sizes differ by at most one).
    """
    sort_by = resolve_sort(sort_by, num_tokens is not None, duration is not None)
    batch_sizes = np.asarray(batch_sizes, dtype=np.int64)
    bucket_of_row = np.asarray(bucket_of_row)
    multiset = rows
    if multiset is None:
        rows, counts, first = _rows_by_bucket(bucket_of_row, int(batch_sizes.shape[0]))
    else:
        rows, counts, first = _multiset_by_bucket(bucket_of_row, np.asarray(multiset), int(batch_sizes.shape[0]))
    if rows.shape[0] == 0:
        return Batches(bucket=np.zeros(0, np.int32), offsets=np.zeros(1, np.int64), rows=np.zeros(0, np.int64))
    grouping = BucketGrouping(sort_by, window, groups, audio_weight)
    if grouping.both:  # shares are of the batched rows' totals (a multiset's: as often as batched)
        grouping = grouping.with_totals(*(allocated_totals(duration, num_tokens, bucket_of_row) if multiset is None
                                          else multiset_totals(duration, num_tokens, rows, counts)))
    d_all = None if duration is None else np.asarray(duration, dtype=np.float64)
    t_all = None if num_tokens is None else np.asarray(num_tokens)
    nb = None if world_size is None else even_batch_counts(counts, batch_sizes, world_size)
    for k in np.flatnonzero(counts):  # loop over buckets; windows and batches vectorized
        lo, cnt = int(first[k]), int(counts[k])
        idx = rows[lo:lo + cnt]  # ascending: gathers from it stream through memory
        p = grouping.order(cnt, int(batch_sizes[k]), rng, None if d_all is None else d_all[idx],
                           None if t_all is None else t_all[idx], batches=None if nb is None else int(nb[k]))
        rows[lo:lo + cnt] = idx[p]
    cut = cut_batches(counts, batch_sizes, rng if grouping.grouped(d_all is not None, t_all is not None) else None,
                      batch_counts=nb)
    offsets, src = gather_segments(cut.pre_offsets(), cut.perm)
    return Batches(bucket=cut.bucket, offsets=offsets, rows=rows[src])


#: Rows per block of :func:`allocated_totals` (the sums are per block, then added in order, so
#: a reader that streams a manifest in blocks of this many rows gets the same totals, bit for bit).
TOTALS_BLOCK = 1 << 20


def block_totals(d: npt.NDArray[np.float64], t: npt.NDArray[Any], allocated: npt.NDArray[np.bool_]) -> tuple[float, float]:
    """(seconds, tokens) of the allocated rows of one block of at most :data:`TOTALS_BLOCK` rows."""
    where: Any = True if allocated.all() else allocated
    return float(d.sum(where=where)), float(t.sum(dtype=np.float64, where=where))


def allocated_totals(duration: npt.ArrayLike, num_tokens: npt.ArrayLike,
                     bucket_of_row: npt.NDArray[np.integer]) -> tuple[float, float]:
    """Real seconds and tokens of the allocated rows (bucket >= 0), summed per block of
    :data:`TOTALS_BLOCK` rows in row order, then across blocks (each at least 1e-300)."""
    d = np.asarray(duration, dtype=np.float64)
    t = np.asarray(num_tokens)
    sd = st = 0.0
    for a in range(0, d.shape[0], TOTALS_BLOCK):
        x, y = block_totals(d[a:a + TOTALS_BLOCK], t[a:a + TOTALS_BLOCK], bucket_of_row[a:a + TOTALS_BLOCK] >= 0)
        sd, st = sd + x, st + y
    return max(sd, 1e-300), max(st, 1e-300)


def multiset_totals(duration: npt.ArrayLike, num_tokens: npt.ArrayLike, rows: npt.NDArray[np.int64],
                    counts: npt.NDArray[np.int64]) -> tuple[float, float]:
    """Real seconds and tokens of a multiset's ``rows`` grouped by bucket (``counts`` entries
    per bucket, each as often as listed): summed per bucket (:func:`bucket_sums`), then across
    buckets in order; each at least 1e-300. A planner that holds one bucket at a time gets the
    same totals, bit for bit."""
    d_all, t_all = np.asarray(duration, dtype=np.float64), np.asarray(num_tokens)
    total_d = total_t = 0.0
    at = 0
    for cnt in counts.tolist():
        x, y = bucket_sums(d_all[rows[at:at + cnt]], t_all[rows[at:at + cnt]])
        total_d, total_t, at = total_d + x, total_t + y, at + cnt
    return max(total_d, 1e-300), max(total_t, 1e-300)


def bucket_sums(d: npt.NDArray[np.float64], t: npt.NDArray[Any]) -> tuple[float, float]:
    """(seconds, tokens) of one bucket's entries of a multiset."""
    return float(d.sum()), float(t.sum(dtype=np.float64))


def _rows_by_bucket(bucket_of_row: npt.NDArray[np.integer],
                    num_buckets: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(allocated rows grouped by bucket, ascending inside; rows per bucket; first index of
    each bucket), by a stable radix sort on a small dtype."""
    valid = bucket_of_row >= 0
    sel = None if valid.all() else np.flatnonzero(valid)
    del valid
    b0 = bucket_of_row if sel is None else bucket_of_row[sel]
    counts = np.bincount(b0, minlength=num_buckets).astype(np.int64)
    rows = np.argsort(_small_int(b0, num_buckets - 1), kind="stable").astype(np.int64, copy=False)
    if sel is not None:
        rows = sel[rows]
    first = np.zeros(num_buckets, dtype=np.int64)
    np.cumsum(counts[:-1], out=first[1:])
    return rows, counts, first


def _multiset_by_bucket(bucket_of_row: npt.NDArray[np.integer], multiset: npt.NDArray[np.integer],
                        num_buckets: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """:func:`_rows_by_bucket` for a multiset of rows: its allocated entries grouped by bucket
    (in the multiset's order inside), entries per bucket, first index of each bucket."""
    b = bucket_of_row[multiset]
    keep = b >= 0
    if not keep.all():
        multiset, b = multiset[keep], b[keep]
    del keep
    counts = np.bincount(b, minlength=num_buckets).astype(np.int64)
    order = np.argsort(_small_int(b, num_buckets - 1), kind="stable")
    del b
    grouped = multiset[order]  # the multiset's own (small) dtype, then int64 with order freed
    del order
    rows = grouped.astype(np.int64, copy=False)
    del grouped
    first = np.zeros(num_buckets, dtype=np.int64)
    np.cumsum(counts[:-1], out=first[1:])
    return rows, counts, first


@dataclass(frozen=True)
class Cut:
    """Batches cut from buckets' ordered rows (laid out bucket after bucket): batch ``i`` of the
    draw order is batch ``perm[i]`` of the cut order, whose rows start at ``starts[perm[i]]``."""

    starts: npt.NDArray[np.int64]  # cut order: first position of each batch
    sizes: npt.NDArray[np.int64]  # cut order
    perm: npt.NDArray[np.int64]  # draw order -> cut order
    bucket: npt.NDArray[np.int32]  # draw order

    def pre_offsets(self) -> npt.NDArray[np.int64]:
        """CSR offsets of the cut order."""
        return np.append(self.starts, self.starts[-1] + self.sizes[-1] if self.sizes.shape[0] else 0).astype(np.int64)


def cut_batches(counts: npt.NDArray[np.int64], batch_sizes: npt.NDArray[np.int64],
                rng: np.random.Generator | None, *, batch_counts: npt.NDArray[np.int64] | None = None) -> Cut:
    """Cut each bucket's ordered rows (``counts`` per bucket, bucket after bucket) into batches
    of its size; with ``rng``, draw the full batches of a bucket in random order (a short batch
    stays last). Per batch only: what a planner that keeps rows on disk needs.

    ``batch_counts`` (balanced steps, :func:`even_batch_counts`): each bucket's rows are cut
    into that many near-equal batches instead (``count mod batches`` of one row more first;
    sizes differ by at most one), all drawn in random order."""
    first = np.zeros(counts.shape[0], dtype=np.int64)
    np.cumsum(counts[:-1], out=first[1:])
    if batch_counts is None:
        starts = np.concatenate([np.arange(0, int(c), int(s)) + f
                                 for c, s, f in zip(counts, batch_sizes, first)]).astype(np.int64)
        bb = np.repeat(np.arange(batch_sizes.shape[0], dtype=np.int64), -(-counts // batch_sizes))
    else:
        nb = np.asarray(batch_counts, dtype=np.int64)
        bb = np.repeat(np.arange(batch_sizes.shape[0], dtype=np.int64), nb)
        starts = first[bb] + even_batch_starts(counts, nb)
    n = int(counts.sum())
    sizes = np.diff(np.append(starts, n)).astype(np.int64)
    perm = np.arange(bb.shape[0], dtype=np.int64)
    if rng is not None and bb.shape[0] > 1:
        short = sizes < batch_sizes[bb] if batch_counts is None else np.zeros(bb.shape[0], dtype=bool)
        bkey = np.where(short, 2.0, rng.random(bb.shape[0]))
        perm = np.lexsort((bkey, bb))
    return Cut(starts, sizes, perm, bb[perm].astype(np.int32))


def even_batch_starts(counts: npt.NDArray[np.int64], batch_counts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Where each near-equal batch starts inside its bucket (positions), bucket after bucket:
    a bucket of ``c`` rows cut into ``n`` batches starts its ``k``-th at ``k q + min(k, r)``
    (``q, r = divmod(c, n)``: the first ``r`` batches hold one more row)."""
    nb = np.asarray(batch_counts, dtype=np.int64)
    c = np.asarray(counts, dtype=np.int64)
    bb = np.repeat(np.arange(nb.shape[0], dtype=np.int64), nb)
    k = np.arange(bb.shape[0], dtype=np.int64) - np.repeat(np.cumsum(nb) - nb, nb)  # index inside its bucket
    q, r = np.divmod(c[bb], np.maximum(nb[bb], 1))
    return k * q + np.minimum(k, r)


def even_batch_counts(counts: npt.NDArray[np.int64], batch_sizes: npt.NDArray[np.int64],
                      world_size: int) -> npt.NDArray[np.int64]:
    """Batches per bucket for near-equal batches that fill whole steps of ``world_size``.

    Each bucket needs ``ceil(count / batch_size)`` batches (B in all); the last step's
    ``W - B mod W`` free slots each go to one more batch of the bucket whose batches would then
    stay the fullest (its smallest batch's ``(count // batches) / batch_size``, then the mean
    ``count / (batches * batch_size)``, then the lower bucket), a bucket at most ``count``
    batches; where fewer rows than slots remain, slots stay free. Vectorized over
    (bucket, extra batch) candidates; batches per bucket never fall below the minimum, so the
    steps per epoch are ``ceil(B / W)`` whenever the slots are filled.
    """
    c = np.asarray(counts, dtype=np.int64)
    bs = np.asarray(batch_sizes, dtype=np.int64)
    nb = -(-c // bs)
    W = int(world_size)
    free = (-int(nb.sum())) % W
    if free == 0:
        return nb
    j = np.arange(1, free + 1, dtype=np.int64)  # the j-th extra batch of a bucket
    n_after = nb[:, None] + j[None, :]
    ok = (n_after <= c[:, None]) & (c[:, None] > 0)
    least = np.where(ok, (c[:, None] // np.maximum(n_after, 1)) / bs[:, None], -1.0)  # smallest batch's fill
    mean = np.where(ok, c[:, None] / (n_after * bs[:, None]), -1.0)
    flat, flat_mean = least.ravel(), mean.ravel()
    idx = np.arange(flat.shape[0])
    pick = np.lexsort((idx, -flat_mean, -flat))[:free]  # both fall with j: the top picks are prefixes per bucket
    pick = pick[flat[pick] > 0]
    return nb + np.bincount(pick // free, minlength=nb.shape[0])


def form_batches_cumulative(
    bucket_of_row: npt.NDArray[np.integer],
    duration: npt.NDArray[np.floating],
    budget: float,
    rng: np.random.Generator,
) -> Batches:
    """The cumulative-duration heuristic (Lhotse ``max_duration``, Canary-1B's 360 s).

    Each bucket's rows are shuffled and taken greedily while the sum of their real durations
    (s) stays <= ``budget`` (a single longer row forms a batch alone). Loops over batches,
    not rows.
    """
    bucket_of_row = np.asarray(bucket_of_row)
    d_all = np.asarray(duration, dtype=np.float64)
    rows = np.flatnonzero(bucket_of_row >= 0).astype(np.int64)
    order = np.lexsort((rng.random(rows.shape[0]), bucket_of_row[rows]))
    rows = rows[order]
    b = bucket_of_row[rows].astype(np.int64)
    n = rows.shape[0]
    cum = np.concatenate([[0.0], np.cumsum(d_all[rows])])
    bucket_end = np.append(np.flatnonzero(b[1:] != b[:-1]) + 1, n)
    firsts: list[int] = []
    s = 0
    e_idx = 0
    while s < n:
        while bucket_end[e_idx] <= s:
            e_idx += 1
        end = int(np.searchsorted(cum, cum[s] + budget * (1 + 1e-12), side="right")) - 1
        end = min(max(end, s + 1), int(bucket_end[e_idx]))
        firsts.append(s)
        s = end
    first = np.asarray(firsts, dtype=np.int64)
    offsets = np.append(first, n).astype(np.int64)
    return Batches(bucket=b[first].astype(np.int32) if n else np.zeros(0, np.int32), offsets=offsets, rows=rows)
