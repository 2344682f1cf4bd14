"""Lhotse: ``PlanSampler``, a ``CutSampler`` that replays one rank of a plan as ``CutSet`` s.

::

    sampler = PlanSampler("plan/", "kept.parquet", rank=rank, world_size=world_size)
    loader = PlanDataLoader(K2SpeechRecognitionDataset(), sampler)  # state_dict() is exact

Each step's ``CutSet`` holds exactly the plan's utterances for this rank, in order
(:func:`dataprep.integrations.cuts.cut_for_row`), rows read from the memory-mapped
:class:`~dataprep.integrations.rows.ManifestRows`. Iterated again after the plan's last step,
a :class:`PlanDataLoader` ends the run (:class:`PlanEnded`: Lightning's ``fit()`` returns).
``state_dict()`` is Lhotse's plus ``plan_hash`` and ``next_step``; inside
``IterableDatasetWrapper`` with ``n`` workers, worker ``w`` builds positions ``i % n == w``,
so batches do not depend on the number of workers.
"""

from __future__ import annotations

import copy
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lhotse import CutSet
from lhotse.dataset.sampling.base import (
    CutSampler,
    SamplingDiagnostics,
    attach_dataloading_info,
)
from torch.utils.data import DataLoader

from dataprep.integrations.cuts import cut_for_row
from dataprep.integrations.prefetch import DEFAULT_PREFETCH_BYTES, PrefetchOptions, StepPrefetcher
from dataprep.integrations.rows import ManifestRows
from manifests.column_cache import ColumnCache
from manifests.hash_cache import require_manifest_hash
from manifests.plan_cursor import PlanCursor, PlanStateError, dataloader_worker
from manifests.plan_files import PlanBatch
from manifests.validation import number_text

#: the warning IterableDatasetWrapper gives for a sampler with a rank: a plan's sampler has one on purpose
_WRAPPER_WARNING = r"We detected you're trying to use a CutSampler with rank"
#: Lightning's warning for an IterableDataset loader with a length (the plan's: exact with any workers)
_LEN_WARNING = r"Your `IterableDataset` has `__len__` defined"
#: the largest trainer epoch a sampler takes (a plan is one pass: the trainer's epoch 0)
MAX_EPOCH = 2**31 - 1
#: the keys of Lhotse's own sampler state (``CutSampler.state_dict``) besides the cursor's
_LHOTSE_KEYS = ("epoch", "drop_last", "world_size", "seed", "shuffle", "diagnostics")


class PlanSampler(CutSampler):  # type: ignore[misc]
    """Rank ``rank``'s batches of the plan in ``plan_dir`` as Lhotse ``CutSet`` s (module docstring).

    ``world_size`` must be the plan's; ``start_step`` is the first global step yielded (default:
    the plan's first); ``channel`` picks one channel of multi-channel audio (default: a
    ``MultiCut`` of all); ``cache_dir`` is where the manifest row cache lives (default
    ``$SPEECH_DATAPREP_CACHE``). Rank, steps, state checks and the worker split are the
    :class:`~manifests.plan_cursor.PlanCursor` 's. ``prefetch_steps`` > 0 reads the audio bytes
    of that many next steps ahead in a background thread, at most ``prefetch_bytes`` held
    (:mod:`dataprep.integrations.prefetch`); the cuts then hold their bytes in memory.
    """

    def __init__(self, plan_dir: str | os.PathLike[str], manifest: str | os.PathLike[str], rank: int,
                 world_size: int, start_step: int | None = None, channel: int | None = None,
                 cache_dir: str | os.PathLike[str] | None = None, prefetch_steps: int = 0,
                 prefetch_bytes: int = DEFAULT_PREFETCH_BYTES) -> None:
        self.prefetch = PrefetchOptions(prefetch_steps, prefetch_bytes)
        self.cursor = PlanCursor(plan_dir, rank, start_step, world_size=world_size)
        super().__init__(shuffle=False, drop_last=False, world_size=world_size, rank=rank, seed=0)
        self.plan_dir = self.cursor.plan_dir
        self.manifest = Path(manifest)
        require_manifest_hash(self.manifest, self.cursor.meta.manifest.content_hash, "the plan's manifest")
        self.channel = channel
        self.cache_dir = cache_dir
        self._rows: ManifestRows | None = None
        self._it: Iterator[PlanBatch] | None = None
        self._prefetcher: StepPrefetcher | None = None

    @property
    def start_step(self) -> int:
        """The step an iteration starts at unless a state was just restored."""
        return self.cursor.start_step

    @property
    def next_step(self) -> int:
        """The step after the last batch this sampler (or this worker's copy) handed out."""
        return self.cursor.next_step

    # ------------------------------------------------------------------ lhotse protocol
    def __iter__(self) -> PlanSampler:
        # a restored state survives iter() until the first batch (DataLoader calls iter() twice)
        if not self._just_restored_state:
            self.cursor.rewind()
        self._reset()
        return self

    def _reset(self) -> None:
        """Drop the iteration in progress and what its prefetch holds."""
        self._it = None
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None

    def __next__(self) -> CutSet:
        self.allow_iter_to_reset_state()
        if self._it is None:
            worker = dataloader_worker()
            if self.prefetch.on:  # from the step this iteration starts at (a restored one included)
                columns = ColumnCache.open(self.manifest, self.cache_dir)
                self._prefetcher = StepPrefetcher(self.cursor, columns, self.prefetch, worker)
            self._it = self.cursor.iter_batches(worker)  # this DataLoader worker's share
        pb = next(self._it)  # StopIteration ends the plan
        cuts = self.cuts_of(pb, None if self._prefetcher is None else self._prefetcher.take(pb.step))
        self._log_diagnostics(cuts)
        for fn in self._transforms:
            cuts = fn(cuts)
        attach_dataloading_info(cuts, rank=self.rank, world_size=self.world_size)
        return cuts

    def _next_batch(self) -> CutSet:
        return next(self)

    def cuts_of(self, pb: PlanBatch, held: list[bytes | None] | None = None) -> CutSet:
        """The ``CutSet`` of one plan batch (its rows, in order; ``custom`` adds ``plan_step``,
        ``plan_target_frames`` for a dynamic-resolution plan and, for a packed plan, each cut's
        ``plan_sequence``, its packed sequence in the batch); ``held``: each row's audio bytes,
        already fetched (``None`` where not)."""
        if self._rows is None:
            self._rows = ManifestRows.open(self.manifest, self.cache_dir)
        rows = self._rows.records(pb.rows)
        custom = {"plan_step": pb.step, **({} if pb.target_frames is None else {"plan_target_frames": pb.target_frames})}
        seqs = [None] * len(rows) if pb.sequence is None else pb.sequence.tolist()
        data = held if held is not None else [None] * len(rows)
        return CutSet.from_cuts(cut_for_row(r, self.channel, custom if q is None else {**custom, "plan_sequence": q}, d)
                                for r, d, q in zip(rows, data, seqs))

    def __len__(self) -> int:
        """Batches left from the next step to the end of the plan."""
        return len(self.cursor)

    @property
    def remaining_duration(self) -> float | None:
        return None

    @property
    def remaining_cuts(self) -> int | None:
        return None

    @property
    def num_cuts(self) -> int | None:
        return None

    def state_dict(self) -> dict[str, Any]:
        """Lhotse's sampler state plus ``plan_hash`` and ``next_step``."""
        return {**super().state_dict(), **self.cursor.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue at ``state_dict["next_step"]`` (the next ``iter()`` does not reset it); a
        malformed state or one of another plan is a :class:`~manifests.plan_cursor.PlanStateError`."""
        step, state_world_size = self.cursor.check_state(state_dict, others=_LHOTSE_KEYS)
        v = self.cursor.state_validator()
        # the world size of the state's plan: this one's, or a re-plan parent's at its last step
        for key, want in (("world_size", state_world_size), ("seed", self.seed)):
            if v.int_(v.key(state_dict, key), key) != want:
                raise v.fail(key, f"{number_text(state_dict[key])} in the state, expected {want}")
        for key in ("drop_last", "shuffle"):
            if state_dict.get(key) is not False:
                raise v.fail(key, f"expected false (a plan's batches are fixed), got {_brief(state_dict.get(key))}")
        v.int_(v.key(state_dict, "epoch"), "epoch", lo=0, hi=MAX_EPOCH)
        v.obj(v.key(state_dict, "diagnostics"), "diagnostics")
        lhotse_state = {k: val for k, val in state_dict.items() if k not in ("plan_hash", "next_step")}
        lhotse_state["world_size"] = self.world_size  # checked above against the state's own plan
        try:  # on a scratch object first: a refused state changes nothing
            SamplingDiagnostics().load_state_dict(copy.deepcopy(lhotse_state["diagnostics"]))
            lhotse_state["diagnostics"] = copy.deepcopy(lhotse_state["diagnostics"])
            super().load_state_dict(lhotse_state)
        except (AssertionError, KeyError, TypeError, ValueError, AttributeError, RecursionError) as exc:
            raise PlanStateError(f"{self.plan_dir}: sampler state: Lhotse's diagnostics do not fit this sampler "
                                 f"({type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''})") from None
        self.cursor.seek(step)
        self._reset()

    def set_epoch(self, epoch: int) -> None:
        """The trainer's epoch (Lhotse's protocol; a new epoch starts again at the first step):
        an ``int`` in ``0 .. MAX_EPOCH``, refused in one line otherwise."""
        v = self.cursor.state_validator("set_epoch")
        v.int_(epoch, "epoch", lo=0, hi=MAX_EPOCH)
        super().set_epoch(epoch)

    def __getstate__(self) -> dict[str, Any]:  # to worker processes: no mapped file, no open iterator
        state = self.__dict__.copy()
        state["_rows"], state["_it"], state["_prefetcher"] = None, None, None
        return state


def _brief(x: Any) -> str:
    """``repr(x)`` cut to 60 characters; a value without one (an integer past 4300 digits) by its type."""
    try:
        return repr(x)[:60]
    except (ValueError, RecursionError):
        return f"a {type(x).__name__}"


class PlanEnded(StopIteration):
    """A trainer asked for another pass after the plan's last step: the clean end of training.
    Lightning's fit loop takes a ``StopIteration`` from the next epoch's ``iter()`` as the end
    of the run (``fit()`` returns, exit status 0); rank 0 prints :func:`plan_end_line` first.
    A plain loop that iterates again gets this exception to catch."""


def plan_end_line(sampler: PlanSampler) -> str:
    """The one line a run that reached the plan's end stops with."""
    c = sampler.cursor
    return (f"{c.plan_dir}: the plan's end: rank {c.rank} trained every batch up to step {c.stop_step} "
            f"(plan.json num_steps {c.meta.num_steps}); stopping the run")


class EndOfPlanGuard:
    """Mixin of the plan's DataLoaders: the plan is one pass. ``len()`` is the pass's batches
    counted from the step it started at, fixed for the pass (after a restore too: what
    Lightning's mid-epoch resume counts against). ``iter()`` once the plan's last step was
    returned raises :class:`PlanEnded` (the first ``iter()`` of a loader restored at the end
    yields nothing instead: Lightning asks for it outside its loop). ``state_dict()`` is the
    step after the last batch returned (the sampler runs ahead by the workers' prefetch) and
    ``pass_start``, the step the pass started at."""

    plan_sampler: PlanSampler
    _returned_step: int
    _pass_start: int
    _iterated: bool
    _announced: bool

    def _start_guard(self, sampler: PlanSampler) -> None:
        self.plan_sampler = sampler
        self._returned_step = self._pass_start = sampler.next_step
        self._iterated = self._announced = False

    def __len__(self) -> int:
        return self.plan_sampler.cursor.stop_step - self._pass_start

    def __iter__(self) -> Iterator[Any]:
        sampler = self.plan_sampler
        if self._returned_step >= sampler.cursor.stop_step:
            if sampler.rank == 0 and not self._announced:  # once: a loader restored at the end ends in two calls
                print(plan_end_line(sampler), file=sys.stderr, flush=True)
                self._announced = True
            if self._iterated:
                raise PlanEnded(plan_end_line(sampler))
            self._iterated = True
            return iter(())
        self._iterated = True
        if sampler._just_restored_state:
            step = sampler.next_step
        else:
            step = self._pass_start = sampler.start_step
        return self._counted(super().__iter__(), step)  # type: ignore[misc]

    def _counted(self, batches: Iterator[Any], step: int) -> Iterator[Any]:
        """``batches``, keeping ``_returned_step`` = the step after the last batch returned."""
        self._returned_step = step
        for batch in batches:
            step += 1
            self._returned_step = step
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """The sampler's state at the step after the last batch returned to the trainer, and
        ``pass_start``."""
        return {**self.plan_sampler.state_dict(), "next_step": self._returned_step, "pass_start": self._pass_start}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state["next_step"]`` on the next iteration (the workers get the sampler
        with that step); a malformed state or one of another plan is refused, changing nothing.
        A state without ``pass_start`` (a sampler's) counts the pass from the plan's first step."""
        sampler = self.plan_sampler
        start = None
        if isinstance(state, dict) and "pass_start" in state:  # checked first: a refused state changes nothing
            nxt = state.get("next_step")
            start = sampler.cursor.state_validator().int_(
                state["pass_start"], "pass_start", lo=0, hi=nxt if type(nxt) is int else None)
            state = {k: v for k, v in state.items() if k != "pass_start"}
        sampler.load_state_dict(state)
        self._pass_start = min(sampler.cursor.first_step, sampler.next_step) if start is None else start
        self._returned_step = sampler.next_step


class PlanDataLoader(EndOfPlanGuard, DataLoader):  # type: ignore[type-arg]
    """A map-style ``DataLoader(dataset, sampler=plan_sampler, batch_size=None)`` whose
    ``state_dict()`` is the step after the last batch it *returned* (the sampler itself runs
    ahead by the workers' prefetch), so a checkpoint resumes at exactly the next batch. Iterated
    again past the plan's end: :class:`PlanEnded` (module docstring)."""

    def __init__(self, dataset: Any, sampler: PlanSampler, **kwargs: Any) -> None:
        super().__init__(dataset, sampler=sampler, batch_size=None, **kwargs)
        self._start_guard(sampler)


class PlanIterableLoader(EndOfPlanGuard, DataLoader):  # type: ignore[type-arg]
    """A ``DataLoader`` over ``IterableDatasetWrapper(dataset, plan_sampler)`` (the sampler in the
    workers) that stops with :class:`PlanEnded` when iterated again past the plan's end; its
    ``state_dict()`` is exact, as :class:`PlanDataLoader` 's."""

    def __init__(self, dataset: Any, sampler: PlanSampler, **kwargs: Any) -> None:
        from lhotse.dataset import IterableDatasetWrapper

        wrapper_warning_filter()
        super().__init__(IterableDatasetWrapper(dataset=dataset, sampler=sampler), batch_size=None, **kwargs)
        self._start_guard(sampler)


def wrapper_warning_filter() -> None:
    """Silence ``IterableDatasetWrapper``'s warning about a sampler with a rank (a plan's sampler
    has one on purpose: it reads that rank's shard; workers split the shard's batches) and
    Lightning's about a length with workers (the plan's length is exact with any number)."""
    warnings.filterwarnings("ignore", message=_WRAPPER_WARNING)
    warnings.filterwarnings("ignore", message=_LEN_WARNING)
