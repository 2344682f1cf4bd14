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
