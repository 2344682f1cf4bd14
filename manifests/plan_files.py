"""Plan directories: the writer the planner uses and the reader any trainer imports.

A plan directory holds ``plan.json`` and one Parquet shard per rank
(``rank-00000.parquet`` ...). One shard row is one batch::

    epoch          int32    epoch number (0-based)
    step           int64    global step, the same on every rank (0 .. total steps - 1; a
                            re-planned plan starts at its ``replan.at_step``)
    step_in_epoch  int64    step inside its epoch
    bucket         int32    bucket index in buckets.json (the same on every rank at a step,
                            except in balanced plans: ``plan-batches --balance``)
    size           int32    utterances in the batch
    max_duration   float64  longest utterance in the batch, seconds
    max_tokens     int32    most tokens of an utterance in the batch
    ids            list<string>  utterance ids
    rows           list<int64>   row numbers in the compiled manifest
    target_frames  int32    (shard version 2 only: plans made with ``--dynamic-resolution``)
                            frames every utterance of the batch is featurized to: the
                            longest at the base rate (:mod:`bucketing.dynres`)

The shard's key-value metadata ``speech_dataprep.plan`` holds its ``version``: 1 without
``target_frames``, 2 with it. Readers take both (``PlanBatch.target_frames`` is None for 1).

Rows are in step order and row groups hold a fixed number of steps (a group never spans
two epochs), with min/max statistics on ``step``: a reader seeks to step ``k`` by reading
the footer and then only the row groups from the one holding ``k``. Needs pyarrow only (no
torch, nothing else of this project)::

    import pyarrow.parquet as pq
    f = pq.ParquetFile("plan/rank-00003.parquet")
    t = f.read(columns=["step", "bucket", "ids", "rows"])   # or f.read_row_group(i)

The whole directory is written into a temporary sibling folder and renamed into place, so
a crash never leaves a half-written plan.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from manifests.arrow_views import numpy_view, single_chunk
from manifests.errors import ManifestError
from manifests.io import atomic_path, current_umask, file_sha256, write_json
from manifests.plan_meta import PLAN_JSON, FileRef, PlanMeta, read_plan_meta

META_KIND = b"speech_dataprep.kind"
META_PLAN = b"speech_dataprep.plan"  # JSON: version, rank, world_size

SHARD_SCHEMA = pa.schema(
    [
        pa.field("epoch", pa.int32(), nullable=False),
        pa.field("step", pa.int64(), nullable=False),
        pa.field("step_in_epoch", pa.int64(), nullable=False),
        pa.field("bucket", pa.int32(), nullable=False),
        pa.field("size", pa.int32(), nullable=False),
        pa.field("max_duration", pa.float64(), nullable=False),
        pa.field("max_tokens", pa.int32(), nullable=False),
        pa.field("ids", pa.list_(pa.string()), nullable=False),
        pa.field("rows", pa.list_(pa.int64()), nullable=False),
    ]
)
#: shards of plans made with dynamic resolution: one more column, version 2
SHARD_SCHEMA_TARGET_FRAMES = SHARD_SCHEMA.append(pa.field("target_frames", pa.int32(), nullable=False))
SHARD_VERSION = 1
SHARD_VERSION_TARGET_FRAMES = 2
SHARD_VERSIONS = (SHARD_VERSION, SHARD_VERSION_TARGET_FRAMES)


def shard_name(rank: int) -> str:
    return f"rank-{rank:05d}.parquet"


def shard_table(
    *,
    epoch: int,
    first_step: int,
    bucket: npt.NDArray[np.integer],
    offsets: npt.NDArray[np.int64],
    rows: npt.NDArray[np.int64],
    ids: pa.Array,
    max_duration: npt.NDArray[np.floating],
    max_tokens: npt.NDArray[np.integer],
    target_frames: npt.NDArray[np.integer] | None = None,
) -> pa.Table:
    """One epoch of one rank as a shard table (batch ``i`` = step ``first_step + i``).

    ``rows[offsets[i]:offsets[i+1]]`` are batch ``i``'s manifest rows (``offsets`` may be a
    slice of a larger CSR); ``ids`` holds the ids of ``rows[offsets[0]:offsets[-1]]`` in that
    order (e.g. ``manifest_ids.take(...)``), so the ``ids`` list column reuses its values.
    ``target_frames`` (frames per batch, dynamic resolution) adds that column (shard version 2).
    """
    n = int(bucket.shape[0])
    offsets = np.asarray(offsets, dtype=np.int64)
    base, end = int(offsets[0]), int(offsets[-1])
    if end - base >= 2**31:
        raise ManifestError(f"{end - base} utterances in one shard epoch: more than a Parquet list holds")
    off = pa.array((offsets - base).astype(np.int32))
    list_ids = pa.ListArray.from_arrays(off, ids)
    list_rows = pa.ListArray.from_arrays(off, pa.array(np.asarray(rows, dtype=np.int64)[base:end]))
    steps = np.arange(n, dtype=np.int64)
    extra = [] if target_frames is None else [pa.array(np.asarray(target_frames, dtype=np.int32))]
    return pa.Table.from_arrays(
        [
            pa.array(np.full(n, epoch, dtype=np.int32)),
            pa.array(steps + first_step),
            pa.array(steps),
            pa.array(np.asarray(bucket, dtype=np.int32)),
            pa.array(np.diff(offsets).astype(np.int32)),
            pa.array(np.asarray(max_duration, dtype=np.float64)),
            pa.array(np.asarray(max_tokens, dtype=np.int32)),
            list_ids,
            list_rows,
            *extra,
        ],
        schema=SHARD_SCHEMA if target_frames is None else SHARD_SCHEMA_TARGET_FRAMES,
    )


class PlanWriter:
    """Stream a plan's shards epoch by epoch, then publish the directory atomically.

    ``with PlanWriter(out, world_size) as w: w.write(rank, table) ...; w.finish(meta)``.
    ``target_frames=True`` writes version-2 shards (tables from ``shard_table(..., target_frames=...)``).
    ``finish`` adds ``plan_hash`` (SHA-256 over ``meta`` and every shard's bytes) and
    ``shards`` (file names and SHA-256s) to ``plan.json`` and renames the folder into
    place, replacing an older plan there; without ``finish`` nothing is published.
    """

    def __init__(self, out_dir: str | os.PathLike[str], world_size: int, row_group_steps: int = 256,
                 target_frames: bool = False) -> None:
        self.out_dir = Path(out_dir)
        self.schema = SHARD_SCHEMA_TARGET_FRAMES if target_frames else SHARD_SCHEMA
        self.version = SHARD_VERSION_TARGET_FRAMES if target_frames else SHARD_VERSION
        if self.out_dir.exists() and not _replaceable(self.out_dir):
            raise ManifestError(f"{self.out_dir}: exists and is not a plan directory; refusing to overwrite it")
        self.world_size = int(world_size)
        self.row_group_steps = int(row_group_steps)
        self.out_dir.parent.mkdir(parents=True, exist_ok=True)
        self.tmp_dir = Path(tempfile.mkdtemp(prefix=f".{self.out_dir.name}.", suffix=".tmp", dir=self.out_dir.parent))
        self._stack = contextlib.ExitStack()
        self._writers: list[pq.ParquetWriter | None] = [None] * self.world_size
        self._paths: list[Path] = []
        for rank in range(self.world_size):
            self._paths.append(self._stack.enter_context(atomic_path(self.tmp_dir / shard_name(rank))))
        self._done = False

    def __enter__(self) -> PlanWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if not self._done:
            self._abort()

    def write(self, rank: int, table: pa.Table) -> None:
        """Append batches (rows in step order) to ``rank``'s shard."""
        writer = self._writers[rank]
        if writer is None:
            meta = {META_KIND: b"plan-shard",
                    META_PLAN: json.dumps({"version": self.version, "rank": rank,
                                           "world_size": self.world_size}, sort_keys=True).encode()}
            writer = pq.ParquetWriter(
                self._paths[rank], self.schema.with_metadata(meta), compression="zstd", compression_level=1,
                use_dictionary=["epoch", "bucket"], write_statistics=["epoch", "step", "bucket"],
            )
            self._writers[rank] = writer
        writer.write_table(table, row_group_size=self.row_group_steps)

    def finish(self, meta: PlanMeta) -> PlanMeta:
        """Close the shards, write ``plan.json``, publish the directory; return the plan's
        metadata with its shards' SHA-256s and ``plan_hash`` filled in."""
        if meta.world_size != self.world_size:
            raise ValueError(f"plan metadata says world size {meta.world_size}, the writer has {self.world_size}")
        for rank in range(self.world_size):
            if self._writers[rank] is None:
                self.write(rank, self.schema.empty_table())
            self._writers[rank].close()  # type: ignore[union-attr]
        self._stack.close()  # renames each temporary shard to its name inside tmp_dir
        shards = [FileRef(shard_name(r), file_sha256(self.tmp_dir / shard_name(r))) for r in range(self.world_size)]
        body = dataclasses.replace(meta, shards=shards, plan_hash="").to_json()
        plan_hash = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        final = dataclasses.replace(meta, shards=shards, plan_hash=plan_hash)
        write_json(final.to_json(), self.tmp_dir / PLAN_JSON)
        old: Path | None = None
        if self.out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{self.out_dir.name}.", suffix=".old", dir=self.out_dir.parent))
            os.replace(self.out_dir, old / "plan")
        os.chmod(self.tmp_dir, 0o777 & ~current_umask())  # mkdtemp makes it private; a plan is shared
        os.replace(self.tmp_dir, self.out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        self._done = True
        return final

    def _abort(self) -> None:
        for w in self._writers:
            if w is not None:
                with contextlib.suppress(Exception):
                    w.close()
        with contextlib.suppress(Exception):
            self._stack.__exit__(RuntimeError, RuntimeError("aborted"), None)
        shutil.rmtree(self.tmp_dir, ignore_errors=True)


def _replaceable(path: Path) -> bool:
    if not path.is_dir():
        return False
    names = {p.name for p in path.iterdir()}
    return not names or PLAN_JSON in names


# --------------------------------------------------------------------------- reading


def read_plan_json(plan_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """``plan.json`` of a plan directory as a dict, validated (see :func:`read_plan_meta`)."""
    return read_plan_meta(plan_dir).to_json()


@dataclass(frozen=True)
class PlanBatch:
    """One batch of a rank: utterance ids and manifest row numbers, with where it sits."""

    epoch: int
    step: int  # global, equal on every rank
    step_in_epoch: int
    bucket: int
    ids: list[str]
    rows: npt.NDArray[np.int64]
    target_frames: int | None = None  # frames per utterance (dynamic resolution); None = ordinary padding


class PlanShard:
    """Rank ``rank``'s shard of a plan: seek to any step without reading earlier ones.

    >>> shard = PlanShard("plan/", rank=3)                     # doctest: +SKIP
    >>> for batch in shard.iter_batches(start_step=1200): ...  # doctest: +SKIP
    """

    def __init__(self, plan_dir: str | os.PathLike[str], rank: int) -> None:
        self.path = Path(plan_dir) / shard_name(rank)
        try:
            self._file = pq.ParquetFile(self.path)
        except FileNotFoundError:
            raise ManifestError(f"{self.path}: no such file (is rank {rank} below the plan's world size?)") from None
        except (OSError, pa.ArrowInvalid) as exc:
            raise ManifestError(f"{self.path}: not a readable Parquet file ({exc})") from None
        meta = self._file.schema_arrow.metadata or {}
        if meta.get(META_KIND) != b"plan-shard":
            raise ManifestError(f"{self.path}: not a plan shard")
        try:
            self.version = json.loads(meta.get(META_PLAN, b"{}")).get("version", SHARD_VERSION)
        except (ValueError, AttributeError):
            raise ManifestError(f"{self.path}: unreadable {META_PLAN.decode()} metadata") from None
        if self.version not in SHARD_VERSIONS:
            raise ManifestError(f"{self.path}: unsupported shard version {self.version!r} "
                                f"(this tool reads {', '.join(map(str, SHARD_VERSIONS))})")
        self.has_target_frames = "target_frames" in self._file.schema_arrow.names
        self.rank = rank
        md = self._file.metadata
        step_col = md.schema.to_arrow_schema().get_field_index("step")
        self._first = np.empty(md.num_row_groups, dtype=np.int64)
        self._last = np.empty(md.num_row_groups, dtype=np.int64)
        for i in range(md.num_row_groups):
            st = md.row_group(i).column(step_col).statistics
            if md.row_group(i).num_rows == 0:  # an empty shard (a plan with no steps) has one empty group
                self._first[i], self._last[i] = np.iinfo(np.int64).max, -1
                continue
            if st is None or not st.has_min_max:
                raise ManifestError(f"{self.path}: row group {i} has no step statistics")
            self._first[i], self._last[i] = st.min, st.max

    @property
    def num_steps(self) -> int:
        """Batches (= steps) in this shard, over all epochs."""
        return int(self._file.metadata.num_rows)

    def row_groups_from(self, start_step: int) -> list[int]:
        """Row groups holding steps ``>= start_step`` (from the footer statistics only)."""
        return [int(i) for i in np.flatnonzero(self._last >= start_step)]

    def read(self, start_step: int = 0, columns: Sequence[str] | None = None) -> pa.Table:
        """Batches from ``start_step`` on, as a table; reads no row group before it."""
        groups = self.row_groups_from(start_step)
        cols = None if columns is None else list(dict.fromkeys(["step", *columns]))
        if groups:
            table = self._file.read_row_groups(groups, columns=cols)
            steps = table.column("step").to_numpy()
            table = table.slice(int(np.searchsorted(steps, start_step)))
        else:
            empty = self._file.schema_arrow.empty_table()
            table = empty if cols is None else empty.select(cols)
        return table if columns is None else table.select(list(columns))

    def iter_batches(self, start_step: int = 0) -> Iterator[PlanBatch]:
        """Yield batches from ``start_step`` on, one row group read at a time."""
        for g in self.row_groups_from(start_step):
            t = self._file.read_row_group(g, columns=["epoch", "step", "step_in_epoch", "bucket", "ids", "rows"]
                                          + (["target_frames"] if self.has_target_frames else []))
            steps = numpy_view(t.column("step"), np.int64)
            skip = int(np.searchsorted(steps, start_step))
            rows_col = single_chunk(t.column("rows"))
            offs = numpy_view(rows_col.offsets, np.int32)
            vals = numpy_view(rows_col.values, np.int64)
            ids = t.column("ids").to_pylist()
            epochs = numpy_view(t.column("epoch"), np.int32).tolist()
            sie = numpy_view(t.column("step_in_epoch"), np.int64).tolist()
            buckets = numpy_view(t.column("bucket"), np.int32).tolist()
            step_list = steps.tolist()
            targets = (numpy_view(t.column("target_frames"), np.int32).tolist() if self.has_target_frames
                       else [None] * t.num_rows)
            for i in range(skip, t.num_rows):
                yield PlanBatch(epochs[i], step_list[i], sie[i], buckets[i], ids[i], vals[offs[i]:offs[i + 1]],
                                targets[i])

    def __iter__(self) -> Iterator[PlanBatch]:
        return self.iter_batches()


def open_shard(plan_dir: str | os.PathLike[str], rank: int) -> PlanShard:
    """Open ``rank``'s shard of the plan in ``plan_dir``."""
    return PlanShard(plan_dir, rank)
