"""manifest -> ``buckets.json`` (``dataprep fit-buckets``): :class:`FitOptions`, checked once
here, and :func:`fit_buckets_file`, which feeds the manifest's blocks to the one fit
(:func:`bucketing.fit_passes.fit_blocks`): held in memory when the corpus fits the memory
limit (one block, nothing spilled), else in blocks and spill files sized by the limit."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bucketing.budget import cost_equal_spec
from bucketing.costmodel import CostModel
from bucketing.fit import DEFAULT_OUTLIER_FENCE, DEFAULT_TOKEN_FENCE
from bucketing.fit_passes import BLOCK_BYTES_PER_ROW, SORT_BYTES_PER_ROW, Passes, block_rows, fit_blocks, sort_rows
from manifests.arrow_views import numeric_values
from manifests.buckets_file import BucketSpec, write_buckets
from manifests.errors import DataprepError
from manifests.hash_cache import manifest_hash
from manifests.manifest_read import iter_manifest, manifest_num_rows
from manifests.options import check_bool, check_int, check_number
from manifests.outputs import refuse_directory_outputs, refuse_same_paths
from manifests.spill import SpillFiles, default_memory_limit, remove_spill, spill_dir

#: Bytes per row of a corpus fitted in memory: one block (:data:`BLOCK_BYTES_PER_ROW`), the
#: durations and tokens held (16), their sorted copy and running sums (:data:`SORT_BYTES_PER_ROW`).
HELD_BYTES_PER_ROW = BLOCK_BYTES_PER_ROW + 16 + SORT_BYTES_PER_ROW


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
    ``memory_limit``: bytes the fit may hold (>= 1; None: half the machine's memory): a
    corpus of :data:`HELD_BYTES_PER_ROW` a row within it is one block held in memory, a larger
    one is read in blocks and sorted ranges sized by it from spill files; the same bytes at
    any limit."""

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


def manifest_blocks(manifest: str | os.PathLike[str], block: int
                    ) -> Iterator[tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]]:
    """(durations s, tokens) of ``manifest`` in blocks of ``block`` rows; rows without tokens
    or duration: one line, after every block is counted (nothing more is yielded past one).
    Duration 0 is a text-only row's (``modality`` text); an audio row's is refused."""
    null_t = null_d = 0
    text = "modality" in pq.read_schema(manifest).names
    for table in iter_manifest(manifest, ["duration", "num_tokens", *(["modality"] if text else [])], block):
        null_t += table.column("num_tokens").null_count
        null_d += table.column("duration").null_count
        if null_t or null_d:
            continue
        d = numeric_values(table.column("duration"), np.float64)
        audio = np.ones(d.shape[0], bool) if not text else \
            ~pc.fill_null(pc.equal(table.column("modality"), "text"), False).to_numpy(zero_copy_only=False)
        if (audio & (d == 0)).any():
            raise DataprepError(f"{manifest}: {int((audio & (d == 0)).sum())} audio rows have duration 0 "
                                "(durations must be finite and > 0; only text-only rows have none)")
        yield d, numeric_values(table.column("num_tokens"), np.int64)
    if null_t:
        raise DataprepError(f"{manifest}: {null_t} rows have no num_tokens (compile with a tokenizer)")
    if null_d:
        raise DataprepError(f"{manifest}: {null_d} rows have no duration")


def fit_passes(rows: int, memory_limit: int, root: Path | None) -> Passes:
    """How a fit of ``rows`` rows runs in ``memory_limit`` bytes: held in memory, one block
    (``root`` None: the corpus fits, :data:`HELD_BYTES_PER_ROW` a row), or in blocks and sorted
    ranges sized by the limit from spill files under ``root``."""
    if root is None:
        return Passes.held(rows)
    block = block_rows(memory_limit)
    return Passes(SpillFiles(root), block, sort_rows(memory_limit, block))


def fit_buckets_file(manifest: str | os.PathLike[str], output: str | os.PathLike[str],
                     options: FitOptions = FitOptions()) -> FitResult:
    """Fit equal-occupancy duration x token buckets on ``manifest``, size batches by the padded
    budget and write ``buckets.json`` to ``output`` (atomically, never over the manifest).
    In ``options.memory_limit`` (:class:`FitOptions`); spill files, when the corpus does not
    fit, next to ``output``."""
    if not isinstance(options, FitOptions):
        raise DataprepError(f"fit_buckets_file: options must be FitOptions, got {type(options).__name__}")
    refuse_same_paths({"MANIFEST": manifest}, {"-o": output})
    refuse_directory_outputs({"-o": output})
    o = options
    limit = o.memory_limit if o.memory_limit is not None else default_memory_limit()
    content_hash = manifest_hash(manifest)  # a missing or unreadable manifest: one line, nothing created
    parent = Path(output).resolve().parent
    try:  # before the work: a folder that cannot be made fails now, in one line
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataprepError(f"{parent}: cannot make the output's folder there ({exc.strerror})") from None
    rows = manifest_num_rows(manifest)
    root = None if rows * HELD_BYTES_PER_ROW <= limit else spill_dir(output)
    passes = fit_passes(rows, limit, root)
    try:
        spec, sa = fit_blocks(
            manifest_blocks(manifest, passes.block), passes, num_buckets=o.num_buckets,
            num_subbuckets=o.num_subbuckets, min_duration=o.min_duration, max_duration=o.max_duration,
            strict=o.strict, max_duration_budget=o.max_duration_budget, max_frames_budget=o.max_frames_budget,
            max_tokens_budget=o.max_tokens_budget, frame_shift=o.frame_shift, manifest_hash=content_hash,
            outlier_fence=o.duration_fence if o.fences else None, token_fence=o.token_fence if o.fences else None)
    except DataprepError:
        raise
    except ValueError as exc:
        raise DataprepError(f"{manifest}: {exc}") from None
    finally:
        if root is not None:
            remove_spill(root)
    if o.cost_equal:
        spec = cost_equal_spec(spec, CostModel())
    write_buckets(spec, output)
    return FitResult(spec, {k: (v, sa.dropped_seconds[k]) for k, v in sa.dropped.items()}, sa.moved)
