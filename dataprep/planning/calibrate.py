"""Fit the step-time cost model from what a run measured (``dataprep calibrate``).

A step log (Parquet) holds one row per rank and step: ``rank``, ``step`` (int) and the
seconds the rank computed, ``step_s``, or ``forward_backward_s`` + ``optimizer_s`` (summed);
``data_wait_s`` (optional) is reported, never fitted. Each row is joined to the rank's batch at
that step in the plan (``size``, ``max_duration`` s, ``max_tokens``), and the coefficients of
:class:`bucketing.costmodel.CostModel` are fitted by non-negative least squares on relative
error (every subset of the five terms with the overhead solved, the best non-negative one kept:
exact for five terms), alternating with each rank's speed (median of measured / predicted over its steps,
the median rank 1.0; 1.2 = 20% slower: another GPU type, a slow host) so one slow rank does not
bend the model. Also out: the residuals (speeds applied) and the step time per bucket,
measured and predicted. The plan's
shards are read one row group at a time, only the logged ranks and steps kept.
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from bucketing.costmodel import CostModel
from manifests.atomic_files import write_json
from manifests.buckets_file import BucketSpec
from manifests.errors import DataprepError, OptionError
from manifests.plan_files import PlanShard
from manifests.plan_meta import read_plan_meta

#: the fitted coefficients, in :class:`CostModel`'s order (``frame_shift`` is given, not fitted)
FITTED = ("overhead", "per_frame", "per_frame2", "per_token", "per_token2")
#: the step logs of a folder (``dataprep train`` writes one per rank beside its checkpoint)
STEP_LOG_GLOB = "steps-rank-*.parquet"
#: ``costmodel.json``'s kind marker
KIND = "speech-dataprep cost model"
#: fewest logged (rank, step) rows a fit takes
MIN_ROWS = 8
#: alternations of the fit and the ranks' speeds
SPEED_ROUNDS = 6


@dataclass(frozen=True)
class Calibration:
    """A fitted cost model and how well it explains the log (see the module docstring)."""

    cost: CostModel
    rows: int
    median_rel_error: float
    p90_rel_error: float
    rank_speed: list[float | None]  # per rank of the plan; None where the log has none of its steps
    per_bucket: list[dict[str, float]]
    data_wait_share: float | None

    def to_json(self, plan_hash: str, log: str) -> dict[str, Any]:
        """``costmodel.json``: the coefficients plan-batches / replan read, and the fit's figures."""
        return {"kind": KIND, "cost_model": {f.name: getattr(self.cost, f.name) for f in fields(CostModel)},
                "fit": {"rows": self.rows, "median_rel_error": self.median_rel_error,
                        "p90_rel_error": self.p90_rel_error, "data_wait_share": self.data_wait_share},
                "rank_speed": self.rank_speed, "per_bucket": self.per_bucket,
                "source": {"plan_hash": plan_hash, "log": log}}


def read_step_log(path: str | os.PathLike[str]) -> pl.DataFrame:
    """The step log's ``rank``, ``step``, ``compute_s`` and ``data_wait_s`` (null where absent),
    every field checked (integers, finite seconds >= 0, one row per rank and step). ``path``: a
    Parquet file, or a folder of them (``dataprep train``'s ``steps-rank-0000r.parquet``)."""
    files = sorted(Path(path).glob(STEP_LOG_GLOB)) if Path(path).is_dir() else [Path(path)]
    if not files:
        raise DataprepError(f"{path}: a folder without step logs ({STEP_LOG_GLOB})")
    try:
        table = pa.concat_tables([pq.read_table(f) for f in files], promote_options="default")
        schema = table.schema
    except FileNotFoundError:
        raise DataprepError(f"{path}: no such file") from None
    except (OSError, pa.ArrowException) as exc:
        raise DataprepError(f"{path}: not a readable Parquet step log ({str(exc).splitlines()[0][:160]})") from None
    names = set(schema.names)
    for col in ("rank", "step"):
        if col not in names or not pa.types.is_integer(schema.field(col).type):
            raise DataprepError(f"{path}: a step log needs an integer `{col}` column")
    df = pl.from_arrow(table)
    assert isinstance(df, pl.DataFrame)
    if "step_s" in names:
        compute = pl.col("step_s")
    elif {"forward_backward_s", "optimizer_s"} <= names:
        compute = pl.col("forward_backward_s") + pl.col("optimizer_s")
    else:
        raise DataprepError(f"{path}: a step log needs `step_s`, or `forward_backward_s` and `optimizer_s` (seconds)")
    wait = pl.col("data_wait_s") if "data_wait_s" in names else pl.lit(None, pl.Float64)
    try:
        df = df.select(pl.col("rank").cast(pl.Int64), pl.col("step").cast(pl.Int64),
                       compute.cast(pl.Float64).alias("compute_s"), wait.cast(pl.Float64).alias("data_wait_s"))
    except pl.exceptions.PolarsError as exc:
        raise DataprepError(f"{path}: the seconds columns are not numbers ({str(exc).splitlines()[0][:160]})") from None
    bad = df.filter(pl.col("rank").is_null() | pl.col("step").is_null() | (pl.col("rank") < 0) | (pl.col("step") < 0)
                    | ~pl.col("compute_s").is_finite().fill_null(False) | (pl.col("compute_s") <= 0)
                    | (pl.col("data_wait_s") < 0).fill_null(False) | pl.col("data_wait_s").is_nan().fill_null(False))
    if bad.height:
        r = bad.row(0, named=True)
        raise DataprepError(f"{path}: {bad.height} row(s) with a missing or negative rank / step or seconds that are "
                            f"not finite and > 0 (first: rank {r['rank']}, step {r['step']})")
    dup = df.group_by("rank", "step").len().filter(pl.col("len") > 1)
    if dup.height:
        r = dup.row(0, named=True)
        raise DataprepError(f"{path}: rank {r['rank']} step {r['step']} is logged {r['len']} times")
    return df


def plan_shapes(plan_dir: str | os.PathLike[str], log: pl.DataFrame) -> pl.DataFrame:
    """The log joined to the plan's batches (``bucket``, ``size``, ``max_duration`` s,
    ``max_tokens``); a logged rank or step the plan does not hold is refused."""
    meta = read_plan_meta(plan_dir)
    parts = []
    cols = ["step", "bucket", "size", "max_duration", "max_tokens"]
    for rank in sorted(log["rank"].unique().to_list()):
        if rank >= meta.world_size:
            raise DataprepError(f"{plan_dir}: the log has rank {rank}, the plan {meta.world_size} ranks")
        steps = log.filter(pl.col("rank") == rank)
        first = max(int(steps["step"].min()), meta.first_step)  # type: ignore[arg-type]  # earlier ones: refused below
        wanted = pl.Series(steps["step"])
        if first >= meta.num_steps:  # every logged step past the plan: refused below
            continue
        for t in PlanShard(plan_dir, rank, meta).iter_tables(first, columns=cols):
            got = pl.from_arrow(t)
            assert isinstance(got, pl.DataFrame)
            parts.append(got.filter(pl.col("step").is_in(wanted.implode())).with_columns(pl.lit(rank, pl.Int64)
                                                                                          .alias("rank")))
    shapes = pl.concat(parts) if parts else pl.DataFrame(schema={c: pl.Int64 for c in ["rank", *cols]})
    joined = log.join(shapes.with_columns(pl.col("step").cast(pl.Int64)), on=["rank", "step"], how="left")
    missing = joined.filter(pl.col("size").is_null())
    if missing.height:
        r = missing.row(0, named=True)
        raise DataprepError(f"{plan_dir}: the log's rank {r['rank']} step {r['step']} is not in the plan "
                            f"(steps {meta.first_step}..{meta.num_steps - 1}; a log of another plan?)")
    return joined


def design(size: npt.NDArray[Any], max_duration: npt.NDArray[Any], max_tokens: npt.NDArray[Any],
           frame_shift: float) -> npt.NDArray[np.float64]:
    """The cost model's terms per batch, one column per :data:`FITTED` coefficient."""
    b = np.asarray(size, np.float64)
    f = np.asarray(max_duration, np.float64) / frame_shift
    t = np.asarray(max_tokens, np.float64)
    return np.stack([np.ones_like(b), b * f, b * f * f, b * t, b * t * t], axis=1)


def nonnegative_fit(x: npt.NDArray[np.float64], y: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Coefficients >= 0 minimizing the squared *relative* error of ``x @ c`` against ``y`` (> 0):
    every subset of columns holding the first (the per-step overhead: every step has one, and a
    cost model needs it > 0) solved by least squares (columns scaled), the best positive one kept."""
    w = x / y[:, None]  # relative error: each row divided by its measured time
    scale = np.linalg.norm(w, axis=0)
    scale[scale == 0] = 1.0
    ws = w / scale
    target = np.ones(y.shape[0])
    best, best_err = np.zeros(x.shape[1]), float(target @ target)
    for k in range(1, x.shape[1] + 1):
        for subset in itertools.combinations(range(1, x.shape[1]), k - 1):
            cols = [0, *subset]
            c, *_ = np.linalg.lstsq(ws[:, cols], target, rcond=None)
            if (c < 0).any() or c[0] <= 0:
                continue
            r = ws[:, cols] @ c - target
            err = float(r @ r)
            if err < best_err * (1 - 1e-12):
                best = np.zeros(x.shape[1])
                best[cols] = c
                best_err = err
    return best / scale


def calibrate(plan_dir: str | os.PathLike[str], log_path: str | os.PathLike[str],
              frame_shift: float = CostModel().frame_shift) -> Calibration:
    """Fit :class:`CostModel` to the step log ``log_path`` of a run of ``plan_dir`` (module docstring)."""
    try:
        CostModel(frame_shift=frame_shift)
    except OptionError as exc:
        raise DataprepError(f"--frame-shift: {exc.problem}") from None
    log = read_step_log(log_path)
    if log.height < MIN_ROWS:
        raise DataprepError(f"{log_path}: {log.height} logged step(s); a fit needs at least {MIN_ROWS}")
    rows = plan_shapes(plan_dir, log)
    x = design(rows["size"].to_numpy(), rows["max_duration"].to_numpy(), rows["max_tokens"].to_numpy(), frame_shift)
    y = rows["compute_s"].to_numpy().astype(np.float64)
    ranks, rank_of = np.unique(rows["rank"].to_numpy(), return_inverse=True)
    speed = np.ones(ranks.shape[0])
    for _ in range(SPEED_ROUNDS):  # the model on speed-normalized times, then each rank's speed under it
        coef = nonnegative_fit(x, y / speed[rank_of])
        ratio = y / np.maximum(x @ coef, 1e-300)
        speed = (pl.DataFrame({"rank": rank_of, "ratio": ratio}).group_by("rank").agg(pl.col("ratio").median())
                 .sort("rank")["ratio"].to_numpy().copy())  # normalised in place below
        speed /= np.median(speed)  # the typical rank runs at the model's speed
    if not coef.any():
        raise DataprepError(f"{log_path}: no non-negative cost model explains these times")
    try:
        cost = CostModel(**dict(zip(FITTED, coef.tolist())), frame_shift=frame_shift)
    except OptionError as exc:
        raise DataprepError(f"{log_path}: the fitted {exc.field} {exc.problem}") from None
    predicted = (x @ coef) * speed[rank_of]
    rel = np.abs(predicted - y) / y
    fitted = rows.with_columns(pl.Series("predicted_s", predicted))
    world = read_plan_meta(plan_dir).world_size
    by_rank = dict(zip(ranks.tolist(), speed.tolist()))
    per_bucket = (fitted.group_by("bucket").agg(pl.len().alias("batches"), pl.col("compute_s").median().alias("measured_s"),
                                                pl.col("predicted_s").median().alias("predicted_s")).sort("bucket"))
    waits = rows["data_wait_s"].drop_nulls()
    share = float(waits.sum() / (waits.sum() + rows.filter(pl.col("data_wait_s").is_not_null())["compute_s"].sum())) \
        if waits.len() else None
    return Calibration(cost, rows.height, float(np.median(rel)), float(np.quantile(rel, 0.9)),
                       [round(float(by_rank[r]), 4) if r in by_rank else None for r in range(world)],
                       per_bucket.to_dicts(), share)


def write_calibration(calibration: Calibration, plan_dir: str | os.PathLike[str], log_path: str | os.PathLike[str],
                      out: str | os.PathLike[str]) -> None:
    """Write ``costmodel.json`` (atomically)."""
    write_json(calibration.to_json(read_plan_meta(plan_dir).plan_hash, Path(log_path).name), out)


def read_cost_model(path: str | os.PathLike[str]) -> CostModel:
    """The :class:`CostModel` of a ``costmodel.json`` written by :func:`write_calibration`
    (every coefficient checked as :class:`CostModel` checks it)."""
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataprepError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DataprepError(f"{path}: not a JSON cost model ({exc})") from None
    if not isinstance(obj, dict) or obj.get("kind") != KIND or not isinstance(obj.get("cost_model"), dict):
        raise DataprepError(f"{path}: not a cost model written by `dataprep calibrate`")
    coefs = obj["cost_model"]
    names = {f.name for f in fields(CostModel)}
    if set(coefs) != names:
        raise DataprepError(f"{path}: cost_model: expected the keys {', '.join(sorted(names))}")
    for name, value in coefs.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise DataprepError(f"{path}: cost_model.{name}: expected a number, got {value!r}")
    try:
        return CostModel(**{k: float(v) for k, v in coefs.items()})
    except OptionError as exc:
        raise DataprepError(f"{path}: cost_model.{exc.field}: {exc.problem}") from None


def cost_equal_sizes(spec: BucketSpec, cost: CostModel | None, where: str) -> BucketSpec:
    """``spec`` with every bucket's batch sized for the same predicted step time under ``cost``
    (None: the built-in model), never above its memory cap: a bucket's recorded
    ``memory_batch_size`` (a spec already made cost-equal), else its batch size
    (:func:`bucketing.budget.cost_equal_spec`; the model's times, not an OOM search's)."""
    from dataclasses import replace

    from bucketing.budget import cost_equal_spec

    caps = tuple(replace(b, batch_size=b.extra.get("memory_batch_size", b.batch_size),
                         extra={k: v for k, v in b.extra.items() if k != "oom_step_seconds"}) for b in spec.buckets)
    try:
        return cost_equal_spec(replace(spec, buckets=caps), cost or CostModel())
    except ValueError as exc:
        raise DataprepError(f"{where}: cost-equal sizes: {exc}") from None
