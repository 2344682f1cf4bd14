"""The spill of a manifest by bucket that every plan starts from (:func:`spill_manifest`): one
pass in blocks of :data:`bucketing.batching.TOTALS_BLOCK` rows allocates each block
(:func:`bucketing.allocate.allocate`, row-wise) and appends every row's (row, duration,
tokens, id; corpus code and index when weighted) to its bucket's columns, keeping each
bucket's tail candidates (at most half a batch). Columns are files under a spill folder or,
for a corpus that fits the memory limit, held in memory (:class:`manifests.spill.SpillFiles`).
:class:`SpilledCorpus` reads a bucket back after the carried tails (:mod:`.carry`), its ids
whole or a chunk at a time. Memory to plan an epoch: :func:`planning_bytes`, checked against
the limit by :func:`check_bucket_fits` (one-line error)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from bucketing.allocate import Allocation, allocate, merge_tail_candidates
from bucketing.batching import TOTALS_BLOCK, block_totals
from bucketing.padding import GROUP_TICKS_PER_SECOND, exact_bincount
from bucketing.quota import corpus_indices
from bucketing.fit import Grid
from manifests.arrow_views import numeric_values
from manifests.errors import DataprepError, ManifestError
from manifests.manifest_read import iter_manifest, manifest_num_rows
from manifests.spill import SpillFiles, give_back_memory

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


@dataclass
class SpilledCorpus:
    """What the pass over the manifest leaves: per-bucket spill files (``b{k}.rows`` of
    :attr:`row_dtype`, ``b{k}.d`` float64, ``b{k}.t`` int32, ``b{k}.ids`` strings; ascending
    rows), the carried tails as edits of them (``removed``: positions of a bucket's own rows carried on;
    ``extra``: rows carried in), and the allocation's figures (as
    :class:`bucketing.allocate.Assignment`'s)."""

    root: Path  # the spill folder (unused when :attr:`memory` holds the columns)
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
    extra: dict[int, Carried] = field(default_factory=dict)
    carry: bool = False  # bucket tails were carried (the plan's ``allocation.carry``)
    has_ids: bool = True  # ``b{k}.ids`` spilled
    has_codes: bool = False  # ``b{k}.c`` spilled (corpus codes)
    has_index: bool = False  # ``b{k}.i`` spilled (each row's index in its corpus, :attr:`row_dtype`)
    unknown_corpus: bool = False  # a row's corpus code is -1 (a corpus not among the names given)
    blocks: Any = None  # a bucket's rows in blocks of containers (:mod:`dataprep.planning.container_blocks`)
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

    def drop_all_ids(self) -> None:
        """Remove every bucket's id files (once no layout reads them again)."""
        for k in range(self.counts.shape[0]):
            self.drop_ids(k)

    def drop_laid_out(self) -> None:
        """Remove what no layout reads once the plan's last epoch is laid out: every bucket's
        id files and, held in memory, all its columns (the epoch's position columns stay)."""
        self.drop_all_ids()
        if self.memory is not None:
            for name in [n for n in self.memory if not n.startswith("pos.")]:
                del self.memory[name]

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
class Carried:
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
                   strict: bool, memory_limit: int, ids: bool = True,
                   codes: Iterator[npt.NDArray[np.int32]] | None = None,
                   num_corpora: int | None = None, memory: bool = False, fixed_buckets: bool = False) -> SpilledCorpus:
    """The module docstring's pass: allocate in blocks, spill by bucket (tails not carried:
    :func:`dataprep.planning.carry.carry_spilled`).
    A one-line error when one bucket cannot be planned within ``memory_limit`` bytes.
    ``ids``: spill the ids (a plan's shards need them; the padding report does not);
    ``codes``: each row's corpus code, in blocks of :data:`TOTALS_BLOCK` rows
    (:func:`manifests.corpus_codes.iter_corpus_codes`), spilled as ``b{k}.c`` (int32); with
    ``num_corpora`` (the codes' range) each allocated row's index among its corpus's allocated rows (manifest
    order, :func:`bucketing.quota.corpus_indices`) too, as ``b{k}.i``: what a weighted plan
    draws by (:class:`bucketing.quota.QuotaSampler`). ``memory``: the spill's columns held in
    memory (:class:`manifests.spill.SpillFiles` ``memory``), nothing written under ``root``.
    ``fixed_buckets``: each row's bucket is the manifest's ``bucket`` column, not allocated
    (the packed sequences of :mod:`dataprep.planning.packed`)."""
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
    for table in iter_manifest(manifest, (["id"] if ids else []) + ["duration", "num_tokens"]
                               + (["bucket"] if fixed_buckets else []), TOTALS_BLOCK):
        c = None if codes is None else next(codes)
        d = numeric_values(table.column("duration"), np.float64)
        t = numeric_values(table.column("num_tokens"), np.int32)
        alloc = (Allocation(numeric_values(table.column("bucket"), np.int32)) if fixed_buckets
                 else allocate(d, t, grid, strict=strict))
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
        id_col = table.column("id") if ids else None  # each bucket's taken from it: no copy of the whole
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
                files.append_strings(f"b{k}.ids", id_col.take(pa.array(r)))
            # its tail candidates (row, tokens, duration, position in the bucket)
            out.candidates[k] = merge_tail_candidates(  # type: ignore[assignment]
                out.candidates[k], (r + base, t[r], d[r], out.counts[k] + np.arange(r.shape[0], dtype=np.int64)),
                int(k), batch_sizes, grid.duration_bin)
        out.counts += np.diff(cut)
        base += table.num_rows
    files.close()
    give_back_memory(heap=memory)  # the pass's blocks: what stays is the spill (and, in memory, its columns)
    out.num_rows = base
    if base == 0:
        raise ManifestError(f"{manifest}: the manifest has no rows")
    out.total_d, out.total_t = max(out.total_d, 1e-300), max(out.total_t, 1e-300)
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
