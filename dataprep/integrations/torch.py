"""A PyTorch batch sampler that replays one rank of a plan: ``PlanBatchSampler``.

Any map-style dataset indexed by compiled-manifest row number works with it (one over the
manifest, ``datasets.Dataset.from_parquet(manifest)``, a Lightning ``DataModule`` with
``Trainer(use_distributed_sampler=False)``)::

    sampler = PlanBatchSampler("plan/", rank=rank)
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collate)
    sampler.load_state_dict(state)       # resumes at exactly the saved step

Each ``__iter__`` yields this rank's batches (row numbers; with ``prefetch_steps``, each with
its audio bytes read ahead) from the current step to the end of the plan. ``state_dict()``
holds the step after the last batch handed out; with DataLoader workers that runs ahead of the
trainer, so save the step you trained last, or use ``PlanDataLoader`` (Lhotse), which counts for you.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from torch.utils.data import Sampler

from dataprep.integrations.prefetch import (
    DEFAULT_PREFETCH_BYTES,
    PrefetchOptions,
    StepPrefetcher,
)
from manifests.column_cache import ColumnCache
from manifests.errors import OptionError
from manifests.hash_cache import require_manifest_hash
from manifests.plan_cursor import PlanCursor


class PlanBatchSampler(Sampler[list[Any]]):
    """Rank ``rank``'s batches of the plan in ``plan_dir`` as lists of manifest row numbers,
    from global step ``start_step`` (default: the plan's first) on; a thin adapter over
    :class:`~manifests.plan_cursor.PlanCursor` (rank, steps and state checks are the cursor's).
    ``with_sequences``: lists of ``(row, sequence)`` pairs instead, ``sequence`` the row's packed
    sequence in its batch (``plan-batches --pack``; one row a sequence otherwise), for a
    dataset whose ``__getitem__`` takes the pair and a packing collate
    (:func:`dataprep.training.packing.pack_layout`). ``prefetch_steps`` > 0 (with the plan's
    ``manifest``; ``cache_dir`` as ``PlanSampler`` 's): the next steps' audio bytes are read
    ahead, at most ``prefetch_bytes`` held, and each item is ``(row, data)`` or
    ``(row, sequence, data)``, ``data`` the row's audio file bytes (``None``: a Parquet row,
    read where it is decoded); a resumed sampler reads ahead from its resumed step."""

    def __init__(self, plan_dir: str | os.PathLike[str], rank: int, start_step: int | None = None,
                 with_sequences: bool = False, manifest: str | os.PathLike[str] | None = None,
                 cache_dir: str | os.PathLike[str] | None = None, prefetch_steps: int = 0,
                 prefetch_bytes: int = DEFAULT_PREFETCH_BYTES) -> None:
        self.prefetch = PrefetchOptions(prefetch_steps, prefetch_bytes)
        self.cursor = PlanCursor(plan_dir, rank, start_step)
        self.plan_dir, self.rank = self.cursor.plan_dir, self.cursor.rank
        self.with_sequences = with_sequences
        if self.prefetch.on and manifest is None:
            raise OptionError("manifest", "prefetch_steps > 0 needs the plan's manifest (where the audio bytes are)")
        self.manifest = None if manifest is None else os.fspath(manifest)
        if self.manifest is not None:
            require_manifest_hash(self.manifest, self.cursor.meta.manifest.content_hash, "the plan's manifest")
        self.cache_dir = cache_dir

    @property
    def next_step(self) -> int:
        """The step the next batch handed out will be."""
        return self.cursor.next_step

    def __iter__(self) -> Iterator[list[Any]]:
        ahead = None
        if self.prefetch.on:  # from the step this iteration starts at (a restored one included)
            ahead = StepPrefetcher(self.cursor, ColumnCache.open(str(self.manifest), self.cache_dir), self.prefetch)
        try:
            for pb in self.cursor.iter_batches((0, 1)):
                items: list[Any] = pb.rows.tolist()
                if self.with_sequences:  # (row, its packed sequence in the batch); a plan without packing: one row a sequence
                    seq = range(len(pb.rows)) if pb.sequence is None else pb.sequence.tolist()
                    items = list(zip(items, seq))
                if ahead is not None:
                    data = ahead.take(pb.step)
                    items = [(*(it if self.with_sequences else (it,)), d) for it, d in zip(items, data)]
                yield items
        finally:
            if ahead is not None:
                ahead.close()

    def __len__(self) -> int:
        """Batches left from the current step to the end of the plan."""
        return len(self.cursor)

    def state_dict(self) -> dict[str, Any]:
        """Where the next batch starts: ``{"plan_hash", "rank", "next_step"}``."""
        return self.cursor.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at ``state["next_step"]``; refuses a state of another plan or a malformed one."""
        self.cursor.load_state_dict(state)
