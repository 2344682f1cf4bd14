"""``dataprep padding``: the padding report of a manifest in memory bounded by
``--memory-limit``, one path for every size (:func:`stream_padding_report`): rows spilled by
bucket, measured one part or one bucket at a time (:func:`bucketing.padding.schemes_report`);
a corpus that fits is one block held in memory (:class:`manifests.spill.SpillFiles`
``memory``), a larger one spills next to the manifest (about :data:`DISK_BYTES_PER_ROW` a row).

Passes: the 1D duration grid (:func:`bucketing.fit_passes.fit_grid`); the 1D and 2D buckets,
the planner's spill (:func:`dataprep.planning.spill_manifest`) with the 2D tails carried; the
fixed schemes, each row of at most ``L`` s to its scatter part (:func:`spill_fixed`); the 2D
rows' durations and rates in batch order. ``--world-sizes``: epoch 0 per world size planned
from the 2D spill (:func:`dataprep.planning.plan_epoch_figures`, :func:`spilled_steps`)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bucketing.allocate import fills_steps
from bucketing.batching import TOTALS_BLOCK
from bucketing.budget import padded_budget_batch_sizes
from bucketing.costmodel import CostModel
from bucketing.dynres import DynResConfig
from bucketing.fit import DEFAULT_OUTLIER_FENCE, DEFAULT_TOKEN_FENCE, Grid
from bucketing.packing import DEFAULT_AUDIO_TOKEN_RATE
from bucketing.padding import BucketedRows, packed_scheme, scatter_count, scatter_part, schemes_report
from bucketing.plan import EpochPlan
from bucketing.steps_report import steps_rows
from dataprep.planning import SpilledCorpus, carry_spilled, plan_epoch_figures, spill_manifest
from bucketing.fit_passes import fit_grid
from dataprep.analysis.buckets import HELD_BYTES_PER_ROW, fit_passes, manifest_blocks
from manifests.arrow_views import numeric_values
from manifests.corpus_codes import corpus_names, iter_corpus_codes
from manifests.manifest_read import iter_manifest
from manifests.spill import SpillFiles, check_free_disk, remove_spill, spill_dir

#: Bytes of memory per row of a padding report held in memory (the fit held,
#: :data:`dataprep.analysis.buckets.HELD_BYTES_PER_ROW`, then the spills' columns, about 85,
#: and one bucket's transients): a larger corpus spills to disk.
PADDING_BYTES_PER_ROW = HELD_BYTES_PER_ROW
#: Bytes of disk per row of the spill files (module docstring), checked free before spilling.
DISK_BYTES_PER_ROW = 90


def spilled_buckets(corpus: SpilledCorpus) -> BucketedRows:
    """:class:`bucketing.padding.BucketedRows` of a spilled corpus (one bucket read at a time)."""
    def rows_of(k: int) -> tuple[npt.NDArray[np.float64], npt.NDArray[Any], npt.NDArray[Any] | None]:
        c = corpus.column(k, "c", np.int32) if corpus.has_codes else None
        return corpus.column(k, "d", np.float64), corpus.column(k, "t", np.int32), c

    return BucketedRows(corpus.counts, rows_of, corpus.total_d, corpus.total_t,
                        dropped={k: int(sum(a.shape[0] for a in v)) for k, v in sorted(corpus.dropped.items())},
                        moved=corpus.moved, carried=corpus.carried, max_tokens=corpus.max_tokens)


def spilled_steps(uncarried: SpilledCorpus, carried: SpilledCorpus, grid: Grid, bs: npt.NDArray[np.int64],
                  world_sizes: list[int], balance: float, *, seed: int = 0) -> list[dict[str, Any]]:
    """:func:`bucketing.steps_report.steps_rows` of epochs planned by the planner
    (:func:`dataprep.planning.plan_epoch_figures`) on the 2D spill, without and
    with its tails carried (``carried`` is ``uncarried`` where they are not): balanced epochs
    and a world size whose every bucket fills a step take the carried one, as
    :func:`bucketing.allocate.assign` decides in memory."""
    cost = CostModel()

    def plan(W: int, tol: float) -> EpochPlan:
        corpus = carried if tol > 0 or fills_steps(uncarried.counts, bs, W) else uncarried
        return plan_epoch_figures(corpus, grid, bs, W, seed, 0, tolerance=tol, cost=cost)

    return steps_rows(plan, world_sizes, balance, bs, cost)


def spill_fixed(manifest: str | os.PathLike[str], files: SpillFiles, lengths: tuple[float, ...], seed: int,
                parts: int) -> list[int]:
    """Pass 3 of the module docstring: rows of at most each length appended to their scatter
    part (``f{i}.{j}.d`` / ``.t``, ascending rows); returns the rows over each length."""
    excluded = [0] * len(lengths)
    base = 0
    for table in iter_manifest(manifest, ["duration", "num_tokens"], TOTALS_BLOCK):
        d = numeric_values(table.column("duration"), np.float64)
        t = numeric_values(table.column("num_tokens"), np.int32)
        for i, length in enumerate(lengths):
            ok = np.flatnonzero(d <= length)
            excluded[i] += d.shape[0] - ok.shape[0]
            if parts == 1:  # every row draws part 0
                files.append(f"f{i}.0.d", d[ok])
                files.append(f"f{i}.0.t", t[ok])
                continue
            part = scatter_part(ok + base, seed, 10 + i, parts)
            order = np.argsort(part, kind="stable")
            cut = np.searchsorted(part[order], np.arange(parts + 1))
            for j in np.flatnonzero(np.diff(cut)):
                r = ok[order[cut[j]:cut[j + 1]]]
                files.append(f"f{i}.{j}.d", d[r])
                files.append(f"f{i}.{j}.t", t[r])
        base += table.num_rows
    files.close()
    return excluded


def stream_padding_report(manifest: str | os.PathLike[str], grid: Grid, bs: npt.NDArray[np.int64], num_rows: int,
                          memory_limit: int, *, budget: float, cumulative_budget: float | None = None,
                          strict: bool = False, seed: int = 0, window: int | None = None,
                          sort_by: str | None = None, audio_weight: float | None = None, carry: bool = True,
                          dynamic_resolution: DynResConfig | None = None,
                          fixed_lengths: tuple[float, ...] = (30.0, 40.0), world_sizes: Sequence[int] = (),
                          balance: float = 0.0, pack: int | None = None,
                          audio_token_rate: float = DEFAULT_AUDIO_TOKEN_RATE) -> dict[str, Any]:
    """The padding report of ``manifest`` (:func:`bucketing.padding.schemes_report`'s figures,
    module docstring), with ``steps`` per world size when ``world_sizes`` are given
    (:func:`spilled_steps`); options already checked. The spill is held in memory when the
    corpus fits ``memory_limit`` (:data:`PADDING_BYTES_PER_ROW` a row), else written to
    files next to the manifest (:func:`spills_to_disk`), removed at the end. ``pack`` (N):
    also ``currencies``: fixed, 2D and packed sequences of N (:func:`bucketing.padding.packed_scheme`)
    compared in audio, tokens and token-equivalents at ``audio_token_rate``."""
    root = spill_dir(manifest) if spills_to_disk(num_rows, memory_limit) else None

    def store(name: str) -> Path:
        return Path(os.devnull) if root is None else _sub(root, name)

    try:
        if root is not None:
            check_free_disk(root, num_rows * DISK_BYTES_PER_ROW, "the padding report's spill files")
        nd = grid.num_duration_bins
        passes = fit_passes(num_rows, memory_limit,
                            None if num_rows * HELD_BYTES_PER_ROW <= memory_limit else store("fit"))
        grid1 = fit_grid(manifest_blocks(manifest, passes.block), passes, num_buckets=nd, num_subbuckets=1,
                         min_duration=None, max_duration=None, outlier_fence=DEFAULT_OUTLIER_FENCE,
                         token_fence=DEFAULT_TOKEN_FENCE)[0].grid
        bs1 = padded_budget_batch_sizes(grid1.max_duration, max_duration_budget=budget)
        one_d = spilled_buckets(spill_manifest(manifest, grid1, bs1, store("1d"), strict=False,
                                               memory_limit=memory_limit, ids=False, memory=root is None))
        names = corpus_names(manifest)
        codes = None if names is None else iter_corpus_codes(manifest, names, TOTALS_BLOCK)
        uncarried = spill_manifest(manifest, grid, bs, store("2d"), strict=strict, memory_limit=memory_limit,
                                   ids=False, codes=codes, memory=root is None)
        carried = carry_spilled(uncarried, grid, bs, manifest, memory_limit) if carry and not strict else uncarried
        two_d = spilled_buckets(carried)
        K = scatter_count(num_rows)
        fixed = SpillFiles(store("fixed"), memory=None if root is not None else {})
        excluded = spill_fixed(manifest, fixed, fixed_lengths, seed, K)

        def fixed_parts(length: float, salt: int) -> tuple[int, Iterator[tuple[npt.NDArray[Any], npt.NDArray[Any]]]]:
            i = salt - 10
            return excluded[i], ((fixed.read(f"f{i}.{j}.d", np.float64), fixed.read(f"f{i}.{j}.t", np.int32))
                                 for j in range(K))

        rates = SpillFiles(store("rates"), memory=None if root is not None else {})
        report = schemes_report(num_rows, fixed_parts, grid1, one_d, grid, bs, two_d, rates,
                                budget=budget, cumulative_budget=cumulative_budget, fixed_lengths=fixed_lengths,
                                seed=seed, window=window, sort_by=sort_by, audio_weight=audio_weight,
                                dynamic_resolution=dynamic_resolution, corpora=names,
                                audio_token_rate=None if pack is None else audio_token_rate)
        if pack is not None:
            compared = {k: v for k, v in report["schemes"].items() if k.startswith("fixed-") or k == "2d"}
            compared["packed"] = packed_scheme(two_d, pack, audio_token_rate)
            report["currencies"] = {"max_tokens": pack, "audio_token_rate": audio_token_rate,
                                    "schemes": {k: {f: v[f] for f in ("audio_padding", "token_padding", "te_padding",
                                                                      "num_rows", "excluded")}
                                                for k, v in compared.items()}}
        if world_sizes:
            report["steps"] = spilled_steps(uncarried, carried, grid, bs, list(world_sizes), balance, seed=seed)
        return report
    finally:
        if root is not None:
            remove_spill(root)


def spills_to_disk(num_rows: int, memory_limit: int) -> bool:
    """Whether the padding report of ``num_rows`` rows spills to disk: holding its spill in
    memory would need more than ``memory_limit`` bytes (:data:`PADDING_BYTES_PER_ROW` a row)."""
    return num_rows * PADDING_BYTES_PER_ROW > memory_limit


def _sub(root: Path, name: str) -> Path:
    path = root / name
    path.mkdir()
    return path
