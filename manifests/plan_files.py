"""Plan directories: the writer the planner uses and the reader any trainer imports.

A plan directory holds ``plan.json`` and one Parquet shard per rank (``rank-00000.parquet`` ...);
one shard row is one batch: ``epoch`` int32, ``step`` int64 (global, the same on every rank),
``step_in_epoch`` int64, ``bucket`` int32, ``size`` int32, ``max_duration`` float64 (seconds),
``max_tokens`` int32, ``ids`` list<string>, ``rows`` list<int64> (manifest row numbers); version
2 (``--dynamic-resolution``) adds ``target_frames`` int32, version 3 (``--pack``) ``sequence`` and
``cu_seqlens`` list<int32>; metadata ``speech_dataprep.plan`` holds the ``version`` (readers take
1-3). See docs/file-formats.md. Pages carry CRC checksums, verified on every read; ``plan.json``
records each shard's size, footer SHA-256 (checked on every open) and full SHA-256 (checked by
``dataprep verify``). Rows are in step order; a row group holds a fixed number of steps (never
two epochs) with min/max statistics on ``step``, so a reader seeks to step ``k`` from the
footer. Needs pyarrow only. The directory is written into a temporary sibling and renamed into
place: never half-written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from manifests.arrow_views import numpy_view, single_chunk
from manifests.atomic_files import atomic_path, current_umask, fsync_file, sweep_stale_temps, temp_prefix, write_json
from manifests.content_hash import file_sha256
from manifests.errors import ManifestError, OutputError, os_error_line
from manifests.hash_cache import file_facts
from manifests.outputs import require_replaceable_plan_dir
from manifests.plan_meta import PLAN_JSON, FileRef, PlanMeta, plan_hash_of, read_plan_meta
from manifests.step_index import step_footer
from manifests.validation import number_text

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
#: shards of packed plans: each member's sequence in its batch and the sequences' te offsets, version 3
SHARD_SCHEMA_PACKED = SHARD_SCHEMA.append(pa.field("sequence", pa.list_(pa.int32()), nullable=False)).append(
    pa.field("cu_seqlens", pa.list_(pa.int32()), nullable=False))
SHARD_VERSION = 1
SHARD_VERSION_TARGET_FRAMES = 2
SHARD_VERSION_PACKED = 3
SHARD_VERSIONS = (SHARD_VERSION, SHARD_VERSION_TARGET_FRAMES, SHARD_VERSION_PACKED)
#: Threads that flush (fsync) and hash a plan's shards at once when it is published: waits on
#: the disk, not the CPU; concurrent flushes share the journal's commits.
SYNC_THREADS = 16


def default_write_threads() -> int:
    """Shards written at once by default: one per core we may use, at most 4 (Arrow's gather,
    encoding and compression release the GIL; each shard's bytes do not depend on it)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))


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
    step_in_epoch: int = 0,
    packed: tuple[npt.NDArray[np.integer], npt.NDArray[np.integer], npt.NDArray[np.integer]] | None = None,
) -> pa.Table:
    """One epoch of one rank as a shard table (batch ``i`` = step ``first_step + i``, the
    epoch's step ``step_in_epoch + i``: a part of an epoch written in several tables).

    ``rows[offsets[i]:offsets[i+1]]`` are batch ``i``'s manifest rows (``offsets`` may be a
    slice of a larger CSR); ``ids`` holds the ids of ``rows[offsets[0]:offsets[-1]]`` in that
    order (e.g. ``manifest_ids.take(...)``), so the ``ids`` list column reuses its values.
    ``target_frames`` (frames per batch, dynamic resolution) adds that column (shard version 2).
    ``packed`` = (sequence, cu_values, cu_offsets): each row's sequence in its batch (aligned
    with ``rows``) and the batches' ``cu_seqlens`` in CSR (shard version 3).
    """
    n = int(bucket.shape[0])
    offsets = np.asarray(offsets, dtype=np.int64)
    base, end = int(offsets[0]), int(offsets[-1])
    if end - base >= 2**31:
        raise ManifestError(f"{end - base} utterances in one shard epoch: more than a Parquet list holds")
    off = pa.array((offsets - base).astype(np.int32))
    list_ids = pa.ListArray.from_arrays(off, ids)
    list_rows = pa.ListArray.from_arrays(off, pa.array(np.asarray(rows, dtype=np.int64)[base:end]))
    steps = np.arange(step_in_epoch, step_in_epoch + n, dtype=np.int64)
    extra = [] if target_frames is None else [pa.array(np.asarray(target_frames, dtype=np.int32))]
    if packed is not None:
        seq, cu, cu_off = packed
        extra = [pa.ListArray.from_arrays(off, pa.array(np.asarray(seq, dtype=np.int32))),
                 pa.ListArray.from_arrays(pa.array(np.asarray(cu_off, dtype=np.int32)),
                                          pa.array(np.asarray(cu, dtype=np.int32)))]
    return pa.Table.from_arrays(
        [
            pa.array(np.full(n, epoch, dtype=np.int32)),
            pa.array(steps + (first_step - step_in_epoch)),
            pa.array(steps),
            pa.array(np.asarray(bucket, dtype=np.int32)),
            pa.array(np.diff(offsets).astype(np.int32)),
            pa.array(np.asarray(max_duration, dtype=np.float64)),
            pa.array(np.asarray(max_tokens, dtype=np.int32)),
            list_ids,
            list_rows,
            *extra,
        ],
        schema=SHARD_SCHEMA_PACKED if packed is not None else
        SHARD_SCHEMA if target_frames is None else SHARD_SCHEMA_TARGET_FRAMES,
    )


class PlanWriter:
    """Stream a plan's shards epoch by epoch, then publish the directory atomically.

    ``with PlanWriter(out, world_size) as w: w.write(rank, table) ...; w.finish(meta)``.
    ``target_frames=True`` writes version-2 shards (tables from ``shard_table(..., target_frames=...)``).
    ``packed`` (a packed plan, :mod:`dataprep.planning.packed`): ``packed.expand(table)`` turns
    each table of sequences into one of their members (version 3) and ``packed.meta(meta)``
    describes the members in ``plan.json``.
    ``finish`` adds ``plan_hash`` (SHA-256 over ``meta`` and every shard's bytes) and
    ``shards`` (file names and SHA-256s) to ``plan.json`` and renames the folder into
    place, replacing an older plan there; without ``finish`` nothing is published.
    ``write_threads`` (default :func:`default_write_threads`): shards :meth:`write_ranks`
    writes at once; the bytes are the same for any number.
    """

    def __init__(self, out_dir: str | os.PathLike[str], world_size: int, row_group_steps: int = 256,
                 target_frames: bool = False, write_threads: int | None = None, packed: Any = None) -> None:
        self.out_dir = Path(out_dir)
        self.write_threads = default_write_threads() if write_threads is None else max(1, int(write_threads))
        self.schema = SHARD_SCHEMA_TARGET_FRAMES if target_frames else SHARD_SCHEMA
        self.version = SHARD_VERSION_TARGET_FRAMES if target_frames else SHARD_VERSION
        self.packed = packed
        if packed is not None:
            self.schema, self.version = SHARD_SCHEMA_PACKED, SHARD_VERSION_PACKED
        require_replaceable_plan_dir(self.out_dir)
        self.world_size = int(world_size)
        self.row_group_steps = int(row_group_steps)
        try:
            self.out_dir.parent.mkdir(parents=True, exist_ok=True)
            sweep_stale_temps(self.out_dir)
            self.tmp_dir = Path(tempfile.mkdtemp(prefix=temp_prefix(self.out_dir), suffix=".tmp",
                                                 dir=self.out_dir.parent))
        except OSError as exc:  # a read-only disk, a permission, a parent that is a file: one line naming -o
            raise OutputError(os_error_line(exc, self.out_dir)) from None
        self._stack = contextlib.ExitStack()
        self._writers: list[pq.ParquetWriter | None] = [None] * self.world_size
        self._closed = [False] * self.world_size  # shards finished early (write_ranks' ``close``)
        self._paths: list[Path] = []
        for rank in range(self.world_size):
            # flushed all at once by finish (one at a time, each flush of the journal waits alone)
            self._paths.append(self._stack.enter_context(atomic_path(self.tmp_dir / shard_name(rank), fsync=False)))
        self._done = False

    def __enter__(self) -> PlanWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if not self._done:
            self._abort()

    def write(self, rank: int, table: pa.Table) -> None:
        """Append batches (rows in step order) to ``rank``'s shard."""
        if self._closed[rank]:
            raise ValueError(f"shard of rank {rank} is already closed")
        if self.packed is not None and "sequence" not in table.column_names:
            table = self.packed.expand(table)
        writer = self._writers[rank]
        if writer is None:
            meta = {META_KIND: b"plan-shard",
                    META_PLAN: json.dumps({"version": self.version, "rank": rank,
                                           "world_size": self.world_size}, sort_keys=True).encode()}
            writer = pq.ParquetWriter(
                self._paths[rank], self.schema.with_metadata(meta), compression="zstd", compression_level=1,
                use_dictionary=["epoch", "bucket"], write_statistics=["epoch", "step", "bucket"],
                write_page_checksum=True,  # every page read is CRC-checked: a flipped bit is an error, not data
            )
            self._writers[rank] = writer
        writer.write_table(table, row_group_size=self.row_group_steps)

    def write_ranks(self, tables: Callable[[int], Iterable[pa.Table]], tick: Callable[[int], object], *,
                    close: bool = False, ranks: range | None = None) -> None:
        """Append ``tables(r)`` (in order) to every rank ``r``'s shard (of ``ranks``, default
        all), ``write_threads`` ranks at a time; ``tick(r)`` once rank ``r`` is written, in rank
        order. Each shard's bytes are those one thread writes. ``close``: the last tables of
        these shards; each is closed once written (its footer out of memory: a writer holds its
        shard's row-group metadata, several KB a row group, until closed), with the bytes
        :meth:`finish` would give it."""
        ranks = range(self.world_size) if ranks is None else ranks

        def one(r: int) -> None:
            for table in tables(r):
                self.write(r, table)
            if close:
                self._close(r)

        if self.write_threads == 1 or len(ranks) == 1:
            for r in ranks:
                one(r)
                tick(r)
            return
        with ThreadPoolExecutor(min(self.write_threads, len(ranks))) as pool:
            for r, _ in zip(ranks, pool.map(one, ranks)):  # in rank order
                tick(r)

    def finish(self, meta: PlanMeta) -> PlanMeta:
        """Close the shards, write ``plan.json``, publish the directory; return the plan's
        metadata with its shards' SHA-256s and ``plan_hash`` filled in."""
        if meta.world_size != self.world_size:
            raise ValueError(f"plan metadata says world size {meta.world_size}, the writer has {self.world_size}")
        if self.packed is not None:
            for rank in range(self.world_size):
                if not self._closed[rank]:
                    self._close(rank)
            meta = self.packed.meta(meta)
        for rank in range(self.world_size):
            if not self._closed[rank]:
                self._close(rank)
        with ThreadPoolExecutor(min(self.world_size, SYNC_THREADS)) as pool:
            list(pool.map(fsync_file, self._paths))
            self._stack.close()  # renames each temporary shard to its name inside tmp_dir
            shards = list(pool.map(_shard_ref, [self.tmp_dir / shard_name(r) for r in range(self.world_size)]))
        plan_hash = plan_hash_of(dataclasses.replace(meta, shards=shards, plan_hash="").to_json())
        final = dataclasses.replace(meta, shards=shards, plan_hash=plan_hash)
        write_json(final.to_json(), self.tmp_dir / PLAN_JSON)
        old: Path | None = None
        if self.out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=temp_prefix(self.out_dir), suffix=".old", dir=self.out_dir.parent))
            os.replace(self.out_dir, old / "plan")
        os.chmod(self.tmp_dir, 0o777 & ~current_umask())  # mkdtemp makes it private; a plan is shared
        os.replace(self.tmp_dir, self.out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        self._done = True
        return final

    def _close(self, rank: int) -> None:
        """Write ``rank``'s footer (an empty table first where nothing was written) and let go
        of its writer."""
        if self._writers[rank] is None:
            self.write(rank, self.schema.empty_table())
        self._writers[rank].close()  # type: ignore[union-attr]
        self._writers[rank] = None
        self._closed[rank] = True

    def _abort(self) -> None:
        for w in self._writers:
            if w is not None:
                with contextlib.suppress(Exception):
                    w.close()
        with contextlib.suppress(Exception):
            self._stack.__exit__(RuntimeError, RuntimeError("aborted"), None)
        shutil.rmtree(self.tmp_dir, ignore_errors=True)


def _shard_ref(path: Path) -> FileRef:
    facts = file_facts(path)
    return FileRef(path.name, file_sha256(path), size=facts["size"], footer_sha256=facts["footer_sha256"])


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
    #: packed plans (shard version 3): each member's sequence in the batch, and the sequences'
    #: token-equivalent offsets (length sequences + 1, from 0); None for other plans
    sequence: npt.NDArray[np.int32] | None = None
    cu_seqlens: npt.NDArray[np.int32] | None = None


class PlanShard:
    """Rank ``rank``'s shard of a plan: seek to any step without reading earlier ones.

    >>> shard = PlanShard("plan/", rank=3)                     # doctest: +SKIP
    >>> for batch in shard.iter_batches(start_step=1200): ...  # doctest: +SKIP

    ``at_step``: open only the row group holding that step (its metadata from the step index,
    :mod:`manifests.step_index`, kept under ``cache_dir``), for a lookup at any plan size.
    """

    def __init__(self, plan_dir: str | os.PathLike[str], rank: int, meta: PlanMeta | None = None, *,
                 at_step: int | None = None, cache_dir: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(plan_dir) / shard_name(rank)
        meta = meta if meta is not None else read_plan_meta(plan_dir)
        if not 0 <= rank < meta.world_size:
            raise ManifestError(f"{self.path}: rank {rank} is not below the plan's world size {meta.world_size}")
        facts = check_shard_facts(self.path, meta.shards[rank])
        footer = None if at_step is None else step_footer(self.path, facts, at_step, cache_dir)
        try:
            self._file = pq.ParquetFile(self.path, metadata=footer, page_checksum_verification=True)
        except (OSError, pa.ArrowException) as exc:
            raise ManifestError(f"{self.path}: not a readable Parquet file ({_first_line(exc)})") from None
        file_meta = self._file.schema_arrow.metadata or {}
        if file_meta.get(META_KIND) != b"plan-shard":
            raise ManifestError(f"{self.path}: not a plan shard")
        try:
            plan_meta = json.loads(file_meta.get(META_PLAN, b"{}"))
            self.version = plan_meta.get("version")
        except (ValueError, AttributeError):
            raise ManifestError(f"{self.path}: unreadable {META_PLAN.decode()} metadata") from None
        if self.version not in SHARD_VERSIONS:
            raise ManifestError(f"{self.path}: unsupported shard version {self.version!r} "
                                f"(this tool reads {', '.join(map(str, SHARD_VERSIONS))})")
        for key, want in (("rank", rank), ("world_size", meta.world_size)):
            got = plan_meta.get(key)
            if got != want or isinstance(got, bool):
                raise ManifestError(f"{self.path}: the shard is {key} {str(got)[:40]} of its plan, {want} is opened "
                                    f"(a shard of another rank or plan put in its place)")
        if self._file.schema_arrow.remove_metadata() not in (SHARD_SCHEMA, SHARD_SCHEMA_TARGET_FRAMES,
                                                               SHARD_SCHEMA_PACKED):
            raise ManifestError(f"{self.path}: columns differ from a plan shard's")
        self.has_target_frames = "target_frames" in self._file.schema_arrow.names
        self.packed = "sequence" in self._file.schema_arrow.names
        self.rank = rank
        self._manifest_rows = meta.manifest.rows
        self.first_step, self.end_step, self.epochs = meta.first_step, meta.num_steps, meta.epochs
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

    def start(self, start_step: int | None) -> int:
        """``start_step``, or the plan's first step for None; a step outside ``first_step ..
        num_steps`` of the plan is refused (one line), never read as an empty or whole shard."""
        if start_step is None:
            return self.first_step
        if isinstance(start_step, bool) or not isinstance(start_step, (int, np.integer)):
            raise ManifestError(f"{self.path}: start step: expected an integer, got {type(start_step).__name__}")
        if not self.first_step <= start_step <= self.end_step:
            raise ManifestError(f"{self.path}: start step {number_text(int(start_step))} is outside the plan's steps "
                                f"{self.first_step}..{self.end_step}")
        return int(start_step)

    def row_groups_from(self, start_step: int | None = None) -> list[int]:
        """Row groups holding steps ``>= start_step`` (from the footer statistics only)."""
        return [int(i) for i in np.flatnonzero(self._last >= self.start(start_step))]

    def read(self, start_step: int | None = None, columns: Sequence[str] | None = None) -> pa.Table:
        """Batches from ``start_step`` (default: the plan's first) on, as a table; reads no row
        group before it."""
        start_step = self.start(start_step)
        groups = self.row_groups_from(start_step)
        cols = None if columns is None else list(dict.fromkeys(["step", *columns]))
        if groups:
            table = self._read(lambda: self._file.read_row_groups(groups, columns=cols))
            steps = table.column("step").to_numpy()
            table = table.slice(int(np.searchsorted(steps, start_step)))
        else:
            empty = self._file.schema_arrow.empty_table()
            table = empty if cols is None else empty.select(cols)
        return table if columns is None else table.select(list(columns))

    def iter_tables(self, start_step: int | None = None, columns: Sequence[str] | None = None) -> Iterator[pa.Table]:
        """The batches of :meth:`read`, one row group at a time (memory: one row group of
        ``columns``, whatever the shard's size); each table checked like every read."""
        start_step = self.start(start_step)
        cols = None if columns is None else list(dict.fromkeys(["step", *columns]))
        for g in self.row_groups_from(start_step):
            table = self._read(lambda: self._file.read_row_group(g, columns=cols))
            steps = numpy_view(table.column("step"), np.int64)
            table = table.slice(int(np.searchsorted(steps, start_step)))
            yield table if columns is None else table.select(list(columns))

    def iter_batches(self, start_step: int | None = None) -> Iterator[PlanBatch]:
        """Yield batches from ``start_step`` (default: the plan's first) on, one row group read
        at a time."""
        start_step = self.start(start_step)
        for g in self.row_groups_from(start_step):
            t = self._read(lambda: self._file.read_row_group(
                g, columns=["epoch", "step", "step_in_epoch", "bucket", "ids", "rows"]
                + (["target_frames"] if self.has_target_frames else [])
                + (["sequence", "cu_seqlens"] if self.packed else [])))
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
            seq = cu = seq_offs = cu_offs = None
            if self.packed:
                seq_col, cu_col = single_chunk(t.column("sequence")), single_chunk(t.column("cu_seqlens"))
                seq, seq_offs = numpy_view(seq_col.values, np.int32), numpy_view(seq_col.offsets, np.int32)
                cu, cu_offs = numpy_view(cu_col.values, np.int32), numpy_view(cu_col.offsets, np.int32)
            for i in range(skip, t.num_rows):
                yield PlanBatch(epochs[i], step_list[i], sie[i], buckets[i], ids[i], vals[offs[i]:offs[i + 1]],
                                targets[i], None if seq is None else seq[seq_offs[i]:seq_offs[i + 1]],
                                None if cu is None else cu[cu_offs[i]:cu_offs[i + 1]])

    def __iter__(self) -> Iterator[PlanBatch]:
        return self.iter_batches()

    def _read(self, read: Any) -> pa.Table:
        """A row-group read whose corruption is a one-line error (the footer was checked on
        open; ``dataprep verify`` checks every byte)."""
        try:
            table = read()
        except (OSError, pa.ArrowException, ValueError) as exc:
            raise ManifestError(f"{self.path}: corrupt row group ({_first_line(exc)}); run `dataprep verify "
                                f"{self.path.parent}`") from None
        if "rows" in table.column_names and "ids" in table.column_names:
            if table.column("rows").null_count or table.column("ids").null_count or \
                    pc.any(pc.not_equal(pc.list_value_length(table.column("rows")),
                                        pc.list_value_length(table.column("ids")))).as_py():
                raise ManifestError(f"{self.path}: a batch's ids and rows differ in length (corrupt shard)")
        if "rows" in table.column_names and "sequence" in table.column_names:
            if table.column("sequence").null_count or pc.any(pc.not_equal(
                    pc.list_value_length(table.column("rows")), pc.list_value_length(table.column("sequence")))).as_py():
                raise ManifestError(f"{self.path}: a batch's sequence and rows differ in length (corrupt shard)")
        if "rows" in table.column_names and table.num_rows:
            values = pc.list_flatten(table.column("rows"))
            if len(values) and (pc.min(values).as_py() < 0 or pc.max(values).as_py() >= self._manifest_rows):
                raise ManifestError(f"{self.path}: refers to manifest rows outside 0..{self._manifest_rows - 1} "
                                    f"(corrupt shard)")
        return table

    def read_epoch(self, epoch: int, columns: Sequence[str]) -> pa.Table:
        """Batches of one epoch (the given columns), checked like every read; an epoch the plan
        does not hold is refused."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or not 0 <= epoch < self.epochs:
            raise ManifestError(f"{self.path}: epoch {str(epoch)[:40] if not isinstance(epoch, int) else number_text(epoch)} "
                                f"is not one of the plan's epochs 0..{self.epochs - 1}")
        return self._read(lambda: pq.read_table(self.path, columns=list(columns), filters=[("epoch", "=", epoch)],
                                                page_checksum_verification=True))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0][:200] if text else type(exc).__name__)


def check_shard_facts(path: Path, ref: FileRef) -> dict[str, Any]:
    """Refuse a shard whose name, size or footer differs from what ``plan.json`` records (a
    file copied from another plan, truncated, or rewritten): cheap, checked on every open.
    Returns the shard's :func:`~manifests.hash_cache.file_facts`."""
    if ref.file != path.name:
        raise ManifestError(f"{path.parent / PLAN_JSON}: shards: lists {ref.file!r} where {path.name!r} belongs")
    if not path.is_file():
        raise ManifestError(f"{path}: no such file (the plan lists it; was the plan directory copied whole?)")
    try:
        facts = file_facts(path)
    except ManifestError as exc:
        raise ManifestError(f"{exc} (plan.json records {ref.size} bytes)") from None
    if facts["size"] != ref.size:
        raise ManifestError(f"{path}: size {facts['size']} bytes, plan.json records {ref.size} "
                            f"(truncated, or a shard of another plan)")
    if facts["footer_sha256"] != ref.footer_sha256:
        raise ManifestError(f"{path}: footer differs from the one plan.json records (a shard of another plan?)")
    return facts


def verify_plan(plan_dir: str | os.PathLike[str]) -> PlanMeta:
    """Every check a plan can get: plan.json valid, ``plan_hash`` recomputed, every shard's
    size, footer and full SHA-256 as recorded, and each shard readable as a plan shard."""
    meta = read_plan_meta(plan_dir)  # plan_hash recomputed there
    for rank, ref in enumerate(meta.shards):
        path = Path(plan_dir) / shard_name(rank)
        check_shard_facts(path, ref)
        got = file_sha256(path)
        if got != ref.sha256:
            raise ManifestError(f"{path}: SHA-256 {got[:12]}... differs from plan.json's {ref.sha256[:12]}...")
        shard = PlanShard(plan_dir, rank, meta)
        if shard.packed:
            pack = meta.extra.get("pack")
            cap = pack.get("max_tokens") if isinstance(pack, dict) else None
            if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
                raise ManifestError(f"{Path(plan_dir) / PLAN_JSON}: pack.max_tokens: a packed plan records its "
                                    "sequences' N (an integer >= 1)")
            for table in shard.iter_tables(columns=["sequence", "cu_seqlens"]):
                check_packed(table, cap, path)
        if shard.num_steps != meta.num_steps - meta.first_step:  # a re-planned plan holds first_step..
            raise ManifestError(f"{path}: holds {shard.num_steps} steps, plan.json says "
                                f"{meta.num_steps - meta.first_step} (steps {meta.first_step}..{meta.num_steps - 1})")
    return meta


def check_packed(table: pa.Table, cap: int, path: Path) -> None:
    """A packed shard's batches (``sequence``, ``cu_seqlens``) hold together: each batch's
    sequence numbers start at 0 and step by 0 or 1 (members of a sequence contiguous), its
    ``cu_seqlens`` has one entry more than it has sequences, starts at 0 and grows by at most
    ``cap`` (no sequence over N) and by at least 0; else a one-line error naming ``path``."""
    if not table.num_rows:
        return
    seq, cu = single_chunk(table.column("sequence")), single_chunk(table.column("cu_seqlens"))
    s_off = np.asarray(seq.offsets, dtype=np.int64)
    s_val = np.asarray(seq.flatten(), dtype=np.int64)
    c_off = np.asarray(cu.offsets, dtype=np.int64)
    c_val = np.asarray(cu.flatten(), dtype=np.int64)
    s_off, c_off = s_off - s_off[0], c_off - c_off[0]
    size = np.diff(s_off)
    if (size == 0).any():
        raise ManifestError(f"{path}: a packed batch holds no rows (corrupt shard)")
    step = np.diff(s_val)
    inner = np.ones(step.shape[0], dtype=bool)
    inner[s_off[1:-1] - 1] = False  # the first member of each batch after the first
    if (s_val[s_off[:-1]] != 0).any() or ((step[inner] != 0) & (step[inner] != 1)).any():
        raise ManifestError(f"{path}: a packed batch's sequence numbers do not start at 0 and rise by 0 or 1 "
                            "(corrupt shard)")
    sequences = s_val[s_off[1:] - 1] + 1
    if (np.diff(c_off) != sequences + 1).any() or (c_val[c_off[:-1]] != 0).any():
        raise ManifestError(f"{path}: a packed batch's cu_seqlens does not have one entry per sequence plus one, "
                            "from 0 (corrupt shard)")
    grow = np.diff(c_val)
    grow[c_off[1:-1] - 1] = 0  # across batches
    if (grow < 0).any() or (grow > cap).any():
        raise ManifestError(f"{path}: a packed sequence's cu_seqlens step is below 0 or over the plan's N {cap} "
                            "(corrupt shard)")


def open_shard(plan_dir: str | os.PathLike[str], rank: int) -> PlanShard:
    """Open ``rank``'s shard of the plan in ``plan_dir`` (its size and footer checked against plan.json)."""
    return PlanShard(plan_dir, rank)
