"""An epoch's position columns moved into one column per group of ranks, before its shards
are written (:func:`move_to_groups`).

Shards are written rank by rank, and each rank's batches lie scattered over the position
columns (a batch is a run of one bucket's positions). On disk, once those files outgrow the
page cache every scattered read goes to the disk, so they are read once, sequentially, from
their end (each truncated behind the reads: one copy at a time), every run appended to its
ranks' group. A group (whole ranks, or a range of steps of one rank) holds at most a memory
budget of records (:func:`group_bytes`) and is read whole to write its shards. Position
columns held in memory are not moved: every group reads its runs of them in place.

Columns (:class:`manifests.spill.SpillFiles`): ``pos.rec`` / ``pos.data`` (rows beside id
offsets, id bytes) in, ``rg{g}.rec`` / ``rg{g}.data`` out; a group's are removed once read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from bucketing.batching import run_positions
from manifests.spill import SpillFiles, record_dtype

#: Rows of the position files moved at once (about 70 bytes of memory each: records, ids,
#: their gather and copy).
MOVE_ROWS = 1 << 21
#: Fewest rows of a group are the epoch's rows over this: at most about twice as many groups
#: (whole ranks packed greedily), two open files each while positions are moved.
MAX_GROUPS = 128
#: Bounds of a group's bytes in memory whatever the memory limit.
MIN_GROUP_BYTES, MAX_GROUP_BYTES = 1 << 20, 1 << 30
#: Most bytes of a group's records when the position columns are held in memory (read in
#: place: what bounds the ranks written at once).
MEMORY_GROUP_BYTES = 16 << 20


@dataclass(frozen=True)
class RankGroup:
    """Rank-major batches ``first:end`` of an epoch of ``S`` steps: ranks ``ranks``, each
    steps ``steps`` (all of them, or a range of one rank's)."""

    ranks: range
    steps: range
    first: int
    end: int


def rank_groups(size: npt.NDArray[np.int64], W: int, part: int, max_rows: int) -> list[RankGroup]:
    """Consecutive rank-major batches (sizes ``size``, ``W`` ranks) cut into groups of at most
    ``max_rows`` rows where they can be: whole ranks together, or a rank of more rows alone,
    cut at multiples of ``part`` steps (the parts a shard is written in), each range at least
    one part."""
    S = size.shape[0] // W
    by_rank = size.reshape(W, S)
    rank_rows = by_rank.sum(1)
    out: list[RankGroup] = []
    r0, rows = 0, 0

    def close(r: int) -> None:
        if r > r0:
            out.append(RankGroup(range(r0, r), range(S), r0 * S, r * S))

    for r in range(W):  # ranks, not rows: at most a few thousand
        if rank_rows[r] > max_rows:
            close(r)
            part_rows = np.add.reduceat(by_rank[r], np.arange(0, S, part)) if S else np.zeros(0, np.int64)
            c0, acc = 0, 0
            for i, n in enumerate(part_rows.tolist()):
                if i * part > c0 and acc + n > max_rows:
                    out.append(RankGroup(range(r, r + 1), range(c0, i * part), r * S + c0, r * S + i * part))
                    c0, acc = i * part, 0
                acc += n
            out.append(RankGroup(range(r, r + 1), range(c0, S), r * S + c0, (r + 1) * S))
            r0, rows = r + 1, 0
        elif r > r0 and rows + rank_rows[r] > max_rows:
            close(r)
            r0, rows = r, int(rank_rows[r])
        else:
            rows += int(rank_rows[r])
    close(W)
    return out


@dataclass
class RankGroupedPositions:
    """An epoch's positions moved into group files (:func:`move_to_groups`): each rank-major
    batch's runs of its group's file. ``run_off``: CSR runs of each batch (None: one run a
    batch, the batch's index)."""

    files: SpillFiles
    key_dtype: np.dtype[np.integer]
    groups: list[RankGroup]
    run_start: npt.NDArray[np.int64]
    run_size: npt.NDArray[np.int64]
    run_off: npt.NDArray[np.int64] | None
    #: the position columns when held in memory (every group's runs are theirs)
    whole: InPlaceRecords | None = None

    def load(self, g: int) -> GroupRecords | InPlaceRecords:
        """Group ``g``'s rows and ids read whole; its files removed."""
        if self.whole is not None:
            return self.whole
        name = f"rg{g}"
        n, _ = self.files.count_records(name, self.key_dtype)
        rows, ids = self.files.read_record_range(name, self.key_dtype, 0, n) if n else \
            (np.empty(0, self.key_dtype), pa.array([], pa.large_string()))
        self.files.remove(name + ".rec", name + ".data")
        return GroupRecords(self, rows, ids)

    def remove(self) -> None:
        """Delete every group file left (a plan that stopped before writing them all)."""
        for g in range(len(self.groups)):
            self.files.remove(f"rg{g}.rec", f"rg{g}.data")
        self.files.remove("pos.rec", "pos.data")
        self.whole = None


@dataclass(frozen=True)
class GroupRecords:
    """One group's rows and ids in memory, in its file's order (``rows`` a view of its records)."""

    where: RankGroupedPositions
    rows: npt.NDArray[np.integer]
    ids: pa.LargeStringArray

    def batches(self, lo: int, hi: int) -> tuple[npt.NDArray[np.integer], pa.Array]:
        """Rows and ids of rank-major batches ``lo:hi`` (of this group), batch after batch."""
        w = self.where
        r0, r1 = (lo, hi) if w.run_off is None else (int(w.run_off[lo]), int(w.run_off[hi]))
        at = run_positions(w.run_start[r0:r1], w.run_size[r0:r1])
        return self.rows[at], self.ids.take(pa.array(at)).cast(pa.string())


@dataclass(frozen=True)
class InPlaceRecords:
    """The position columns held in memory, read in place: ``rec`` (:func:`record_dtype`,
    ending with the total) and ``data`` (the ids' bytes); runs as in the columns."""

    where: RankGroupedPositions
    rec: npt.NDArray[Any]
    data: npt.NDArray[np.uint8]

    def batches(self, lo: int, hi: int) -> tuple[npt.NDArray[np.integer], pa.Array]:
        """Rows and ids of rank-major batches ``lo:hi``, batch after batch (the ids' bytes
        gathered for these rows only: no offsets of the whole columns)."""
        w = self.where
        r0, r1 = (lo, hi) if w.run_off is None else (int(w.run_off[lo]), int(w.run_off[hi]))
        at = run_positions(w.run_start[r0:r1], w.run_size[r0:r1])
        first, end = self.rec["off"][at], self.rec["off"][at + 1]
        off = np.zeros(at.shape[0] + 1, dtype=np.int64)
        np.cumsum(end - first, out=off[1:])
        gather = np.arange(int(off[-1]), dtype=np.int64) + np.repeat(first - off[:-1], end - first)
        data = self.data[gather] if gather.shape[0] else np.zeros(1, np.uint8)
        offsets = off.astype(np.int32) if off[-1] < 2**31 else off
        kind = pa.StringArray if off[-1] < 2**31 else pa.LargeStringArray
        ids = kind.from_buffers(at.shape[0], pa.py_buffer(offsets), pa.py_buffer(data))
        return self.rec["key"][at], ids if kind is pa.StringArray else ids.cast(pa.string())


def group_bytes(memory_limit: int, in_memory: bool = False) -> int:
    """Bytes of one group's records in memory under ``memory_limit``: an eighth of it, within
    :data:`MIN_GROUP_BYTES` and :data:`MAX_GROUP_BYTES` (:data:`MEMORY_GROUP_BYTES` at most
    when the position columns are in memory)."""
    most = MEMORY_GROUP_BYTES if in_memory else MAX_GROUP_BYTES
    return int(min(most, max(MIN_GROUP_BYTES, memory_limit // 8)))


def move_to_groups(files: SpillFiles, key_dtype: np.dtype[np.integer], batch_size: npt.NDArray[np.int64],
                   start: npt.NDArray[np.int64], size: npt.NDArray[np.int64], run_off: npt.NDArray[np.int64] | None,
                   W: int, part: int, budget: int) -> RankGroupedPositions:
    """Move the epoch's position files into rank groups of about ``budget`` bytes (see the
    module docstring). ``batch_size``: rows of each rank-major batch; ``start``/``size``: runs
    of positions, batch after batch (``run_off``: CSR runs of each batch; None: one run a
    batch); ``part``: steps a shard part holds. The position files are consumed (truncated
    while read, then removed); held in memory, they are read in place (no copy) until
    :meth:`RankGroupedPositions.remove`."""
    total = int(size.sum())
    count, data_bytes = files.count_records("pos", key_dtype)
    row_bytes = key_dtype.itemsize + 8 + -(-data_bytes // max(1, count))
    groups = rank_groups(batch_size, W, part, max(budget // row_bytes, -(-total // MAX_GROUPS), 1))
    if files.in_memory:
        grouped = RankGroupedPositions(files, key_dtype, groups, start, size, run_off)
        grouped.whole = _records_in_place(files, key_dtype, grouped)
        return grouped
    first_batch = np.array([g.first for g in groups], dtype=np.int64)
    new_start = np.empty(start.shape[0], dtype=np.int64)
    filled = np.zeros(len(groups), dtype=np.int64)
    order = np.argsort(start, kind="stable")  # runs by position
    blocks = _blocks(size[order], MOVE_ROWS)
    ends = [int((start[order[a:b]] + size[order[a:b]]).max()) for a, b in blocks]
    reach = np.maximum.accumulate([-1, *ends])  # reach[i]: the furthest end of the runs before block i
    for i in range(len(blocks) - 1, -1, -1):  # from the end: the files shrink behind the reads
        a, b = blocks[i]
        ps = order[a:b]
        batch = ps if run_off is None else np.searchsorted(run_off, ps, side="right") - 1
        g = np.searchsorted(first_batch, batch, side="right") - 1
        within = np.argsort(g, kind="stable")  # the block's runs by group, then position
        ps, g = ps[within], g[within]
        st, sz = start[ps], size[ps]
        lo, hi = int(st.min()), ends[i]
        block_keys, block_ids = files.read_record_range("pos", key_dtype, lo, hi)
        at = run_positions(st - lo, sz)
        keys, ids = block_keys[at], block_ids.take(pa.array(at))
        first_run = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
        excl = np.cumsum(sz) - sz  # each run's first row in the block's (group, position) order
        new_start[ps] = filled[g] + excl - np.repeat(excl[first_run], np.diff(np.r_[first_run, g.shape[0]]))
        bounds = np.r_[excl[first_run], at.shape[0]].tolist()
        for j, k in enumerate(g[first_run].tolist()):
            files.append_records(f"rg{k}", keys[bounds[j]:bounds[j + 1]], ids.slice(bounds[j], bounds[j + 1] - bounds[j]))
            filled[k] += bounds[j + 1] - bounds[j]
        if reach[i] <= lo:  # no run before this block reads past lo: drop what was read
            files.cut_records("pos", key_dtype, lo)
    files.close()
    files.remove("pos.rec", "pos.data")
    return RankGroupedPositions(files, key_dtype, groups, new_start, size, run_off)


def _records_in_place(files: SpillFiles, key_dtype: np.dtype[np.integer], where: RankGroupedPositions) -> InPlaceRecords:
    """The position columns held in memory as :class:`InPlaceRecords` (views, no copy)."""
    rec = files.read("pos.rec", record_dtype(key_dtype))
    if rec.shape[0] == 0:
        rec = np.zeros(1, record_dtype(key_dtype))
    return InPlaceRecords(where, rec, files.read("pos.data", np.uint8))


def _blocks(sizes: npt.NDArray[np.int64], rows: int) -> list[tuple[int, int]]:
    """Consecutive ranges of ``sizes`` of about ``rows`` in all (each at least one)."""
    if sizes.shape[0] == 0:
        return []
    cum = np.cumsum(sizes)
    cuts = np.unique(np.searchsorted(cum, np.arange(rows, int(cum[-1]), rows), side="left") + 1)
    bounds = [0, *cuts[cuts < sizes.shape[0]].tolist(), sizes.shape[0]]
    return list(zip(bounds[:-1], bounds[1:]))
