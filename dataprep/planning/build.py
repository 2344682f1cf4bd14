"""manifest + buckets.json -> plan directory: read the columns the planner needs, assign rows
to buckets, plan every epoch with :func:`bucketing.plan.plan_epoch`, stream the rank shards
and publish ``plan.json`` (:class:`manifests.plan_meta.PlanMeta`) atomically with them.

With dynamic resolution (:mod:`bucketing.dynres`) each batch also records its target frames
(shard version 2) and ``plan.json`` gets a ``dynamic_resolution`` entry: the rates and the
predicted frame padding, clamped and fallback shares, overall and per bucket."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from bucketing.allocate import Assignment, assign, fills_steps
from bucketing.batching import TOTALS_BLOCK
from bucketing.dynres import (
    DynResConfig,
    ResolutionTotals,
    batch_targets,
    comparison_rows,
    policy_totals,
    resolution_totals,
    resolve,
)
from bucketing.balance import PlanReport
from bucketing.costmodel import CostModel
from bucketing.fit import Grid, grid_from_spec
from bucketing.groups import regroup
from bucketing.plan import EpochPlan, PlanError, PlanInputs, plan_epoch, require_one_step
from bucketing.steps_report import epoch_report
from dataprep.planning.options import PlanOptions
from dataprep.planning.weights import (
    Blend,
    WeightedEpochs,
    blend_of,
    unknown_corpus_error,
    wants_weights,
    weighted_epochs,
    weighting,
)
from manifests.buckets_file import BucketSpec, read_buckets
from manifests.errors import DataprepError, ManifestError
from dataprep.planning.out_of_core import (
    IN_MEMORY_BYTES_PER_ROW,
    SpilledCorpus,
    check_bucket_fits,
    default_memory_limit,
    disk_bytes,
    carry_spilled,
    draw_epoch,
    plan_epoch_identical_spilled,
    plan_epoch_spilled,
    spill_manifest,
    write_epoch_spilled,
)
from manifests.content_hash import file_sha256
from manifests.corpus_codes import iter_corpus_codes
from manifests.hash_cache import manifest_hash
from manifests.manifest_read import manifest_num_rows, read_manifest
from manifests.plan_files import PlanWriter, shard_table
from manifests.plan_meta import BalanceInfo, FileRef, ManifestRef, PlanMeta
from manifests.spill import SpillFiles, check_free_disk, remove_spill, retained_heap, spill_dir


def batch_sizes_of(spec: BucketSpec, where: str = "buckets.json") -> npt.NDArray[np.int64]:
    """Batch size per bucket; a one-line error if any bucket lacks one."""
    missing = [b.index for b in spec.buckets if b.batch_size is None]
    if missing:
        raise ManifestError(
            f"{where}: bucket {missing[0]} has no batch_size ({len(missing)} buckets lack one); "
            "run `dataprep fit-buckets` with a budget or `dataprep oomptimize`"
        )
    return np.asarray([b.batch_size for b in spec.buckets], dtype=np.int64)


def check_shape_policy(spec: BucketSpec, dynamic_resolution: DynResConfig | None, where: str = "buckets.json") -> None:
    """Refuse batch sizes made for another batch shape: ``batch_size_source.shape_policy``
    (written by ``oomptimize``; absent = the longest utterance at the base rate, as every
    other sizing) must be the plan's (:meth:`DynResConfig.shape_policy`; no dynamic resolution
    = the longest)."""
    longest = DynResConfig().shape_policy()
    sized = (spec.batch_size_source or {}).get("shape_policy") or longest
    want = longest if dynamic_resolution is None else dynamic_resolution.shape_policy()
    if sized.get("target_frames") != want["target_frames"] or (want["target_frames"] != longest["target_frames"]
                                                               and sized != want):
        def name(p: dict[str, Any]) -> str:
            t = p.get("target_frames")
            return "the longest utterance at the base rate" if t == longest["target_frames"] else \
                f"dynamic resolution at {t} frames ({p.get('min_rate')}-{p.get('max_rate')} Hz, floor {p.get('floor_rate')} Hz)"

        raise ManifestError(f"{where}: batch_size_source: batch sizes are for {name(sized)}, the plan asks for "
                            f"{name(want)}; run `dataprep oomptimize` with the plan's --dynamic-resolution options")


@dataclass(frozen=True)
class ManifestColumns:
    """What the planner reads of a manifest: durations (s), tokens, ids."""

    duration: npt.NDArray[np.float64]
    num_tokens: npt.NDArray[np.int64]
    ids: pa.Array

    @classmethod
    def read(cls, manifest: str | os.PathLike[str]) -> ManifestColumns:
        df = read_manifest(manifest, columns=["id", "duration", "num_tokens"])
        if df.height == 0:
            raise ManifestError(f"{manifest}: the manifest has no rows")
        ids = df.get_column("id").to_arrow().cast(pa.string())
        if isinstance(ids, pa.ChunkedArray):
            ids = ids.combine_chunks()
        return cls(df["duration"].to_numpy(), df["num_tokens"].fill_null(0).to_numpy().astype(np.int64), ids)


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
            cost: CostModel | None = None) -> None:
        self.real_s, self.pad_s = self.real_s + ep.real_seconds, self.pad_s + ep.padded_seconds
        self.real_t, self.pad_t = self.real_t + ep.real_tokens, self.pad_t + ep.padded_tokens
        bucket_of_batch = ep.bucket_of_batch()
        if batch_sizes is not None:
            self.reports.append(epoch_report(ep, batch_sizes, cost))
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


def build_plan(
    manifest: str | os.PathLike[str],
    buckets: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    options: PlanOptions,
    *,
    on_progress: Callable[[int, int], None] | None = None,
    on_phase: Callable[[str], None] | None = None,
    timings: dict[str, float] | None = None,
) -> PlanMeta:
    """Plan ``options.epochs`` epochs of ``manifest`` over ``options.world_size`` ranks into
    ``out_dir`` (the options, checked by :class:`PlanOptions`, say how).

    ``balance`` > 0 (default 0.05): balanced steps (full batches whose predicted times under
    ``cost``, in seconds, agree within that relative tolerance: one bucket's where the data
    allows, several buckets' otherwise; :mod:`bucketing.balance`); 0: one bucket per step
    (identical buckets on every rank, the plans made before ``--balance`` existed, byte for
    byte). ``sync_group`` G (dividing ``world_size``; None = all): ranks are synchronized only
    within groups of G, each group drawing the steps in its own order (:mod:`bucketing.groups`).

    Returns the plan's metadata (the content of ``plan.json``). ``on_progress(done, total)``
    counts shard writes; ``on_phase(what)`` is told each phase as it starts (reading, each
    epoch's layout and writing: minutes apiece at hundreds of millions of rows, before or
    between shard writes); ``timings`` (if given) receives wall seconds per phase (read,
    allocate, plan, write). ``dynamic_resolution``: record each batch's target frames (the
    config's constant, or its longest utterance at ``frames_per_second``) in a
    ``target_frames`` shard column and the predicted figures in ``plan.json``; the buckets'
    sizes must be for that shape (:func:`check_shape_policy`). None (default) writes today's
    plan, byte for byte.

    A manifest of many corpora with a weighted blend (or ``options.weights``) gets a weighted
    plan (:mod:`dataprep.planning.weights`): each epoch holds exactly each corpus's quota
    instead of every row once, recorded in ``plan.json`` under ``weights``.

    A manifest whose in-memory plan would need more than ``options.memory_limit`` bytes
    (:data:`~dataprep.planning.out_of_core.IN_MEMORY_BYTES_PER_ROW` per row) is planned out of
    core (:mod:`dataprep.planning.out_of_core`): the same bytes, memory bounded by the largest
    bucket; balanced, unweighted plans without dynamic resolution only (else a one-line error).
    """
    if not isinstance(options, PlanOptions):
        raise DataprepError(f"build_plan: options must be PlanOptions, got {type(options).__name__}")
    clock = _Clock(timings, on_phase)
    world_size, seed, epochs, strict, carry = (options.world_size, options.seed, options.epochs, options.strict,
                                               options.carry)
    interleave, balance, cost, group = options.interleave, options.balance, options.cost, options.group
    dynamic_resolution = options.dynamic_resolution
    row_group_steps = options.row_group_steps
    spec = read_buckets(buckets)
    bs = batch_sizes_of(spec, str(buckets))
    check_shape_policy(spec, dynamic_resolution, str(buckets))
    grid = grid_from_spec(spec)
    limit = memory_limit_of(options)
    if plans_out_of_core(manifest, options):
        with retained_heap():  # bucket-sized arrays reused, not zeroed afresh (see retained_heap)
            return _build_out_of_core(manifest, buckets, out_dir, options, spec, limit, on_progress, clock)
    clock.begin("reading the manifest")
    cols = ManifestColumns.read(manifest)
    options.check_rows(cols.duration.shape[0])  # before any per-rank allocation
    clock("read")
    # balanced steps need no bucket to fill whole steps, so tails are always carried
    assigned = assign(cols.duration, cols.num_tokens, grid, bs, strict=strict, carry=carry,
                      world_size=None if balance > 0 else world_size)
    inputs = PlanInputs(assigned.bucket, bs, cols.duration, cols.num_tokens, grid.max_duration,
                        assigned.max_tokens.astype(np.float64))
    weighted = weighted_epochs(manifest, assigned.bucket, cols.duration, options)
    clock("allocate")
    try:  # before one shard writer per rank is opened (seconds at a huge --world-size)
        require_one_step(assigned.bucket, world_size)
    except PlanError as exc:
        raise DataprepError(f"{manifest}: cannot plan: {exc}") from None
    totals = EpochTotals(len(spec.buckets))
    dynres = DynResTotals(dynamic_resolution, len(spec.buckets)) if dynamic_resolution is not None else None
    total = epochs * world_size
    with PlanWriter(out_dir, world_size, row_group_steps=row_group_steps,
                    target_frames=dynamic_resolution is not None) as writer:
        for e in range(epochs):
            clock.begin(f"epoch {e + 1}/{epochs}: laying out steps")
            epoch_inputs = inputs if weighted is None else weighted.epoch_inputs(inputs, e)
            try:
                ep = regroup(plan_epoch(epoch_inputs, world_size, seed, e, interleave=interleave,  # type: ignore[arg-type]
                                        balance=balance, cost=cost), group, seed)
            except PlanError as exc:
                raise DataprepError(f"{manifest}: cannot plan: {exc}") from None
            del epoch_inputs  # a weighted epoch's rows: freed before the shards are written
            if weighted is not None:
                weighted.add(ep, cols.duration, cols.num_tokens)
            clock("plan")
            clock.begin(f"epoch {e + 1}/{epochs}: writing shards")
            first_step = totals.num_steps
            write_epoch(writer, ep, cols.ids, first_step, lambda r: on_progress(e * world_size + r + 1, total)
                         if on_progress else None, dynamic_resolution, last=e == epochs - 1)
            totals.add(ep, first_step, bs, cost)
            if dynres is not None:
                dynres.add(ep, cols.duration)
            clock("write")
        if totals.num_steps == 0:
            raise DataprepError(
                f"{manifest}: the plan has no steps ({int((assigned.bucket >= 0).sum())} of {cols.duration.shape[0]} "
                f"rows allocated, {totals.fallback_summary()['dropped_rows']} dropped for {world_size} ranks); "
                "use fewer ranks or buckets with larger batch sizes"
            )
        meta = _plan_meta(manifest, buckets, spec, cols.duration.shape[0], _allocation_entry(assigned, strict), totals,
                          world_size=world_size, seed=seed, epochs=epochs, interleave=interleave,
                          balance=totals.balance_info(balance), sync_group=group)
        meta = writer.finish(dataclasses.replace(meta, extra={**meta.extra, **plan_extra(weighted, dynres)}))
    clock("write")
    return meta


def memory_limit_of(options: PlanOptions) -> int:
    """The bytes a plan may hold: ``options.memory_limit``, else half the machine's memory."""
    return options.memory_limit if options.memory_limit is not None else default_memory_limit()


def plans_out_of_core(manifest: str | os.PathLike[str], options: PlanOptions) -> bool:
    """Whether a plan (or re-plan) of ``manifest`` with ``options`` runs out of core: its
    in-memory plan would need more than the memory limit (:data:`IN_MEMORY_BYTES_PER_ROW` a
    row; the manifest's footer is read, not its rows)."""
    return manifest_num_rows(manifest) * IN_MEMORY_BYTES_PER_ROW > memory_limit_of(options)


def _allocation_entry(assigned: Assignment, strict: bool) -> dict[str, Any]:
    """``plan.json``'s ``allocation``."""
    alloc = assigned.allocation
    return {
        "strict": strict,
        "allocated_rows": int((alloc.bucket >= 0).sum()),
        "left_out": {k: v.tolist() for k, v in sorted(alloc.dropped.items())},
        "moved_to_longer_bin": alloc.moved,
        "carried_tails": assigned.carried,
        "carry": assigned.carry,
        "raised_max_tokens_rows": alloc.raised,
    }


def _build_out_of_core(manifest: str | os.PathLike[str], buckets: str | os.PathLike[str],
                       out_dir: str | os.PathLike[str], options: PlanOptions, spec: BucketSpec, limit: int,
                       on_progress: Callable[[int, int], None] | None, clock: _Clock) -> PlanMeta:
    """:func:`build_plan` for a corpus whose in-memory plan would exceed ``limit`` bytes
    (:mod:`dataprep.planning.out_of_core`): the same plan, memory bounded by the largest bucket."""
    W, epochs = options.world_size, options.epochs
    blend = blend_of(manifest, options) if wants_weights(manifest, options) else None
    config = options.dynamic_resolution
    dynres = DynResTotals(config, len(spec.buckets)) if config is not None else None
    bs = batch_sizes_of(spec, str(buckets))
    grid = grid_from_spec(spec)
    root = spill_dir(out_dir)
    try:
        clock.begin("reading the manifest, spilling it")
        corpus, weighted = spill_for_plan(manifest, grid, bs, root, blend, options, strict=options.strict,
                                          epochs=epochs, limit=limit,
                                          world_size=None if options.balance > 0 else W)
        clock("read")
        totals = EpochTotals(len(spec.buckets))
        cost = options.cost or CostModel()
        with PlanWriter(out_dir, W, row_group_steps=options.row_group_steps,
                        target_frames=config is not None) as writer:
            for e in range(epochs):
                clock.begin(f"epoch {e + 1}/{epochs}: ordering buckets, laying out steps")
                draw = None
                if weighted is not None:
                    draw = draw_epoch(corpus, weighted.sampler, e)
                    check_bucket_fits(manifest, draw.counts, bs, limit)
                try:
                    if options.balance > 0:
                        lay = plan_epoch_spilled(corpus, bs, W, options.seed, e, interleave=options.interleave,
                                                 tolerance=options.balance, cost=cost, group=options.group,
                                                 final=e == epochs - 1, draw=draw,
                                                 measure=None if dynres is None else dynres.add_batches)
                    else:
                        lay = plan_epoch_identical_spilled(corpus, grid, bs, W, options.seed, e,
                                                           interleave=options.interleave, group=options.group,
                                                           final=e == epochs - 1, draw=draw,
                                                           measure=None if dynres is None else dynres.add_batches)
                except (DataprepError, PlanError) as exc:
                    raise DataprepError(f"{manifest}: cannot plan: {exc}") from None
                if weighted is not None and lay.groups is not None:
                    weighted.add_totals(lay.groups)
                clock("plan")
                clock.begin(f"epoch {e + 1}/{epochs}: writing shards")
                first_step = totals.num_steps
                write_epoch_spilled(writer, lay, corpus, first_step, options.row_group_steps,
                                    lambda r: on_progress(e * W + r + 1, epochs * W) if on_progress else None,
                                    None if config is None else batch_targets(lay.ep.max_duration, config),
                                    memory_limit=limit, last=e == epochs - 1)
                totals.add(lay.ep, first_step, bs, options.cost)
                clock("write")
            meta = _plan_meta(manifest, buckets, spec, corpus.num_rows,
                              corpus.allocation_entry(options.strict, corpus.carry), totals,
                              world_size=W, seed=options.seed, epochs=epochs, interleave=options.interleave,
                              balance=totals.balance_info(options.balance), sync_group=options.group)
            meta = writer.finish(dataclasses.replace(meta, extra={**meta.extra, **plan_extra(weighted, dynres)}))
    finally:
        remove_spill(root)
    clock("write")
    return meta


def plan_extra(weighted: WeightedEpochs | None, dynres: DynResTotals | None) -> dict[str, Any]:
    """``plan.json``'s optional sections: ``weights`` of a weighted plan, ``dynamic_resolution``
    of one with dynamic resolution."""
    return {**({"weights": weighted.to_json()} if weighted is not None else {}),
            **({"dynamic_resolution": dynres.to_json()} if dynres is not None else {})}


def spill_for_plan(manifest: str | os.PathLike[str], grid: Grid, bs: npt.NDArray[np.int64], root: Path,
                   blend: Blend | None, options: PlanOptions, *, strict: bool, epochs: int,
                   limit: int, world_size: int | None = None, ids_once: bool | None = None,
                   drawn: bool = False) -> tuple[SpilledCorpus, WeightedEpochs | None]:
    """The spill of an out-of-core plan of ``epochs`` epochs (the free disk checked before it for
    the whole plan, and after it again once the largest bucket is known: ``ids_once`` and
    ``drawn`` as :func:`dataprep.planning.out_of_core.disk_bytes` takes them):
    with a ``blend``, each row's corpus and index in it too, and the blend's quotas over the
    spilled rows (``options``: the weighting's epoch size and seed). Tails are carried
    (``options.carry``, never ``strict``) as :func:`bucketing.allocate.assign` carries them:
    with ``world_size`` (one bucket per step), only where every bucket fills a step
    (``SpilledCorpus.carry`` says whether they were)."""
    names = [] if blend is None else list(blend.probabilities)
    codes = None
    if blend is not None:
        codes = iter_corpus_codes(manifest, names, TOTALS_BLOCK)
        if codes is None:
            raise DataprepError(f"{manifest}: has no corpus column (compile an input_cfg blend to weigh corpora)")
    check_free_disk(root, disk_bytes(manifest, epochs, weighted=blend is not None, ids_once=ids_once,
                                     drawn=drawn).peak, "the spill files and the plan")
    carry = options.carry and not strict
    corpus = spill_manifest(manifest, grid, bs, root, strict=strict, carry=carry and world_size is None,
                            memory_limit=limit, codes=codes, num_corpora=len(names) if blend is not None else None)
    if carry and world_size is not None:
        carry = fills_steps(corpus.counts, bs, world_size)
        if carry:
            corpus = carry_spilled(corpus, grid, bs, manifest, limit)
    corpus.carry = carry
    need = disk_bytes(manifest, epochs, weighted=blend is not None, largest=int(corpus.counts.max(initial=0)),
                      ids_once=ids_once, drawn=drawn)
    check_free_disk(root, need.peak - SpillFiles(root).written_bytes(),
                    "the position files and the plan (besides the spill files written)")
    if blend is None:
        return corpus, None
    if corpus.unknown_corpus:
        raise unknown_corpus_error(manifest, names)
    return corpus, weighting(manifest, blend, *corpus.corpus_sums(len(names)), options)


def _plan_meta(manifest: str | os.PathLike[str], buckets: str | os.PathLike[str], spec: BucketSpec,
               num_rows: int, allocation: dict[str, Any], totals: EpochTotals, *, world_size: int,
               seed: int, epochs: int, interleave: str, balance: BalanceInfo | None = None,
               sync_group: int | None = None) -> PlanMeta:
    return PlanMeta(
        manifest=ManifestRef(Path(manifest).name, manifest_hash(manifest), int(num_rows)),
        buckets_file=FileRef(Path(buckets).name, file_sha256(buckets)),
        buckets=spec.to_json()["buckets"],
        world_size=world_size, seed=seed, epochs=epochs, interleave=interleave,
        allocation=allocation,
        num_steps=totals.num_steps,
        steps_per_epoch=totals.steps_per_epoch,
        per_epoch=totals.per_epoch,
        per_bucket=totals.per_bucket(epochs, world_size),
        padding=totals.padding(),
        fallbacks=totals.fallback_summary(),
        balance=balance,
        sync_group=sync_group,
    )


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


class _Clock:
    """Adds the seconds since the previous call to ``timings[phase]``; :meth:`begin` tells
    ``announce`` what starts now."""

    def __init__(self, timings: dict[str, float] | None, announce: Callable[[str], None] | None = None) -> None:
        self.timings, self.t, self.announce = timings, time.perf_counter(), announce

    def begin(self, what: str) -> None:
        if self.announce is not None:
            self.announce(what)

    def __call__(self, phase: str) -> None:
        now = time.perf_counter()
        if self.timings is not None:
            self.timings[phase] = self.timings.get(phase, 0.0) + now - self.t
        self.t = now


def write_epoch(writer: PlanWriter, ep: EpochPlan, ids: pa.Array, first_step: int,
                 tick: Callable[[int], object], dynamic_resolution: DynResConfig | None = None, *,
                 last: bool = False) -> None:
    """Every rank's batches of ``ep`` appended to its shard; ``last``: the plan's last epoch
    (each shard closed once written, :meth:`manifests.plan_files.PlanWriter.write_ranks`)."""
    S = ep.num_steps
    targets = None if dynamic_resolution is None else batch_targets(ep.max_duration, dynamic_resolution)

    def one(r: int) -> pa.Table:
        lo, hi = ep.rank_slice(r)
        off = ep.offsets[lo:hi + 1]
        a, b = int(off[0]), int(off[-1])
        table = shard_table(
            epoch=ep.epoch, first_step=first_step, bucket=ep.bucket_of_batch()[lo:hi], offsets=off, rows=ep.rows,
            ids=ids.take(pa.array(ep.rows[a:b])),  # this rank's ids, one gather
            max_duration=ep.max_duration[lo:hi], max_tokens=ep.max_tokens[lo:hi],
            target_frames=None if targets is None else targets[lo:hi],
        )
        assert table.num_rows == S
        return table

    writer.write_ranks(lambda r: [one(r)], tick, close=last)
