"""The padding report of a manifest and a buckets.json: what each batching scheme would
waste (:func:`bucketing.padding.padding_report`) and, for given world sizes, the steps
``plan-batches`` would make (:func:`bucketing.steps_report.steps_report`). I/O around the
pure core; ``dataprep padding`` prints what this returns."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from bucketing.budget import padded_budget_batch_sizes
from bucketing.dynres import DynResConfig
from bucketing.fit import grid_from_spec
from bucketing.padding import padding_report
from bucketing.plan import PlanError
from bucketing.steps_report import steps_report
from manifests.buckets_file import read_buckets
from manifests.errors import DataprepError
from manifests.io import manifest_hash, read_corpus_codes, read_manifest


def duration_and_tokens(path: str | os.PathLike[str]) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """Durations (s) and token counts of a compiled manifest; one line if any is missing."""
    df = read_manifest(path, columns=["duration", "num_tokens"])
    if df["num_tokens"].null_count():
        raise DataprepError(f"{path}: {df['num_tokens'].null_count()} rows have no num_tokens (compile with a tokenizer)")
    if df["duration"].null_count():
        raise DataprepError(f"{path}: {df['duration'].null_count()} rows have no duration")
    return df["duration"].to_numpy(), df["num_tokens"].to_numpy().astype(np.int64)


def manifest_padding_report(
    manifest: str | os.PathLike[str],
    buckets: str | os.PathLike[str],
    *,
    budget: float | None = None,
    cumulative_budget: float | None = None,
    strict: bool = False,
    seed: int = 0,
    window: int | None = None,
    sort_by: str | None = None,
    audio_weight: float | None = None,
    carry: bool = True,
    dynamic_resolution: DynResConfig | None = None,
    world_sizes: Sequence[int] = (),
    balance: float = 0.0,
) -> dict[str, Any]:
    """The JSON-ready padding report (see :func:`bucketing.padding.padding_report`), plus
    ``steps`` per world size when ``world_sizes`` are given and the manifest's hash.

    ``budget`` (padded seconds per batch) defaults to the one buckets.json was sized with;
    buckets without a batch size are sized by it."""
    d, t = duration_and_tokens(manifest)
    got = read_corpus_codes(manifest)  # many corpora: the 2D scheme per corpus too
    codes, names = got if got is not None else (None, [])
    spec = read_buckets(buckets)
    grid = grid_from_spec(spec)
    if budget is None:
        budget = float(spec.batch_size_source.get("max_duration", 600.0))
    sizes = [b.batch_size for b in spec.buckets]
    if any(s is None for s in sizes):
        bs = padded_budget_batch_sizes(grid.max_duration, max_duration_budget=budget)
    else:
        bs = np.asarray(sizes, dtype=np.int64)
    try:
        report = padding_report(d, t, grid, bs, budget=budget, cumulative_budget=cumulative_budget,
                                strict=strict, seed=seed, window=window, sort_by=sort_by,
                                audio_weight=audio_weight, carry=carry, dynamic_resolution=dynamic_resolution,
                                corpus_of_row=codes, corpora=names)
        if world_sizes:
            report["steps"] = steps_report(d, t, grid, bs, list(world_sizes), balance, seed=seed, strict=strict,
                                           carry=carry)
    except PlanError as exc:
        raise DataprepError(f"{manifest}: cannot plan: {exc}") from None
    except ValueError as exc:
        raise DataprepError(f"{manifest}: {exc}") from None
    report["manifest_hash"] = manifest_hash(manifest)
    return report
