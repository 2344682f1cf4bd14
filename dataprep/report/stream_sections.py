"""Sections 2 (buckets) and 3 (plan) of ``dataprep report`` fed block by block (the
:class:`RowBlock` s of the report's binning pass), in memory bounded by a budget, not by the
corpus: the same tables as whole arrays give.

- :class:`BucketRows` (section 2): rows per bucket before the carry; past the sample size, the
  seeded sample :func:`sample_rows` draws (the padding's rows) and every row's bucket exactly
  as :func:`bucketing.allocate.assign` gives it (the carry runs after the pass on each
  bucket's :func:`bucketing.allocate.tail_candidates`); a second pass sums each bucket's seconds.
- :class:`CorpusShares` (section 3): per epoch and corpus, utterances planned (exact) and their
  seconds summed in manifest row order (:func:`share_range_rows`, :func:`planned_times`,
  :func:`spill_planned_rows`).

Memory: one block; past the sample size, the sample (16 bytes a row) and half a batch per
bucket; a range of rows (:data:`SHARE_BYTES_PER_ROW` each), a shard row group. Disk:
:data:`SPILL_BYTES_PER_ROW`."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from bucketing.allocate import allocate, merge_tail_candidates, tail_moves
from bucketing.fit import Grid
from bucketing.fit_passes import AllocationTotals
from bucketing.quota import Shuffle
from manifests.arrow_views import numpy_view, single_chunk
from manifests.plan_files import PlanShard
from manifests.plan_meta import PlanMeta
from manifests.spill import SpillFiles

#: Bytes per row of a range of the corpus shares' join: corpus code (4, and 4 while it is
#: mapped to the sorted names), duration (8), its planned rows (4 each, about one a row) and
#: the times each row is planned (8).
SHARE_BYTES_PER_ROW = 28
#: Most rows per range (about 230 MB): more would only save passes over spill files.
SHARE_RANGE_ROWS = 1 << 23
#: Bytes of disk per row the corpus shares spill: corpus code and duration (12), and the
#: planned rows of the epoch being joined (4 each, about one a row).
SPILL_BYTES_PER_ROW = 16
#: Planned rows of a range added at a time (their gathered codes, times and seconds: ~30 MB).
SHARE_ADD_ROWS = 1 << 20


@dataclass(frozen=True)
class RowBlock:
    """Consecutive rows of the manifest from row ``start``: durations (s, NaN where unknown),
    tokens (0 where unknown) and, when asked for, corpus codes (in order of first appearance,
    see :class:`dataprep.report.aggregates.CorpusGroups`)."""

    start: int
    duration: npt.NDArray[np.float64]
    tokens: npt.NDArray[np.int64]
    corpus: npt.NDArray[np.int32] | None = None


def sample_rows(num_rows: int, sample: int) -> npt.NDArray[np.int64] | None:
    """The rows the padding is measured on, ascending: a seeded uniform draw of ``sample`` of
    ``num_rows`` (the first ``sample`` places of a keyed :class:`bucketing.quota.Shuffle`:
    memory of the sample, not of ``num_rows``); None (every row) when there are no more."""
    if num_rows <= sample:
        return None
    return np.sort(Shuffle(num_rows, (0, 0x5A3)).forward(np.arange(sample, dtype=np.int64)))


class BucketRows:
    """Section 2's rows, block by block (module docstring): :attr:`counts` per bucket as
    ``allocate`` gives them; past the sample (:attr:`exact`), :attr:`d` / :attr:`t` the
    sample's rows, and :attr:`counts` and :attr:`seconds` per bucket after the carried tails,
    as ``assign(d, t, grid, batch_sizes)`` of whole arrays and a weighted ``np.bincount`` give
    them (bit for bit). Call :meth:`add` on every block in order, then :meth:`carry`; when it
    returns True, :meth:`add_seconds` on every block again."""

    def __init__(self, num_rows: int, grid: Grid, batch_sizes: npt.NDArray[np.int64], sample: int) -> None:
        self.num_rows = num_rows
        self.grid, self.bs = grid, np.asarray(batch_sizes, dtype=np.int64)
        self.pick = sample_rows(num_rows, sample)
        self.exact = self.pick is not None
        #: rows the padding is measured on: the sample's, or every row (read from the manifest)
        self.measured = min(num_rows, sample)
        m = sample if self.exact else 0
        self.d, self.t = np.empty(m, np.float64), np.empty(m, np.int64)
        self.alloc = AllocationTotals.of(grid)
        nb = grid.num_buckets
        empty = (np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float64))
        self._cand: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64]]] = [empty] * nb
        self._moved_rows = np.empty(0, np.int64)
        self._moved_to = np.empty(0, np.int32)
        #: rows per bucket before the tails are carried (set by :meth:`carry`)
        self.allocated: npt.NDArray[np.int64] | None = None

    def add(self, b: RowBlock) -> None:
        """Pass 1: the block's buckets, counts and seconds; past the sample, its rows of the
        sample and the tails' candidates."""
        al = allocate(b.duration, b.tokens, self.grid)
        self.alloc.add(al, b.duration)  # the last bucket's bound raised where a row needed it, too
        if self.pick is None:
            return
        h = b.duration.shape[0]
        lo, hi = np.searchsorted(self.pick, [b.start, b.start + h])
        at = self.pick[lo:hi] - b.start
        self.d[lo:hi], self.t[lo:hi] = b.duration[at], b.tokens[at]
        nb = self.grid.num_buckets
        rows = np.flatnonzero(al.bucket >= 0)
        rows = rows[np.argsort(al.bucket[rows], kind="stable")]
        cuts = np.searchsorted(al.bucket[rows], np.arange(nb + 1))
        for k in np.flatnonzero(np.diff(cuts[:-1])).tolist():  # buckets of the block but the last
            r = rows[cuts[k]:cuts[k + 1]]
            self._cand[k] = merge_tail_candidates(self._cand[k], (r + b.start, b.tokens[r], b.duration[r]), k,  # type: ignore[assignment]
                                                  self.bs, self.grid.duration_bin)

    @property
    def counts(self) -> npt.NDArray[np.int64]:
        return self.alloc.counts

    @property
    def seconds(self) -> npt.NDArray[np.float64]:
        return self.alloc.seconds

    @property
    def carried(self) -> int:
        """Rows :meth:`carry` moved to a later bucket."""
        return int(self._moved_rows.shape[0])

    def carry(self) -> bool:
        """After pass 1: the tails carried bucket after bucket (:func:`bucketing.allocate.tail_moves`
        on each bucket's candidates and the rows carried in, with the bucket's size); the
        counts follow them. True when rows moved: :meth:`add_seconds` must sum again."""
        self.allocated = self.counts.copy()
        if not self.exact:
            return False
        nb, dbin = self.grid.num_buckets, self.grid.duration_bin
        incoming: list[list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64]]]] = \
            [[] for _ in range(nb)]
        moves: dict[int, int] = {}
        for k in range(nb - 1):
            parts = [self._cand[k], *incoming[k]]
            rows, t, d = (np.concatenate([p[i] for p in parts]) for i in range(3))
            pick, target = tail_moves(rows, t, d, k, self.bs, self.alloc.max_tokens, dbin,
                                      size=int(self.counts[k]))
            for j in np.unique(target[target >= 0]).tolist():
                sel = pick[target == j]
                incoming[j].append((rows[sel], t[sel], d[sel]))
                self.counts[k] -= sel.shape[0]
                self.counts[j] += sel.shape[0]
                moves.update(dict.fromkeys(rows[sel].tolist(), j))  # a row carried on again: its last bucket
        self._cand = []
        if not moves:
            return False
        self._moved_rows = np.asarray(sorted(moves), dtype=np.int64)
        self._moved_to = np.asarray([moves[r] for r in self._moved_rows.tolist()], dtype=np.int32)
        self.alloc = AllocationTotals.of(self.grid)
        return True

    def add_seconds(self, b: RowBlock) -> None:
        """Pass 2 (after :meth:`carry` returned True): the block's rows allocated again, the
        carried ones in their new buckets; counts and seconds summed in row order."""
        al = allocate(b.duration, b.tokens, self.grid)
        lo, hi = np.searchsorted(self._moved_rows, [b.start, b.start + b.duration.shape[0]])
        al.bucket[self._moved_rows[lo:hi] - b.start] = self._moved_to[lo:hi]  # a fresh array: edited in place
        self.alloc.add(al, b.duration)


class CorpusShares:
    """Per epoch and corpus: the utterances an epoch plans (exact) and their seconds, summed
    in manifest row order (a row planned ``m`` times adds ``m`` times its duration, once), so
    any split of the rows into ranges (in order) gives the same floats as one
    ``np.bincount(code, weights=d * times)``."""

    def __init__(self, epochs: int, corpora: int) -> None:
        self.n = np.zeros((epochs, corpora), np.int64)
        self.seconds = np.zeros((epochs, corpora), np.float64)

    def add(self, epoch: int, code: npt.NDArray[np.integer], d: npt.NDArray[np.float64],
            times: npt.NDArray[np.integer]) -> None:
        """A range of rows (after the previous one): their corpus codes, durations (s, 0 where
        unknown) and how many times ``epoch`` plans each."""
        for a in range(0, times.shape[0], SHARE_ADD_ROWS):  # in order: the same sums, bounded temporaries
            nz = np.flatnonzero(times[a:a + SHARE_ADD_ROWS]) + a
            c, m = code[nz], times[nz].astype(np.int64)
            np.add.at(self.n[epoch], c, m)  # into one short row per epoch: np.add.at is fast here
            np.add.at(self.seconds[epoch], c, d[nz] * m)


def share_range_rows(memory_limit: int) -> int:
    """Rows per range of the corpus shares' join: :data:`SHARE_RANGE_ROWS`, fewer when
    ``memory_limit`` bytes hold fewer (at least 1)."""
    return max(1, min(memory_limit // SHARE_BYTES_PER_ROW, SHARE_RANGE_ROWS))


def spill_planned_rows(plan_dir: str | os.PathLike[str], meta: PlanMeta, epoch: int, step: int,
                       files: SpillFiles) -> None:
    """Every rank's planned rows of ``epoch`` appended to ``files`` by range of ``step``
    manifest rows: ``p{k}`` holds those of ``[k * step, (k + 1) * step)`` as int32 offsets
    from ``k * step``. One pass over the epoch's batches, one row group of a shard at a time."""
    first = meta.first_step_of_epoch[epoch]
    for r in range(meta.world_size):
        for t in PlanShard(plan_dir, r, meta).iter_tables(first, columns=["epoch", "rows"]):
            ep = numpy_view(t.column("epoch"), np.int32)
            a, b = (int(i) for i in np.searchsorted(ep, [epoch, epoch + 1]))
            if a < b:
                col = single_chunk(t.column("rows"))
                offs = numpy_view(col.offsets, np.int32)
                rows = numpy_view(col.values, np.int64)[offs[a]:offs[b]]
                k = rows // step
                order = np.argsort(k, kind="stable")
                rows, k = rows[order], k[order]
                ends = [*(np.flatnonzero(np.diff(k)) + 1).tolist(), rows.shape[0]]
                for lo, hi in zip([0, *ends[:-1]], ends):
                    if hi > lo:
                        kk = int(k[lo])
                        files.append(f"p{kk}", (rows[lo:hi] - kk * step).astype(np.int32))
            if b < ep.shape[0]:  # the next epoch began
                break
    files.close()


def planned_times(files: SpillFiles, k: int, size: int) -> npt.NDArray[np.int64]:
    """How many times the epoch :func:`spill_planned_rows` spilled plans each row of range
    ``k`` (``size`` rows)."""
    return np.bincount(files.read(f"p{k}", np.int32), minlength=size)


def spill_rows(files: SpillFiles, b: RowBlock) -> None:
    """Each row's corpus code and duration (0 where unknown) appended to ``files`` (``c``,
    ``d``: 12 bytes a row) for :class:`CorpusShares`' ranges."""
    assert b.corpus is not None
    files.append("c", b.corpus)
    files.append("d", np.where(np.isnan(b.duration), 0.0, b.duration))
