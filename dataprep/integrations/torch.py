"""A PyTorch batch sampler that replays one rank of a plan: ``PlanBatchSampler``.

Any map-style dataset indexed by compiled-manifest row number works with it: one built over the
manifest, a Hugging Face ``datasets.Dataset`` made from it (``Dataset.from_parquet(manifest)``
keeps the row order), a Lightning ``DataModule`` (with ``Trainer(use_distributed_sampler=False)``,
since the plan already gives each rank its batches)::

    sampler = PlanBatchSampler("plan/", rank=rank)
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collate)
    ...
    torch.save({"sampler": sampler.state_dict(), ...}, ckpt)       # the step after the last batch
    sampler.load_state_dict(torch.load(ckpt)["sampler"])           # resumes at exactly that batch

Each ``__iter__`` yields rank ``rank``'s batches from the current step to the end of the plan
(every epoch of it), one list of manifest row numbers per global step. ``state_dict()`` holds
the step after the last batch the sampler handed out: with ``num_workers=0`` that is the last
batch the trainer received; with workers the DataLoader fetches ahead, so save ``next_step``
as the start step plus the batches you trained (every rank has one batch per step), or use
:class:`dataprep.integrations.lhotse.PlanDataLoader`, which counts for you.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from torch.utils.data import Sampler

from manifests.plan_cursor import PlanCursor


class PlanBatchSampler(Sampler[list[int]]):
    """Rank ``rank``'s batches of the plan in ``plan_dir`` as lists of manifest row numbers,
    from global step ``start_step`` (default: the plan's first) on; a thin adapter over
    :class:`~manifests.plan_cursor.PlanCursor` (rank, steps and state checks are the cursor's)."""

    def __init__(self, plan_dir: str | os.PathLike[str], rank: int, start_step: int | None = None) -> None:
        self.cursor = PlanCursor(plan_dir, rank, start_step)
        self.plan_dir, self.rank = self.cursor.plan_dir, self.cursor.rank

    @property
    def next_step(self) -> int:
        """The step the next batch handed out will be."""
        return self.cursor.next_step

    def __iter__(self) -> Iterator[list[int]]:
        for pb in self.cursor.iter_batches((0, 1)):
            yield pb.rows.tolist()

    def __len__(self) -> int:
        """Batches left from the current step to the end of the plan."""
        return len(self.cursor)

    def state_dict(self) -> dict[str, Any]:
        """Where the next batch starts: ``{"plan_hash", "rank", "next_step"}``."""
        return self.cursor.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at ``state["next_step"]``; refuses a state of another plan or a malformed one."""
        self.cursor.load_state_dict(state)
