"""Out-of-core planning: the same plan as :func:`dataprep.planning.build.build_plan` in memory
bounded by the largest bucket, not by the corpus.

1. One pass over the manifest in blocks of :data:`bucketing.batching.TOTALS_BLOCK` rows:
   allocate each block (:func:`bucketing.allocate.allocate` is row-wise) and append every
   row's (row, duration, tokens, id) to its bucket's spill files; each bucket's tail
   candidates (:func:`bucketing.allocate.tail_candidates`, at most half a batch) are kept.
2. Carry bucket tails bucket after bucket (:func:`bucketing.allocate.tail_moves` on a
   bucket's candidates and the rows carried into it: never a whole bucket in memory); the
   moves (at most half a batch per bucket) are kept as edits of the spill files, which are
   not sorted or rewritten.
3. Per epoch: each bucket's rows are ordered into batches in parts of whole windows
   (:meth:`bucketing.batching.BucketGrouping.order_chunks`, the same rng draws in the same
   order); its rows and ids are laid out in that order in the epoch's position files (each
   row beside its id's offset, :meth:`manifests.spill.SpillFiles.append_records`; a large
   bucket's ids gathered a chunk at a time, :meth:`SpilledCorpus.ids_in_parts`) and its
   per-batch summaries (longest, most tokens, sums) taken on the way (the few batches that
   steps cut into pieces look their rows' durations and tokens up again,
   :meth:`SpilledCorpus.lookup`); batches are drawn per batch
   (:func:`bucketing.batching.cut_batches`); balanced steps are laid out from the per-batch
   summaries only: :func:`bucketing.balance.balance_steps`,
   :func:`bucketing.balance.layout_order`, :func:`bucketing.groups.group_order` (the
   per-batch figures they do not need wait on disk meanwhile).
4. The position files are moved, in one sequential pass from their end, into one file per
   group of ranks (:mod:`dataprep.planning.rank_files`: whole ranks, or steps of one rank,
   of at most an eighth of the memory limit); each group is read whole and its shards are
   streamed (several ranks at once, :meth:`manifests.plan_files.PlanWriter.write_ranks`) in
   parts of whole row groups; in the last epoch each shard is closed once written (its
   footer's metadata freed).

Memory (:func:`planning_bytes`): the bucket being ordered (:data:`BUCKET_BYTES_PER_ROW` per
row, a chunk of its ids) beside per-batch summaries, or later the per-batch arrays of the
layout (:data:`BATCH_BYTES`), plus, while shards are written, one rank group (an eighth of
the limit, :func:`dataprep.planning.rank_files.group_bytes`) and one part of a shard per
writing thread;
the spill files take about 31 bytes per row plus the ids on disk (about twice during an
epoch; the last epoch removes each bucket's ids once laid out, so the position files reuse
their page cache). The plan equals the in-memory one (tests compare the shards byte for byte).

Variants, each the in-memory plan's bytes:

- One bucket per step (``balance`` 0, :func:`plan_epoch_identical_spilled`): steps placed from
  the per-batch figures (:mod:`bucketing.plan_summary`), reading back the rows of the few tails
  a bucket pools, carries or borrows; those batches are written by their rows' positions
  (:attr:`EpochLayout.explicit`).
- Weighted blends: the spill also keeps each row's corpus code and index in its corpus; each
  epoch is drawn bucket by bucket (:func:`draw_epoch`: the times each row is taken, to
  ``x{k}`` files) and batched over those entries; per-corpus figures are exact integer sums
  (:func:`bucketing.padding.group_padding`) taken as batches are formed.
- A re-plan's unseen rest of an epoch: :func:`draw_rows` counts the rows listed in the
  parent's shards into the same ``x{k}`` files.
- Dynamic resolution: a :data:`BatchMeasure` sees every formed batch, and batches cut into
  pieces or pooled into tails are taken away and their replacements added (integer counts:
  the order does not matter).

Reports that need a plan's figures, not its shards (``dataprep padding --world-sizes``), plan
with :func:`plan_epoch_figures`: step 3 without ids (the position files hold rows alone).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bucketing.allocate import allocate, merge_tail_candidates, tail_moves
from bucketing.balance import balance_steps, layout_order
from bucketing.batching import (TOTALS_BLOCK, BucketGrouping, Cut, block_totals, bucket_sums, cut_batches,
                                even_batch_counts, even_batch_starts, gather_segments, run_positions)
from bucketing.costmodel import CostModel
from bucketing.padding import GROUP_TICKS_PER_SECOND, exact_bincount, group_padding
from bucketing.quota import QuotaSampler, corpus_indices
from bucketing.fit import Grid
from bucketing.groups import group_order, regroup
from bucketing.plan import EpochPlan, Interleave, check_one_step
from bucketing.plan_summary import ROW_DTYPE, BatchSources, FormedBatches, plan_identical_layout
from dataprep.planning.rank_files import GroupRecords, group_bytes, move_to_groups
from manifests.errors import DataprepError, ManifestError
from manifests.io import iter_manifest, manifest_num_rows
from manifests.plan_files import PlanWriter, shard_table
from manifests.spill import SpillFiles, default_memory_limit, record_dtype

#: Bytes of memory per row of the bucket being ordered: its durations, tokens and shuffle
#: (8 + 4 + 4), the ordered positions and the parts collected (4 + 4); then, as its rows are
#: laid out beside their ids, its positions and rows (int32 below 2**31 rows) and a chunk
#: number (4 + 4 + 1; with carried tails an int32 index too), the ids held a chunk at a time
#: (:data:`ID_BYTES_PER_ROW`). Both on top of about 45 MiB for one part (:data:`ORDER_ROWS`)
#: of sort keys and candidates.
BUCKET_BYTES_PER_ROW = 24
#: Bytes of memory per id held while a bucket's rows are laid out (at most
#: :data:`ID_CHUNK_ROWS` of them): offsets read as int64 and narrowed, bytes, the taken copy.
ID_BYTES_PER_ROW = 40
#: Rows of a bucket ordered at once (:meth:`bucketing.batching.BucketGrouping.order_chunks`,
#: rounded to whole windows): sort keys and 2D candidates of a part, about 150 bytes a row.
ORDER_ROWS = 1 << 19
#: A bucket of more ids than this gathers them into its position files a chunk of this many
#: at a time (:func:`_gathered_ids`), else holds them all (about 20 bytes an id).
ID_CHUNK_ROWS = 1 << 20
#: Bytes of memory per batch of an epoch while steps are laid out (cut batches, segments,
#: the layout, the totals): 161 measured (tracemalloc, 0.5M and 1.7M batches).
BATCH_BYTES = 200
#: Bytes of memory per batch while buckets are ordered: its longest, most tokens and sums,
#: and where it is cut (60 measured).
SUMMARY_BYTES = 64
#: Bytes of memory per row that planning in memory takes (columns, ids, the epoch's arrays).
IN_MEMORY_BYTES_PER_ROW = 100
#: Rows of a shard written at once (rounded to whole row groups): each part reads its batches'
#: runs of the position files (two reads a batch: rows with id offsets, id bytes).
PART_ROWS = 1 << 16
#: Bytes of memory per row of a shard part being written (gather indices, rows, ids, the
#: Arrow table and its encoded pages).
PART_BYTES_PER_ROW = 200


@dataclass
class SpilledCorpus:
    """What the pass over the manifest leaves: per-bucket spill files (``b{k}.rows`` of
    :attr:`row_dtype`, ``b{k}.d`` float64, ``b{k}.t`` int32, ``b{k}.ids`` strings; ascending
    rows), the carried tails as edits of them (``removed``: positions of a bucket's own rows carried on;
    ``extra``: rows carried in), and the allocation's figures (as
    :class:`bucketing.allocate.Assignment`'s)."""

    root: Path
    num_rows: int = 0
    counts: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    dropped: dict[str, list[npt.NDArray[np.int64]]] = field(default_factory=dict)
    moved: int = 0
    raised: int = 0
    max_tokens: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    carried: int = 0
    #: per bucket, the rows its tail may carry on, whichever rows join it
    #: (:func:`bucketing.allocate.tail_candidates`, at most half a batch, kept as the manifest is
    #: spilled): (row, tokens, duration, position in the bucket)
    candidates: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int32], npt.NDArray[np.float64],
                           npt.NDArray[np.int64]]] = field(default_factory=list)
    total_d: float = 0.0
    total_t: float = 0.0
    removed: dict[int, npt.NDArray[np.int64]] = field(default_factory=dict)
    extra: dict[int, _Carried] = field(default_factory=dict)
    carry: bool = False  # bucket tails were carried (the plan's ``allocation.carry``)
    has_ids: bool = True  # ``b{k}.ids`` spilled
    has_codes: bool = False  # ``b{k}.c`` spilled (corpus codes)
    has_index: bool = False  # ``b{k}.i`` spilled (each row's index in its corpus, :attr:`row_dtype`)
    unknown_corpus: bool = False  # a row's corpus code is -1 (a corpus not among the names given)
    #: Row numbers on disk (``b{k}.rows``, the position files' records): int32 below 2**31
    #: rows (4 bytes a row less to write and read twice), else int64.
    row_dtype: type = np.int64
    #: the spill's columns in memory (:class:`manifests.spill.SpillFiles` ``memory``); None: files under ``root``
    memory: dict[str, list[npt.NDArray[np.uint8]]] | None = None

    @property
    def files(self) -> SpillFiles:
        return SpillFiles(self.root, self.memory)

    def allocation_entry(self, strict: bool, carry: bool) -> dict[str, object]:
        """``plan.json``'s ``allocation`` (as :func:`dataprep.planning.build._plan_meta` writes it)."""
        return {
            "strict": strict,
            "allocated_rows": int(self.counts.sum()),
            "left_out": {k: np.concatenate(v).tolist() for k, v in sorted(self.dropped.items())},
            "moved_to_longer_bin": self.moved,
            "carried_tails": self.carried,
            "carry": carry,
            "raised_max_tokens_rows": self.raised,
        }

    def column(self, k: int, name: str, dtype: type) -> npt.NDArray[Any]:
        """Bucket ``k``'s column ``name`` (rows, d or t) after the carried tails, ascending rows."""
        own = self.files.read(f"b{k}.{name}", dtype)
        if k in self.removed:
            own = np.delete(own, self.removed[k])
        if k in self.extra:
            e = self.extra[k]
            own = np.insert(own, e.at, getattr(e, name))
        return own

    def ids_taker(self, k: int) -> Callable[[npt.NDArray[Any]], pa.Array]:
        """Bucket ``k``'s ids: a function of positions in :meth:`column`'s order to their ids.
        Holds the bucket's own ids and, with carried tails, an int32 index; each call's
        transients are its positions' only."""
        own = self.files.read_strings(f"b{k}.ids")
        n = len(own)
        index, extra = self._id_sources(k, n)
        if index is None:
            return lambda q: own.take(pa.array(q))

        def take(q: npt.NDArray[Any]) -> pa.Array:
            src = index[q]
            carried = src >= n
            if not carried.any():
                return own.take(pa.array(src))
            got = own.take(pa.array(np.where(carried, 0, src)))  # the few carried ones put in after
            put = extra.take(pa.array(src[carried] - n)).cast(got.type)
            return pc.replace_with_mask(got, pa.array(carried), put)

        return take

    def _id_sources(self, k: int, n: int) -> tuple[npt.NDArray[Any] | None, pa.Array]:
        """Where each of bucket ``k``'s positions (:meth:`column`'s order) takes its id from,
        the bucket having ``n`` own ids on disk: ``(index, extra)``, ``index[position]`` below
        ``n`` (an own id) or ``n + j`` (``extra[j]``, carried in); ``index`` None without
        carried tails (the position is the own id's)."""
        extra = pa.array([], pa.string())
        if k not in self.removed and k not in self.extra:
            return None, extra
        index = np.arange(n, dtype=np.int32 if n + self.counts[k] < 2**31 else np.int64)
        if k in self.removed:
            index = np.delete(index, self.removed[k])
        if k in self.extra:
            e = self.extra[k]
            index = np.insert(index, e.at, n + np.arange(e.rows.shape[0], dtype=index.dtype))
            extra = e.ids
        return index, extra

    def ids_in_parts(self, k: int, positions: npt.NDArray[Any], part_rows: int, *,
                     drop: bool = False) -> Iterator[pa.Array]:
        """The ids of bucket ``k``'s ``positions`` (:meth:`column`'s order, repeats allowed),
        in parts of ``part_rows`` positions. A bucket of at most :data:`ID_CHUNK_ROWS` own
        ids holds them (:meth:`ids_taker`); a larger one holds one chunk of them at a time
        (:func:`_gathered_ids`), whatever its size. Same ids either way. ``drop``: the
        bucket's id files are removed once read (:meth:`drop_ids`; its last read of them)."""
        name = f"b{k}.ids"
        n = self.files.count_strings(name)
        bounds = list(range(0, positions.shape[0], part_rows)) + [positions.shape[0]]
        if n <= ID_CHUNK_ROWS or self.memory is not None:
            take = self.ids_taker(k)
            if drop:
                self.drop_ids(k)
            for a, b in zip(bounds[:-1], bounds[1:]):
                yield take(positions[a:b])
            return
        index, extra = self._id_sources(k, n)
        yield from _gathered_ids(self.files, name, n, extra, _Sources(index, positions), bounds,
                                 self.root / f"b{k}.gather", (lambda: self.drop_ids(k)) if drop else None)

    def drop_ids(self, k: int) -> None:
        """Remove bucket ``k``'s id files (after its last :meth:`ids_in_parts`)."""
        self.files.remove(f"b{k}.ids.off", f"b{k}.ids.data")

    def lookup(self, k: int, rows: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int32]]:
        """Durations and tokens of some of bucket ``k``'s ``rows`` (after the carried tails):
        a binary search of its own rows or its carried ones, then their values read through the
        mappings (a few pages). For a few rows only (the batches cut across steps)."""
        d, t = self.lookup_columns(k, rows, ("d", "t"))
        return d, t

    def lookup_columns(self, k: int, rows: npt.NDArray[np.int64], names: tuple[str, ...]) -> list[npt.NDArray[Any]]:
        """:meth:`lookup` of the columns ``names`` (``d``, ``t``, ``c``)."""
        dtypes = {"d": np.float64, "t": np.int32, "c": np.int32}
        out = [np.empty(rows.shape[0], dtypes[n]) for n in names]
        carried = np.zeros(rows.shape[0], dtype=bool)
        if k in self.extra:
            e = self.extra[k]
            i = np.minimum(np.searchsorted(e.rows, rows), max(e.rows.shape[0] - 1, 0))
            carried = (e.rows.shape[0] > 0) & (e.rows[i] == rows)
            for o, n in zip(out, names):
                o[carried] = getattr(e, n)[i[carried]]
        # the rows in the file's own type: another would convert the whole mapped file first
        own = np.searchsorted(self.files.map(f"b{k}.rows", self.row_dtype), rows[~carried].astype(self.row_dtype))
        for o, n in zip(out, names):
            o[~carried] = self.files.map(f"b{k}.{n}", dtypes[n])[own]
        return out

    def corpus_sums(self, num_corpora: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Rows and microseconds (exact sums, :func:`bucketing.padding.exact_bincount`) per
        corpus code, over every bucket (one bucket's codes and durations in memory)."""
        rows, micros = np.zeros(num_corpora, np.int64), np.zeros(num_corpora, np.int64)
        for k in np.flatnonzero(self.counts).tolist():
            c = self.column(k, "c", np.int32)
            rows += np.bincount(c, minlength=num_corpora)
            micros += exact_bincount(c, np.rint(self.column(k, "d", np.float64) * GROUP_TICKS_PER_SECOND),
                                     num_corpora)
        return rows, micros


@dataclass(frozen=True)
class _Carried:
    """Rows carried into a bucket (ascending rows; ``d`` / ``t`` / ``ids`` / corpus codes ``c`` /
    index in the corpus ``i`` theirs: ``ids`` empty, ``c`` and ``i`` None where not spilled) and
    where they go among the bucket's kept own rows (``np.insert`` positions)."""

    rows: npt.NDArray[np.int64]
    d: npt.NDArray[np.float64]
    t: npt.NDArray[np.int32]
    ids: pa.Array
    at: npt.NDArray[np.int64]
    c: npt.NDArray[np.int32] | None = None
    i: npt.NDArray[Any] | None = None


class _Sources:
    """Where positions ``a:b`` (some of them: ``sel``) take their strings from:
    ``index[positions[a:b]]``, or the positions themselves (``index`` None); never the whole."""

    def __init__(self, index: npt.NDArray[Any] | None, positions: npt.NDArray[Any]) -> None:
        self.index, self.positions = index, positions

    def __call__(self, a: int, b: int, sel: npt.NDArray[np.int64] | None = None) -> npt.NDArray[Any]:
        p = self.positions[a:b] if sel is None else self.positions[a:b][sel]
        return p if self.index is None else self.index[p]


def _gathered_ids(files: SpillFiles, name: str, n: int, extra: pa.Array, sources: _Sources, bounds: list[int],
                  scratch_path: Path, read: Callable[[], None] | None = None) -> Iterator[pa.Array]:
    """Strings ``name`` (``n`` of them on disk) and ``extra`` (sources ``n + j``) of
    ``sources``, in the parts ``bounds[j] : bounds[j + 1]``, holding one chunk of
    :data:`ID_CHUNK_ROWS` strings at a time.

    Two passes. First, chunk after chunk (the carried ``extra`` last), the chunk's strings of
    every part, in the parts' order, are appended to a scratch file: one append per chunk, and
    per part a count. Then each part reads its run of every chunk's section (one read of runs)
    and puts them in its sources' order. Memory: one chunk's strings, one part, and a chunk
    number per source (1-2 bytes). The scratch file (as large as the strings) is removed;
    ``read`` is called once the strings on disk are read (the first pass)."""
    C = ID_CHUNK_ROWS
    G = -(-n // C) + 1  # chunks of the strings on disk, then ``extra``
    total = int(bounds[-1])
    chunk = np.empty(total, dtype=np.min_scalar_type(G))
    for a, b in zip(bounds[:-1], bounds[1:]):
        src = sources(a, b)
        chunk[a:b] = np.where(src < n, src // C, G - 1)
    scratch = SpillFiles(scratch_path.parent)
    sname = scratch_path.name
    scratch.append_strings(sname, pa.array([], pa.string()))
    count = np.zeros((G, len(bounds) - 1), np.int64)  # strings of chunk g in part j
    try:
        for g in range(G):
            lo = min(n, g * C) if g < G - 1 else n
            strings = (files.read_string_runs(name, np.array([lo]), np.array([min(n, lo + C) - lo]))
                       if g < G - 1 else extra)
            local = []
            for j, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
                mine = np.flatnonzero(chunk[a:b] == g)
                count[g, j] = mine.shape[0]
                if mine.shape[0]:
                    local.append((sources(a, b, mine) - lo).astype(np.int32))  # below C
            if local:
                scratch.append_strings(sname, strings.take(pa.array(np.concatenate(local))))
            del strings, local
        scratch.close()
        if read is not None:
            read()
        at = np.zeros(G, np.int64)  # where each chunk's section of the scratch file starts
        np.cumsum(count.sum(1)[:-1], out=at[1:])
        for j, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
            runs = scratch.read_string_runs(sname, at, count[:, j])
            at += count[:, j]
            order = np.argsort(chunk[a:b], kind="stable")  # the part's sources in the runs' order
            inverse = np.empty_like(order)
            inverse[order] = np.arange(order.shape[0])
            yield runs.take(pa.array(inverse))
    finally:
        scratch.close()
        scratch.remove(f"{sname}.off", f"{sname}.data")


def spill_manifest(manifest: str | os.PathLike[str], grid: Grid, batch_sizes: npt.NDArray[np.int64], root: Path, *,
                   strict: bool, carry: bool, memory_limit: int, ids: bool = True,
                   codes: Iterator[npt.NDArray[np.int32]] | None = None,
                   num_corpora: int | None = None, memory: bool = False) -> SpilledCorpus:
    """Steps 1 and 2 of the module docstring: allocate in blocks, spill by bucket, carry tails.
    A one-line error when one bucket cannot be planned within ``memory_limit`` bytes.
    ``ids``: spill the ids (a plan's shards need them; the padding report does not);
    ``codes``: each row's corpus code, in blocks of :data:`TOTALS_BLOCK` rows
    (:func:`manifests.io.iter_corpus_codes`), spilled as ``b{k}.c`` (int32); with
    ``num_corpora`` (the codes' range) each allocated row's index among its corpus's allocated rows (manifest
    order, :func:`bucketing.quota.corpus_indices`) too, as ``b{k}.i``: what a weighted plan
    draws by (:class:`bucketing.quota.QuotaSampler`). ``memory``: the spill's columns held in
    memory (:class:`manifests.spill.SpillFiles` ``memory``), nothing written under ``root``."""
    B = grid.num_buckets
    out = SpilledCorpus(root, counts=np.zeros(B, np.int64), max_tokens=grid.max_tokens.astype(np.int64).copy(),
                        has_ids=ids, has_codes=codes is not None, has_index=codes is not None and num_corpora is not None,
                        row_dtype=np.int32 if manifest_num_rows(manifest) < 2**31 else np.int64,
                        memory={} if memory else None)
    files = out.files
    base = 0
    next_index = np.zeros(num_corpora or 0, np.int64)  # per corpus: its allocated rows so far
    out.candidates = [(np.empty(0, np.int64), np.empty(0, np.int32), np.empty(0), np.empty(0, np.int64))
                      for _ in range(B)]
    for table in iter_manifest(manifest, ["id", "duration", "num_tokens"] if ids else ["duration", "num_tokens"],
                               TOTALS_BLOCK):
        c = None if codes is None else next(codes)
        d = table.column("duration").to_numpy().astype(np.float64, copy=False)
        t = pc.fill_null(table.column("num_tokens"), 0).to_numpy().astype(np.int32, copy=False)
        alloc = allocate(d, t, grid, strict=strict)
        x, y = block_totals(d, t, alloc.bucket >= 0)
        out.total_d, out.total_t = out.total_d + x, out.total_t + y
        for reason, rows in alloc.dropped.items():
            out.dropped.setdefault(reason, []).append(rows + base)
        out.moved += alloc.moved
        out.raised += alloc.raised
        if alloc.max_tokens is not None:
            out.max_tokens = np.maximum(out.max_tokens, alloc.max_tokens)
        rows = np.flatnonzero(alloc.bucket >= 0)
        index = None
        if c is not None:
            out.unknown_corpus = out.unknown_corpus or bool((c < 0).any())
            if out.has_index and not out.unknown_corpus:
                index = corpus_indices(c[rows], next_index).astype(out.row_dtype)
        b = alloc.bucket[rows]
        order = np.argsort(b.astype(np.int16) if B < 2**15 - 1 else b, kind="stable")
        rows, b = rows[order], b[order]
        if index is not None:
            index = index[order]
        id_col = table.column("id").combine_chunks().cast(pa.large_string()).take(pa.array(rows)) if ids else None
        cut = np.searchsorted(b, np.arange(B + 1))
        for k in np.flatnonzero(np.diff(cut)):
            r = rows[cut[k]:cut[k + 1]]
            files.append(f"b{k}.rows", (r + base).astype(out.row_dtype, copy=False))
            files.append(f"b{k}.d", d[r])
            files.append(f"b{k}.t", t[r])
            if c is not None:
                files.append(f"b{k}.c", c[r])
            if index is not None:
                files.append(f"b{k}.i", index[cut[k]:cut[k + 1]])
            if id_col is not None:
                files.append_strings(f"b{k}.ids", id_col.slice(cut[k], cut[k + 1] - cut[k]))
            # its tail candidates (row, tokens, duration, position in the bucket)
            out.candidates[k] = merge_tail_candidates(  # type: ignore[assignment]
                out.candidates[k], (r + base, t[r], d[r], out.counts[k] + np.arange(r.shape[0], dtype=np.int64)),
                int(k), batch_sizes, grid.duration_bin)
        out.counts += np.diff(cut)
        base += table.num_rows
    files.close()
    out.num_rows = base
    if base == 0:
        raise ManifestError(f"{manifest}: the manifest has no rows")
    out.total_d, out.total_t = max(out.total_d, 1e-300), max(out.total_t, 1e-300)
    check_bucket_fits(manifest, out.counts, batch_sizes, memory_limit)
    return carry_spilled(out, grid, batch_sizes, manifest, memory_limit) if carry and not strict else out


def carry_spilled(corpus: SpilledCorpus, grid: Grid, batch_sizes: npt.NDArray[np.int64],
                  manifest: str | os.PathLike[str], memory_limit: int) -> SpilledCorpus:
    """``corpus`` (spilled from ``manifest`` without carrying) with bucket tails carried: the
    same spill files, edits of its own (``corpus`` stays as it is); the one-line error of
    :func:`spill_manifest` when a bucket grown by them cannot be planned within ``memory_limit``."""
    out = dataclasses.replace(corpus, counts=corpus.counts.copy(), removed={}, extra={}, carried=0)
    _carry(out, grid, batch_sizes)
    check_bucket_fits(manifest, out.counts, batch_sizes, memory_limit)
    return out


def planning_bytes(counts: npt.NDArray[np.int64], bs: npt.NDArray[np.int64]) -> int:
    """Bytes of memory to plan an epoch of buckets of ``counts`` rows (batch sizes ``bs``): the
    larger of its two phases, ordering the largest bucket beside the per-batch summaries
    (:data:`BUCKET_BYTES_PER_ROW`, a chunk of its ids at :data:`ID_BYTES_PER_ROW`,
    :data:`SUMMARY_BYTES`) and laying steps out from per-batch arrays only (:data:`BATCH_BYTES`). (The shard parts being written, at most
    ``write_threads * PART_ROWS * PART_BYTES_PER_ROW``, about 25 MiB, are not counted: a fixed
    cost, not the corpus's.)"""
    batches = int((-(-counts // bs)).sum()) + 1
    largest = int(counts.max())
    bucket = largest * BUCKET_BYTES_PER_ROW + min(largest, ID_CHUNK_ROWS) * ID_BYTES_PER_ROW
    return max(bucket + batches * SUMMARY_BYTES, batches * BATCH_BYTES)


def check_bucket_fits(manifest: str | os.PathLike[str], counts: npt.NDArray[np.int64], bs: npt.NDArray[np.int64],
                       memory_limit: int) -> None:
    """A one-line error unless the largest bucket and the epoch's batches fit ``memory_limit``."""
    k = int(np.argmax(counts))
    need = planning_bytes(counts, bs)
    if need > memory_limit:
        raise DataprepError(f"{manifest}: --memory-limit: bucket {k} holds {int(counts[k])} rows and, with the "
                            f"epoch's {int((-(-counts // bs)).sum())} batches, needs about "
                            f"{need / 2**30:.2f} GiB to plan, more than the limit {memory_limit / 2**30:.2f} GiB; "
                            "raise --memory-limit or use more buckets")


def _carry(out: SpilledCorpus, grid: Grid, bs: npt.NDArray[np.int64]) -> None:
    """Carry bucket tails as :func:`bucketing.allocate.carry_tails` does, from each bucket's
    tail candidates (:attr:`SpilledCorpus.candidates`) and the rows carried into it, never its
    whole rows: half a batch per bucket in memory. The spill files stay; the moves are kept as
    edits (:attr:`SpilledCorpus.removed` / :attr:`SpilledCorpus.extra`): no bucket is sorted or
    rewritten (where carried rows go among a bucket's own is a binary search of its rows file)."""
    B = grid.num_buckets
    files = out.files
    dbin = grid.duration_bin
    incoming: list[list[_Carried]] = [[] for _ in range(B)]
    for k in range(B):
        n_own = int(out.counts[k])
        cand_rows, cand_t, cand_d, cand_pos = out.candidates[k]
        n_c = cand_rows.shape[0]
        inc = incoming[k]
        inc_rows = np.concatenate([c.rows for c in inc]) if inc else np.empty(0, np.int64)
        inc_d = np.concatenate([c.d for c in inc]) if inc else np.empty(0, np.float64)
        inc_t = np.concatenate([c.t for c in inc]) if inc else np.empty(0, np.int32)
        inc_ids = pa.concat_arrays([c.ids for c in inc]) if inc else pa.array([], pa.string())
        inc_c = (np.concatenate([c.c for c in inc]) if inc else np.empty(0, np.int32)) if out.has_codes else None
        inc_i = (np.concatenate([c.i for c in inc]) if inc else np.empty(0, out.row_dtype)) if out.has_index else None
        rows = np.concatenate([cand_rows, inc_rows])
        t = np.concatenate([cand_t, inc_t])
        d = np.concatenate([cand_d, inc_d])
        pick, target = tail_moves(rows, t, d, k, bs, out.max_tokens, dbin, size=n_own + inc_rows.shape[0])
        go = target >= 0
        pick, target = pick[go], target[go]
        own_local, inc_pick = pick[pick < n_c], pick[pick >= n_c] - n_c
        own_pick = cand_pos[own_local]  # positions among the bucket's own rows
        if pick.shape[0]:
            one = np.ones(own_pick.shape[0], dtype=np.int64)
            pick_d = np.concatenate([cand_d[own_local], inc_d[inc_pick]])
            pick_ids = pa.concat_arrays([files.read_string_runs(f"b{k}.ids", own_pick, one),
                                         inc_ids.take(pa.array(inc_pick)).cast(pa.string())]) if out.has_ids else None
            pick_c = None if inc_c is None else np.concatenate([files.read_runs(f"b{k}.c", np.int32, own_pick, one),
                                                                inc_c[inc_pick]])
            pick_i = None if inc_i is None else np.concatenate([files.read_runs(f"b{k}.i", out.row_dtype, own_pick,
                                                                                one), inc_i[inc_pick]])
            at = np.concatenate([own_local, inc_pick + n_c])
            pick_rows, pick_t = rows[at], t[at]
            tgt = np.concatenate([target[pick < n_c], target[pick >= n_c]])
            for j in np.unique(tgt):
                sel = np.flatnonzero(tgt == j)
                incoming[int(j)].append(_Carried(pick_rows[sel], pick_d[sel], pick_t[sel],
                                                 pa.array([], pa.string()) if pick_ids is None
                                                 else pick_ids.take(pa.array(sel)), np.empty(0, np.int64),
                                                 None if pick_c is None else pick_c[sel],
                                                 None if pick_i is None else pick_i[sel]))
        del rows, t, d
        if own_pick.shape[0]:
            out.removed[k] = np.sort(own_pick)
        stay = np.ones(inc_rows.shape[0], dtype=bool)
        stay[inc_pick] = False
        if stay.any():
            o = np.argsort(inc_rows[stay], kind="stable")
            keep_rows = inc_rows[stay][o]
            # among the kept own rows: own rows below each (a binary search of the ascending
            # rows file, a few pages) less the removed ones among them
            below = np.searchsorted(files.map(f"b{k}.rows", out.row_dtype), keep_rows.astype(out.row_dtype))
            if k in out.removed:
                below = below - np.searchsorted(out.removed[k], below)
            out.extra[k] = _Carried(keep_rows, inc_d[stay][o], inc_t[stay][o],
                                    inc_ids.filter(pa.array(stay)).take(pa.array(o)).cast(pa.string())
                                    if out.has_ids else pa.array([], pa.string()),
                                    below.astype(np.int64), None if inc_c is None else inc_c[stay][o],
                                    None if inc_i is None else inc_i[stay][o])
        out.carried += int(stay.sum())
        out.counts[k] = n_own - own_pick.shape[0] + int(stay.sum())
        incoming[k] = []


@dataclass(frozen=True)
class EpochLayout:
    """One out-of-core epoch: the plan's per-batch figures (``ep``, whose ``rows`` is empty)
    and where each rank-major batch's rows lie in the epoch's position files."""

    ep: EpochPlan
    start: npt.NDArray[np.int64]  # first position of each rank-major batch
    size: npt.NDArray[np.int64]
    groups: npt.NDArray[np.int64] | None = None  # weighted: bucketing.padding.group_padding per corpus
    #: one bucket per step: (CSR offsets, positions) of the batches whose ``start`` is -1
    explicit: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] | None = None


@dataclass(frozen=True)
class EpochDraw:
    """An epoch's entries per bucket when they are not every row once (a weighted epoch,
    :func:`draw_epoch`; the unseen rest of a re-planned one): times each row of bucket ``k`` is
    taken lie in the epoch's ``x{k}`` file (int32, the bucket's column order); the entries per
    bucket and their real totals (as :func:`bucketing.batching.multiset_totals`);
    ``num_corpora`` > 0: per-corpus totals are counted (the spill holds corpus codes)."""

    num_corpora: int
    counts: npt.NDArray[np.int64]
    total_d: float
    total_t: float


def drawn_entries(corpus: SpilledCorpus, k: int) -> npt.NDArray[np.int64]:
    """Bucket ``k``'s entries of the epoch drawn (its ``x{k}`` file) as positions into its
    columns: ascending, a row taken twice listed twice (the in-memory multiset's bucket ``k``,
    :mod:`bucketing.quota`)."""
    return _entries(corpus.files.read(f"x{k}", np.int32))


def _entries(times: npt.NDArray[np.integer]) -> npt.NDArray[np.int64]:
    """Positions ``0 .. len(times) - 1``, each listed ``times`` times."""
    return np.repeat(np.arange(times.shape[0], dtype=np.int64), times)


def draw_epoch(corpus: SpilledCorpus, sampler: QuotaSampler, epoch: int) -> EpochDraw:
    """Draw a weighted epoch bucket by bucket (one bucket's codes, indices, durations and
    tokens in memory): each row's times taken (:meth:`bucketing.quota.QuotaSampler.times`) to
    the ``x{k}`` files, the entries per bucket and their totals."""
    return _epoch_draw(corpus, lambda k: sampler.times(corpus.column(k, "c", np.int32),
                                                       corpus.column(k, "i", corpus.row_dtype), epoch),
                       sampler.sizes.shape[0])


def _epoch_draw(corpus: SpilledCorpus, times_of: Callable[[int], npt.NDArray[np.integer]],
                num_corpora: int, write: bool = True) -> EpochDraw:
    """The :class:`EpochDraw` of the times ``times_of(k)`` each row of bucket ``k`` is taken
    (``write``: to its ``x{k}`` file; else ``times_of`` reads that file): entries and totals
    per bucket, one pass."""
    files = corpus.files
    counts = np.zeros_like(corpus.counts)
    total_d = total_t = 0.0
    for k in np.flatnonzero(corpus.counts).tolist():
        times = times_of(k).astype(np.int32, copy=False)
        if write:
            files.append(f"x{k}", times)
        rep = _entries(times)
        x, y = bucket_sums(corpus.column(k, "d", np.float64)[rep], corpus.column(k, "t", np.int32)[rep])
        counts[k], total_d, total_t = rep.shape[0], total_d + x, total_t + y
    files.close()
    return EpochDraw(num_corpora, counts, max(total_d, 1e-300), max(total_t, 1e-300))


#: Bytes of memory per manifest row of a block of :func:`draw_rows` (its int64 count and, per
#: bucket, the counts of its rows).
ROW_COUNT_BYTES = 16


def draw_rows(corpus: SpilledCorpus, blocks: Callable[[], Iterator[npt.NDArray[np.int64]]], num_corpora: int,
              block_rows: int) -> tuple[EpochDraw, int]:
    """An epoch of the rows ``blocks()`` yields (manifest rows, each as often as listed, in any
    order; e.g. the unseen rest of a re-planned epoch, read from its shards) as an
    :class:`EpochDraw`, and how many of them lie in no bucket. Memory: a count per row of
    ``block_rows`` manifest rows at a time (:data:`ROW_COUNT_BYTES` each), each block another
    pass of ``blocks()``; then one bucket's rows."""
    files = corpus.files
    live = np.flatnonzero(corpus.counts).tolist()
    listed = placed = 0
    for a in range(0, corpus.num_rows, block_rows):
        b = min(corpus.num_rows, a + block_rows)
        times = np.zeros(b - a, dtype=np.int64)
        for rows in blocks():  # a row group at a time: its rows' counts, not a block-sized bincount
            u, n = np.unique(rows[(rows >= a) & (rows < b)] - a, return_counts=True)
            times[u] += n
        listed += int(times.sum(dtype=np.int64))
        for k in live:
            own = corpus.column(k, "rows", corpus.row_dtype)
            got = times[own[np.searchsorted(own, a):np.searchsorted(own, b)] - a]
            placed += int(got.sum(dtype=np.int64))
            files.append(f"x{k}", got.astype(np.int32))
    files.close()
    return _epoch_draw(corpus, lambda k: corpus.files.read(f"x{k}", np.int32), num_corpora, write=False), \
        listed - placed


@dataclass(frozen=True)
class _Formed:
    """An epoch's batches formed from the spill files (cut order, :class:`bucketing.batching.Cut`)
    and their figures: longest, sums of durations, most tokens, sums of tokens."""

    cut: Cut
    max_d: npt.NDArray[np.float64]
    sum_d: npt.NDArray[np.float64]
    max_t: npt.NDArray[np.int64]
    sum_t: npt.NDArray[np.int64]
    counts: npt.NDArray[np.int64]  # entries per bucket
    groups: npt.NDArray[np.int64] | None = None  # weighted: bucketing.padding.group_padding per corpus


#: What an out-of-core plan measures per batch beside its figures (dynamic resolution:
#: :meth:`dataprep.planning.build.DynResTotals.add_batches`): durations (s) in CSR offsets,
#: each batch's longest and bucket, and +1 to add them or -1 to take them away.
BatchMeasure = Callable[[npt.NDArray[np.float64], npt.NDArray[np.int64], npt.NDArray[np.float64],
                         npt.NDArray[np.int64], int], None]


def _form_spilled(corpus: SpilledCorpus, bs: npt.NDArray[np.int64], W: int | None, rng: np.random.Generator,
                  final: bool, draw: EpochDraw | None = None, measure: BatchMeasure | None = None) -> _Formed:
    """Each bucket's rows ordered into batches and laid out in the epoch's position files
    (rows beside ids, or rows alone when the corpus has no ids), the figures of each batch
    taken on the way; batches then drawn (:func:`bucketing.batching.cut_batches`). ``W``:
    near-equal batches filling whole steps (balanced); None: full batches and a short last
    one (:func:`bucketing.batching.form_batches` with no world size). ``draw``: a weighted
    epoch's entries instead of every row once, and the per-corpus totals of its batches.
    ``measure``: called on each part's formed batches."""
    files = corpus.files
    files.remove("pos.rec", "pos.data", "pos.rows")
    if draw is None:
        grouping = BucketGrouping("both").with_totals(corpus.total_d, corpus.total_t)
        counts = corpus.counts
    else:
        grouping = BucketGrouping("both").with_totals(draw.total_d, draw.total_t)
        counts = draw.counts
    C = draw.num_corpora if draw is not None and corpus.has_codes else 0
    groups = np.zeros((5, C), np.int64) if C else None
    if W is not None:
        nb = even_batch_counts(counts, bs, W)  # near-equal batches filling whole steps (as plan_epoch)
        starts_in_bucket = even_batch_starts(counts, nb)  # a bucket's k-th batch starts at k q + min(k, r)
    else:
        nb = -(-counts // bs)
        starts_in_bucket = (np.arange(int(nb.sum())) - np.repeat(np.cumsum(nb) - nb, nb)) * np.repeat(bs, nb)
    # per batch (cut order: bucket after bucket): longest, most tokens, sums, filled while each bucket is ordered
    n_cut = int(nb.sum())
    mx_d, sm_d = np.empty(n_cut), np.empty(n_cut)
    mx_t, sm_t = np.empty(n_cut, np.int64), np.empty(n_cut, np.int64)
    at = 0
    for k in np.flatnonzero(counts):
        cnt, size = int(counts[k]), int(bs[k])
        first = starts_in_bucket[at:at + int(nb[k])]  # the bucket's batch starts (as cut_batches)
        d, t = corpus.column(int(k), "d", np.float64), corpus.column(int(k), "t", np.int32)
        entries = None if draw is None else drawn_entries(corpus, int(k))
        if entries is not None:
            d, t = d[entries], t[entries]
        c = None if entries is None or groups is None else corpus.column(int(k), "c", np.int32)[entries]
        parts = []
        pos = 0
        for p in grouping.order_chunks(cnt, size, rng, d, t, ORDER_ROWS, batches=None if W is None else int(nb[k])):
            dk, tk32 = d[p], t[p]
            tk = tk32.astype(np.int64)
            loc = first[np.searchsorted(first, pos):np.searchsorted(first, pos + p.shape[0])] - pos
            sl = slice(at, at + loc.shape[0])
            mx_d[sl], sm_d[sl] = np.maximum.reduceat(dk, loc), np.add.reduceat(dk, loc)
            mx_t[sl], sm_t[sl] = np.maximum.reduceat(tk, loc), np.add.reduceat(tk, loc)
            if groups is not None and c is not None:
                groups += group_padding(np.arange(p.shape[0]), np.diff(np.append(loc, p.shape[0])), mx_d[sl],
                                        mx_t[sl], dk, tk, c[p], C)
            if measure is not None:
                measure(dk, np.append(loc, p.shape[0]), mx_d[sl], np.full(loc.shape[0], k, np.int64), 1)
            pos += p.shape[0]
            at += loc.shape[0]
            parts.append(p)
        del d, t, c
        p = parts[0] if len(parts) == 1 else np.concatenate(parts)
        del parts
        if entries is not None:
            p = entries[p]  # positions into the bucket's columns
        del entries
        rows = corpus.column(int(k), "rows", corpus.row_dtype)
        if not corpus.has_ids:
            files.append("pos.rows", rows[p])
            continue
        # each row beside its id: a batch is two reads, not three
        # (the ids first: the gather runs to its end, its scratch file removed)
        for ids, a in zip(corpus.ids_in_parts(int(k), p, ORDER_ROWS, drop=final), range(0, cnt, ORDER_ROWS)):
            files.append_records("pos", rows[p[a:a + ORDER_ROWS]], ids)
        del rows, p
    files.close()
    cut = cut_batches(counts, bs, rng, batch_counts=None if W is None else nb)
    return _Formed(cut, mx_d, sm_d, mx_t, sm_t, counts, groups)


def _position_rows(corpus: SpilledCorpus, starts: npt.NDArray[np.int64],
                   sizes: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The rows at positions ``starts[i] : starts[i] + sizes[i]`` of the epoch's position files."""
    files = corpus.files
    if corpus.has_ids:
        rows = files.read_runs("pos.rec", record_dtype(np.dtype(corpus.row_dtype)), starts, sizes)["key"]
    else:
        rows = files.read_runs("pos.rows", corpus.row_dtype, starts, sizes)
    return rows.astype(np.int64)


def balanced_or_none(corpus: SpilledCorpus, bs: npt.NDArray[np.int64], W: int, seed: int, epoch: int, *,
                     interleave: str, tolerance: float, cost: CostModel, group: int,
                     final: bool = False, draw: EpochDraw | None = None,
                     measure: BatchMeasure | None = None) -> EpochLayout | None:
    """Step 3 of the module docstring: :func:`bucketing.plan.plan_epoch` (balanced) then
    :func:`bucketing.groups.regroup`, from the spill files and per-batch arrays; None where the
    rows cannot fill whole balanced steps (the caller lays the epoch out one bucket per step).
    ``final``: no later epoch reads the ids, so a spill on disk removes each bucket's id files
    once laid out (the page cache they held is reused for the position files instead of fresh
    memory; a spill in memory keeps them); such an epoch that cannot be balanced is a one-line
    error. ``draw``: a weighted epoch (:func:`draw_epoch`), planned over its entries; the
    layout then carries the per-corpus totals (:attr:`EpochLayout.groups`). ``measure``:
    called on the epoch's batches as laid out (formed ones, then the pieces steps cut: the
    formed batch taken away, each piece added)."""
    drop = final and corpus.memory is None
    lay = _balanced_spilled(corpus, bs, W, seed, epoch, interleave=interleave, tolerance=tolerance, cost=cost,
                            group=group, final=drop, draw=draw, measure=measure)
    if lay is None and drop:
        raise DataprepError(f"the rows cannot fill whole balanced steps of {W} ranks out of core "
                            "(fewer utterances than steps x ranks); plan with a larger --memory-limit")
    return lay


class _Stash:
    """Per-batch arrays set aside on disk (:class:`manifests.spill.SpillFiles` ``{prefix}{name}``
    under ``root``) while others need the memory."""

    def __init__(self, files: SpillFiles, prefix: str) -> None:
        self.files, self.prefix = files, prefix
        self.kinds: dict[str, np.dtype[Any]] = {}

    def put(self, **arrays: npt.NDArray[Any]) -> None:
        for name, a in arrays.items():
            self.kinds[name] = a.dtype
            self.files.append(self.prefix + name, a)
        self.files.close()

    def take(self, *names: str) -> list[npt.NDArray[Any]]:
        """The arrays ``names``, read back; their files removed."""
        out = [self.files.read(self.prefix + n, self.kinds[n]) for n in names]
        self.files.remove(*(self.prefix + n for n in names))
        for n in names:
            del self.kinds[n]
        return out

    def drop(self) -> None:
        self.files.remove(*(self.prefix + n for n in self.kinds))
        self.kinds.clear()


def _balanced_spilled(corpus: SpilledCorpus, bs: npt.NDArray[np.int64], W: int, seed: int, epoch: int, *,
                      interleave: str, tolerance: float, cost: CostModel, group: int,
                      final: bool = False, draw: EpochDraw | None = None,
                      measure: BatchMeasure | None = None) -> EpochLayout | None:
    """:func:`balanced_or_none` (``final``: remove each bucket's ids once laid out)."""
    counts = corpus.counts if draw is None else draw.counts
    if int(counts.sum()) < W:
        raise DataprepError(f"{int(counts.sum())} utterances cannot fill one step of {W} ranks")
    rng = np.random.default_rng([seed, epoch, 0])
    # per batch, each stage's arrays are freed once the next has what it needs (at a billion
    # rows an epoch has ~20M batches: every 8-byte array held is ~160 MB)
    formed = _form_spilled(corpus, bs, W, rng, final, draw, measure)
    groups, bucket, perm = formed.groups, formed.cut.bucket, formed.cut.perm
    sizes, start = formed.cut.sizes[perm], formed.cut.starts[perm]
    mx_d, mx_t, sm_d, sm_t = formed.max_d[perm], formed.max_t[perm], formed.sum_d[perm], formed.sum_t[perm]
    del formed, perm
    off = np.zeros(sizes.shape[0] + 1, dtype=np.int64)
    np.cumsum(sizes, out=off[1:])
    times, padded = cost.step_time(sizes, mx_d, mx_t), sizes * mx_d
    # what the steps are laid out by is in memory; the rest waits on disk (40 bytes a batch)
    stash = _Stash(corpus.files, "layout.")
    stash.put(start=start, mx_d=mx_d, mx_t=mx_t, sm_d=sm_d, sm_t=sm_t)
    del start, mx_d, mx_t, sm_d, sm_t
    steps = balance_steps(bucket, off, times, W, tolerance, cost.overhead, padded=padded)
    del times, padded
    if steps is None:
        stash.drop()
        return None
    rng_steps = np.random.default_rng([seed, epoch, 1]) if interleave == "random" else None
    order = layout_order(steps, W, rng_steps, np.random.default_rng([seed, epoch, 2]))
    start, mx_d, mx_t, sm_d, sm_t = stash.take("start", "mx_d", "mx_t", "sm_d", "sm_t")
    seg_size = np.diff(steps.seg_offsets)
    if seg_size.shape[0] == sizes.shape[0]:  # no batch cut into pieces: the segments are the batches
        parent = None
        seg_start, s_mx_d, s_mx_t, s_sm_d, s_sm_t = start, mx_d, mx_t, sm_d, sm_t
        pieces = np.empty(0, np.int64)
    else:
        seg_lo = steps.seg_offsets[:-1]
        parent = np.searchsorted(off, seg_lo, side="right") - 1
        seg_start = start[parent] + (seg_lo - off[parent])
        s_mx_d, s_mx_t, s_sm_d, s_sm_t = mx_d[parent], mx_t[parent], sm_d[parent], sm_t[parent]
        pieces = np.flatnonzero(seg_size != sizes[parent])
        del seg_lo
    del start, sm_d, sm_t, off, sizes
    split: dict[int, list[npt.NDArray[np.float64]]] = {}  # formed batch -> its pieces' durations
    if pieces.shape[0]:
        for i in pieces:  # the few batches cut into pieces (at most one step's worth)
            piece_rows = _position_rows(corpus, seg_start[i:i + 1], seg_size[i:i + 1])
            dk, tk32, *ck = corpus.lookup_columns(int(steps.seg_bucket[i]), piece_rows,
                                                  ("d", "t", "c") if groups is not None else ("d", "t"))
            tk = tk32.astype(np.int64)
            s_mx_d[i], s_mx_t[i] = dk.max(), tk.max()
            s_sm_d[i], s_sm_t[i] = np.add.reduceat(dk, [0])[0], tk.sum()
            if groups is not None:  # the piece's rows pad to its own longest, not the formed batch's
                one, C = np.arange(dk.shape[0]), groups.shape[1]
                groups += group_padding(one, seg_size[i:i + 1], s_mx_d[i:i + 1], s_mx_t[i:i + 1], dk, tk, ck[0], C)
                groups -= group_padding(one, seg_size[i:i + 1], mx_d[parent[i]:parent[i] + 1],
                                        mx_t[parent[i]:parent[i] + 1], dk, tk, ck[0], C)
            if measure is not None:
                one_batch = np.array([0, dk.shape[0]])
                measure(dk, one_batch, s_mx_d[i:i + 1], steps.seg_bucket[i:i + 1].astype(np.int64), 1)
                split.setdefault(int(parent[i]), []).append(dk)
    for j, parts in split.items():  # each formed batch cut into pieces, as it was measured: taken away
        dk = np.concatenate(parts)
        measure(dk, np.array([0, dk.shape[0]]), mx_d[j:j + 1], bucket[j:j + 1].astype(np.int64), -1)  # type: ignore[misc]
    del mx_d, mx_t, bucket, parent
    # rank-major batches
    real_seconds, real_tokens = float(s_sm_d[order].sum()), int(s_sm_t.sum())
    del s_sm_d, s_sm_t
    f_start, f_size = seg_start[order], seg_size[order]
    del seg_start, seg_size
    f_bucket = steps.seg_bucket[order]
    f_mx_d, f_mx_t = s_mx_d[order], s_mx_t[order]
    del s_mx_d, s_mx_t, order
    t = cost.step_time(f_size, f_mx_d, f_mx_t).reshape(W, -1)  # counted before sync groups reorder steps
    unbalanced = int((t.max(0) > (1 + tolerance) * t.mean(0)).sum())
    del t
    regroup = group_order(W, steps.num_steps, group, seed, epoch)
    if regroup is not None:
        f_start, f_size, f_bucket = f_start[regroup], f_size[regroup], f_bucket[regroup]
        f_mx_d, f_mx_t = f_mx_d[regroup], f_mx_t[regroup]
    offsets = np.zeros(f_size.shape[0] + 1, dtype=np.int64)
    np.cumsum(f_size, out=offsets[1:])
    by_step = f_bucket.reshape(W, steps.num_steps)
    step_bucket = np.where((by_step == by_step[:1]).all(0), by_step[0], -1).astype(np.int32)
    ep = EpochPlan(epoch=epoch, world_size=W, step_bucket=step_bucket, offsets=offsets,
                   rows=np.empty(0, np.int64), max_duration=f_mx_d, max_tokens=f_mx_t,
                   dropped=np.empty(0, np.int64), real_seconds=real_seconds, real_tokens=real_tokens,
                   batch_bucket=f_bucket.astype(np.int32), split_batches=steps.split_batches,
                   unbalanced_steps=unbalanced)
    return EpochLayout(ep, f_start, f_size, groups)


def plan_epoch_figures(corpus: SpilledCorpus, grid: Grid, bs: npt.NDArray[np.int64], W: int, seed: int, epoch: int,
                       *, tolerance: float, cost: CostModel, interleave: Interleave = "random") -> EpochPlan:
    """:func:`bucketing.plan.plan_epoch` of a spilled corpus (``grid`` its buckets), per-batch
    figures only: its :class:`~bucketing.plan.EpochPlan` without rows, for reports (no shards,
    position files of rows alone when the corpus has no ids). ``tolerance`` > 0: balanced
    steps, falling back as in memory to one bucket per step where the rows cannot fill whole
    balanced steps; 0: one bucket per step (:func:`bucketing.plan_summary.plan_identical_summaries`,
    which reads the rows of the few pooled, carried or borrowed tails back)."""
    check_one_step(int(corpus.counts.sum()), W)
    if tolerance > 0:
        lay = _balanced_spilled(corpus, bs, W, seed, epoch, interleave=interleave, tolerance=tolerance, cost=cost,
                                group=W)
        if lay is not None:
            return lay.ep
    return _identical_spilled(corpus, grid, bs, W, seed, epoch, interleave=interleave, final=False)[0]


def _identical_spilled(corpus: SpilledCorpus, grid: Grid, bs: npt.NDArray[np.int64], W: int, seed: int, epoch: int,
                       *, interleave: Interleave, final: bool, draw: EpochDraw | None = None,
                       measure: BatchMeasure | None = None
                       ) -> tuple[EpochPlan, BatchSources, npt.NDArray[np.int64], npt.NDArray[np.int64] | None]:
    """One bucket per step (``balance`` 0) from the spill files: the plan without rows, where
    each batch's rows are, the formed batches' first positions (draw order) and, weighted,
    the per-corpus totals. ``draw``: the epoch's entries (:class:`EpochDraw`) instead of every
    row once; ``measure``: called on the plan's batches (formed ones as they are formed; a
    formed batch whose rows went into tails taken away, each tail batch added)."""
    formed = _form_spilled(corpus, bs, None, np.random.default_rng([seed, epoch, 0]), final=final, draw=draw,
                           measure=measure)
    cut = formed.cut
    perm = cut.perm
    starts, sizes = cut.starts[perm], cut.sizes[perm]
    batches = FormedBatches(cut.bucket, sizes, formed.max_d[perm], formed.max_t[perm], formed.sum_d[perm],
                            formed.sum_t[perm])

    def read_rows(lo: int, hi: int) -> npt.NDArray[Any]:  # formed batches lo:hi, all of one bucket
        rows = _position_rows(corpus, starts[lo:hi], sizes[lo:hi])
        out = np.empty(rows.shape[0], ROW_DTYPE)
        out["row"] = rows
        got = corpus.lookup_columns(int(cut.bucket[lo]), rows, ("d", "t", "c") if corpus.has_codes else ("d", "t"))
        out["d"], out["t"] = got[0], got[1]
        out["c"] = got[2] if corpus.has_codes else 0
        out["pos"] = run_positions(starts[lo:hi], sizes[lo:hi])
        return out

    ep, sources = plan_identical_layout(batches, bs, W, seed, epoch, read_rows, max_duration=grid.max_duration,
                                        max_tokens=corpus.max_tokens.astype(np.float64), interleave=interleave)
    groups = formed.groups
    if groups is not None or measure is not None:  # formed batches not laid out whole: their tails instead
        used = np.zeros(sizes.shape[0], dtype=bool)
        used[sources.formed[sources.formed >= 0]] = True
        for j in np.flatnonzero(~used).tolist():
            got = read_rows(j, j + 1)
            _measure_batches(got, np.array([0, got.shape[0]]), batches.max_duration[j:j + 1],
                             batches.max_tokens[j:j + 1], cut.bucket[j:j + 1], -1, groups, measure)
        tails = np.flatnonzero(sources.formed < 0)
        off, gather = gather_segments(sources.off, tails)
        _measure_batches(sources.records[gather], off, ep.max_duration[tails], ep.max_tokens[tails],
                         ep.bucket_of_batch()[tails], 1, groups, measure)
    return ep, sources, starts, groups


def _measure_batches(records: npt.NDArray[Any], off: npt.NDArray[np.int64], longest: npt.NDArray[np.float64],
                     most: npt.NDArray[np.int64], bucket: npt.NDArray[np.integer], sign: int,
                     groups: npt.NDArray[np.int64] | None, measure: BatchMeasure | None) -> None:
    """Add (``sign`` 1) or take away (-1) batches of :data:`~bucketing.plan_summary.ROW_DTYPE`
    records in CSR ``off`` to the per-corpus ``groups`` and ``measure``."""
    if off.shape[0] < 2:
        return
    d, t = np.ascontiguousarray(records["d"]), np.ascontiguousarray(records["t"])
    if groups is not None:
        got = group_padding(np.arange(d.shape[0]), np.diff(off), longest, most, d, t, records["c"], groups.shape[1])
        groups += sign * got
    if measure is not None:
        measure(d, off, longest, np.asarray(bucket, dtype=np.int64), sign)


def plan_epoch_identical_spilled(corpus: SpilledCorpus, grid: Grid, bs: npt.NDArray[np.int64], W: int, seed: int,
                                 epoch: int, *, interleave: Interleave, group: int, final: bool = False,
                                 draw: EpochDraw | None = None, measure: BatchMeasure | None = None) -> EpochLayout:
    """:func:`bucketing.plan.plan_epoch` with ``balance`` 0 then
    :func:`bucketing.groups.regroup`, for shards: each batch a run of the position files or,
    for the few tails pooled, carried or borrowed, its rows' positions
    (:attr:`EpochLayout.explicit`)."""
    check_one_step(int((corpus.counts if draw is None else draw.counts).sum()), W)
    ep, sources, starts, groups = _identical_spilled(corpus, grid, bs, W, seed, epoch, interleave=interleave,
                                                     final=final, draw=draw, measure=measure)
    order = group_order(W, ep.num_steps, group, seed, epoch)
    if order is not None:
        ep, sources = regroup(ep, group, seed), sources.take(order)
    start = np.where(sources.formed >= 0, starts[np.maximum(sources.formed, 0)], -1)
    return EpochLayout(ep, start, ep.sizes(), groups, explicit=(sources.off, sources.pos))


def write_epoch_spilled(writer: PlanWriter, layout: EpochLayout, corpus: SpilledCorpus, first_step: int,
                        row_group_steps: int, tick: Callable[[int], object],
                        target_frames: npt.NDArray[np.int64] | None = None, *, memory_limit: int,
                        last: bool = False) -> None:
    """Step 4 of the module docstring: the position files moved into groups of ranks of
    about an eighth of ``memory_limit`` bytes (:mod:`dataprep.planning.rank_files`), then each
    group read whole and its ranks' shards written in parts of whole row groups (ranks in
    parallel, :meth:`manifests.plan_files.PlanWriter.write_ranks`); ``target_frames``: per
    rank-major batch (dynamic resolution's column); ``last``: the plan's last epoch (each
    shard closed once written)."""
    ep = layout.ep
    S = ep.num_steps
    mean = max(1, int(layout.size.sum()) // max(1, layout.size.shape[0]))
    part = row_group_steps * max(1, PART_ROWS // (row_group_steps * mean))
    bucket = ep.bucket_of_batch()
    start, size, run_off = layout.start, layout.size, None
    if layout.explicit is not None and (start < 0).any():  # its rows' positions: runs of one
        start, size, run_off = _explicit_runs(start, size, layout.explicit)
    grouped = move_to_groups(corpus.files, np.dtype(corpus.row_dtype), layout.size, start, size, run_off,
                             ep.world_size, part, group_bytes(memory_limit))
    try:
        for g, group in enumerate(grouped.groups):
            records = grouped.load(g)

            def parts(r: int, steps: range = group.steps, records: GroupRecords = records) -> Iterator[pa.Table]:
                for c in range(steps.start, steps.stop, part):
                    lo, hi = r * S + c, r * S + min(steps.stop, c + part)
                    off = np.zeros(hi - lo + 1, dtype=np.int64)
                    np.cumsum(layout.size[lo:hi], out=off[1:])
                    rows, ids = records.batches(lo, hi)
                    yield shard_table(epoch=ep.epoch, first_step=first_step + c, bucket=bucket[lo:hi], offsets=off,
                                      rows=rows, ids=ids, max_duration=ep.max_duration[lo:hi],
                                      max_tokens=ep.max_tokens[lo:hi], step_in_epoch=c,
                                      target_frames=None if target_frames is None else target_frames[lo:hi])

            whole = group.steps.stop == S  # the group ends its ranks' epoch
            writer.write_ranks(parts, tick if whole else lambda r: None, close=last and whole, ranks=group.ranks)
            del parts, records  # before the next group is read: one group in memory at a time
    finally:
        grouped.remove()


def _explicit_runs(start: npt.NDArray[np.int64], size: npt.NDArray[np.int64],
                   explicit: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]
                   ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Runs of positions of an epoch's rank-major batches, batch after batch: a whole one's
    run, and one run of one position per row of a batch given by positions (``start`` -1);
    with the CSR offsets of each batch's runs."""
    exp = start < 0
    n_runs = np.where(exp, size, 1)
    run_off = np.zeros(start.shape[0] + 1, dtype=np.int64)
    np.cumsum(n_runs, out=run_off[1:])
    run_start = np.repeat(start, n_runs)
    run_size = np.repeat(np.where(exp, 1, size), n_runs)
    _, gather = gather_segments(explicit[0], np.flatnonzero(exp))
    run_start[np.repeat(exp, n_runs)] = explicit[1][gather]
    return run_start, run_size, run_off


#: Bytes of disk per row of the spill files besides its id's bytes: row (int32 below 2**31
#: rows, else int64), duration (8), tokens (4) and the id's offset (8).
SPILL_DISK_BYTES_PER_ROW = 24
#: Bytes of disk per row of an epoch's position files besides its id's bytes: the row (4 or 8)
#: beside its id's offset (8).
POSITION_DISK_BYTES_PER_ROW = 12
#: Bytes of disk per row of a weighted plan's spill besides those: corpus code, index in the
#: corpus and times drawn (4 + 8 + 4).
WEIGHTED_DISK_BYTES_PER_ROW = 16
#: Bytes of disk per row of an epoch drawn row by row when not weighted (a re-plan's unseen
#: rest, :func:`draw_rows`): the times each row is taken (int32).
DRAWN_DISK_BYTES_PER_ROW = 4
#: Bytes of disk per row and epoch of the plan's shards (about 9 measured at 10M-100M rows).
PLAN_DISK_BYTES_PER_ROW = 10


@dataclass(frozen=True)
class DiskNeed:
    """Disk an out-of-core plan takes (bytes): ``spill``, what the pass over the manifest
    writes; ``peak``, the most at once later (the spill, an epoch's position files, the
    largest bucket's ids gathered, the plan's shards)."""

    spill: int
    peak: int


def disk_bytes(manifest: str | os.PathLike[str], epochs: int, weighted: bool = False, *, largest: int = 0,
               ids_once: bool | None = None, drawn: bool = False) -> DiskNeed:
    """Disk that out-of-core planning ``manifest`` for ``epochs`` takes (:class:`DiskNeed`).

    The ids' size is read from the Parquet footer (uncompressed: at least their bytes). The
    spill holds every row's numbers and id; an epoch's position files every row and id again,
    except where the last epoch is the only one (``ids_once``, default ``epochs == 1``): it
    removes each bucket's spilled ids once laid out, so the ids are on disk about once. A
    bucket of more than :data:`ID_CHUNK_ROWS` rows gathers its ids through a scratch copy
    (``largest``: the largest bucket's rows, once known; 0 before the spill). ``weighted``: the
    corpus codes, indices and times drawn too (an epoch the size of the manifest); ``drawn``:
    the times drawn alone (a re-plan's unseen rest, not weighted).
    Measured (3M synthetic rows, ids of ~11 bytes, one epoch / three): at most 47.0 / 73.1 bytes
    a row on disk at once; this estimates 60.8 / 95.6 (before: 83.6 / 103.6)."""
    md = pq.ParquetFile(manifest).metadata
    col = md.schema.names.index("id")
    id_bytes = sum(md.row_group(g).column(col).total_uncompressed_size for g in range(md.num_row_groups))
    n = md.num_rows
    wide = 4 if n >= 2**31 else 0  # int64 row numbers
    extra = WEIGHTED_DISK_BYTES_PER_ROW if weighted else DRAWN_DISK_BYTES_PER_ROW if drawn else 0
    numbers = (SPILL_DISK_BYTES_PER_ROW + wide + extra) * n
    once = epochs == 1 if ids_once is None else ids_once
    positions = (POSITION_DISK_BYTES_PER_ROW + wide) * n + (0 if once else id_bytes)
    gathered = 0 if largest <= ID_CHUNK_ROWS else -(-id_bytes * largest // max(n, 1)) + 8 * largest
    spill = numbers + id_bytes
    return DiskNeed(spill, spill + positions + gathered + PLAN_DISK_BYTES_PER_ROW * epochs * n)


__all__ = ["ROW_COUNT_BYTES", "BatchMeasure", "DiskNeed", "EpochDraw", "EpochLayout", "SpilledCorpus",
           "carry_spilled", "check_bucket_fits", "default_memory_limit", "disk_bytes", "draw_epoch", "draw_rows",
           "balanced_or_none", "plan_epoch_figures", "plan_epoch_identical_spilled",
           "spill_manifest", "write_epoch_spilled"]
