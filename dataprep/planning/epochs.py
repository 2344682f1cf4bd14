"""The one epoch loop of a plan and a re-plan: each epoch laid out from the spill
(:func:`~dataprep.planning.layout.balanced_or_none`, one bucket per step where balanced
steps cannot be filled or ``balance`` is 0), its shards written
(:func:`~dataprep.planning.shards.write_epoch_spilled`) and its figures added
(:class:`EpochTotals`, :class:`DynResTotals`, a weighted plan's per-corpus totals)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from bucketing.balance import DEFAULT_BALANCE
from bucketing.step_figures import PlanReport
from bucketing.costmodel import CostModel
from bucketing.dynres import (DynResConfig, ResolutionTotals, batch_targets, comparison_rows, policy_totals,
                              resolution_totals, resolve)
from bucketing.fit import Grid
from bucketing.plan import EpochPlan, PlanError
from bucketing.speeds import RankSpeeds
from dataprep.planning.stages import StagedWeights
from bucketing.steps_report import epoch_report
from dataprep.planning.draw import EpochDraw
from dataprep.planning.layout import EpochLayout, balanced_or_none, plan_epoch_identical_spilled
from dataprep.planning.shards import write_epoch_spilled
from dataprep.planning.spill import SpilledCorpus, check_bucket_fits
from dataprep.planning.weights import WeightedEpochs
from manifests.errors import DataprepError
from manifests.plan_files import PlanWriter
from manifests.plan_meta import BalanceInfo

#: Tolerance of the balanced steps a re-plan falls back to for the unseen rest of an epoch when
#: one-bucket steps would drop some of it (tiny buckets of batch size 1).
REST_BALANCE = DEFAULT_BALANCE


@dataclass
class EpochTotals:
    """What the epochs add up to, for ``plan.json``."""

    num_buckets: int
    steps_per_epoch: list[int] = field(default_factory=list)
    per_epoch: list[dict[str, Any]] = field(default_factory=list)
    fallbacks: list[dict[str, int]] = field(default_factory=list)
    dropped_rows: dict[str, list[int]] = field(default_factory=dict)
    real_s: float = 0.0
    pad_s: float = 0.0
    real_t: int = 0
    pad_t: int = 0
    reports: list[PlanReport] = field(default_factory=list)
    split_batches: int = 0
    unbalanced_steps: int = 0
    batches: npt.NDArray[np.int64] = field(init=False)
    utterances: npt.NDArray[np.int64] = field(init=False)

    def __post_init__(self) -> None:
        self.batches = np.zeros(self.num_buckets, dtype=np.int64)
        self.utterances = np.zeros(self.num_buckets, dtype=np.int64)

    @property
    def num_steps(self) -> int:
        return sum(self.steps_per_epoch)

    def add(self, ep: EpochPlan, first_step: int, batch_sizes: npt.NDArray[np.int64] | None = None,
            cost: CostModel | None = None, speed: npt.NDArray[np.float64] | None = None) -> None:
        self.real_s, self.pad_s = self.real_s + ep.real_seconds, self.pad_s + ep.padded_seconds
        self.real_t, self.pad_t = self.real_t + ep.real_tokens, self.pad_t + ep.padded_tokens
        bucket_of_batch = ep.bucket_of_batch()
        if batch_sizes is not None:
            self.reports.append(epoch_report(ep, batch_sizes, cost, speed))
        self.split_batches += ep.split_batches
        self.unbalanced_steps += ep.unbalanced_steps
        self.batches += np.bincount(bucket_of_batch, minlength=self.num_buckets)
        self.utterances += np.bincount(bucket_of_batch, weights=ep.sizes(), minlength=self.num_buckets).astype(np.int64)
        self.steps_per_epoch.append(ep.num_steps)
        self.per_epoch.append({"epoch": ep.epoch, "steps": ep.num_steps, "first_step": first_step,
                               "padding_audio": round(ep.audio_padding, 6),
                               "padding_tokens": round(ep.token_padding, 6),
                               "resplit_buckets": ep.resplit_buckets})
        self.fallbacks += [{"epoch": ep.epoch, **f} for f in ep.fallbacks]
        if ep.dropped.shape[0]:
            self.dropped_rows[str(ep.epoch)] = ep.dropped.tolist()

    def per_bucket(self, epochs: int, world_size: int) -> list[dict[str, int]]:
        return [{"bucket": b, "batches": int(self.batches[b]) // epochs,
                 "utterances": int(self.utterances[b]) // epochs,
                 "steps": int(self.batches[b]) // epochs // world_size} for b in range(self.num_buckets)]

    def padding(self) -> dict[str, Any]:
        return {"audio": round(1 - self.real_s / self.pad_s, 6) if self.pad_s else 0.0,
                "tokens": round(1 - self.real_t / self.pad_t, 6) if self.pad_t else 0.0,
                "real_seconds": round(self.real_s, 3), "padded_seconds": round(self.pad_s, 3),
                "real_tokens": self.real_t, "padded_tokens": self.pad_t}

    def balance_info(self, tolerance: float) -> BalanceInfo:
        """The epochs' reports, step-weighted."""
        w = np.array([r.steps for r in self.reports], dtype=np.float64)
        w = w / w.sum() if w.sum() else w

        def avg(name: str) -> float:
            return float(sum(wi * getattr(r, name) for wi, r in zip(w, self.reports)))

        return BalanceInfo(steps=sum(r.steps for r in self.reports), fill=avg("fill"), mean_batch=avg("mean_batch"),
                           straggler=avg("straggler"), idle=avg("idle"), same_bucket=avg("same_bucket"),
                           balance_mean=avg("balance_mean"), balance_over_1_10=avg("balance_over_1_10"),
                           tolerance=float(tolerance), split_batches=self.split_batches,
                           unbalanced_steps=self.unbalanced_steps)

    def fallback_summary(self) -> dict[str, Any]:
        return {
            "moved_rows": sum(f["rows"] for f in self.fallbacks if f["kind"] in ("carried", "borrowed")),
            "dropped_rows": sum(len(v) for v in self.dropped_rows.values()),
            "events": self.fallbacks,
            "dropped": self.dropped_rows,
            "resplit_buckets": sum(p["resplit_buckets"] for p in self.per_epoch),
            "broken_sync_steps": 0,
        }


@dataclass
class DynResTotals:
    """Predicted dynamic-resolution figures over the epochs, overall and per bucket."""

    config: DynResConfig
    num_buckets: int
    per_bucket: list[ResolutionTotals] = field(init=False)

    compare: dict[str, ResolutionTotals] = field(default_factory=dict)  # the same batches, other policies

    def __post_init__(self) -> None:
        self.per_bucket = [ResolutionTotals() for _ in range(self.num_buckets)]

    def add(self, ep: EpochPlan, duration: npt.NDArray[np.float64]) -> None:
        """Add one epoch, one rank at a time (memory: a rank's rows, not the epoch's)."""
        for r in range(ep.world_size):
            lo, hi = ep.rank_slice(r)
            off = ep.offsets[lo:hi + 1]
            self.add_batches(duration[ep.rows[off[0]:off[-1]]], off - off[0], ep.max_duration[lo:hi],
                             ep.bucket_of_batch()[lo:hi])

    def merge(self, other: DynResTotals) -> None:
        """Add another's figures (e.g. one epoch's, kept apart until its layout is final)."""
        self.per_bucket = [a + b for a, b in zip(self.per_bucket, other.per_bucket)]
        for k, t in other.compare.items():
            self.compare[k] = self.compare.get(k, ResolutionTotals()) + t

    def add_batches(self, d: npt.NDArray[np.float64], off: npt.NDArray[np.int64], longest: npt.NDArray[np.float64],
                    bucket: npt.ArrayLike, sign: int = 1) -> None:
        """Add (``sign`` -1: take away) batches given as durations ``d`` (s) in CSR ``off``, each
        batch's longest (s, its target) and bucket. The totals are integer counts: any split of
        an epoch's batches into calls, in any order, gives the same figures."""
        res = resolve(d, off, batch_targets(longest, self.config), self.config)
        got = resolution_totals(d, off, res, self.config, np.asarray(bucket), self.num_buckets)
        add = (lambda a, b: a + b) if sign > 0 else (lambda a, b: a - b)
        self.per_bucket = [add(a, b) for a, b in zip(self.per_bucket, got)]
        for k, t in policy_totals(d, off, self.config).items():
            self.compare[k] = add(self.compare.get(k, ResolutionTotals()), t)

    def to_json(self) -> dict[str, Any]:
        whole = sum(self.per_bucket, ResolutionTotals())
        return {"config": self.config.to_json(), **whole.to_json(),
                "per_bucket": [{"bucket": b, **t.to_json()} for b, t in enumerate(self.per_bucket)],
                "compare": comparison_rows(self.compare)}


def plan_extra(weighted: WeightedEpochs | None, dynres: DynResTotals | None,
               rank_speed: tuple[float, ...] | None = None, window: WindowTotals | None = None) -> dict[str, Any]:
    """``plan.json``'s optional sections: ``weights`` of a weighted plan, ``dynamic_resolution``
    of one with dynamic resolution, ``rank_speed`` of one for ranks of different speeds,
    ``weight_window`` of one whose steps keep the weights in every window."""
    return {**({"weights": weighted.to_json()} if weighted is not None else {}),
            **({"weight_window": window.to_json()} if window is not None else {}),
            **({"dynamic_resolution": dynres.to_json()} if dynres is not None else {}),
            **({"rank_speed": [float(s) for s in rank_speed]}
               if rank_speed is not None and RankSpeeds.of(rank_speed) is not None else {})}


def stages_extra(staged: StagedWeights | None, totals: EpochTotals, epochs: int,
                 known: dict[int, int] | None = None) -> dict[str, Any]:
    """``plan.json``'s ``stages`` of a staged plan (:mod:`dataprep.planning.stages`);
    ``known``: first steps of epochs a re-plan keeps from its parent."""
    if staged is None:
        return {}
    first = {p["epoch"]: p["first_step"] for p in totals.per_epoch}
    return {"stages": staged.to_json({**first, **(known or {})}, epochs)}


@dataclass
class WindowTotals:
    """A weighted plan's windows (``weight_window`` steps, ``tolerance``): per epoch laid out in
    ordered steps, its worst window and the windows over the tolerance; epochs not so ordered
    (one bucket per step where balanced steps cannot be filled) are counted apart."""

    window: int
    tolerance: float
    worst: float = 0.0
    windows: int = 0
    over: int = 0
    unordered_epochs: list[int] = field(default_factory=list)

    def add(self, epoch: int, gaps: npt.NDArray[np.float64] | None) -> None:
        if gaps is None:
            self.unordered_epochs.append(epoch)
            return
        self.worst = max(self.worst, float(gaps.max(initial=0.0)))
        self.windows += int(gaps.shape[0])
        self.over += int((gaps > self.tolerance + 1e-12).sum())

    def to_json(self) -> dict[str, Any]:
        return {"window": self.window, "tolerance": self.tolerance, "worst_gap": round(self.worst, 6),
                "windows": self.windows, "windows_over": self.over, "unordered_epochs": self.unordered_epochs}


def window_totals(window: int | None, tolerance: float, weighted: WeightedEpochs | None,
                  where: str) -> WindowTotals | None:
    """The :class:`WindowTotals` of a plan asked for ``window`` (None: not asked); refused
    for a plan that is not weighted (``where`` names its manifest)."""
    if window is None:
        return None
    if weighted is None:
        raise DataprepError(f"{where}: --weight-window keeps corpus weights in every window: the plan is not "
                            "weighted (give --weights CORPUS=W ..., or a manifest compiled from a weighted blend)")
    return WindowTotals(window, tolerance)


@dataclass
class EpochLoop:
    """How every epoch of one plan (or re-plan) is laid out and written: the spilled
    ``corpus`` (``grid``'s buckets, batch sizes ``bs``), ``world_size`` ranks, the seed,
    interleave, balance ``tolerance`` (0: one bucket per step), step-time ``cost``, sync
    ``group``, the memory ``limit`` (bytes), shard row groups, the figures it adds to
    (``weighted``, ``dynres``) and the ranks' ``speeds`` (None: alike)."""

    corpus: SpilledCorpus
    grid: Grid
    bs: npt.NDArray[np.int64]
    world_size: int
    seed: int
    interleave: str
    tolerance: float
    cost: CostModel
    group: int
    limit: int
    row_group_steps: int
    manifest: str
    weighted: WeightedEpochs | None = None
    dynres: DynResTotals | None = None
    speeds: RankSpeeds | None = None
    window: WindowTotals | None = None
    stages: StagedWeights | None = None

    def run(self, writer: PlanWriter, epochs: range, first_step: int, totals: EpochTotals, *,
            draw_of: Callable[[int], EpochDraw | None], last: int, rest: int | None = None,
            on_progress: Callable[[int, int], None] | None = None,
            begin: Callable[[str], None] = lambda what: None, lap: Callable[[str], None] = lambda phase: None,
            error: Callable[[int, Exception], DataprepError]) -> None:
        """Lay out and write ``epochs`` (the plan's last is ``last``), steps numbered from
        ``first_step``, figures into ``totals``. ``draw_of(e)``: epoch ``e``'s entries (None:
        every row once). ``rest``: the epoch whose entries must all be placed (a re-plan's
        unseen rest: where one bucket per step drops some, balanced steps of
        :data:`REST_BALANCE` instead, counted as a ``balanced_rest`` fallback).
        ``on_progress(done, total)`` counts shard writes; ``begin`` / ``lap`` announce and
        time phases; ``error(e, exc)`` is the one-line error of a plan error in epoch ``e``."""
        W, n = self.world_size, len(epochs)
        first = first_step
        for i, e in enumerate(epochs):
            begin(f"epoch {i + 1}/{n}: ordering buckets, laying out steps")
            draw = draw_of(e)
            if draw is not None:
                check_bucket_fits(self.manifest, draw.counts, self.bs, self.limit)
            final = e == last
            try:
                lay, figures = self._lay_out(e, self.tolerance, final and e != rest, draw)
                if e == rest and lay.ep.dropped.shape[0]:  # the rest must be seen: balanced steps place all
                    lay, figures = self._lay_out(e, REST_BALANCE, final, draw)
                    lay.ep.fallbacks.append({"kind": "balanced_rest", "from": -1, "to": -1,
                                             "rows": int((self.corpus.counts if draw is None else draw.counts).sum())})
            except (DataprepError, PlanError) as exc:
                raise error(e, exc) from None
            if final:  # the ids are in the position columns now: the spill's go before the shards are written
                self.corpus.drop_laid_out()
            if self.stages is not None and lay.groups is not None:
                self.stages.add_totals(e, lay.groups)
            elif self.weighted is not None and lay.groups is not None:
                self.weighted.add_totals(lay.groups)
            if self.window is not None:
                self.window.add(e, lay.windows)
            if self.dynres is not None and figures is not None:
                self.dynres.merge(figures)
            lap("plan")
            begin(f"epoch {i + 1}/{n}: writing shards")
            config = None if self.dynres is None else self.dynres.config
            write_epoch_spilled(writer, lay, self.corpus, first, self.row_group_steps,
                                lambda r: on_progress(i * W + r + 1, n * W) if on_progress else None,
                                None if config is None else batch_targets(lay.ep.max_duration, config),
                                memory_limit=self.limit, last=final)
            totals.add(lay.ep, first, self.bs, self.cost, None if self.speeds is None else self.speeds.rank_speed())
            first += lay.ep.num_steps
            lap("write")

    def _lay_out(self, e: int, tolerance: float, final: bool,
                 draw: EpochDraw | None) -> tuple[EpochLayout, DynResTotals | None]:
        """Epoch ``e`` in balanced steps of ``tolerance`` (0: one bucket per step; so too where
        the rows cannot fill whole balanced steps, as :func:`bucketing.plan.plan_epoch`), and its
        dynamic-resolution figures."""
        c, dynres = self.corpus, self.dynres
        if tolerance > 0:
            figures = None if dynres is None else DynResTotals(dynres.config, dynres.num_buckets)
            lay = balanced_or_none(c, self.bs, self.world_size, self.seed, e, interleave=self.interleave,
                                   tolerance=tolerance, cost=self.cost, group=self.group, final=final, draw=draw,
                                   measure=None if figures is None else figures.add_batches, speeds=self.speeds,
                                   full_cost=None if self.speeds is None else
                                   self.cost.step_time(self.bs, self.grid.max_duration, c.max_tokens),
                                   window=None if self.window is None else self.window.window)
            if lay is not None:
                return lay, figures
        figures = None if dynres is None else DynResTotals(dynres.config, dynres.num_buckets)
        return plan_epoch_identical_spilled(c, self.grid, self.bs, self.world_size, self.seed, e,
                                            interleave=self.interleave, group=self.group, final=final, draw=draw,
                                            measure=None if figures is None else figures.add_batches), figures
