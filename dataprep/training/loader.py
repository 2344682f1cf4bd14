"""The torch loader over a plan: rank ``r``'s shard from step ``k`` -> tensor batches in step order.

:class:`PlanDataset` yields rank ``r``'s :class:`~dataprep.training.batches.Batch` es from its
shard (``rank-0000r.parquet``); :func:`make_loader` prepares them ahead, in DataLoader workers
or in one background thread (:func:`prefetch`).

Determinism: a batch depends only on (plan, step, manifest, tokenizer), never on the number
of workers; with DataLoader workers, worker ``w`` of ``n`` builds the batches whose position
``i`` (from the start step) has ``i % n == w`` and the DataLoader returns them in order.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from torch.utils.data import DataLoader, IterableDataset

from dataprep.integrations.prefetch import PrefetchOptions, StepPrefetcher
from dataprep.training.batches import Batch, BatchBuilder
from dataprep.training_config import MAX_PREFETCH, MAX_WORKERS
from manifests.options import check_int, check_number
from manifests.plan_cursor import PlanCursor, dataloader_worker
from manifests.plan_files import PlanBatch

T = TypeVar("T")


class PlanDataset(IterableDataset[Batch]):
    """Rank ``rank``'s batches of the plan in ``plan_dir``, from global step ``start_step``
    (default: the plan's first) up to (not including) ``stop_step`` (default: its end). Yields
    :class:`Batch`; use ``batch_size=None`` with a DataLoader (see :func:`make_loader`). Steps,
    rank and the worker split are the :class:`~manifests.plan_cursor.PlanCursor` 's. ``prefetch``:
    read the audio of the next steps ahead (:mod:`dataprep.integrations.prefetch`; default off)."""

    def __init__(self, plan_dir: str | os.PathLike[str], rank: int, builder: BatchBuilder,
                 start_step: int | None = None, stop_step: int | None = None,
                 prefetch: PrefetchOptions | None = None) -> None:
        super().__init__()
        self.cursor = PlanCursor(plan_dir, rank, start_step, stop_step)
        self.builder = builder
        self.prefetch = prefetch or PrefetchOptions()

    def __len__(self) -> int:
        """Batches one iteration yields (all workers together)."""
        return len(self.cursor)

    def plan_batches(self) -> Iterator[PlanBatch]:
        """The shard's batches in the step range (metadata only), this worker's share."""
        self.cursor.rewind()
        return self.cursor.iter_batches()

    def __iter__(self) -> Iterator[Batch]:
        batches = self.plan_batches()
        if not self.prefetch.on:
            yield from map(self.builder.build, batches)
            return
        ahead = StepPrefetcher(self.cursor, self.builder.columns, self.prefetch, dataloader_worker())
        try:
            for pb in batches:
                yield self.builder.build(pb, ahead.take(pb.step))
        finally:
            ahead.close()


def _identity(x: T) -> T:
    return x


def prefetch(items: Iterable[T], depth: int = 2) -> Iterator[T]:
    """Iterate ``items`` in a background thread, ``depth`` items ahead; order is kept and
    an exception in the producer is raised in the consumer at the same position."""
    if depth <= 0:
        yield from items
        return
    q: queue.Queue[tuple[int, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        q.put((0, item), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put((1, None))
        except BaseException as exc:  # noqa: BLE001  (re-raised in the consumer)
            q.put((2, exc))

    thread = threading.Thread(target=produce, name="dataprep-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            kind, item = q.get()
            if kind == 1:
                return
            if kind == 2:
                raise item
            yield item
    finally:
        stop.set()


def make_loader(dataset: PlanDataset, num_workers: int = 0, prefetch_depth: int = 2,
                timeout_s: float = 600.0) -> Iterable[Batch]:
    """Batches of ``dataset`` in step order, prepared ahead: in ``num_workers`` DataLoader
    worker processes, or (``num_workers=0``) in one background thread ``prefetch_depth`` ahead.
    A worker that delivers nothing for ``timeout_s`` seconds is an error, not a hang. Sizes are
    bounded before anything starts (:data:`~dataprep.training_config.MAX_WORKERS`, ``MAX_PREFETCH``)."""
    check_int("num_workers", num_workers, ge=0, le=MAX_WORKERS)
    check_int("prefetch_depth", prefetch_depth, ge=0, le=MAX_PREFETCH)
    check_number("timeout_s", timeout_s, gt=0)
    if num_workers > 0:
        # forkserver, not fork: a worker forked from a process whose thread pools (Polars, Arrow,
        # OpenMP) hold locks can deadlock; the dataset is pickled to each worker instead
        return DataLoader(dataset, batch_size=None, num_workers=num_workers, collate_fn=_identity,
                          prefetch_factor=max(1, prefetch_depth), timeout=timeout_s,
                          multiprocessing_context="forkserver", persistent_workers=False)
    return prefetch(dataset, prefetch_depth)
