"""Disk a plan that spills to disk takes (:func:`disk_bytes`, :class:`DiskNeed`, bytes): the
spill, an epoch's position columns, a large bucket's ids gathered through a scratch copy, and
the plan's shards; checked before anything is written (:func:`manifests.spill.check_free_disk`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pyarrow.parquet as pq

from dataprep.planning.spill import ID_CHUNK_ROWS

#: Bytes of disk per row of the spill files besides its id's bytes: row (int32 below 2**31
#: rows, else int64), duration (8), tokens (4) and the id's offset (8).
SPILL_DISK_BYTES_PER_ROW = 24
#: Bytes of disk per row of an epoch's position files besides its id's bytes: the row (4 or 8)
#: beside its id's offset (8).
POSITION_DISK_BYTES_PER_ROW = 12
#: Bytes of disk per row of a weighted plan's spill besides those: corpus code, index in the
#: corpus and times drawn (4 + 8 + 4).
WEIGHTED_DISK_BYTES_PER_ROW = 16
#: Bytes of disk per row of an epoch drawn row by row when not weighted (a re-plan's unseen
#: rest, :func:`draw_rows`): the times each row is taken (int32).
DRAWN_DISK_BYTES_PER_ROW = 4
#: Bytes of disk per row and epoch of the plan's shards (about 9 measured at 10M-100M rows).
PLAN_DISK_BYTES_PER_ROW = 10


@dataclass(frozen=True)
class DiskNeed:
    """Disk an out-of-core plan takes (bytes): ``spill``, what the pass over the manifest
    writes; ``peak``, the most at once later (the spill, an epoch's position files, the
    largest bucket's ids gathered, the plan's shards)."""

    spill: int
    peak: int


def disk_bytes(manifest: str | os.PathLike[str], epochs: int, weighted: bool = False, *, largest: int = 0,
               ids_once: bool | None = None, drawn: bool = False) -> DiskNeed:
    """Disk that out-of-core planning ``manifest`` for ``epochs`` takes (:class:`DiskNeed`).

    The ids' size is read from the Parquet footer (uncompressed: at least their bytes). The
    spill holds every row's numbers and id; an epoch's position files every row and id again,
    except where the last epoch is the only one (``ids_once``, default ``epochs == 1``): it
    removes each bucket's spilled ids once laid out, so the ids are on disk about once. A
    bucket of more than :data:`ID_CHUNK_ROWS` rows gathers its ids through a scratch copy
    (``largest``: the largest bucket's rows, once known; 0 before the spill). ``weighted``: the
    corpus codes, indices and times drawn too (an epoch the size of the manifest); ``drawn``:
    the times drawn alone (a re-plan's unseen rest, not weighted).
    Measured (3M synthetic rows, ids of ~11 bytes, one epoch / three): at most 47.0 / 73.1 bytes
    a row on disk at once; this estimates 60.8 / 95.6 (before: 83.6 / 103.6)."""
    md = pq.ParquetFile(manifest).metadata
    col = md.schema.names.index("id")
    id_bytes = sum(md.row_group(g).column(col).total_uncompressed_size for g in range(md.num_row_groups))
    n = md.num_rows
    wide = 4 if n >= 2**31 else 0  # int64 row numbers
    extra = WEIGHTED_DISK_BYTES_PER_ROW if weighted else DRAWN_DISK_BYTES_PER_ROW if drawn else 0
    numbers = (SPILL_DISK_BYTES_PER_ROW + wide + extra) * n
    once = epochs == 1 if ids_once is None else ids_once
    positions = (POSITION_DISK_BYTES_PER_ROW + wide) * n + (0 if once else id_bytes)
    gathered = 0 if largest <= ID_CHUNK_ROWS else -(-id_bytes * largest // max(n, 1)) + 8 * largest
    spill = numbers + id_bytes
    return DiskNeed(spill, spill + positions + gathered + PLAN_DISK_BYTES_PER_ROW * epochs * n)
