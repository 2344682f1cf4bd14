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
from pathlib import Path
from typing import Any

from torch.utils.data import Sampler

from manifests.errors import DataprepError
from manifests.plan_files import PlanShard
from manifests.plan_meta import read_plan_meta


class PlanBatchSampler(Sampler[list[int]]):
    """Rank ``rank``'s batches of the plan in ``plan_dir`` as lists of manifest row numbers,
    from global step ``start_step`` on (see the module docstring)."""

    def __init__(self, plan_dir: str | os.PathLike[str], rank: int, start_step: int = 0) -> None:
        self.plan_dir = Path(plan_dir)
        meta = read_plan_meta(self.plan_dir)
        if not 0 <= rank < meta.world_size:
            raise DataprepError(f"{self.plan_dir}: rank {rank} is outside the plan's world size {meta.world_size}")
        self.rank = rank
        self.plan_hash = meta.plan_hash
        self.num_steps = meta.num_steps
        self._check_step(start_step)
        self.next_step = start_step  # the step the next batch handed out will be

    def _check_step(self, step: int) -> None:
        if not 0 <= step <= self.num_steps:
            raise DataprepError(f"{self.plan_dir}: step {step} is outside the plan's 0..{self.num_steps} steps")

    def __iter__(self) -> Iterator[list[int]]:
        start = self.next_step
        for pb in PlanShard(self.plan_dir, self.rank).iter_batches(start):
            self.next_step = pb.step + 1
            yield pb.rows.tolist()

    def __len__(self) -> int:
        """Batches left from the current step to the end of the plan."""
        return self.num_steps - self.next_step

    def state_dict(self) -> dict[str, Any]:
        """Where the next batch starts: ``{"plan_hash", "rank", "next_step"}``."""
        return {"plan_hash": self.plan_hash, "rank": self.rank, "next_step": self.next_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at ``state["next_step"]``; refuses the state of another plan."""
        if state.get("plan_hash") != self.plan_hash:
            raise DataprepError(f"{self.plan_dir}: sampler state is of another plan "
                                f"({str(state.get('plan_hash'))[:12]}... vs {self.plan_hash[:12]}...)")
        step = int(state["next_step"])
        self._check_step(step)
        self.next_step = step
