"""An epoch's entries when they are not every row once (:class:`EpochDraw`): a weighted epoch
drawn bucket by bucket (:func:`draw_epoch`, :class:`bucketing.quota.QuotaSampler`), or a
re-plan's unseen rest counted from the parent's shards (:func:`draw_rows`). The times each
row of bucket ``k`` is taken lie in the spill's ``x{k}`` column (int32)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from bucketing.batching import bucket_sums
from bucketing.quota import QuotaSampler
from dataprep.planning.exclude import ExcludedDraw, is_excluded
from dataprep.planning.spill import SpilledCorpus


@dataclass(frozen=True)
class EpochDraw:
    """An epoch's entries per bucket when they are not every row once (a weighted epoch,
    :func:`draw_epoch`; the unseen rest of a re-planned one): times each row of bucket ``k`` is
    taken lie in the epoch's ``x{k}`` file (int32, the bucket's column order); the entries per
    bucket and their real totals (as :func:`bucketing.batching.multiset_totals`);
    ``num_corpora`` > 0: per-corpus totals are counted (the spill holds corpus codes)."""

    num_corpora: int
    counts: npt.NDArray[np.int64]
    total_d: float
    total_t: float


def drawn_entries(corpus: SpilledCorpus, k: int) -> npt.NDArray[np.int64]:
    """Bucket ``k``'s entries of the epoch drawn (its ``x{k}`` file) as positions into its
    columns: ascending, a row taken twice listed twice (the in-memory multiset's bucket ``k``,
    :mod:`bucketing.quota`)."""
    return _entries(corpus.files.read(f"x{k}", np.int32))


def _entries(times: npt.NDArray[np.integer]) -> npt.NDArray[np.int64]:
    """Positions ``0 .. len(times) - 1``, each listed ``times`` times."""
    return np.repeat(np.arange(times.shape[0], dtype=np.int64), times)


def draw_epoch(corpus: SpilledCorpus, sampler: QuotaSampler, epoch: int) -> EpochDraw:
    """Draw a weighted epoch bucket by bucket (one bucket's codes, indices, durations and
    tokens in memory): each row's times taken (:meth:`bucketing.quota.QuotaSampler.times`) to
    the ``x{k}`` files, the entries per bucket and their totals."""
    return _epoch_draw(corpus, lambda k: sampler.times(corpus.column(k, "c", np.int32),
                                                       corpus.column(k, "i", corpus.row_dtype), epoch),
                       sampler.sizes.shape[0])


def _epoch_draw(corpus: SpilledCorpus, times_of: Callable[[int], npt.NDArray[np.integer]],
                num_corpora: int, write: bool = True) -> EpochDraw:
    """The :class:`EpochDraw` of the times ``times_of(k)`` each row of bucket ``k`` is taken
    (``write``: to its ``x{k}`` file; else ``times_of`` reads that file): entries and totals
    per bucket, one pass."""
    files = corpus.files
    counts = np.zeros_like(corpus.counts)
    total_d = total_t = 0.0
    for k in np.flatnonzero(corpus.counts).tolist():
        times = times_of(k).astype(np.int32, copy=False)
        if write:
            files.append(f"x{k}", times)
        rep = _entries(times)
        x, y = bucket_sums(corpus.column(k, "d", np.float64)[rep], corpus.column(k, "t", np.int32)[rep])
        counts[k], total_d, total_t = rep.shape[0], total_d + x, total_t + y
    files.close()
    return EpochDraw(num_corpora, counts, max(total_d, 1e-300), max(total_t, 1e-300))


#: Bytes of memory per manifest row of a block of :func:`draw_rows` (its int64 count and, per
#: bucket, the counts of its rows).
ROW_COUNT_BYTES = 16


def draw_rows(corpus: SpilledCorpus, blocks: Callable[[], Iterator[npt.NDArray[np.int64]]], num_corpora: int,
              block_rows: int) -> tuple[EpochDraw, int]:
    """An epoch of the rows ``blocks()`` yields (manifest rows, each as often as listed, in any
    order; e.g. the unseen rest of a re-planned epoch, read from its shards) as an
    :class:`EpochDraw`, and how many of them lie in no bucket. Memory: a count per row of
    ``block_rows`` manifest rows at a time (:data:`ROW_COUNT_BYTES` each), each block another
    pass of ``blocks()``; then one bucket's rows."""
    files = corpus.files
    live = np.flatnonzero(corpus.counts).tolist()
    listed = placed = 0
    for a in range(0, corpus.num_rows, block_rows):
        b = min(corpus.num_rows, a + block_rows)
        times = np.zeros(b - a, dtype=np.int64)
        for rows in blocks():  # a row group at a time: its rows' counts, not a block-sized bincount
            u, n = np.unique(rows[(rows >= a) & (rows < b)] - a, return_counts=True)
            times[u] += n
        listed += int(times.sum(dtype=np.int64))
        for k in live:
            own = corpus.column(k, "rows", corpus.row_dtype)
            got = times[own[np.searchsorted(own, a):np.searchsorted(own, b)] - a]
            placed += int(got.sum(dtype=np.int64))
            files.append(f"x{k}", got.astype(np.int32))
    files.close()
    return _epoch_draw(corpus, lambda k: corpus.files.read(f"x{k}", np.int32), num_corpora, write=False), \
        listed - placed


def draw_without(corpus: SpilledCorpus, excluded: npt.NDArray[np.int64], num_corpora: int) -> EpochDraw:
    """An epoch of every row once except ``excluded`` (sorted, unique manifest row numbers; a
    re-plan's ``--exclude``), as an :class:`EpochDraw`; memory: one bucket's rows."""
    def times(k: int) -> npt.NDArray[np.int32]:
        own = corpus.column(k, "rows", corpus.row_dtype).astype(np.int64, copy=False)
        return (~is_excluded(own, excluded)).astype(np.int32)

    return _epoch_draw(corpus, times, num_corpora)


def draw_weighted_without(corpus: SpilledCorpus, draw: ExcludedDraw, sampler: QuotaSampler, names: list[str],
                          epoch: int) -> EpochDraw:
    """A weighted epoch of ``sampler``'s quotas drawn from the rows ``draw`` leaves (a re-plan's
    ``--exclude``, :class:`dataprep.planning.exclude.ExcludedDraw`), as :func:`draw_epoch`."""
    remaining = draw.sampler(sampler, names)
    return _epoch_draw(corpus, lambda k: draw.times(k, remaining, epoch), sampler.sizes.shape[0])
