"""The padding report: what each batching scheme wastes on one manifest, before training.

Padding ratio = 1 − Σ real / Σ (batch size × max in batch), for audio (seconds; equal to the
frame ratio up to rounding) and for tokens. A scheme that pads to a fixed length (Whisper's
30 s) uses that length instead of the max in batch. Batches are formed with
:func:`bucketing.batching.form_batches`, exactly as the planner forms them.

Schemes (same budget of padded seconds per batch):

1. ``fixed-<L>s``: one bucket, batch = floor(budget / L), audio padded to L seconds; rows
   longer than L cannot be used and are counted as ``excluded``.
2. ``1d-cumulative``: 1D duration buckets, batches filled while the sum of real durations
   stays <= the cumulative budget (Lhotse ``max_duration``; Canary-1B used 360 s).
3. ``1d-budget``: 1D buckets, per-bucket batch size by the padded-budget rule.
4. ``2d``: the given 2D buckets with their per-bucket batch sizes.
5. ``2d-dynamic-resolution``: the same batches, each utterance featurized at the rate that
   brings it to its batch's target frames (:mod:`bucketing.dynres`); ``audio_padding`` is
   the frame padding left (clamped utterances), beside ``frame_padding_base`` (ordinary
   padding at the base rate), ``clamped_share`` (utterances), ``fallback_share`` (batches)
   and ``off_rate_share`` (frames more than 10% off the base rate), also per bucket.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from bucketing.allocate import allocate, assign, carry_tails
from bucketing.batching import Batches, form_batches, form_batches_cumulative
from bucketing.budget import padded_budget_batch_sizes
from bucketing.dynres import (
    COMPARED_TARGETS,
    DynResConfig,
    comparison_rows,
    policy_totals,
    resolution_totals,
    resolve,
)
from bucketing.fit import Grid, fit_buckets


@dataclass(frozen=True)
class Padding:
    """Padding figures of one set of batches (ratios in [0, 1])."""

    audio_padding: float
    token_padding: float
    num_batches: int
    mean_batch_size: float
    num_rows: int

    def to_json(self) -> dict[str, Any]:
        return {
            "audio_padding": round(self.audio_padding, 6),
            "token_padding": round(self.token_padding, 6),
            "num_batches": self.num_batches,
            "mean_batch_size": round(self.mean_batch_size, 4),
            "num_rows": self.num_rows,
        }


def _ratio(real: float, padded: float) -> float:
    return 0.0 if padded <= 0 else 1.0 - real / padded


def batch_maxima(batches: Batches, values: npt.ArrayLike) -> npt.NDArray[Any]:
    """Max of ``values`` over each batch's rows."""
    v = np.asarray(values)[batches.rows]
    if batches.num_batches == 0:
        return v[:0]
    return np.maximum.reduceat(v, batches.offsets[:-1])


def measure(
    batches: Batches,
    duration: npt.ArrayLike,
    num_tokens: npt.ArrayLike,
    fixed_audio: float | None = None,
) -> Padding:
    """Padding of ``batches`` (audio padded to the max in batch, or to ``fixed_audio`` s)."""
    d = np.asarray(duration, dtype=np.float64)
    t = np.asarray(num_tokens, dtype=np.float64)
    sizes = batches.sizes().astype(np.float64)
    dmax = np.full(batches.num_batches, fixed_audio) if fixed_audio else batch_maxima(batches, d)
    tmax = batch_maxima(batches, t)
    n = int(batches.rows.shape[0])
    return Padding(
        audio_padding=_ratio(float(d[batches.rows].sum()), float((sizes * dmax).sum())),
        token_padding=_ratio(float(t[batches.rows].sum()), float((sizes * tmax).sum())),
        num_batches=batches.num_batches,
        mean_batch_size=n / batches.num_batches if batches.num_batches else 0.0,
        num_rows=n,
    )


def per_bucket(
    batches: Batches, duration: npt.ArrayLike, num_tokens: npt.ArrayLike, num_buckets: int
) -> dict[str, npt.NDArray[Any]]:
    """Per-bucket audio/token padding, batches, rows and mean batch size (arrays by bucket)."""
    d = np.asarray(duration, dtype=np.float64)
    t = np.asarray(num_tokens, dtype=np.float64)
    sizes = batches.sizes().astype(np.float64)
    bb = batches.bucket
    real_d = np.bincount(bb, weights=np.add.reduceat(d[batches.rows], batches.offsets[:-1])
                         if batches.num_batches else None, minlength=num_buckets)
    real_t = np.bincount(bb, weights=np.add.reduceat(t[batches.rows], batches.offsets[:-1])
                         if batches.num_batches else None, minlength=num_buckets)
    pad_d = np.bincount(bb, weights=sizes * batch_maxima(batches, d), minlength=num_buckets)
    pad_t = np.bincount(bb, weights=sizes * batch_maxima(batches, t), minlength=num_buckets)
    nb = np.bincount(bb, minlength=num_buckets)
    rows = np.bincount(bb, weights=sizes, minlength=num_buckets)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "audio_padding": np.where(pad_d > 0, 1 - real_d / np.where(pad_d > 0, pad_d, 1), 0.0),
            "token_padding": np.where(pad_t > 0, 1 - real_t / np.where(pad_t > 0, pad_t, 1), 0.0),
            "num_batches": nb,
            "num_rows": rows.astype(np.int64),
            "mean_batch_size": np.where(nb > 0, rows / np.maximum(nb, 1), 0.0),
            "hours": real_d / 3600.0,
        }


def group_padding(rows: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64], max_duration: npt.ArrayLike,
                  max_tokens: npt.ArrayLike, duration: npt.ArrayLike, num_tokens: npt.ArrayLike,
                  group_of_row: npt.NDArray[np.integer], num_groups: int) -> npt.NDArray[np.float64]:
    """Per group of rows (e.g. corpus) over batches given as ``rows`` (concatenated) and
    ``sizes`` with each batch's maxima: ``[utterances, real s, padded s, real tokens, padded
    tokens]`` (shape ``(5, num_groups)``); a row pads to its batch's longest."""
    g = np.asarray(group_of_row)[rows]
    out = np.zeros((5, num_groups), dtype=np.float64)
    out[0] = np.bincount(g, minlength=num_groups)
    out[1] = np.bincount(g, weights=np.asarray(duration, np.float64)[rows], minlength=num_groups)
    out[2] = np.bincount(g, weights=np.repeat(np.asarray(max_duration, np.float64), sizes), minlength=num_groups)
    out[3] = np.bincount(g, weights=np.asarray(num_tokens, np.float64)[rows], minlength=num_groups)
    out[4] = np.bincount(g, weights=np.repeat(np.asarray(max_tokens, np.float64), sizes), minlength=num_groups)
    return out


def group_json(names: list[str], totals: npt.NDArray[np.float64], epochs: int = 1) -> list[dict[str, Any]]:
    """:func:`group_padding` totals as JSON rows: utterances and hours (per epoch), padding."""
    return [{"corpus": n, "utterances": int(round(totals[0, i] / epochs)),
             "hours": round(float(totals[1, i]) / epochs / 3600, 6),
             "padding_audio": round(_ratio(float(totals[1, i]), float(totals[2, i])), 6),
             "padding_tokens": round(_ratio(float(totals[3, i]), float(totals[4, i])), 6)}
            for i, n in enumerate(names)]


def padding_report(
    duration: npt.ArrayLike,
    num_tokens: npt.ArrayLike,
    grid: Grid,
    batch_sizes: npt.ArrayLike,
    *,
    budget: float = 600.0,
    cumulative_budget: float | None = None,
    fixed_lengths: tuple[float, ...] = (30.0, 40.0),
    strict: bool = False,
    seed: int = 0,
    window: int | None = None,
    sort_by: str | None = None,
    audio_weight: float | None = None,
    carry: bool = True,
    dynamic_resolution: DynResConfig | None = DynResConfig(),
    corpus_of_row: npt.ArrayLike | None = None,
    corpora: Sequence[str] = (),
) -> dict[str, Any]:
    """Compare the schemes on one manifest (see the module docstring).

    ``budget``: padded seconds per batch for schemes 1 and 3 (scheme 4 uses ``batch_sizes``);
    ``cumulative_budget``: real seconds per batch for scheme 2 (default: ``budget``).
    ``window`` / ``sort_by`` / ``audio_weight``: in-bucket grouping passed to ``form_batches``
    (None = its default). ``carry``: bucket tails fill the next bucket that holds them
    (:func:`bucketing.allocate.carry_tails`) in the bucketed schemes 3 and 4, as the planner does.
    ``dynamic_resolution``: the rates of scheme 5 (None leaves it out). ``corpus_of_row``
    (index into ``corpora`` per row): also the 2D scheme's utterances, hours and padding per corpus.
    Returns JSON-ready figures; ``per_bucket`` holds the 2D scheme's buckets (with the
    ``dynres_*`` figures of scheme 5).
    """
    d = np.asarray(duration, dtype=np.float64)
    t = np.asarray(num_tokens, dtype=np.int64)
    opts: dict[str, Any] = {"duration": d}
    if window is not None:
        opts["window"] = window
    if sort_by is not None:
        opts["sort_by"] = sort_by
    if audio_weight is not None:
        opts["audio_weight"] = audio_weight
    schemes: dict[str, Any] = {}

    def rng(k: int) -> np.random.Generator:
        return np.random.default_rng([seed, k])

    for i, length in enumerate(fixed_lengths):
        ok = d <= length
        bs = max(1, int(np.floor(budget / length + 1e-9)))
        batches = form_batches(np.where(ok, 0, -1), np.asarray([bs]), rng(10 + i), None, window=1)
        p = measure(batches, d, t, fixed_audio=length).to_json()
        p["excluded"] = int((~ok).sum())
        schemes[f"fixed-{length:g}s"] = p

    nd = grid.num_duration_bins
    fit1 = fit_buckets(d, None, num_buckets=nd, num_subbuckets=1).grid
    b1 = allocate(d, None, fit1).bucket
    cum = form_batches_cumulative(b1, d, cumulative_budget or budget, rng(1))
    schemes["1d-cumulative"] = {**measure(cum, d, t).to_json(), "excluded": 0}
    bs1 = padded_budget_batch_sizes(fit1.max_duration, max_duration_budget=budget)
    if carry:
        b1 = carry_tails(b1, d, None, bs1, np.zeros(fit1.num_buckets, dtype=np.int64), fit1.duration_bin)[0]
    schemes["1d-budget"] = {**measure(form_batches(b1, bs1, rng(2), t, **opts), d, t).to_json(), "excluded": 0}

    assigned = assign(d, t, grid, batch_sizes, strict=strict, carry=carry)
    alloc, carried = assigned.allocation, assigned.carried
    batches2 = form_batches(assigned.bucket, np.asarray(batch_sizes), rng(3), t, **opts)
    schemes["2d"] = {**measure(batches2, d, t).to_json(), "excluded": alloc.num_dropped}
    pb = per_bucket(batches2, d, t, grid.num_buckets)
    if dynamic_resolution is not None:
        schemes["2d-dynamic-resolution"] = _dynamic_resolution_scheme(
            schemes["2d"], batches2, d, dynamic_resolution, grid.num_buckets, pb)
    extra: dict[str, Any] = {}
    if corpus_of_row is not None:
        sizes = batches2.sizes()
        totals = group_padding(batches2.rows, sizes, batch_maxima(batches2, d), batch_maxima(batches2, t), d, t,
                               np.asarray(corpus_of_row), len(corpora))
        extra["per_corpus"] = group_json(list(corpora), totals)
    return {
        **extra,
        "num_rows": int(d.shape[0]),
        "budget": budget,
        "cumulative_budget": cumulative_budget or budget,
        "seed": seed,
        "schemes": schemes,
        "dropped": {k: int(v.shape[0]) for k, v in alloc.dropped.items()},
        "moved": alloc.moved,
        "carried": carried,
        "per_bucket": [
            {
                "index": i,
                "duration_bin": int(grid.duration_bin[i]),
                "token_bin": int(grid.token_bin[i]),
                "max_duration": float(grid.max_duration[i]),
                "max_tokens": int(alloc.max_tokens[i]) if alloc.max_tokens is not None else None,
                "batch_size": int(np.asarray(batch_sizes)[i]),
                **{k: (round(float(v[i]), 6) if v.dtype.kind == "f" else int(v[i])) for k, v in pb.items()},
            }
            for i in range(grid.num_buckets)
        ],
    }


def _dynamic_resolution_scheme(scheme_2d: dict[str, Any], batches: Batches, d: npt.NDArray[np.float64],
                               config: DynResConfig, num_buckets: int,
                               pb: dict[str, npt.NDArray[Any]]) -> dict[str, Any]:
    """Scheme 5: the 2D batches featurized at their own rates; adds the per-bucket
    ``dynres_*`` arrays to ``pb``."""
    db = d[batches.rows]
    res = resolve(db, batches.offsets, None, config)
    by_bucket = resolution_totals(db, batches.offsets, res, config, batches.bucket, num_buckets)
    whole = sum(by_bucket[1:], by_bucket[0]).to_json() if by_bucket else {}
    dyn = [x.to_json() for x in by_bucket]
    for k in ("frame_padding", "clamped_share", "fallback_share", "off_rate_share"):
        pb[f"dynres_{k}"] = np.asarray([x[k] for x in dyn], dtype=np.float64)
    return {**scheme_2d, "audio_padding": whole.get("frame_padding", 0.0),
            **{k: whole.get(k, 0.0) for k in ("frame_padding", "frame_padding_base", "clamped_share",
                                                "fallback_share", "off_rate_share")},
            "config": config.to_json(), "compare": comparison_rows(policy_totals(db, batches.offsets, config)),
            "rate_vs_duration": _rates(db, res.rate, config)}


def _rates(d: npt.NDArray[np.float64], rate: npt.NDArray[np.float64], config: DynResConfig,
           n: int = 2000) -> dict[str, Any]:
    """For the rate-vs-duration plot: up to ``n`` evenly spaced (duration s, rate Hz) pairs of
    the utterances, and per constant target the rate of a batch's longest utterance on a
    duration grid (``grid`` s, ``curves[F]`` Hz)."""
    idx = np.linspace(0, d.shape[0] - 1, min(n, d.shape[0])).astype(np.int64) if d.shape[0] else np.zeros(0, np.int64)
    grid = np.linspace(0.5, max(float(d.max()) if d.shape[0] else 1.0, 1.0), 200)
    one = np.arange(grid.shape[0] + 1, dtype=np.int64)  # one utterance per batch
    curves = {str(t): np.round(resolve(grid, one, None, replace(config, target_frames=t)).rate, 3).tolist()
              for t in COMPARED_TARGETS}
    return {"duration": np.round(d[idx], 3).tolist(), "rate": np.round(rate[idx], 3).tolist(),
            "grid": np.round(grid, 3).tolist(), "curves": curves}
