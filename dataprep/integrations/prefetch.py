"""Plan-driven prefetch: the bytes of a rank's next steps, read ahead of the trainer.

:class:`StepPrefetcher` walks a copy of a :class:`~manifests.plan_cursor.PlanCursor` (the
trainer's own cursor never moves ahead) up to ``prefetch_steps`` steps ahead in a background
thread. A step's rows are addressed through the manifest's column cache: a tar member by
``container`` / ``member_offset`` / ``member_size``, a loose file whole, both as byte ranges
of one object; a step's ranges of one object within :data:`~dataprep.planning.step_reads.
DEFAULT_MAX_GAP` bytes are one request and a range two rows share is read once
(:func:`~dataprep.planning.step_reads.coalesce`), so no byte is fetched twice for one step.
Requests run on ``io_threads`` daemon threads, the first step's alone (the first batch's
bandwidth unshared); the bytes held (fetched or in flight, not yet taken) stay within
``prefetch_bytes``, a step larger than that being read alone. ``take(step)``
gives each row's bytes (``None`` for a Parquet row: read where it is decoded). The decoders
read those bytes (:func:`manifests.audio.load_audio` ``data=``, a Lhotse in-memory source).
"""

from __future__ import annotations

import copy
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dataprep.planning.step_reads import (  # noqa: F401  (PrefetchOptions and its defaults: this module's API)
    DEFAULT_IO_THREADS,
    DEFAULT_MAX_GAP,
    DEFAULT_PREFETCH_BYTES,
    PrefetchOptions,
    coalesce,
)
from manifests import storage
from manifests.column_cache import ColumnCache, RowsMeta
from manifests.errors import DataprepError
from manifests.plan_cursor import PlanCursor
from manifests.plan_files import PlanBatch


def read_ranges(path: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
    """The bytes of ``(offset, length)`` ranges of ``path`` (a file or a URL), one request each
    (the ranges come coalesced): :func:`manifests.storage.read_ranges`, length and ETag checked."""
    return storage.read_ranges(path, ranges, gap=0)


class _DaemonPool:
    """``n`` daemon threads running submitted calls: a process that stops iterating (or exits)
    never waits for reads in flight, as it would for a ``ThreadPoolExecutor`` 's threads."""

    def __init__(self, n: int) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None] = queue.SimpleQueue()
        self._stop = False
        self._n = n
        for i in range(n):
            threading.Thread(target=self._work, name=f"dataprep-fetch-{i}", daemon=True).start()

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            fut, fn, args = job
            if self._stop:
                fut.cancel()
            elif fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(*args))
                except BaseException as exc:  # noqa: BLE001  (raised where the result is asked for)
                    fut.set_exception(exc)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        self._jobs.put((fut, fn, args))
        return fut

    def shutdown(self) -> None:
        """Cancel what has not started; the threads end once their call returns."""
        self._stop = True
        for _ in range(self._n):
            self._jobs.put(None)


@dataclass
class _Step:
    """One step's reads: the requests (object, start, end) and, per row, the request its bytes
    lie in (-1: not read ahead) and where in it they begin and end."""

    step: int
    objects: list[str]
    starts: list[int]
    ends: list[int]
    request: list[int]
    begin: list[int]
    end: list[int]
    futures: list[Future[bytes | None]] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(self.ends) - sum(self.starts)


class StepPrefetcher:
    """Reads the bytes of ``cursor``'s next steps ahead (module docstring). The cursor is
    copied at its ``next_step``: make the prefetcher where the trainer's iteration starts (a
    resumed one included) and call :meth:`take` with each step it reaches, in order.
    ``reader(path, [(offset, length), ...])``: the bytes of ranges of one object (default
    :func:`read_ranges`)."""

    def __init__(self, cursor: PlanCursor, columns: ColumnCache, options: PrefetchOptions,
                 worker: tuple[int, int] = (0, 1), max_gap: int = DEFAULT_MAX_GAP,
                 reader: Callable[[str, Sequence[tuple[int, int]]], list[bytes]] | None = None) -> None:
        self.options = options
        self.reader = read_ranges if reader is None else reader
        self.columns = columns
        self.max_gap = max_gap
        self._cursor = copy.copy(cursor)
        self._worker = worker
        self._steps: OrderedDict[int, _Step] = OrderedDict()
        self._held = 0
        self.peak_bytes = 0  # most bytes held at once (fetched or in flight, not yet taken)
        self.fetched_bytes = 0  # bytes read so far, and in how many requests
        self.requests = 0
        self._error: BaseException | None = None
        self._done = False
        self._stop = False
        self._cond = threading.Condition()
        self._pool = _DaemonPool(options.io_threads)
        self._thread = threading.Thread(target=self._run, name="dataprep-prefetch", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the reading thread
    def _run(self) -> None:
        first = True
        try:
            for pb in self._cursor.iter_batches(self._worker):
                step = self._plan(pb)
                with self._cond:
                    while not self._stop and self._steps and (
                            len(self._steps) >= self.options.prefetch_steps
                            or self._held + step.nbytes > self.options.prefetch_bytes):
                        self._cond.wait()
                    if self._stop:
                        return
                    self._held += step.nbytes
                    self.peak_bytes = max(self.peak_bytes, self._held)
                    self._submit(step)  # futures made before a consumer can see the step
                    self._steps[pb.step] = step
                    self._cond.notify_all()
                if first:  # the first step read alone: the steps after it do not share its bandwidth
                    wait(step.futures)
                    first = False
        except BaseException as exc:  # noqa: BLE001  (raised in the consumer, at the step it stops)
            with self._cond:
                self._error = exc
        finally:
            with self._cond:
                self._done = True
                self._cond.notify_all()

    def _plan(self, pb: PlanBatch) -> _Step:
        """The requests of one step, and where each row's bytes lie in them."""
        meta = self.columns.gather(pb.rows, pb.ids)
        obj, begin, end, names = self._ranges(meta)
        read = obj >= 0
        reqs = coalesce(obj[read], begin[read], end[read], self.max_gap)
        request = np.full(len(meta), -1, np.int64)
        request[read] = reqs.of_range
        at = np.where(read, begin - reqs.start[np.maximum(request, 0)] if len(reqs) else 0, -1)
        return _Step(pb.step, [names[o] for o in reqs.obj.tolist()], reqs.start.tolist(), reqs.end.tolist(),
                     request.tolist(), at.tolist(), np.where(read, at + end - begin, -1).tolist())

    def _ranges(self, meta: RowsMeta) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
        """Per row: the object its bytes are in (a code into the returned names; -1: not read
        ahead) and their range ``[begin, end)``. A tar member is its range of the container, a
        loose file all of it; one name is one code (a dictionary may list a name twice)."""
        tar = (meta.container_codes >= 0) & (meta.member_offsets >= 0) & (meta.member_sizes >= 0)
        loose = meta.container_codes < 0
        begin = np.where(tar, meta.member_offsets, 0).astype(np.int64)
        end = np.where(tar, meta.member_offsets + meta.member_sizes, 0).astype(np.int64)
        obj = np.full(len(meta), -1, np.int64)
        names: dict[str, int] = {}
        # one code per distinct (container or file) of the step: a loop over objects, not rows
        for mask, codes, lookup in ((tar, meta.container_codes, self._container_names),
                                    (loose, meta.audio_codes, self.columns.audio_names)):
            if not mask.any():
                continue
            uniq, inverse = np.unique(codes[mask], return_inverse=True)
            local = np.asarray([names.setdefault(n, len(names)) for n in lookup(uniq)], np.int64)
            obj[mask] = local[inverse.reshape(-1)]
        name_list = list(names)
        if loose.any():
            sizes = np.asarray([self._size(name_list[o]) for o in np.unique(obj[loose]).tolist()], np.int64)
            end[loose] = sizes[np.searchsorted(np.unique(obj[loose]), obj[loose])]
            obj[loose & (end < 0)] = -1  # a file that cannot be asked for: left to the decoder's one-line error
        return obj, begin, end, name_list

    def _container_names(self, codes: np.ndarray) -> list[str]:
        names = self.columns.containers
        return [names[c] for c in codes.tolist()]

    @staticmethod
    def _size(path: str) -> int:
        """``path``'s size; -1 where it cannot be had (missing): not read ahead, so the decoder
        names the utterance (and ``--skip-bad-audio`` skips it)."""
        try:
            return storage.stat(path).size
        except storage.StoreError:
            return -1

    def _submit(self, step: _Step) -> None:
        step.futures = [self._pool.submit(self._fetch, o, s, e) for o, s, e in zip(step.objects, step.starts, step.ends)]

    def _fetch(self, path: str, start: int, end: int) -> bytes | None:
        """The bytes ``[start, end)`` of ``path``; ``None`` where the object is gone or ends
        before ``end`` (a missing or truncated tar): its rows are left to the decoder, which
        names each utterance (and ``--skip-bad-audio`` skips them). A store fault still raises."""
        try:
            data = self.reader(path, [(start, end - start)])[0]
        except storage.StoreError as exc:
            if "past the object's end" in str(exc) or not storage.exists(path):
                return None
            raise
        if len(data) != end - start:
            raise DataprepError(f"{path}: bytes {start}..{end - 1} cut short ({len(data)} of {end - start} bytes)")
        with self._cond:
            self.fetched_bytes += len(data)
            self.requests += 1
        return data

    # ------------------------------------------------------------------ the consumer
    def take(self, step: int) -> list[bytes | None]:
        """Each row's bytes of ``step`` (in the batch's order; ``None``: not read ahead), once
        they are read; releases them from the budget. Steps before ``step`` not taken are dropped."""
        with self._cond:
            while step not in self._steps and not self._done and not (self._steps and next(iter(self._steps)) > step):
                self._cond.wait()
            for s in [s for s in self._steps if s < step]:
                self._release(self._steps[s])
            entry = self._steps.get(step)
            if entry is None:
                if self._error is not None:
                    raise self._error
                raise DataprepError(f"step {step} was not read ahead (the prefetch walked other steps)")
        try:
            bufs = [f.result() for f in entry.futures]
        finally:
            with self._cond:
                self._release(entry)
        out: list[bytes | None] = []
        for r, b, e in zip(entry.request, entry.begin, entry.end):
            out.append(None if r < 0 or bufs[r] is None else bufs[r][b:e])  # type: ignore[index]
        return out

    def _release(self, entry: _Step) -> None:
        """Drop ``entry`` from the held steps (under the lock)."""
        if self._steps.pop(entry.step, None) is not None:
            self._held -= entry.nbytes
            self._cond.notify_all()

    def close(self) -> None:
        """Stop reading ahead and drop what is held."""
        with self._cond:
            self._stop = True
            self._steps.clear()
            self._held = 0
            self._cond.notify_all()
        self._pool.shutdown()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001  (interpreter shutdown)
            pass
