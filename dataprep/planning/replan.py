"""Elastic re-plan: continue a plan at step K on another world size.

``replan(plan/, at_step=K, world_size=W2, out_dir=plan2/)``: the parent's batches of steps < K
stay consumed; the rest of K's epoch (exactly the rows of the parent's batches at steps >= K of
that epoch, in the buckets they had) and every later epoch are planned for W2 ranks with
:func:`bucketing.plan.plan_epoch`, the parent's seed, interleave and balance tolerance. The new
plan keeps the parent's global step numbers: its shards hold steps K .. num_steps - 1 and
``plan.json`` records ``replan`` (parent plan hash, parent world size, K), so a trainer resumes
the parent's checkpoint at step K on it (``dataprep train --resume``).

A parent with sync groups keeps them (each group draws the re-planned steps in its own order,
:func:`bucketing.groups.regroup`; ``options.sync_group`` overrides the parent's size, which must
divide the new world size); a dynamic-resolution parent keeps its rates (its batches record
target frames); the rest is in blocks of ``options.container_block`` containers (default: the parent's)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from bucketing.costmodel import CostModel
from bucketing.dynres import DynResConfig
from bucketing.fit import grid_from_spec
from dataprep.planning.calibrate import cost_equal_sizes
from dataprep.planning.build import memory_limit_of, spill_for_plan, spills_to_disk
from dataprep.planning.container_blocks import ContainerBlocks, container_codes
from dataprep.planning.epochs import DynResTotals, EpochLoop, EpochTotals, WindowTotals, plan_extra, stages_extra
from dataprep.planning.stages import recorded_stages, staged_weights
from bucketing.speeds import RankSpeeds
from dataprep.planning.options import PlanOptions, replan_speeds
from dataprep.planning.packed import replan_packed
from dataprep.planning.draw import ROW_COUNT_BYTES, draw_epoch, draw_rows, draw_weighted_without, draw_without
from dataprep.planning.exclude import (EXCLUDED_KEY, ExcludedDraw, exclusion_entry, excluded_rows, is_excluded,
                                       read_excluded_ids, recorded_exclusions)
from dataprep.planning.weights import WeightedEpochs, blend_of
from manifests.arrow_views import numeric_values
from manifests.buckets_file import parse_buckets
from manifests.errors import DataprepError, OptionError
from manifests.hash_cache import require_manifest_hash
from manifests.options import check_int
from manifests.plan_files import PlanShard, PlanWriter
from manifests.plan_meta import PlanMeta, ReplanInfo, read_plan_meta
from manifests.spill import remove_spill, retained_heap, spill_dir, system_arrow_pool


def epoch_of_step(meta: PlanMeta, step: int) -> int:
    """The epoch holding global ``step`` (``epochs`` when ``step == num_steps``)."""
    starts = np.asarray(meta.first_step_of_epoch + [meta.num_steps])
    return int(np.searchsorted(starts, step, side="right") - 1) if step < meta.num_steps else meta.epochs


def replan(plan_dir: str | os.PathLike[str], manifest: str | os.PathLike[str], out_dir: str | os.PathLike[str],
           options: PlanOptions, *, at_step: int, exclude: str | os.PathLike[str] | None = None,
           packed: Any = None) -> PlanMeta:
    """Re-plan ``plan_dir`` from ``at_step`` on for ``options.world_size`` ranks into ``out_dir``
    (module docstring). ``manifest`` must be the parent's (by content hash). Of ``options``
    only ``world_size``, ``carry``, ``cost``, ``cost_equal`` (the parent's sizes as memory caps),
    ``row_group_steps``, ``sync_group``, ``rank_speed`` (default: the parent's where the world
    size stays) and ``container_block`` (default: the parent's) apply: seed,
    epochs, interleave, strictness, balance and dynamic resolution are the parent plan's
    (``options.dynamic_resolution``, if given, must equal the parent's).

    ``exclude``: a file of ids (:func:`dataprep.planning.exclude.read_excluded_ids`) never seen
    from ``at_step`` on: the rest of that epoch is the unseen rows without them, every later
    epoch every other row once; with the parent's own exclusions (kept), recorded in
    ``plan.json``. A weighted plan's later epochs draw each corpus's quota again from its
    remaining rows (:class:`dataprep.planning.exclude.ExcludedDraw`); the rest of ``at_step``'s
    epoch is its unseen rows without the excluded ones.

    A packed parent (``plan.json``'s ``pack``) is re-planned by
    :func:`dataprep.planning.packed.replan_packed`, which calls back with ``packed`` (its
    sequences; ``manifest`` then the sequences' manifest)."""
    if not isinstance(options, PlanOptions):
        raise DataprepError(f"replan: options must be PlanOptions, got {type(options).__name__}")
    check_int("at_step", at_step, le=None)  # its range is the plan's, checked below
    world_size, cost, row_group_steps = options.world_size, options.cost, options.row_group_steps
    meta = read_plan_meta(plan_dir)
    if not meta.first_step <= at_step < meta.num_steps:
        raise DataprepError(f"--at-step {at_step}: the plan holds steps {meta.first_step}..{meta.num_steps - 1}")
    if "pack" in meta.extra and options.container_block is not None:
        raise OptionError("container_block", "is not available for a packed plan (plan.json's pack)")
    if packed is None and "pack" in meta.extra:
        return replan_packed(plan_dir, manifest, out_dir, options, meta, at_step=at_step, exclude=exclude,
                             replan=replan, limit=memory_limit_of(options))
    group = _sync_group(meta, options)
    dynres_config = _dynres_config(plan_dir, meta, options)
    if packed is None:  # a packed plan's manifest was checked by replan_packed
        require_manifest_hash(manifest, meta.manifest.content_hash, "the plan's manifest")
    spec = parse_buckets({"buckets": meta.buckets}, f"{plan_dir}/plan.json: buckets")
    spec = cost_equal_sizes(spec, cost, f"{plan_dir}/plan.json") if options.cost_equal else spec
    bs = spec.batch_sizes()
    grid = grid_from_spec(spec)
    tol = meta.balance.tolerance if meta.balance is not None else 0.0
    strict = bool(meta.allocation.get("strict", False))
    e0 = epoch_of_step(meta, at_step)
    recorded = meta.extra.get("weights")
    parent = _parent_weighting(meta, options)
    blend = blend_of(manifest, parent, tree=recorded.get("tree")) if isinstance(recorded, dict) else None
    num_corpora = 0 if blend is None else len(blend.probabilities)
    excluded, excluded_entry = _exclusions(plan_dir, meta, manifest, exclude, at_step)
    speeds = replan_speeds(options, meta.extra.get("rank_speed"), meta.world_size, tol)
    limit = memory_limit_of(options)
    root = spill_dir(out_dir) if spills_to_disk(manifest, options) else None
    try:
        # on disk: bucket-sized arrays reused, not zeroed afresh (see retained_heap); in memory the
        # spill's own columns fill the heap, and freed blocks given back (Arrow's too: the system
        # allocator) keep the peak the corpus's
        with retained_heap() if root is not None else system_arrow_pool():
            corpus, weighted = spill_for_plan(manifest, grid, bs, root, blend, parent, strict=strict,
                                              epochs=meta.epochs - e0, limit=limit,
                                              world_size=None if tol > 0 else world_size,
                                              ids_once=tol > 0 and meta.epochs - e0 == 1,  # one bucket per step: kept
                                              drawn=True,  # the unseen rest's times drawn
                                              fixed_buckets=packed is not None)
            options.check_rows(corpus.num_rows)  # before any per-rank allocation
            block = _container_block(meta, options)
            if block is not None:
                corpus.blocks = ContainerBlocks(container_codes(str(manifest)), block)
            if weighted is not None:
                _check_recorded_quotas(meta, weighted)
            stages = recorded_stages(meta.extra.get("stages"))
            staged = None if stages is None or weighted is None else staged_weights(
                manifest, stages, weighted.names, *corpus.corpus_sums(len(weighted.names)), parent)
            gone = ExcludedDraw(corpus, excluded, num_corpora) if excluded.shape[0] and weighted is not None else None
            # excluding from an epoch's first step: that epoch is drawn whole again, its quotas exact
            rest, stray = (None, 0) if gone is not None and at_step == meta.first_step_of_epoch[e0] else draw_rows(
                corpus, lambda: _unseen_blocks(plan_dir, meta, at_step, e0, excluded,
                                               None if packed is None else packed.sequence_of), num_corpora,
                block_rows=max(1, limit // (2 * ROW_COUNT_BYTES)))
            if stray:
                raise DataprepError(f"{plan_dir}: {stray} of the rows the plan has not trained are in no bucket of "
                                    "the re-plan's allocation (another manifest?)")
            totals = EpochTotals(len(spec.buckets))
            loop = EpochLoop(corpus, grid, bs, world_size, meta.seed, meta.interleave, tol, cost or CostModel(),
                             group, limit, row_group_steps, str(manifest), weighted,
                             DynResTotals(dynres_config, len(spec.buckets)) if dynres_config is not None else None,
                             None if speeds is None else RankSpeeds.of(speeds), _window(meta, weighted), staged)

            def error(e: int, exc: Exception) -> DataprepError:
                return DataprepError(f"{plan_dir}: cannot re-plan epoch {e} from step {at_step} for {world_size} "
                                     f"ranks: {exc}; re-plan at another step")

            with PlanWriter(out_dir, world_size, row_group_steps=row_group_steps,
                            target_frames=dynres_config is not None,
                            packed=None if packed is None else packed.shards()) as writer:
                loop.run(writer, range(e0, meta.epochs), at_step, totals, last=meta.epochs - 1, rest=e0,
                         draw_of=lambda e: rest if e == e0 and rest is not None else None if weighted is None and not excluded.shape[0]
                         else draw_without(corpus, excluded, num_corpora) if weighted is None
                         else draw_epoch(corpus, (weighted if staged is None else staged.of(e)).sampler, e)
                         if not excluded.shape[0] else draw_weighted_without(
                             corpus, gone, (weighted if staged is None else staged.of(e)).sampler, weighted.names, e),
                         error=error)
                known = {e: meta.first_step_of_epoch[e] for e in range(e0 + 1)}
                extra = {**plan_extra(weighted, loop.dynres, speeds, loop.window),
                         **stages_extra(staged, totals, meta.epochs, known), **excluded_entry,
                         **({} if corpus.blocks is None else {"container_blocks": corpus.blocks.entry()})}
                return writer.finish(dataclasses.replace(_replan_meta(
                    meta, world_size, at_step, totals, corpus.carried, corpus.carry, tol, group, extra),
                    buckets=spec.to_json()["buckets"]))
    finally:
        if root is not None:
            remove_spill(root)


def _container_block(meta: PlanMeta, options: PlanOptions) -> int | None:
    """Containers a block of the re-planned part: ``options.container_block``, else the parent's
    (``plan.json``'s ``container_blocks``; None: the parent had none)."""
    recorded = meta.extra.get("container_blocks")
    if options.container_block is not None or not isinstance(recorded, dict):
        return options.container_block
    return int(recorded["containers"])


def _window(meta: PlanMeta, weighted: WeightedEpochs | None) -> WindowTotals | None:
    """The parent's weight windows (``plan.json``'s ``weight_window``), kept."""
    recorded = meta.extra.get("weight_window")
    if not isinstance(recorded, dict) or weighted is None:
        return None
    return WindowTotals(int(recorded["window"]), float(recorded["tolerance"]))


def _replan_meta(meta: PlanMeta, world_size: int, at_step: int, totals: EpochTotals, carried: int, carry: bool,
                 tol: float, group: int, extra: dict[str, object]) -> PlanMeta:
    """The re-plan's ``plan.json``: the parent's epochs before ``at_step``, the re-planned ones'
    ``totals``."""
    e0 = epoch_of_step(meta, at_step)
    consumed = at_step - meta.first_step_of_epoch[e0]
    spe = meta.steps_per_epoch[:e0] + [consumed + totals.steps_per_epoch[0]] + totals.steps_per_epoch[1:]
    per_epoch = meta.per_epoch[:e0] + totals.per_epoch
    return PlanMeta(
        manifest=meta.manifest, buckets_file=meta.buckets_file, buckets=meta.buckets, world_size=world_size,
        seed=meta.seed, epochs=meta.epochs, interleave=meta.interleave,
        allocation={**meta.allocation, "carried_tails": carried, "carry": carry},
        num_steps=sum(spe), steps_per_epoch=spe, per_epoch=per_epoch,
        per_bucket=totals.per_bucket(meta.epochs - e0, world_size), padding=totals.padding(),
        fallbacks=totals.fallback_summary(), balance=totals.balance_info(tol),
        replan=ReplanInfo(meta.plan_hash, meta.world_size, at_step),
        sync_group=group if group != world_size else None,
        extra=extra,
    )


def _unseen_blocks(plan_dir: str | os.PathLike[str], meta: PlanMeta, at_step: int, epoch: int,
                   excluded: npt.NDArray[np.int64], sequence_of: Any = None) -> Iterator[npt.NDArray[np.int64]]:
    """The manifest rows of the parent's batches of ``epoch`` at steps >= ``at_step`` on every
    rank (what no rank has seen of that epoch) but ``excluded``, one row group of one shard at a
    time; ``sequence_of``: a packed plan's map of rows to the sequences holding them."""
    for t in _unseen_tables(plan_dir, meta, at_step, epoch, ["epoch", "rows"]):
        rows = numeric_values(pc.list_flatten(t.column("rows")), np.int64)
        if sequence_of is not None:
            rows = sequence_of(rows)
        yield rows[~is_excluded(rows, excluded)] if excluded.shape[0] else rows


def _exclusions(plan_dir: str | os.PathLike[str], meta: PlanMeta, manifest: str | os.PathLike[str],
                exclude: str | os.PathLike[str] | None, at_step: int) -> tuple[npt.NDArray[np.int64], dict[str, Any]]:
    """The rows excluded from ``at_step`` on (the parent's and ``exclude``'s) and the re-plan's
    ``plan.json`` entry for them (empty when none)."""
    parent, from_step = recorded_exclusions(meta, f"{plan_dir}/plan.json")
    previous = meta.extra.get(EXCLUDED_KEY) or {}
    if exclude is None:
        return parent, ({} if from_step is None else {EXCLUDED_KEY: previous})
    ids = read_excluded_ids(exclude)
    if ids.len() == 0:
        raise DataprepError(f"{exclude}: lists no ids to exclude")
    rows, unknown = excluded_rows(manifest, ids)
    if rows.shape[0] == 0:
        raise DataprepError(f"{exclude}: none of its {ids.len():,} ids is in the plan's manifest {manifest}")
    both = np.union1d(parent, rows).astype(np.int64)
    files = [*previous.get("files", []), Path(exclude).name]
    start = at_step if from_step is None else min(from_step, at_step)
    return both, {EXCLUDED_KEY: exclusion_entry(both, start, files, unknown + int(previous.get("unknown_ids", 0)))}


def _unseen_tables(plan_dir: str | os.PathLike[str], meta: PlanMeta, at_step: int, epoch: int,
                   columns: list[str]) -> Iterator[pa.Table]:
    """The parent's batches of ``epoch`` at steps >= ``at_step``, rank after rank, one row
    group at a time (``columns``, ``epoch`` among them)."""
    for r in range(meta.world_size):
        for t in PlanShard(plan_dir, r).iter_tables(at_step, columns=columns):
            yield t.filter(pc.equal(t.column("epoch"), pa.scalar(epoch, pa.int32())))


def _parent_weighting(meta: PlanMeta, options: PlanOptions) -> PlanOptions:
    """``options`` with the parent's weighting (temperature, epoch size, seed)."""
    recorded = meta.extra.get("weights")
    recorded = recorded if isinstance(recorded, dict) else {}
    return dataclasses.replace(options, weights=None, temperature=recorded.get("temperature"),
                               epoch_utterances=recorded.get("epoch_size"), epoch_hours=None, seed=meta.seed)


def _check_recorded_quotas(meta: PlanMeta, weighted: WeightedEpochs) -> None:
    recorded = meta.extra.get("weights")
    corpora = recorded.get("corpora", []) if isinstance(recorded, dict) else []
    if [int(c["quota"]) for c in corpora] != weighted.quota.tolist():
        raise DataprepError("plan.json: weights: the recorded quotas differ from the manifest's (another manifest?)")


def _sync_group(meta: PlanMeta, options: PlanOptions) -> int:
    """Ranks per sync group of the re-plan: ``options.sync_group``, else the parent's (which
    must divide the new world size), else all ranks."""
    if options.sync_group is not None:
        return options.sync_group  # PlanOptions checked that it divides the world size
    if meta.sync_group is None or meta.sync_group == meta.world_size:
        return options.world_size
    if options.world_size % meta.sync_group:
        raise OptionError("sync_group", f"the plan's sync groups of {meta.sync_group} ranks do not divide the new "
                          f"world size {options.world_size}; give the re-plan's group size")
    return meta.sync_group


def _dynres_config(plan_dir: str | os.PathLike[str], meta: PlanMeta, options: PlanOptions) -> DynResConfig | None:
    """The parent's dynamic-resolution rates (None: the parent has none); ``options``' must agree."""
    entry = meta.extra.get("dynamic_resolution")
    if entry is None:
        if options.dynamic_resolution is not None:
            raise OptionError("dynamic_resolution", "the plan has no dynamic resolution; a re-plan keeps the parent's")
        return None
    try:
        config = DynResConfig.from_json(entry["config"])
    except (KeyError, TypeError, ValueError) as exc:
        raise DataprepError(f"{plan_dir}/plan.json: dynamic_resolution: config: {exc}") from None
    if options.dynamic_resolution is not None and options.dynamic_resolution != config:
        raise OptionError("dynamic_resolution", "differs from the plan's; a re-plan keeps the parent's rates")
    return config


def default_manifest(plan_dir: str | os.PathLike[str], meta: PlanMeta) -> Path:
    """The parent's manifest by its recorded file name, next to the plan directory."""
    path = Path(plan_dir).resolve().parent / meta.manifest.file
    if not path.exists():
        raise DataprepError(f"{path}: the plan's manifest is not next to the plan directory; give --manifest")
    return path
