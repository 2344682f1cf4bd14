"""One rank's position in a plan: :class:`PlanCursor`, the one cursor every sampler and loader uses.

A cursor opens a plan for one rank (refused where ``torch.distributed`` runs this process as
another rank); its shard holds steps ``first_step .. num_steps - 1`` (``first_step`` is 0, or
``replan.at_step`` for a re-planned plan). It yields the rank's
:class:`~manifests.plan_files.PlanBatch` es from ``next_step`` up to (not including) ``stop_step``,
one per global step, and refuses a start or stop outside the plan with a one-line
:class:`~manifests.errors.DataprepError`; ``len(cursor)`` is ``stop_step - next_step``.
``state_dict()`` is ``{"plan_hash", "rank", "next_step"}``; :func:`check_state` and
:func:`resume_point` are the one validation of a state or checkpoint (no coercion; another
plan's state refused but the parent's at exactly the step a re-plan starts at; rank 0's state
resumes any rank). DataLoader worker ``w`` of ``n`` takes the batches at positions
``i % n == w`` from the first step (:meth:`PlanCursor.worker_steps`), in step order: the
batches never depend on the number of workers. Torch-free: torch is read only when loaded.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

from manifests.errors import DataprepError, ManifestError
from manifests.plan_files import PlanBatch, PlanShard
from manifests.plan_meta import PlanMeta, read_plan_meta
from manifests.validation import Validator, number_text

#: the keys of a cursor's state
STATE_KEYS = ("plan_hash", "rank", "next_step")


class PlanStateError(DataprepError):
    """A sampler or loader state (``load_state_dict``) that does not resume this plan."""


class _Check(Validator):
    """The validation layer's checks (no coercion), failing as ``error`` (one line)."""

    def __init__(self, where: str, error: type[DataprepError] = DataprepError) -> None:
        super().__init__(where)
        self.error = error

    def fail(self, name: str, problem: str) -> ManifestError:
        return self.error(f"{self.where}: {name}: {problem}")  # type: ignore[return-value]


def dataloader_worker() -> tuple[int, int]:
    """``(worker id, number of workers)`` of the torch DataLoader worker running this code;
    ``(0, 1)`` outside one. Imports nothing: a process that has not loaded torch is no worker."""
    data = sys.modules.get("torch.utils.data")
    info = data.get_worker_info() if data is not None else None
    return (int(info.id), int(info.num_workers)) if info is not None else (0, 1)


def resume_point(meta: PlanMeta, plan_hash: str, step: int, v: Validator, stop_step: int | None = None) -> int:
    """The world size of the plan whose state (``plan_hash``, next step ``step``) resumes plan
    ``meta``: ``meta`` itself at a step in ``first_step .. stop_step`` (default ``num_steps``),
    or its re-plan parent at exactly ``replan.at_step`` (the parent's batches before it were
    consumed). Anything else fails through ``v``: the one check of a resume point."""
    stop = meta.num_steps if stop_step is None else stop_step
    parent = meta.replan
    if plan_hash == meta.plan_hash:
        if not meta.first_step <= step <= stop:
            hint = (f" (re-planned at step {meta.first_step}: resume its parent's checkpoint there)"
                    if parent is not None and step < meta.first_step else "")
            raise v.fail("next_step", f"{number_text(step)} is outside the plan's steps {meta.first_step}..{stop}{hint}")
        return meta.world_size
    if parent is None or plan_hash != parent.parent_plan_hash:
        raise v.fail("plan_hash", f"{plan_hash[:12]}... is another plan's (this plan is {meta.plan_hash[:12]}...)")
    if step != parent.at_step:
        raise v.fail("next_step", f"{number_text(step)} of the parent plan, but the plan was re-planned at step "
                                  f"{parent.at_step}; re-plan with --at-step {number_text(step)}")
    return parent.parent_world_size  # at_step is this plan's first step: within any stop step


def check_state(meta: PlanMeta, state: Any, v: Validator, others: Collection[str] = (),
                stop_step: int | None = None) -> tuple[int, int]:
    """``(next_step, world size of the state's plan)`` of a cursor state (:data:`STATE_KEYS`,
    plus the caller's own keys ``others``) that resumes plan ``meta`` (:func:`resume_point`);
    every sampler's and loader's state goes through here. Fails through ``v``, never coerces."""
    if not isinstance(state, Mapping):
        error = type(v.fail("", ""))  # the validator's error class, without a field name
        raise error(f"{v.where}: expected a dict, got {type(state).__name__}")
    unknown = sorted(repr(k)[:60] if isinstance(k, str) else f"({type(k).__name__} key)"
                     for k in state if not isinstance(k, str) or (k not in STATE_KEYS and k not in others))
    if unknown:
        raise v.fail(unknown[0], "unexpected key (not a state of this sampler)")
    plan_hash = v.hex_(v.key(state, "plan_hash"), "plan_hash")
    step = v.int_(v.key(state, "next_step"), "next_step", lo=0)
    rank = v.int_(v.key(state, "rank"), "rank", lo=0)
    world_size = resume_point(meta, plan_hash, step, v, stop_step)
    if rank >= world_size:
        raise v.fail("rank", f"must be <= {world_size - 1}, got {number_text(rank, ',')} "
                             f"(the state's plan has {world_size} ranks)")
    return step, world_size


def check_distributed_rank(plan_dir: Path, rank: int, world_size: int) -> None:
    """Refuse to open rank ``rank``'s shard in a process that ``torch.distributed`` (when loaded
    and initialized) runs as another rank of a group the plan's size: each rank would otherwise
    train on another's batches (or every rank on rank 0's). A group of another size (tensor or
    pipeline parallel: data-parallel ranks are not the global ranks) is not checked."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    group_rank, group_size = int(dist.get_rank()), int(dist.get_world_size())
    if group_size == world_size and group_rank != rank:
        raise DataprepError(f"{plan_dir}: rank {rank} given, but this process is rank {group_rank} of "
                            f"{group_size} (torch.distributed): open rank {group_rank}'s shard")


def argument_validator(where: str) -> Validator:
    """The validation layer's checks (no coercion) failing as one-line :class:`DataprepError` s."""
    return _Check(where)


class PlanCursor:
    """Rank ``rank``'s batches of the plan in ``plan_dir`` from ``start_step`` (default: the
    plan's first step) up to ``stop_step`` (default: its end); see the module docstring.

    ``world_size``, when given, must be the plan's (a trainer started with another world
    size needs a re-plan). ``next_step`` is the step of the next batch :meth:`iter_batches` yields.
    """

    def __init__(self, plan_dir: str | os.PathLike[str], rank: int, start_step: int | None = None,
                 stop_step: int | None = None, world_size: int | None = None) -> None:
        self.plan_dir = Path(plan_dir)
        self.meta: PlanMeta = read_plan_meta(self.plan_dir)
        check = argument_validator(str(self.plan_dir))
        if world_size is not None and check.int_(world_size, "world_size", lo=1) != self.meta.world_size:
            raise DataprepError(f"{self.plan_dir}: world size {number_text(world_size)} given, the plan is for "
                                f"{self.meta.world_size} (re-plan it: `dataprep replan`)")
        self.rank = check.int_(rank, "rank", lo=0)
        if self.rank >= self.meta.world_size:
            raise DataprepError(f"{self.plan_dir}: rank {number_text(rank)} is outside the plan's world size "
                                f"{self.meta.world_size}")
        check_distributed_rank(self.plan_dir, self.rank, self.meta.world_size)
        self.first_step = self.meta.first_step
        end = self.meta.num_steps
        self.stop_step = end if stop_step is None else self._step(stop_step, "stop step", self.first_step, end)
        self.start_step = (self.first_step if start_step is None
                           else self._step(start_step, "start step", self.first_step, self.stop_step))
        self.next_step = self.start_step

    # ------------------------------------------------------------------ steps
    @property
    def plan_hash(self) -> str:
        return self.meta.plan_hash

    @property
    def world_size(self) -> int:
        return self.meta.world_size

    @property
    def steps(self) -> range:
        """The global steps this cursor can yield: ``first_step .. stop_step - 1``."""
        return range(self.first_step, self.stop_step)

    def _step(self, step: Any, name: str, lo: int, hi: int) -> int:
        """``step`` if it is an int in ``lo .. hi`` (a one-line :class:`DataprepError` if not)."""
        v = _Check(str(self.plan_dir)).int_(step, name)
        if not lo <= v <= hi:
            replanned = (f" (re-planned at step {self.first_step}: resume its parent's checkpoint there)"
                         if self.meta.replan is not None and v < self.first_step else "")
            raise DataprepError(f"{self.plan_dir}: {name}: {number_text(v)} is outside steps {lo}..{hi} of the plan{replanned}")
        return v

    def seek(self, step: int) -> None:
        """Make ``step`` the next step (``first_step .. stop_step``; ``stop_step`` = nothing left)."""
        self.next_step = self._step(step, "step", self.first_step, self.stop_step)

    def rewind(self) -> None:
        """Back to the step the cursor was made at."""
        self.next_step = self.start_step

    def __len__(self) -> int:
        """Batches the next iteration yields: ``stop_step - next_step`` (one per global step)."""
        return self.stop_step - self.next_step

    # ------------------------------------------------------------------ batches
    def worker_steps(self, worker: int, num_workers: int) -> range:
        """The steps worker ``worker`` of ``num_workers`` yields, from ``next_step`` on."""
        if not 0 <= worker < num_workers:
            raise DataprepError(f"worker {worker} is outside 0..{num_workers - 1}")
        return range(self.next_step + worker, self.stop_step, num_workers)

    def iter_batches(self, worker: tuple[int, int] | None = None) -> Iterator[PlanBatch]:
        """This rank's batches from ``next_step`` to ``stop_step``: all of them, or worker
        ``worker = (id, count)``'s share (default: the DataLoader worker running this, if any).
        ``next_step`` passes every step the iteration reaches, the other workers' included;
        a shard that skips or repeats a step is an error, not a shorter run."""
        wid, nw = dataloader_worker() if worker is None else worker
        start = self.next_step
        mine = self.worker_steps(wid, nw)
        if not mine:
            return
        shard = PlanShard(self.plan_dir, self.rank, self.meta)
        expected = start
        for pb in shard.iter_batches(start):
            if pb.step >= self.stop_step:
                break
            if pb.step != expected:
                raise ManifestError(f"{shard.path}: holds step {pb.step} where step {expected} belongs (corrupt shard)")
            expected += 1
            self.next_step = pb.step + 1
            if (pb.step - start) % nw == wid:
                yield pb
        if expected < self.stop_step:
            raise ManifestError(f"{shard.path}: ends at step {expected}, the plan holds steps up to "
                                f"{self.stop_step - 1} (corrupt shard)")

    def __iter__(self) -> Iterator[PlanBatch]:
        return self.iter_batches()

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Where the next batch starts: ``{"plan_hash", "rank", "next_step"}``."""
        return {"plan_hash": self.plan_hash, "rank": self.rank, "next_step": self.next_step}

    def state_validator(self, where: str = "sampler state") -> Validator:
        """The validation layer's checks (no coercion) failing as one-line :class:`PlanStateError` s
        named ``PLAN_DIR: where: field``, for adapters that check their own state keys."""
        return _Check(f"{self.plan_dir}: {where}", PlanStateError)

    def check_state(self, state: Any, others: Collection[str] = (), where: str = "sampler state") -> tuple[int, int]:
        """``(next_step, world size of the state's plan)`` of ``state`` after validating it
        (:func:`check_state`; nothing changes); ``others`` are keys of the caller's own state
        allowed besides the cursor's (checked by the caller)."""
        return check_state(self.meta, state, self.state_validator(where), others, self.stop_step)

    def load_state_dict(self, state: Any) -> None:
        """Continue at ``state["next_step"]`` (validated by :meth:`check_state`)."""
        self.next_step = self.check_state(state)[0]

