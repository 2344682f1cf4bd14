"""An epoch's rank shards written from its layout (:func:`write_epoch_spilled`): the position
columns moved into groups of ranks of about an eighth of the memory limit
(:mod:`dataprep.planning.rank_files`), each group read whole and its ranks' shards written in
parts of whole row groups, several ranks at once (:meth:`manifests.plan_files.PlanWriter.write_ranks`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from bucketing.batching import gather_segments
from dataprep.planning.rank_files import GroupRecords, InPlaceRecords, group_bytes, move_to_groups
from dataprep.planning.layout import EpochLayout
from dataprep.planning.spill import SpilledCorpus
from manifests.plan_files import PlanWriter, shard_table

#: Rows of a shard written at once (rounded to whole row groups): each part reads its batches'
#: runs of the position files (two reads a batch: rows with id offsets, id bytes).
PART_ROWS = 1 << 16
#: Bytes of memory per row of a shard part being written (gather indices, rows, ids, the
#: Arrow table and its encoded pages).
PART_BYTES_PER_ROW = 200


def write_epoch_spilled(writer: PlanWriter, layout: EpochLayout, corpus: SpilledCorpus, first_step: int,
                        row_group_steps: int, tick: Callable[[int], object],
                        target_frames: npt.NDArray[np.int64] | None = None, *, memory_limit: int,
                        last: bool = False) -> None:
    """The position files moved into groups of ranks of
    about an eighth of ``memory_limit`` bytes (:mod:`dataprep.planning.rank_files`), then each
    group read whole and its ranks' shards written in parts of whole row groups (ranks in
    parallel, :meth:`manifests.plan_files.PlanWriter.write_ranks`); ``target_frames``: per
    rank-major batch (dynamic resolution's column); ``last``: the plan's last epoch (each
    shard closed once written)."""
    ep = layout.ep
    S = ep.num_steps
    mean = max(1, int(layout.size.sum()) // max(1, layout.size.shape[0]))
    part = row_group_steps * max(1, PART_ROWS // (row_group_steps * mean))
    bucket = ep.bucket_of_batch()
    start, size, run_off = layout.start, layout.size, None
    if layout.explicit is not None and (start < 0).any():  # its rows' positions: runs of one
        start, size, run_off = _explicit_runs(start, size, layout.explicit)
    grouped = move_to_groups(corpus.files, np.dtype(corpus.row_dtype), layout.size, start, size, run_off,
                             ep.world_size, part, group_bytes(memory_limit, corpus.memory is not None))
    try:
        for g, group in enumerate(grouped.groups):
            records = grouped.load(g)

            def parts(r: int, steps: range = group.steps,
                      records: GroupRecords | InPlaceRecords = records) -> Iterator[pa.Table]:
                for c in range(steps.start, steps.stop, part):
                    lo, hi = r * S + c, r * S + min(steps.stop, c + part)
                    off = np.zeros(hi - lo + 1, dtype=np.int64)
                    np.cumsum(layout.size[lo:hi], out=off[1:])
                    rows, ids = records.batches(lo, hi)
                    yield shard_table(epoch=ep.epoch, first_step=first_step + c, bucket=bucket[lo:hi], offsets=off,
                                      rows=rows, ids=ids, max_duration=ep.max_duration[lo:hi],
                                      max_tokens=ep.max_tokens[lo:hi], step_in_epoch=c,
                                      target_frames=None if target_frames is None else target_frames[lo:hi])

            whole = group.steps.stop == S  # the group ends its ranks' epoch
            writer.write_ranks(parts, tick if whole else lambda r: None, close=last and whole, ranks=group.ranks)
            del parts, records  # before the next group is read: one group in memory at a time
    finally:
        grouped.remove()


def _explicit_runs(start: npt.NDArray[np.int64], size: npt.NDArray[np.int64],
                   explicit: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]
                   ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Runs of positions of an epoch's rank-major batches, batch after batch: a whole one's
    run, and one run of one position per row of a batch given by positions (``start`` -1);
    with the CSR offsets of each batch's runs."""
    exp = start < 0
    n_runs = np.where(exp, size, 1)
    run_off = np.zeros(start.shape[0] + 1, dtype=np.int64)
    np.cumsum(n_runs, out=run_off[1:])
    run_start = np.repeat(start, n_runs)
    run_size = np.repeat(np.where(exp, 1, size), n_runs)
    _, gather = gather_segments(explicit[0], np.flatnonzero(exp))
    run_start[np.repeat(exp, n_runs)] = explicit[1][gather]
    return run_start, run_size, run_off
