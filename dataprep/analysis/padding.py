"""The padding report of a manifest and a buckets.json: what each batching scheme would
waste and, for given world sizes, the steps ``plan-batches`` would make, in memory bounded by
``--memory-limit`` (:func:`dataprep.analysis.stream_padding.stream_padding_report`: held in
memory when the corpus fits, spilled to disk otherwise; the same figures). Options checked
here (:func:`check_padding_options`); ``dataprep padding`` prints what this returns, and
``dataprep report`` shows it (of its sample past a million rows)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from bucketing.budget import padded_budget_batch_sizes
from bucketing.dynres import DynResConfig
from bucketing.fit import grid_from_spec
from bucketing.packing import DEFAULT_AUDIO_TOKEN_RATE
from bucketing.plan import PlanError
from dataprep.analysis.stream_padding import stream_padding_report
from manifests.buckets_file import BucketSpec, read_buckets
from manifests.errors import DataprepError, OptionError
from manifests.hash_cache import manifest_hash
from manifests.manifest_read import manifest_num_rows
from manifests.options import check_bool, check_int, check_number
from manifests.spill import default_memory_limit


def manifest_padding_report(
    manifest: str | os.PathLike[str], buckets: str | os.PathLike[str] | BucketSpec, *,
    memory_limit: int | None = None, name: str | os.PathLike[str] | None = None, **options: Any
) -> dict[str, Any]:
    """The JSON-ready padding report (:func:`bucketing.padding.schemes_report`), plus ``steps``
    per world size when ``world_sizes`` are given and the manifest's hash. ``buckets``: a
    buckets.json or a parsed one; ``options``: those of :func:`check_padding_options`.
    ``memory_limit``: bytes (default: half the machine's); a manifest over it
    (:data:`dataprep.analysis.stream_padding.PADDING_BYTES_PER_ROW` a row) spills to disk.
    ``name``: what an error names (default: ``manifest``)."""
    check_int("memory_limit", memory_limit, ge=1, le=2**62, optional=True)
    limit = memory_limit if memory_limit is not None else default_memory_limit()
    spec = buckets if isinstance(buckets, BucketSpec) else read_buckets(buckets)
    name = manifest if name is None else name
    rows = manifest_num_rows(manifest)
    check_padding_options(rows, **options)
    budget, bs = batch_sizes_for(spec, options.pop("budget", None))
    try:
        report = stream_padding_report(manifest, grid_from_spec(spec), bs, rows, limit, budget=budget, **options)
    except PlanError as exc:
        raise DataprepError(f"{name}: cannot plan: {exc}") from None
    except OptionError:
        raise  # names the option (the CLI shows its flag)
    except ValueError as exc:
        raise DataprepError(f"{name}: {exc}") from None
    report["manifest_hash"] = manifest_hash(manifest)
    return report


def batch_sizes_for(spec: BucketSpec, budget: float | None = None) -> tuple[float, npt.NDArray[np.int64]]:
    """``(budget, batch sizes)``: the padded seconds per batch (default: the one buckets.json
    was sized with, else 600) and the buckets' batch sizes, all sized by that budget when any
    bucket has none."""
    if budget is None:
        budget = float(spec.batch_size_source.get("max_duration", 600.0))
    if any(b.batch_size is None for b in spec.buckets):
        return budget, padded_budget_batch_sizes(grid_from_spec(spec).max_duration, max_duration_budget=budget)
    return budget, spec.batch_sizes()


def check_padding_options(rows: int, *, budget: float | None = None, cumulative_budget: float | None = None,
                          strict: bool = False, seed: int = 0, window: int | None = None, sort_by: str | None = None,
                          audio_weight: float | None = None, carry: bool = True,
                          dynamic_resolution: DynResConfig | None = None, world_sizes: Sequence[int] = (),
                          balance: float = 0.0, pack: int | None = None,
                          audio_token_rate: float = DEFAULT_AUDIO_TOKEN_RATE) -> None:
    """Every option of the padding report checked (finite, in range, never coerced);
    ``window`` and each world size bounded by the manifest's ``rows``."""
    check_number("budget", budget, gt=0, optional=True)
    check_number("cumulative_budget", cumulative_budget, gt=0, optional=True)
    check_number("audio_weight", audio_weight, ge=0, optional=True)
    check_number("balance", balance, ge=0)
    check_int("pack", pack, ge=1, le=2**31 - 1, optional=True)
    check_number("audio_token_rate", audio_token_rate, gt=0, le=1e6)
    check_bool("strict", strict)
    check_bool("carry", carry)
    check_int("seed", seed, ge=0, le=2**63 - 1)
    check_int("window", window, ge=1, optional=True)
    for w in world_sizes:
        check_int("world_sizes", w, ge=1)
    if window is not None and window > max(rows, 1):
        raise OptionError("window", f"must be <= the number of rows ({rows}) of the manifest, got {window}")
    if world_sizes and max(world_sizes) > rows:
        raise OptionError("world_sizes", f"must be <= the number of rows ({rows}) of the manifest, got {max(world_sizes)}")

