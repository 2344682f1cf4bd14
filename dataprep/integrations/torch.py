"""A PyTorch batch sampler that replays one rank of a plan: ``PlanBatchSampler``.

Any map-style dataset indexed by compiled-manifest row number works with it (one over the
manifest, ``datasets.Dataset.from_parquet(manifest)``, a Lightning ``DataModule`` with
``Trainer(use_distributed_sampler=False)``)::

    sampler = PlanBatchSampler("plan/", rank=rank)
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collate)
    sampler.load_state_dict(state)       # resumes at exactly the saved step

Each ``__iter__`` yields this rank's batches (lists of row numbers) from the current step to
the end of the plan. ``state_dict()`` holds the step after the last batch handed out; with
DataLoader workers that runs ahead of the trainer, so save the step you trained last, or use
:class:`dataprep.integrations.lhotse.PlanDataLoader`, which counts for you.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from torch.utils.data import Sampler

from manifests.plan_cursor import PlanCursor


class PlanBatchSampler(Sampler[list[Any]]):
    """Rank ``rank``'s batches of the plan in ``plan_dir`` as lists of manifest row numbers,
    from global step ``start_step`` (default: the plan's first) on; a thin adapter over
    :class:`~manifests.plan_cursor.PlanCursor` (rank, steps and state checks are the cursor's).
    ``with_sequences``: lists of ``(row, sequence)`` pairs instead, ``sequence`` the row's packed
    sequence in its batch (``plan-batches --pack``; one row a sequence otherwise), for a
    dataset whose ``__getitem__`` takes the pair and a packing collate
    (:func:`dataprep.training.packing.pack_layout`)."""

    def __init__(self, plan_dir: str | os.PathLike[str], rank: int, start_step: int | None = None,
                 with_sequences: bool = False) -> None:
        self.cursor = PlanCursor(plan_dir, rank, start_step)
        self.plan_dir, self.rank = self.cursor.plan_dir, self.cursor.rank
        self.with_sequences = with_sequences

    @property
    def next_step(self) -> int:
        """The step the next batch handed out will be."""
        return self.cursor.next_step

    def __iter__(self) -> Iterator[list[Any]]:
        for pb in self.cursor.iter_batches((0, 1)):
            if not self.with_sequences:
                yield pb.rows.tolist()
            else:  # (row, its packed sequence in the batch); a plan without packing: one row a sequence
                seq = range(len(pb.rows)) if pb.sequence is None else pb.sequence.tolist()
                yield list(zip(pb.rows.tolist(), seq))

    def __len__(self) -> int:
        """Batches left from the current step to the end of the plan."""
        return len(self.cursor)

    def state_dict(self) -> dict[str, Any]:
        """Where the next batch starts: ``{"plan_hash", "rank", "next_step"}``."""
        return self.cursor.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at ``state["next_step"]``; refuses a state of another plan or a malformed one."""
        self.cursor.load_state_dict(state)
