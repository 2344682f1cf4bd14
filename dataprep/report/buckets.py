"""manifest -> ``buckets.json`` (``dataprep fit-buckets``): :class:`FitOptions`, checked once
here, and :func:`fit_buckets_file`, the I/O around :func:`bucketing.allocate.fit_spec`."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from bucketing.allocate import Allocation, fit_spec
from bucketing.budget import cost_equal_spec
from bucketing.costmodel import CostModel
from bucketing.fit import DEFAULT_OUTLIER_FENCE, DEFAULT_TOKEN_FENCE
from dataprep.report.padding import duration_and_tokens
from manifests.buckets_file import BucketSpec, write_buckets
from manifests.errors import DataprepError
from manifests.io import manifest_hash
from manifests.options import check_bool, check_int, check_number
from manifests.outputs import refuse_directory_outputs, refuse_same_paths


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
    size (:func:`bucketing.budget.cost_equal_spec`): full batches of any buckets balance."""

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


@dataclass(frozen=True)
class FitResult:
    """What :func:`fit_buckets_file` wrote (``spec``), where every row went (``allocation``)
    and the manifest's durations (s) the report of left-out rows sums."""

    spec: BucketSpec
    allocation: Allocation
    duration: npt.NDArray[np.float64]


def fit_buckets_file(manifest: str | os.PathLike[str], output: str | os.PathLike[str],
                     options: FitOptions = FitOptions()) -> FitResult:
    """Fit equal-occupancy duration x token buckets on ``manifest``, size batches by the padded
    budget and write ``buckets.json`` to ``output`` (atomically, never over the manifest)."""
    if not isinstance(options, FitOptions):
        raise DataprepError(f"fit_buckets_file: options must be FitOptions, got {type(options).__name__}")
    refuse_same_paths({"MANIFEST": manifest}, {"-o": output})
    refuse_directory_outputs({"-o": output})
    d, t = duration_and_tokens(manifest)
    o = options
    try:
        spec, alloc = fit_spec(
            d, t, num_buckets=o.num_buckets, num_subbuckets=o.num_subbuckets, min_duration=o.min_duration,
            max_duration=o.max_duration, strict=o.strict, max_duration_budget=o.max_duration_budget,
            max_frames_budget=o.max_frames_budget, max_tokens_budget=o.max_tokens_budget,
            frame_shift=o.frame_shift, manifest_hash=manifest_hash(manifest),
            outlier_fence=o.duration_fence if o.fences else None, token_fence=o.token_fence if o.fences else None,
        )
    except ValueError as exc:
        raise DataprepError(f"{manifest}: {exc}") from None
    if o.cost_equal:
        spec = cost_equal_spec(spec, CostModel())
    write_buckets(spec, output)
    return FitResult(spec, alloc, d)
