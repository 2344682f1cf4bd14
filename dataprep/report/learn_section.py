"""The report's figures of a run against its plan: predicted and measured step time per bucket
and per rank (a step log, ``dataprep report --steps``), and each corpus's share of every window
of steps of a plan made with ``--weight-window``.

Step times: the log joined to the plan's batches (:func:`dataprep.planning.calibrate.plan_shapes`);
predictions from ``--cost-model`` (its coefficients times its ranks' time factors) or, without
one, from the model ``dataprep calibrate`` fits to this log. Seconds; medians per bucket, sums
per rank. Windows: the first whole epoch's utterances per step and corpus, counted by range of manifest rows
(each range's corpus codes joined to every shard's planned rows of it: memory of one range and
steps x corpora counts); shares per window of ``K`` steps (from the epoch's first) and the worst
gap to the corpus's share of the epoch over every ``K`` consecutive steps. Shares in 0..1.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from manifests.arrow_views import numpy_view, single_chunk
from manifests.errors import DataprepError
from manifests.plan_files import PlanShard
from manifests.plan_meta import PlanMeta
from manifests.spill import SpillFiles

#: windows drawn in the shares chart (the table covers every window)
MAX_WINDOW_POINTS = 400


def _r(x: float, digits: int = 6) -> float:
    return round(float(x), digits) if np.isfinite(x) else 0.0


@dataclass(frozen=True)
class StepTimeAggregates:
    """Measured against predicted step time of a logged run (seconds)."""

    log: str
    model: str  # where the predictions come from
    rows: int
    median_rel_error: float
    per_bucket: list[dict[str, Any]]
    per_rank: list[dict[str, Any]]


def _factors(cost_model: str | os.PathLike[str], world: int) -> npt.NDArray[np.float64]:
    """The time factor of each rank (1.2: 20% slower) a ``costmodel.json`` records, 1 where none."""
    from dataprep.planning.options import parse_rank_speed

    try:
        has = isinstance(json.loads(Path(cost_model).read_text(encoding="utf-8")).get("rank_speed"), list)
    except (OSError, ValueError, AttributeError):
        has = False
    speeds = np.asarray(parse_rank_speed(str(cost_model)), dtype=np.float64) if has else np.ones(world)
    out = np.ones(world)
    out[:min(world, speeds.shape[0])] = 1.0 / speeds[:world]
    return out


def step_time_aggregates(plan_dir: str | os.PathLike[str], log: str | os.PathLike[str],
                         cost_model: str | os.PathLike[str] | None = None) -> StepTimeAggregates:
    """Per bucket (batches, median measured and predicted seconds) and per rank (steps, summed
    measured and predicted seconds, measured / predicted) of the step log ``log`` of a run of
    ``plan_dir``; a log the plan does not hold is refused in one line (as ``calibrate``)."""
    from dataprep.planning.calibrate import calibrate, plan_shapes, read_cost_model, read_step_log
    from manifests.plan_meta import read_plan_meta

    world = read_plan_meta(plan_dir).world_size
    rows = plan_shapes(plan_dir, read_step_log(log))
    if cost_model is not None:
        cost, factor, model = read_cost_model(cost_model), _factors(cost_model, world), Path(cost_model).name
    else:
        cal = calibrate(plan_dir, log)
        cost, model = cal.cost, "fitted to this log (dataprep calibrate)"
        factor = np.asarray([1.0 if s is None else s for s in cal.rank_speed], dtype=np.float64)
    rank = rows["rank"].to_numpy()
    if rank.size and int(rank.max()) >= world:
        raise DataprepError(f"{log}: rank {int(rank.max())} is not below the plan's world size {world}")
    pred = cost.step_time(rows["size"].to_numpy(), rows["max_duration"].to_numpy(),
                          rows["max_tokens"].to_numpy()) * factor[rank]
    df = rows.with_columns(pl.Series("predicted_s", pred))
    rel = (df["predicted_s"] - df["compute_s"]).abs() / df["compute_s"]
    per_bucket = df.group_by("bucket").agg(pl.len().alias("batches"), pl.col("compute_s").median().alias("measured_s"),
                                           pl.col("predicted_s").median().alias("predicted_s")).sort("bucket")
    per_rank = df.group_by("rank").agg(pl.len().alias("steps"), pl.col("compute_s").sum().alias("measured_s"),
                                       pl.col("predicted_s").sum().alias("predicted_s")).sort("rank")
    return StepTimeAggregates(
        Path(log).name, model, df.height, _r(float(rel.median() or 0.0)),
        [{"bucket": int(r["bucket"]), "batches": int(r["batches"]), "measured_s": _r(r["measured_s"]),
          "predicted_s": _r(r["predicted_s"])} for r in per_bucket.to_dicts()],
        [{"rank": int(r["rank"]), "steps": int(r["steps"]), "measured_s": _r(r["measured_s"], 4),
          "predicted_s": _r(r["predicted_s"], 4), "ratio": _r(r["measured_s"] / r["predicted_s"], 4)
          if r["predicted_s"] else None, "time_factor": _r(float(factor[int(r["rank"])]), 4)}
         for r in per_rank.to_dicts()])


@dataclass(frozen=True)
class WindowShares:
    """A weight-window plan's first whole epoch: each corpus's share per window against its target."""

    epoch: int
    window: int
    tolerance: float
    windows: list[dict[str, Any]]  # window, corpus, share (the first MAX_WINDOW_POINTS windows)
    corpora: list[dict[str, Any]]  # corpus, target, fewest, most, worst gap, windows over


def first_whole_epoch(meta: PlanMeta) -> int | None:
    """The first epoch the plan holds whole (a re-plan holds its steps from ``first_step`` on)."""
    return next((e for e in range(meta.epochs) if meta.first_step_of_epoch[e] >= meta.first_step), None)


def step_corpus_counts(plan_dir: str | os.PathLike[str], meta: PlanMeta, epoch: int, order: npt.NDArray[np.int32],
                       corpora: int, rows: SpillFiles, num_rows: int, range_rows: int) -> npt.NDArray[np.int64]:
    """``epoch``'s utterances per step (of the epoch) and corpus, all ranks; ``rows`` holds each
    manifest row's corpus code (``c``), read ``range_rows`` at a time, ``order`` maps a code to
    its corpus's place."""
    counts = np.zeros((meta.steps_per_epoch[epoch], corpora), np.int64)
    for a in range(0, num_rows, range_rows):
        b = min(a + range_rows, num_rows)
        code = order[rows.read_range("c", np.int32, a, b)]
        for r in range(meta.world_size):
            for t in PlanShard(plan_dir, r, meta).iter_tables(meta.first_step_of_epoch[epoch],
                                                              columns=["epoch", "step_in_epoch", "rows"]):
                ep = numpy_view(t.column("epoch"), np.int32)
                n = int(np.searchsorted(ep, epoch + 1))
                col = single_chunk(t.column("rows"))
                offs = numpy_view(col.offsets, np.int32)
                vals = numpy_view(col.values, np.int64)[offs[0]:offs[n]]
                step = np.repeat(numpy_view(t.column("step_in_epoch"), np.int64)[:n], np.diff(offs[:n + 1]))
                inside = (vals >= a) & (vals < b)
                np.add.at(counts, (step[inside], code[vals[inside] - a]), 1)
                if n < ep.shape[0]:
                    break
    return counts


def window_shares(epoch: int, counts: npt.NDArray[np.int64], names: Sequence[str], targets: dict[str, float],
                  window: int, tolerance: float) -> WindowShares:
    """Shares per window of ``window`` steps from the epoch's first; per corpus its blend target,
    its share of the epoch (what every window keeps, as the planner's
    :func:`bucketing.quota.window_deviation`), the fewest and most over those windows and the
    worst gap to its epoch share over every ``window`` consecutive steps."""
    S = counts.shape[0]
    k = min(window, max(S, 1))
    blocks = np.add.reduceat(counts, np.arange(0, S, k), axis=0) if S else np.zeros((0, len(names)), np.int64)
    share = blocks / np.maximum(blocks.sum(1, keepdims=True), 1)
    whole = counts.sum(0) / max(int(counts.sum()), 1)
    csum = np.vstack([np.zeros((1, counts.shape[1]), np.int64), np.cumsum(counts, axis=0)])
    sliding = csum[k:] - csum[:-k]  # every k consecutive steps
    gap = np.abs(sliding / np.maximum(sliding.sum(1, keepdims=True), 1) - whole[None, :])
    rows = [{"window": int(w), "corpus": name, "share": _r(float(share[w, i]))}
            for w in range(min(share.shape[0], MAX_WINDOW_POINTS)) for i, name in enumerate(names)]
    corp = [{"corpus": name, "target": targets.get(name), "epoch_share": _r(float(whole[i])),
             "fewest": _r(float(share[:, i].min())) if S else None, "most": _r(float(share[:, i].max())) if S else None,
             "worst_gap": _r(float(gap[:, i].max())) if S else None,
             "windows_over": int((gap[:, i] > tolerance + 1e-12).sum())} for i, name in enumerate(names)]
    return WindowShares(epoch, k, tolerance, rows, corp)


def window_aggregates(plan_dir: str | os.PathLike[str], meta: PlanMeta, order: npt.NDArray[np.int32],
                      names: Sequence[str], rows: SpillFiles, num_rows: int, range_rows: int,
                      targets: Sequence[dict[str, Any]]) -> WindowShares | None:
    """A ``--weight-window`` plan's :class:`WindowShares` (None for other plans, or without
    ``targets``: the plan section's blend table)."""
    recorded = meta.extra.get("weight_window")
    epoch = first_whole_epoch(meta)
    if not isinstance(recorded, dict) or not targets or epoch is None:
        return None
    counts = step_corpus_counts(plan_dir, meta, epoch, order, len(names), rows, num_rows, range_rows)
    return window_shares(epoch, counts, names, {t["corpus"]: t["target"] for t in targets},
                         int(recorded["window"]), float(recorded["tolerance"]))
