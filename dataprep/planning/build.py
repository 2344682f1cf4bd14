"""manifest + buckets.json -> plan directory: spill the rows the planner needs by bucket (in
memory when the corpus fits the memory limit, else to disk; :mod:`dataprep.planning.spill`),
plan and write every epoch (:class:`dataprep.planning.epochs.EpochLoop`) and publish
``plan.json`` (:class:`manifests.plan_meta.PlanMeta`) atomically with the rank shards.

With dynamic resolution (:mod:`bucketing.dynres`) each batch also records its target frames
(shard version 2) and ``plan.json`` gets a ``dynamic_resolution`` entry: the rates and the
predicted frame padding, clamped and fallback shares, overall and per bucket."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bucketing.allocate import fills_steps
from bucketing.batching import TOTALS_BLOCK
from bucketing.costmodel import CostModel
from bucketing.dynres import DynResConfig
from bucketing.fit import Grid, grid_from_spec
from bucketing.plan import PlanError, check_one_step
from dataprep.planning.container_blocks import ContainerBlocks, container_codes
from dataprep.planning.epochs import (DynResTotals, EpochLoop, EpochTotals, plan_extra, stages_extra,
                                     window_totals)
from dataprep.planning.stages import staged_weights
from dataprep.planning.options import PlanOptions
from dataprep.planning.packed import build_packed_plan
from dataprep.planning.calibrate import cost_equal_sizes
from dataprep.planning.carry import carry_spilled
from dataprep.planning.disk import disk_bytes
from dataprep.planning.draw import draw_epoch
from dataprep.planning.spill import IN_MEMORY_BYTES_PER_ROW, SpilledCorpus, spill_manifest
from dataprep.planning.weights import Blend, WeightedEpochs, blend_of, unknown_corpus_error, wants_weights, weighting
from manifests.buckets_file import BucketSpec, read_buckets
from manifests.errors import DataprepError, ManifestError
from manifests.content_hash import file_sha256
from manifests.corpus_codes import iter_corpus_codes
from manifests.hash_cache import manifest_hash
from manifests.manifest_read import manifest_num_rows
from manifests.plan_files import PlanWriter
from manifests.plan_meta import BalanceInfo, FileRef, ManifestRef, PlanMeta
from manifests.spill import (check_free_disk, default_memory_limit, give_back_memory, remove_spill, retained_heap,
                             spill_dir, system_arrow_pool)


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


def build_plan(
    manifest: str | os.PathLike[str],
    buckets: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    options: PlanOptions,
    *,
    on_progress: Callable[[int, int], None] | None = None,
    on_phase: Callable[[str], None] | None = None,
    timings: dict[str, float] | None = None,
    packed: Any = None,
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

    Every plan spills its rows by bucket (:mod:`dataprep.planning.spill`): in memory when
    the corpus fits ``options.memory_limit`` (:func:`spills_to_disk`), else to files next to
    ``out_dir``, memory then bounded by the largest bucket. The same bytes either way.

    ``options.pack``: a packed plan (:func:`dataprep.planning.packed.build_packed_plan`, which
    plans its sequences through here with ``packed``: rows of fixed buckets, shards expanded).
    """
    if not isinstance(options, PlanOptions):
        raise DataprepError(f"build_plan: options must be PlanOptions, got {type(options).__name__}")
    if options.pack is not None:
        return build_packed_plan(manifest, buckets, out_dir, options, plan=build_plan, limit=memory_limit_of(options),
                                 on_progress=on_progress, on_phase=on_phase, timings=timings)
    clock = _Clock(timings, on_phase)
    W, epochs = options.world_size, options.epochs
    spec = read_buckets(buckets)
    spec = cost_equal_sizes(spec, options.cost, str(buckets)) if options.cost_equal else spec
    bs = spec.batch_sizes()
    check_shape_policy(spec, options.dynamic_resolution, str(buckets))
    grid = grid_from_spec(spec)
    limit = memory_limit_of(options)
    stages = options.stages
    if stages is not None:  # the spill's corpora and stage 0's quotas from its weights
        options = dataclasses.replace(options, weights=dict(stages[0][1]), stages=None)
    blend = blend_of(manifest, options) if wants_weights(manifest, options) else None
    config = options.dynamic_resolution
    on_disk = spills_to_disk(manifest, options)
    root = spill_dir(out_dir) if on_disk else None
    try:
        # on disk: bucket-sized arrays reused, not zeroed afresh (see retained_heap); in memory the
        # spill's own columns fill the heap, and freed blocks given back (Arrow's too: the system
        # allocator) keep the peak the corpus's
        with retained_heap() if root is not None else system_arrow_pool():
            clock.begin("reading the manifest, spilling it" if on_disk else "reading the manifest")
            corpus, weighted = spill_for_plan(manifest, grid, bs, root, blend, options, strict=options.strict,
                                              epochs=epochs, limit=limit,
                                              world_size=None if options.balance > 0 else W,
                                              fixed_buckets=packed is not None)
            options.check_rows(corpus.num_rows)  # before any per-rank allocation
            staged = None if stages is None or weighted is None else staged_weights(
                manifest, stages, weighted.names, *corpus.corpus_sums(len(weighted.names)), options)
            if options.container_block is not None:
                corpus.blocks = ContainerBlocks(container_codes(str(manifest)), options.container_block)
            clock("read")
            try:  # before one shard writer per rank is opened (seconds at a huge --world-size)
                check_one_step(int(corpus.counts.sum()), W)
            except PlanError as exc:
                raise DataprepError(f"{manifest}: cannot plan: {exc}") from None
            totals = EpochTotals(len(spec.buckets))
            loop = EpochLoop(corpus, grid, bs, W, options.seed, options.interleave, options.balance,
                             options.cost or CostModel(), options.group, limit, options.row_group_steps,
                             str(manifest), weighted,
                             DynResTotals(config, len(spec.buckets)) if config is not None else None,
                             options.speeds, window_totals(options.weight_window, options.weight_tolerance,
                                                           weighted, str(manifest)), staged)
            with PlanWriter(out_dir, W, row_group_steps=options.row_group_steps,
                            target_frames=config is not None, packed=packed) as writer:
                loop.run(writer, range(epochs), 0, totals, last=epochs - 1,
                         draw_of=lambda e: None if weighted is None else draw_epoch(
                             corpus, (weighted if staged is None else staged.of(e)).sampler, e),
                         on_progress=on_progress, begin=clock.begin, lap=clock,
                         error=lambda e, exc: DataprepError(f"{manifest}: cannot plan: {exc}"))
                if totals.num_steps == 0:
                    raise DataprepError(
                        f"{manifest}: the plan has no steps ({int(corpus.counts.sum())} of {corpus.num_rows} "
                        f"rows allocated, {totals.fallback_summary()['dropped_rows']} dropped for {W} ranks); "
                        "use fewer ranks or buckets with larger batch sizes"
                    )
                meta = _plan_meta(manifest, buckets, spec, corpus.num_rows,
                                  corpus.allocation_entry(options.strict, corpus.carry), totals,
                                  world_size=W, seed=options.seed, epochs=epochs, interleave=options.interleave,
                                  balance=totals.balance_info(options.balance), sync_group=options.group)
                blocks = {} if corpus.blocks is None else {"container_blocks": corpus.blocks.entry()}
                meta = writer.finish(dataclasses.replace(meta, extra={**meta.extra,
                                                                      **plan_extra(weighted, loop.dynres, options.rank_speed,
                                                                                 loop.window),
                                                                      **stages_extra(staged, totals, epochs), **blocks}))
    finally:
        if root is not None:
            remove_spill(root)
    clock("write")
    return meta


def memory_limit_of(options: PlanOptions) -> int:
    """The bytes a plan may hold: ``options.memory_limit``, else half the machine's memory."""
    return options.memory_limit if options.memory_limit is not None else default_memory_limit()


def spills_to_disk(manifest: str | os.PathLike[str], options: PlanOptions) -> bool:
    """Whether a plan (or re-plan) of ``manifest`` with ``options`` spills to disk: planning it
    in memory would need more than the memory limit (:data:`IN_MEMORY_BYTES_PER_ROW` a row; the
    manifest's footer is read, not its rows). Else the spill is held in memory."""
    return manifest_num_rows(manifest) * IN_MEMORY_BYTES_PER_ROW > memory_limit_of(options)


def spill_for_plan(manifest: str | os.PathLike[str], grid: Grid, bs: npt.NDArray[np.int64], root: Path | None,
                   blend: Blend | None, options: PlanOptions, *, strict: bool, epochs: int,
                   limit: int, world_size: int | None = None, ids_once: bool | None = None,
                   drawn: bool = False, fixed_buckets: bool = False) -> tuple[SpilledCorpus, WeightedEpochs | None]:
    """The spill of a plan of ``epochs`` epochs: in memory (``root`` None), or to files under
    ``root`` (the free disk checked before it for the whole plan, and after it again once the
    largest bucket is known: ``ids_once`` and ``drawn`` as
    :func:`dataprep.planning.disk.disk_bytes` takes them);
    with a ``blend``, each row's corpus and index in it too, and the blend's quotas over the
    spilled rows (``options``: the weighting's epoch size and seed); ``fixed_buckets``: the
    manifest's ``bucket`` column instead of an allocation. Tails are carried
    (``options.carry``, never ``strict``) as :func:`bucketing.allocate.assign` carries them:
    with ``world_size`` (one bucket per step), only where every bucket fills a step
    (``SpilledCorpus.carry`` says whether they were)."""
    names = [] if blend is None else list(blend.probabilities)
    codes = None
    if blend is not None:
        codes = iter_corpus_codes(manifest, names, TOTALS_BLOCK)
        if codes is None:
            raise DataprepError(f"{manifest}: has no corpus column (compile an input_cfg blend to weigh corpora)")
    if root is not None:
        check_free_disk(root, disk_bytes(manifest, epochs, weighted=blend is not None, ids_once=ids_once,
                                         drawn=drawn).peak, "the spill files and the plan")
    carry = options.carry and not strict
    corpus = spill_manifest(manifest, grid, bs, root or Path(os.devnull), strict=strict, memory_limit=limit,
                            codes=codes, num_corpora=len(names) if blend is not None else None, memory=root is None,
                            fixed_buckets=fixed_buckets)
    if carry and world_size is not None:
        carry = fills_steps(corpus.counts, bs, world_size)
    if carry:
        corpus = carry_spilled(corpus, grid, bs, manifest, limit)
    corpus.carry = carry
    give_back_memory(heap=root is None)  # what the pass and the carry freed: the spill stays
    if root is not None:
        need = disk_bytes(manifest, epochs, weighted=blend is not None, largest=int(corpus.counts.max(initial=0)),
                          ids_once=ids_once, drawn=drawn)
        check_free_disk(root, need.peak - corpus.files.written_bytes(),
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
