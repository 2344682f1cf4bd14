"""Per-bucket batch sizes from a padded budget, until the OOM search replaces them.

Rule ("padded-budget"): a batch of bucket b is padded to the bucket's bounds, so
``batch_size[b] = min over the given budgets of floor(budget / bound[b])``:

- ``max_duration``: seconds of padded audio per batch / ``max_duration[b]`` (s);
- ``max_frames``: padded frames per batch / ``ceil(max_duration[b] / frame_shift)``;
- ``max_tokens``: padded tokens per batch / ``max_tokens[b]``.

A bucket whose single utterance already exceeds a budget still gets batch size 1.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

_EPS = 1e-9  # floor(600 / 12.0) must be 50, not 49, whatever the float rounding


def padded_budget_batch_sizes(
    max_duration: npt.ArrayLike,
    max_tokens: npt.ArrayLike | None = None,
    *,
    max_duration_budget: float | None = None,
    max_frames_budget: int | None = None,
    max_tokens_budget: int | None = None,
    frame_shift: float = 0.01,
) -> npt.NDArray[np.int64]:
    """Batch size per bucket under the padded-budget rule (see the module docstring); >= 1."""
    md = np.asarray(max_duration, dtype=np.float64)
    if max_duration_budget is None and max_frames_budget is None and max_tokens_budget is None:
        raise ValueError("give at least one budget: max_duration, max_frames or max_tokens")
    size = np.full(md.shape[0], np.iinfo(np.int64).max, dtype=np.int64)
    if max_duration_budget is not None:
        size = np.minimum(size, np.floor(max_duration_budget / md + _EPS).astype(np.int64))
    if max_frames_budget is not None:
        frames = np.ceil(md / frame_shift - _EPS)
        size = np.minimum(size, np.floor(max_frames_budget / frames + _EPS).astype(np.int64))
    if max_tokens_budget is not None:
        if max_tokens is None:
            raise ValueError("a token budget needs the buckets' max_tokens")
        mt = np.asarray(max_tokens, dtype=np.float64)
        size = np.minimum(size, np.floor(max_tokens_budget / mt + _EPS).astype(np.int64))
    return np.maximum(size, 1)


def budget_source(
    *,
    max_duration_budget: float | None = None,
    max_frames_budget: int | None = None,
    max_tokens_budget: int | None = None,
    frame_shift: float = 0.01,
) -> dict[str, Any]:
    """The ``batch_size_source`` record of ``buckets.json`` for this rule."""
    src: dict[str, Any] = {"rule": "padded-budget"}
    if max_duration_budget is not None:
        src["max_duration"] = float(max_duration_budget)
    if max_frames_budget is not None:
        src["max_frames"] = int(max_frames_budget)
        src["frame_shift"] = float(frame_shift)
    if max_tokens_budget is not None:
        src["max_tokens"] = int(max_tokens_budget)
    return src


def cost_equal_batch_sizes(max_duration: npt.ArrayLike, max_tokens: npt.ArrayLike | None,
                           caps: npt.ArrayLike, cost: Any, step_seconds: npt.ArrayLike | None = None
                           ) -> tuple[npt.NDArray[np.int64], float]:
    """Batch sizes whose predicted step times (s) are equal across buckets, never above ``caps``.

    A bucket's batch at its bounds (``max_duration`` s, ``max_tokens``) costs ``overhead + B u``
    (``cost``: a :class:`bucketing.costmodel.CostModel`; ``u`` seconds per utterance). With
    ``step_seconds`` (the probe's measured time of each bucket at its cap), ``u`` comes from it
    instead. The target is the least time of any bucket at its cap (the one every bucket can
    reach); each bucket takes the size (1 .. cap) whose time is nearest it. Returns (sizes,
    target seconds). Invariant: ``1 <= size <= cap``; a bucket whose cap fits the target is
    within ``u / 2`` of it.
    """
    cap = np.maximum(np.asarray(caps, dtype=np.int64), 1)
    md = np.asarray(max_duration, dtype=np.float64)
    mt = np.zeros_like(md) if max_tokens is None else np.asarray(max_tokens, dtype=np.float64)
    at_cap = (cost.step_time(cap, md, mt) if step_seconds is None
              else np.asarray(step_seconds, dtype=np.float64))
    overhead = float(cost.overhead) if step_seconds is None else 0.0
    per_utt = np.maximum((at_cap - overhead) / cap, 1e-12)
    target = float(at_cap.min())
    x = (target - overhead) / per_utt
    lo = np.clip(np.floor(x + _EPS), 1, cap).astype(np.int64)
    hi = np.minimum(lo + 1, cap)
    pick_hi = np.abs(overhead + hi * per_utt - target) < np.abs(overhead + lo * per_utt - target)
    return np.where(pick_hi, hi, lo), target


def cost_equal_spec(spec: Any, cost: Any) -> Any:
    """``spec`` (a :class:`manifests.buckets_file.BucketSpec` with batch sizes: the memory caps)
    with :func:`cost_equal_batch_sizes`; measured ``oom_step_seconds`` are used when every bucket
    has one. ``batch_size_source`` records ``cost_equal`` (target s, measured or model)."""
    from dataclasses import replace

    caps = [b.batch_size for b in spec.buckets]
    if any(c is None for c in caps):
        raise ValueError("cost-equal sizes need a batch size (the memory cap) in every bucket")
    secs = [b.extra.get("oom_step_seconds") for b in spec.buckets]
    measured = all(isinstance(s, (int, float)) and s > 0 for s in secs)
    md = [b.max_duration for b in spec.buckets]
    mt = [b.max_tokens if b.max_tokens is not None else 0 for b in spec.buckets]
    sizes, target = cost_equal_batch_sizes(md, mt, caps, cost, secs if measured else None)
    buckets = tuple(replace(b, batch_size=int(s), extra={**b.extra, "memory_batch_size": int(c)})
                    for b, s, c in zip(spec.buckets, sizes, caps))
    src = {**spec.batch_size_source,
           "cost_equal": {"target_step_s": round(target, 6), "times": "measured" if measured else "cost model"}}
    return replace(spec, buckets=buckets, batch_size_source=src)
