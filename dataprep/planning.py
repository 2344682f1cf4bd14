"""Planning pipelines: manifest + buckets.json -> plan directory (:func:`build_plan`), and the
tail-worker simulation of a written plan (:func:`simulate_plan`).

I/O around the pure core in :mod:`bucketing.plan` and :mod:`bucketing.simulate`; the
``plan-batches`` and ``simulate`` commands call these.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bucketing.allocate import assign
from bucketing.costmodel import CostModel
from bucketing.fit import grid_from_spec
from bucketing.plan import EpochPlan, PlanError, PlanInputs, plan_epoch
from bucketing.simulate import SimResult, simulate
from manifests.buckets_file import BucketSpec, read_buckets
from manifests.errors import DataprepError, ManifestError
from manifests.io import file_sha256, manifest_hash, read_manifest
from manifests.plan_files import PlanWriter, read_plan_json, shard_name, shard_table

DEFAULT_WORLD_SIZES = (2, 16, 128)


def batch_sizes_of(spec: BucketSpec, where: str = "buckets.json") -> np.ndarray:
    """Batch size per bucket; a one-line error if any bucket lacks one."""
    missing = [b.index for b in spec.buckets if b.batch_size is None]
    if missing:
        raise ManifestError(
            f"{where}: bucket {missing[0]} has no batch_size ({len(missing)} buckets lack one); "
            "run `dataprep fit-buckets` with a budget or `dataprep oomptimize`"
        )
    return np.asarray([b.batch_size for b in spec.buckets], dtype=np.int64)


def build_plan(
    manifest: str | os.PathLike[str],
    buckets: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    world_size: int,
    seed: int = 0,
    epochs: int = 1,
    strict: bool = False,
    interleave: str = "random",
    row_group_steps: int = 128,
    carry: bool = True,
    on_progress: Callable[[int, int], None] | None = None,
    timings: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Plan ``epochs`` epochs of ``manifest`` over ``world_size`` ranks into ``out_dir``.

    Returns the content of ``plan.json``. ``on_progress(done, total)`` counts shard writes;
    ``timings`` (if given) receives wall seconds per phase (read, allocate, plan, write).
    """
    clock = _Clock(timings)
    if world_size < 1 or epochs < 1:
        raise DataprepError(f"world size and epochs must be >= 1 (got {world_size}, {epochs})")
    spec = read_buckets(buckets)
    bs = batch_sizes_of(spec, str(buckets))
    grid = grid_from_spec(spec)
    df = read_manifest(manifest, columns=["id", "duration", "num_tokens"])
    if df.height == 0:
        raise ManifestError(f"{manifest}: the manifest has no rows")
    duration = df["duration"].to_numpy()
    tokens = df["num_tokens"].fill_null(0).to_numpy().astype(np.int64)
    ids = df.get_column("id").to_arrow().cast(pa.string())
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    del df
    clock("read")
    assigned = assign(duration, tokens, grid, bs, strict=strict, carry=carry, world_size=world_size)
    alloc = assigned.allocation
    inputs = PlanInputs(assigned.bucket, bs, duration, tokens, grid.max_duration, assigned.max_tokens.astype(np.float64))
    clock("allocate")

    steps_per_epoch: list[int] = []
    per_epoch: list[dict[str, Any]] = []
    fallbacks: list[dict[str, int]] = []
    B = len(spec.buckets)
    per_bucket_batches = np.zeros(B, dtype=np.int64)
    per_bucket_utts = np.zeros(B, dtype=np.int64)
    real_s = pad_s = 0.0
    real_t = pad_t = 0
    dropped_rows: dict[str, list[int]] = {}
    first_step = 0
    total = epochs * world_size
    with PlanWriter(out_dir, world_size, row_group_steps=row_group_steps) as writer:
        for e in range(epochs):
            try:
                ep = plan_epoch(inputs, world_size, seed, e, interleave=interleave)  # type: ignore[arg-type]
            except PlanError as exc:
                raise DataprepError(f"{manifest}: cannot plan: {exc}") from None
            clock("plan")
            _write_epoch(writer, ep, ids, first_step, lambda r: on_progress(e * world_size + r + 1, total)
                         if on_progress else None)
            real_s, pad_s = real_s + ep.real_seconds, pad_s + ep.padded_seconds
            real_t, pad_t = real_t + ep.real_tokens, pad_t + ep.padded_tokens
            sizes = ep.sizes()
            bucket_of_batch = np.tile(ep.step_bucket, world_size)
            per_bucket_batches += np.bincount(bucket_of_batch, minlength=B)
            per_bucket_utts += np.bincount(bucket_of_batch, weights=sizes, minlength=B).astype(np.int64)
            steps_per_epoch.append(ep.num_steps)
            per_epoch.append({"epoch": e, "steps": ep.num_steps, "first_step": first_step,
                              "padding_audio": round(ep.audio_padding, 6), "padding_tokens": round(ep.token_padding, 6),
                              "resplit_buckets": ep.resplit_buckets})
            fallbacks += [{"epoch": e, **f} for f in ep.fallbacks]
            if ep.dropped.shape[0]:
                dropped_rows[str(e)] = ep.dropped.tolist()
            first_step += ep.num_steps
            clock("write")
        moved = sum(f["rows"] for f in fallbacks if f["kind"] in ("carried", "borrowed"))
        meta: dict[str, Any] = {
            "inputs": {
                "manifest": {"file": Path(manifest).name, "content_hash": manifest_hash(manifest),
                             "rows": int(duration.shape[0])},
                "buckets": {"file": Path(buckets).name, "sha256": file_sha256(buckets)},
            },
            "buckets": spec.to_json()["buckets"],
            "world_size": world_size,
            "seed": seed,
            "epochs": epochs,
            "interleave": interleave,
            "allocation": {
                "strict": strict,
                "allocated_rows": int((alloc.bucket >= 0).sum()),
                "left_out": {k: v.tolist() for k, v in sorted(alloc.dropped.items())},
                "moved_to_longer_bin": alloc.moved,
                "carried_tails": assigned.carried,
                "carry": assigned.carry,
                "raised_max_tokens_rows": alloc.raised,
            },
            "num_steps": first_step,
            "steps_per_epoch": steps_per_epoch,
            "per_epoch": per_epoch,
            "per_bucket": [{"bucket": b, "batches": int(per_bucket_batches[b]) // epochs,
                            "utterances": int(per_bucket_utts[b]) // epochs,
                            "steps": int(per_bucket_batches[b]) // epochs // world_size} for b in range(B)],
            "padding": {"audio": round(1 - real_s / pad_s, 6) if pad_s else 0.0,
                        "tokens": round(1 - real_t / pad_t, 6) if pad_t else 0.0,
                        "real_seconds": round(real_s, 3), "padded_seconds": round(pad_s, 3),
                        "real_tokens": real_t, "padded_tokens": pad_t},
            "fallbacks": {
                "moved_rows": moved,
                "dropped_rows": sum(len(v) for v in dropped_rows.values()),
                "events": fallbacks,
                "dropped": dropped_rows,
                "resplit_buckets": sum(p["resplit_buckets"] for p in per_epoch),
                "broken_sync_steps": 0,
            },
        }
        if first_step == 0:
            raise DataprepError(
                f"{manifest}: the plan has no steps ({int((alloc.bucket >= 0).sum())} of {duration.shape[0]} rows "
                f"allocated, {meta['fallbacks']['dropped_rows']} dropped for {world_size} ranks); "
                "use fewer ranks or buckets with larger batch sizes"
            )
        meta["plan_hash"] = writer.finish(meta)
    clock("write")
    return meta


class _Clock:
    """Adds the seconds since the previous call to ``timings[phase]``."""

    def __init__(self, timings: dict[str, float] | None) -> None:
        self.timings, self.t = timings, time.perf_counter()

    def __call__(self, phase: str) -> None:
        now = time.perf_counter()
        if self.timings is not None:
            self.timings[phase] = self.timings.get(phase, 0.0) + now - self.t
        self.t = now


def _write_threads() -> int:
    """Shards written at once: one per core we may use, at most 4 (Arrow's gather,
    encoding and compression release the GIL; each shard's bytes do not depend on it)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))


def _write_epoch(writer: PlanWriter, ep: EpochPlan, ids: pa.Array, first_step: int,
                 tick: Callable[[int], object]) -> None:
    S = ep.num_steps

    def one(r: int) -> None:
        lo, hi = ep.rank_slice(r)
        off = ep.offsets[lo:hi + 1]
        a, b = int(off[0]), int(off[-1])
        table = shard_table(
            epoch=ep.epoch, first_step=first_step, bucket=ep.step_bucket, offsets=off, rows=ep.rows,
            ids=ids.take(pa.array(ep.rows[a:b])),  # this rank's ids, one gather
            max_duration=ep.max_duration[lo:hi], max_tokens=ep.max_tokens[lo:hi],
        )
        assert table.num_rows == S
        writer.write(r, table)

    with ThreadPoolExecutor(_write_threads()) as pool:
        for r, _ in enumerate(pool.map(one, range(ep.world_size))):  # in rank order
            tick(r)


# --------------------------------------------------------------------------- simulate


def read_epoch_batches(plan_dir: str | os.PathLike[str], epoch: int = 0) -> dict[str, np.ndarray]:
    """Per-batch columns of one epoch over all ranks, as (steps, ranks) matrices."""
    meta = read_plan_json(plan_dir)
    W = int(meta["world_size"])
    cols = ["epoch", "step", "bucket", "size", "max_duration", "max_tokens", "rows"]
    parts = []
    for r in range(W):
        t = pq.read_table(Path(plan_dir) / shard_name(r), columns=cols, filters=[("epoch", "=", epoch)])
        parts.append(t)
    S = parts[0].num_rows
    if S == 0:
        raise ManifestError(f"{plan_dir}: epoch {epoch} is not in the plan (epochs: {meta.get('epochs')})")
    out = {c: np.stack([p.column(c).to_numpy() for p in parts], axis=1)
           for c in ("bucket", "size", "max_duration", "max_tokens")}
    out["rows"] = [p.column("rows").combine_chunks() for p in parts]  # type: ignore[assignment]
    return out


def simulate_plan(
    plan_dir: str | os.PathLike[str],
    world_sizes: Sequence[int] = DEFAULT_WORLD_SIZES,
    cost: CostModel | None = None,
    manifest: str | os.PathLike[str] | None = None,
    epoch: int = 0,
    seed: int = 0,
) -> list[SimResult]:
    """Tail-worker simulation of one epoch of a plan: at the plan's world size with its own
    step layout, and at each of ``world_sizes`` by re-dealing the same batches (one bucket
    per step when synchronized, random buckets per rank when not).

    With ``manifest`` (which must be the plan's, by content hash), batch lengths are
    recomputed from it instead of read from the shards.
    """
    cost = cost or CostModel()
    meta = read_plan_json(plan_dir)
    W = int(meta["world_size"])
    m = read_epoch_batches(plan_dir, epoch)
    max_d, max_t = m["max_duration"], m["max_tokens"]
    if manifest is not None:
        expected = meta["inputs"]["manifest"]["content_hash"]
        if manifest_hash(manifest) != expected:
            raise ManifestError(f"{manifest}: content hash differs from the plan's manifest ({expected[:12]}...)")
        df = read_manifest(manifest, columns=["duration", "num_tokens"])
        d = df["duration"].to_numpy()
        tk = df["num_tokens"].fill_null(0).to_numpy().astype(np.int64)
        max_d = np.empty_like(max_d)
        max_t = np.empty_like(max_t)
        for r, col in enumerate(m["rows"]):  # type: ignore[arg-type]
            rows = col.values.to_numpy()
            starts = col.offsets.to_numpy()[:-1]
            max_d[:, r] = np.maximum.reduceat(d[rows], starts)
            max_t[:, r] = np.maximum.reduceat(tk[rows], starts)
    times = cost.step_time(m["size"], max_d, max_t)
    results = []
    for w in dict.fromkeys([W, *world_sizes]):
        if w < 1:
            raise DataprepError(f"world size must be >= 1, got {w}")
        results.append(simulate(m["bucket"].ravel(), times.ravel(), w, seed=seed,
                                sync_matrix=times if w == W else None, overhead=cost.overhead))
    return results
