"""Forming batches inside buckets: which utterances train together.

Shared by the padding report (which predicts what training sees) and the planner (which
writes it), so both form batches the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


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


def form_batches(
    bucket_of_row: npt.NDArray[np.integer],
    batch_sizes: npt.NDArray[np.integer],
    rng: np.random.Generator,
    num_tokens: npt.NDArray[np.integer] | None = None,
) -> Batches:
    """Shuffle each bucket's rows and cut them into batches of its batch size.

    Parameters
    ----------
    bucket_of_row: bucket index per manifest row (``-1`` = not allocated, skipped).
    batch_sizes: utterances per batch, per bucket (>= 1).
    rng: the only source of randomness; equal seeds give equal batches.
    num_tokens: tokens per row, for token-aware grouping (unused by this baseline).

    Invariant: every allocated row is in exactly one batch; no batch exceeds its bucket's
    batch size; only a bucket's last batch may be smaller.
    """
    bucket_of_row = np.asarray(bucket_of_row)
    batch_sizes = np.asarray(batch_sizes, dtype=np.int64)
    rows = np.flatnonzero(bucket_of_row >= 0).astype(np.int64)
    keys = rng.random(rows.shape[0])
    order = np.lexsort((keys, bucket_of_row[rows]))
    rows = rows[order]
    b = bucket_of_row[rows].astype(np.int64)
    counts = np.bincount(b, minlength=batch_sizes.shape[0])
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    pos_in_bucket = np.arange(rows.shape[0]) - starts[b]
    batch_in_bucket = pos_in_bucket // batch_sizes[b]
    new_batch = np.ones(rows.shape[0], dtype=bool)
    if rows.shape[0] > 1:
        new_batch[1:] = (b[1:] != b[:-1]) | (batch_in_bucket[1:] != batch_in_bucket[:-1])
    first = np.flatnonzero(new_batch)
    offsets = np.append(first, rows.shape[0]).astype(np.int64)
    return Batches(bucket=b[first].astype(np.int32), offsets=offsets, rows=rows)
