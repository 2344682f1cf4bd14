"""manifest -> ``buckets.json`` (``dataprep fit-buckets``): :class:`FitOptions`, checked once
here, and :func:`fit_buckets_file`, which fits as :func:`bucketing.allocate.fit_spec` does,
streamed in bounded memory (:mod:`dataprep.report.stream_fit`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from bucketing.budget import cost_equal_spec
from bucketing.costmodel import CostModel
from bucketing.fit import DEFAULT_OUTLIER_FENCE, DEFAULT_TOKEN_FENCE
from dataprep.report.stream_fit import streamed_fit_spec
from manifests.buckets_file import BucketSpec, write_buckets
from manifests.errors import DataprepError
from manifests.hash_cache import manifest_hash
from manifests.options import check_bool, check_int, check_number
from manifests.outputs import refuse_directory_outputs, refuse_same_paths
from manifests.spill import default_memory_limit, remove_spill, spill_dir


@dataclass(frozen=True)
class FitOptions:
    """How to fit the buckets. ``num_buckets``: duration bins of equal seconds of audio (>= 1);
    ``num_subbuckets``: token sub-bins per duration bin (>= 1; 1 = 1D). Batch sizes from a
    padded budget per batch: ``max_duration_budget`` (s), ``max_frames_budget`` (frames of
    ``frame_shift`` s) or ``max_tokens_budget`` (each > 0; None: not used). ``strict``: NeMo
    strict 2D. ``min_duration`` / ``max_duration`` (s): rows outside are left out, reported.
    ``duration_fence`` / ``token_fence``: k of Q3 + k*IQR (>= 0) unless ``fences`` is False
    (plain equal occupancy). ``cost_equal``: then resize every bucket's batch so its predicted
    step time (:class:`bucketing.costmodel.CostModel`) is the same, never above the budget's
    size (:func:`bucketing.budget.cost_equal_spec`): full batches of any buckets balance.
    ``memory_limit``: bytes the fit may hold (>= 1; None: half the machine's memory): the
    fit streams the manifest (:mod:`dataprep.report.stream_fit`), whatever its size, in
    blocks and sorted ranges sized by it; the same bytes at any limit."""

    num_buckets: int = 30
    num_subbuckets: int = 2
    max_duration_budget: float | None = 600.0
    max_frames_budget: int | None = None
    max_tokens_budget: int | None = None
    frame_shift: float = 0.01
    strict: bool = False
    min_duration: float | None = None
    max_duration: float | None = None
    duration_fence: float = DEFAULT_OUTLIER_FENCE
    token_fence: float = DEFAULT_TOKEN_FENCE
    fences: bool = True
    cost_equal: bool = False
    memory_limit: int | None = None

    def __post_init__(self) -> None:
        check_int("num_buckets", self.num_buckets, ge=1)
        check_int("num_subbuckets", self.num_subbuckets, ge=1)
        check_number("max_duration_budget", self.max_duration_budget, gt=0, optional=True)
        check_int("max_frames_budget", self.max_frames_budget, ge=1, le=None, optional=True)
        check_int("max_tokens_budget", self.max_tokens_budget, ge=1, le=None, optional=True)
        check_number("frame_shift", self.frame_shift, gt=0)
        check_bool("strict", self.strict)
        check_number("min_duration", self.min_duration, ge=0, optional=True)
        check_number("max_duration", self.max_duration, gt=0, optional=True)
        check_number("duration_fence", self.duration_fence, ge=0)
        check_number("token_fence", self.token_fence, ge=0)
        check_bool("fences", self.fences)
        check_bool("cost_equal", self.cost_equal)
        check_int("memory_limit", self.memory_limit, ge=1, le=2**62, optional=True)


@dataclass(frozen=True)
class FitResult:
    """What :func:`fit_buckets_file` wrote (``spec``), the rows left out per reason with
    their seconds, and the rows moved to a longer bin for their tokens."""

    spec: BucketSpec
    dropped: dict[str, tuple[int, float]] = field(default_factory=dict)  # reason -> (rows, seconds)
    moved: int = 0


def fit_buckets_file(manifest: str | os.PathLike[str], output: str | os.PathLike[str],
                     options: FitOptions = FitOptions()) -> FitResult:
    """Fit equal-occupancy duration x token buckets on ``manifest``, size batches by the padded
    budget and write ``buckets.json`` to ``output`` (atomically, never over the manifest).
    Streamed (:mod:`dataprep.report.stream_fit`) in ``options.memory_limit``: the bytes of
    :func:`bucketing.allocate.fit_spec` on the whole columns; spill files next to ``output``."""
    if not isinstance(options, FitOptions):
        raise DataprepError(f"fit_buckets_file: options must be FitOptions, got {type(options).__name__}")
    refuse_same_paths({"MANIFEST": manifest}, {"-o": output})
    refuse_directory_outputs({"-o": output})
    o = options
    limit = o.memory_limit if o.memory_limit is not None else default_memory_limit()
    content_hash = manifest_hash(manifest)  # a missing or unreadable manifest: one line, nothing created
    root = spill_dir(output)
    try:
        spec, sa = streamed_fit_spec(
            manifest, root, limit, num_buckets=o.num_buckets, num_subbuckets=o.num_subbuckets,
            min_duration=o.min_duration, max_duration=o.max_duration, strict=o.strict,
            max_duration_budget=o.max_duration_budget, max_frames_budget=o.max_frames_budget,
            max_tokens_budget=o.max_tokens_budget, frame_shift=o.frame_shift, manifest_hash=content_hash,
            outlier_fence=o.duration_fence if o.fences else None, token_fence=o.token_fence if o.fences else None)
    except DataprepError:
        raise
    except ValueError as exc:
        raise DataprepError(f"{manifest}: {exc}") from None
    finally:
        remove_spill(root)
    if o.cost_equal:
        spec = cost_equal_spec(spec, CostModel())
    write_buckets(spec, output)
    return FitResult(spec, {k: (v, sa.dropped_seconds[k]) for k, v in sa.dropped.items()}, sa.moved)
