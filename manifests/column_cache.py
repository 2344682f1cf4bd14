"""The memory-mapped manifest column cache: the loader's manifest columns, built once per manifest.

Manifest metadata is not re-read per run: the columns the loader needs are converted once
into an uncompressed Arrow IPC stream keyed by the manifest's content hash, written block by
block (memory bounded by a block, not the corpus) and memory-mapped, so the time to the first
batch does not grow with the corpus (see ``benchmarks/bench_loader.py`` and
``benchmarks/bench_stream_checks.py``).
A batch's metadata (:class:`RowsMeta`) is numpy takes from that mapping; Python strings
(audio paths, texts) are made only when the batch's audio is read and its text tokenized.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from manifests.atomic_files import current_umask, file_lock
from manifests.errors import DataprepError
from manifests.hash_cache import default_cache_dir, manifest_hash
from manifests.manifest_read import iter_manifest, manifest_num_rows

#: manifest columns the loader reads (ids come from the plan, which holds them per batch)
LOADER_COLUMNS = ("audio_path", "offset", "duration", "text", "lang", "num_tokens")
#: container addressing columns (schema version 2); a version-1 manifest caches them as "" / -1
ADDRESS_COLUMNS = ("container", "member_offset", "member_size", "row_group", "group_row")
#: every column of a cache file, in order
CACHE_COLUMNS = LOADER_COLUMNS + ADDRESS_COLUMNS
#: layout version of the manifest column cache files (5: an IPC stream of blocks, per-batch dictionaries)
CACHE_VERSION = 5
#: rows per record batch of the cache: the build holds one block of manifest rows plus the
#: Parquet reader's row group (peak RSS growth 176 MiB at 1<<16 rows, 348 MiB at 1<<18, on
#: 1M rows of ~150-character texts: ``benchmarks/bench_stream_checks.py``); opening costs a
#: few microseconds per batch, a gather the same whatever the batches
CACHE_BATCH_ROWS = 1 << 16
#: schema metadata key of the cache's facts (version, manifest content hash, rows)
CACHE_META = "dataprep.column_cache"
_STRINGS = pa.dictionary(pa.int32(), pa.string())
#: the cache's columns and types (:class:`ColumnCache` documents them)
CACHE_SCHEMA = pa.schema([
    ("audio_path", _STRINGS), ("offset", pa.float64()), ("duration", pa.float64()), ("text", pa.large_string()),
    ("lang", _STRINGS), ("num_tokens", pa.int32()), ("container", _STRINGS), ("member_offset", pa.int64()),
    ("member_size", pa.int64()), ("row_group", pa.int32()), ("group_row", pa.int64()),
])
#: audio file dictionaries up to this many paths are kept as Python strings per process
SMALL_DICTIONARY = 1 << 16

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class RowsMeta:
    """Manifest fields of one batch's rows, in batch order: the metadata path of a batch.

    Numbers are numpy arrays (seconds for ``offsets`` / ``durations``); strings stay in the
    mapped cache until asked for: ``audio_codes`` index :attr:`ColumnCache.audio_files`
    (many utterances share a file), and :attr:`audio_paths`, :attr:`texts`, :attr:`langs`
    build Python strings on first access (once per batch, for the audio reader and tokenizer).
    """

    ids: list[str]
    rows: npt.NDArray[np.int64]
    offsets: npt.NDArray[np.float64]
    durations: npt.NDArray[np.float64]
    num_tokens: npt.NDArray[np.int64]
    audio_codes: npt.NDArray[np.int32]
    lang_codes: npt.NDArray[np.int32]
    columns: ColumnCache = field(repr=False, compare=False)
    #: container of each row (codes into :attr:`ColumnCache.containers`, -1 = a loose file)
    container_codes: npt.NDArray[np.int32] = field(default_factory=lambda: np.zeros(0, np.int32))
    #: tar rows: byte offset and size of the member's data (-1 elsewhere)
    member_offsets: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    member_sizes: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    #: Parquet rows: row group and row inside it (-1 elsewhere)
    row_groups: npt.NDArray[np.int32] = field(default_factory=lambda: np.zeros(0, np.int32))
    group_rows: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    @cached_property
    def audio_paths(self) -> list[str]:
        """Audio file of each row."""
        return self.columns.audio_names(self.audio_codes)

    @cached_property
    def container_paths(self) -> list[str | None]:
        """Container of each row (``None`` for a loose file)."""
        names = self.columns.containers
        return [names[c] if c >= 0 else None for c in self.container_codes.tolist()]

    @cached_property
    def texts(self) -> list[str]:
        """Transcript of each row (a null text reads as ``""``)."""
        return self.columns.texts(self.rows)

    @cached_property
    def langs(self) -> list[str | None]:
        """Language of each row, ``None`` where the manifest has none."""
        names = self.columns.langs
        return [names[i] for i in self.lang_codes.tolist()]


class ColumnCache:
    """The loader's manifest columns, memory-mapped from an Arrow IPC cache file.

    The cache (``<cache_dir>/<content hash>.v5.arrow``) is an Arrow IPC *stream* of record
    batches of :data:`CACHE_BATCH_ROWS` rows (the last shorter) with no nulls: ``offset``,
    ``duration`` (float64, s), ``num_tokens`` (int32), ``text`` (large_string), ``audio_path``,
    ``lang`` and ``container`` dictionary-encoded per record batch (int32 codes into that
    batch's dictionary; ``""`` = no language / no container), ``member_offset``,
    ``member_size``, ``row_group``, ``group_row`` (-1 where the row is not in a container).
    It is built once per manifest content by streaming the manifest block by block (memory: a
    block, whatever the corpus size) and shared by every rank and run; one process builds it
    under a file lock while the others wait, and the file appears atomically. Opening maps it
    and walks the stream's message headers (no column is read or copied): resident memory
    grows only with the pages a gather touches. What opening checks is listed in
    :func:`_read_cache`; the values themselves are not re-read (a cache is only ever
    published whole, by rename).

    Row ``r`` lives in record batch ``b = searchsorted(starts, r, "right") - 1``. Codes are
    made global by adding the batch's dictionary offset: :attr:`audio_files` and
    :attr:`containers` / :attr:`langs` are the batches' dictionaries one after the other (a
    file used in several batches appears once per batch).
    """

    def __init__(self, table: pa.Table, source: str, mapped: pa.Buffer) -> None:
        self.source = source
        self.num_rows = table.num_rows
        batches = table.to_batches()  # zero-copy views of the mapped record batches
        self._starts = np.cumsum([0] + [b.num_rows for b in batches]).astype(np.int64)

        def views(name: str, dtype: type[np.generic]) -> _Spread:
            return _Spread(mapped, [b.column(name) for b in batches], dtype)

        def codes(name: str) -> tuple[_Spread, list[pa.Array], npt.NDArray[np.int64]]:
            cols = [b.column(name) for b in batches]
            dicts = [c.dictionary for c in cols]
            return (_Spread(mapped, [c.indices for c in cols], np.int32), dicts,
                    np.cumsum([0] + [len(d) for d in dicts]).astype(np.int64))

        self._offset = views("offset", np.float64)
        self._duration = views("duration", np.float64)
        self._num_tokens = views("num_tokens", np.int32)
        self._member_offset = views("member_offset", np.int64)
        self._member_size = views("member_size", np.int64)
        self._row_group = views("row_group", np.int32)
        self._group_row = views("group_row", np.int64)
        self._audio, audio_dicts, self._audio_starts = codes("audio_path")
        self._lang, lang_dicts, self._lang_starts = codes("lang")
        self._container, container_dicts, self._container_starts = codes("container")
        self._texts: list[pa.Array] = [b.column("text") for b in batches]
        self._text = _SpreadStrings(mapped, self._texts)
        #: the record batches' audio file dictionaries, in order (mapped strings); ``RowsMeta.audio_codes`` index it
        self.audio_files: pa.ChunkedArray = pa.chunked_array(audio_dicts, pa.string())
        self._audio_names = _SpreadStrings(mapped, audio_dicts)
        #: the record batches' language dictionaries (``None`` = none given); ``RowsMeta.lang_codes`` index it
        self.langs: list[str | None] = [x or None for d in lang_dicts for x in d.to_pylist()]
        #: the record batches' container dictionaries (``""`` stands for none)
        self.containers: list[str] = [x for d in container_dicts for x in d.to_pylist()]
        self._no_container = np.asarray([x == "" for x in self.containers] or [False], dtype=bool)
        self._file_names: list[str] | None = None

    @property
    def text(self) -> pa.ChunkedArray:
        """Transcripts (mapped strings), one per manifest row."""
        return pa.chunked_array(self._texts, pa.large_string())

    def audio_names(self, codes: npt.NDArray[np.int32]) -> list[str]:
        """Paths of ``audio_codes``. A small dictionary (many utterances per file) becomes Python
        strings once, on first use; a large one (one file per utterance) is decoded per call."""
        if len(self.audio_files) <= SMALL_DICTIONARY:
            if self._file_names is None:
                self._file_names = self.audio_files.to_pylist()
            names = self._file_names
            return [names[c] for c in codes.tolist()]
        return self._audio_names.get(np.asarray(codes, np.int64))

    def texts(self, rows: npt.NDArray[np.int64]) -> list[str]:
        """Transcripts of manifest ``rows`` (row numbers, checked by :meth:`gather`), in that order."""
        return self._text.get(np.asarray(rows, np.int64))

    @classmethod
    def open(cls, manifest: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None) -> ColumnCache:
        """Open (building on first use) the memory-mapped columns of a compiled manifest."""
        return open_or_build_cache(manifest, cache_dir, f"v{CACHE_VERSION}.arrow",
                                   lambda path: _open_cache(path, str(manifest)), build_column_cache,
                                   "the loader's column cache")

    def gather(self, rows: npt.NDArray[np.int64], ids: Sequence[str]) -> RowsMeta:
        """Fields of manifest ``rows`` (row numbers) in the given order; ``ids`` are the plan's
        ids of those rows. One numpy take per column whatever the record batches the rows fall
        in (:class:`_Spread`): no Python string is made here."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(ids) != rows.shape[0]:
            raise DataprepError(f"{self.source}: {len(ids)} ids for {rows.shape[0]} rows")
        if rows.size and (rows.min() < 0 or rows.max() >= self.num_rows):
            raise DataprepError(f"{self.source}: plan refers to row {int(rows.max())} but the manifest has "
                                f"{self.num_rows} rows (plan made from another manifest?)")
        batch = np.searchsorted(self._starts, rows, side="right") - 1
        local = rows - self._starts[batch]
        container = self._container.take(batch, local) + self._container_starts[batch]
        return RowsMeta(
            ids=list(ids), rows=rows, offsets=self._offset.take(batch, local),
            durations=self._duration.take(batch, local),
            num_tokens=self._num_tokens.take(batch, local).astype(np.int64),
            audio_codes=(self._audio.take(batch, local) + self._audio_starts[batch]).astype(np.int32),
            lang_codes=(self._lang.take(batch, local) + self._lang_starts[batch]).astype(np.int32),
            columns=self,
            container_codes=np.where(self._no_container[container], -1, container).astype(np.int32),
            member_offsets=self._member_offset.take(batch, local),
            member_sizes=self._member_size.take(batch, local),
            row_groups=self._row_group.take(batch, local),
            group_rows=self._group_row.take(batch, local),
        )


class _Spread:
    """One fixed-width column spread over the record batches of a mapped file, read with ONE
    numpy take whatever the batches: the whole file is viewed as ``dtype`` and each batch's
    values start at element ``base[b]`` of that view (IPC buffers are 8-byte aligned)."""

    def __init__(self, mapped: pa.Buffer, arrays: list[pa.Array], dtype: type[np.generic], *, buffer: int = 1,
                 extra: int = 0) -> None:
        """``buffer``: which of each array's buffers holds the values (1: values, or offsets of
        a string array); ``extra``: values past the array's length it must hold (1 for offsets)."""
        width = np.dtype(dtype).itemsize
        self.values = np.frombuffer(mapped, dtype=dtype, count=mapped.size // width)
        base = []
        for arr in arrays:
            buf = arr.buffers()[buffer]
            at = (buf.address - mapped.address) if buf is not None else 0
            end = at + (arr.offset + len(arr) + extra) * width
            if arr.null_count or at % width or at < 0 or end > mapped.size or (buf is not None and end > at + buf.size):
                raise CacheInvalid("a column is not a null-free aligned buffer inside the mapped file")
            base.append(at // width + arr.offset)
        self.base = np.asarray(base or [0], dtype=np.int64)

    def take(self, batch: npt.NDArray[np.intp], local: npt.NDArray[np.int64]) -> npt.NDArray[Any]:
        """Values of rows ``local`` of record batches ``batch`` (one pair per row)."""
        return self.values[self.base[batch] + local]


class _SpreadStrings:
    """String arrays laid end to end (positions ``starts[b]..starts[b+1]`` in array ``b``) inside
    a mapped file: the strings at any positions are made with one numpy take of their offsets
    and one slice of the mapping each, whatever the arrays they fall in."""

    def __init__(self, mapped: pa.Buffer, arrays: list[pa.Array]) -> None:
        self.mapped = memoryview(mapped)
        self.starts = np.cumsum([0] + [len(a) for a in arrays]).astype(np.int64)
        large = [pa.types.is_large_string(a.type) for a in arrays]
        dtype = np.int64 if all(large) else np.int32
        if any(large) and not all(large):
            raise CacheInvalid("string columns of two offset widths")
        self.offsets = _Spread(mapped, arrays, dtype, buffer=1, extra=1)
        data = [a.buffers()[2] for a in arrays]
        self.data = np.asarray([(d.address - mapped.address) if d is not None and d.size else 0 for d in data] or [0],
                               dtype=np.int64)
        for a, d, at in zip(arrays, data, self.data.tolist()):
            if a.null_count or at < 0 or (d is not None and at + d.size > mapped.size):
                raise CacheInvalid("a string column is not null-free inside the mapped file")

    def __len__(self) -> int:
        return int(self.starts[-1])

    def get(self, idx: npt.NDArray[np.int64]) -> list[str]:
        """The strings at positions ``idx`` (``0 <= idx < len(self)``), in that order."""
        batch = np.searchsorted(self.starts, idx, side="right") - 1
        local = idx - self.starts[batch]
        data = self.data[batch]
        start = (data + self.offsets.take(batch, local)).tolist()
        stop = (data + self.offsets.take(batch, local + 1)).tolist()
        mv = self.mapped
        return [str(mv[a:z], "utf-8") for a, z in zip(start, stop)]


def open_or_build_cache(
    manifest: str | os.PathLike[str],
    cache_dir: str | os.PathLike[str] | None,
    suffix: str,
    open_fn: Callable[[Path], T | None],
    build_fn: Callable[[str | os.PathLike[str], Path], None],
    what: str,
) -> T:
    """The mapped cache file ``<cache_dir>/<content hash>.<suffix>`` of a compiled manifest:
    ``open_fn(path)`` maps it (``None``: missing or not whole); on a miss one process builds it
    with ``build_fn(manifest, path)`` under a file lock while the others wait, then all map it.
    ``what`` names the cache in the one-line errors. The manifest's footer is not parsed here:
    its verified content hash names the file, and that hash covers its schema and rows."""
    digest = manifest_hash(manifest)  # recomputed from the rows unless the file is unchanged since verified
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = cache / f"{digest}.{suffix}"
    table = open_fn(path)
    if table is None:
        cache.mkdir(parents=True, exist_ok=True)
        with file_lock(path.with_name(path.name + ".lock")):
            table = open_fn(path)  # another rank may have built it while we waited
            if table is None:
                build_fn(manifest, path)
                table = open_fn(path)
        if table is None:
            raise DataprepError(f"{path}: {what} of {manifest} cannot be read back")
    return table


def _encoded(col: pa.ChunkedArray) -> pa.DictionaryArray:
    """One dictionary<int32, string> array of ``col`` with no nulls (null -> ``""``)."""
    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col)
    col = pa.chunked_array(col.chunks, col.type) if col.num_chunks else pa.chunked_array([], col.type)
    arr = pa.Table.from_arrays([col], ["c"]).unify_dictionaries().column(0).combine_chunks()
    values, codes = arr.dictionary.cast(pa.string()), arr.indices.cast(pa.int32())
    if arr.null_count:  # rows without a value (no lang given): point them at ""
        empty = pc.index(values, "").as_py()
        if empty < 0:
            empty = len(values)
            values = pa.concat_arrays([values, pa.array([""], values.type)])
        codes = pc.fill_null(codes, empty)
    return pa.DictionaryArray.from_arrays(codes, values)


def build_column_cache(manifest: str | os.PathLike[str], path: Path, *, batch_rows: int = CACHE_BATCH_ROWS) -> None:
    """Write the loader's column cache of ``manifest`` to ``path`` (atomically; ``path``'s name
    starts with the manifest's content hash, recorded in the file and checked on open).

    Streams the manifest ``batch_rows`` rows at a time (:func:`manifests.manifest_read.iter_manifest`,
    only :data:`LOADER_COLUMNS` and the container columns of a version-2 manifest): memory is a
    block, not the corpus. Each block becomes one record batch whose string columns are
    dictionary-encoded with their own dictionary (the IPC stream carries a replacement per batch).
    A cache of an older layout version for the same manifest is removed once this one is written.
    """
    try:
        names = pq.read_schema(manifest).names
    except (OSError, pa.ArrowInvalid) as exc:
        raise DataprepError(f"{manifest}: cannot read the loader's columns ({exc})") from None
    address = [c for c in ADDRESS_COLUMNS if c in names]
    blocks = iter_manifest(manifest, list(LOADER_COLUMNS) + address, batch_rows)
    schema = with_cache_facts(CACHE_SCHEMA, CACHE_META, CACHE_VERSION, path, manifest)
    # atomic (temporary file + rename) but not fsynced, unlike ``manifests.atomic_files.atomic_path``: the
    # fsync of a 0.6 GB cache costs more than writing it, and a file a crash left unreadable is
    # found by ``_open_cache`` and rebuilt
    write_ipc_file(path, schema, (_cache_batch(t, address) for t in blocks), stream=True)
    remove_older_versions(path, [f"v{old}.arrow" for old in range(1, CACHE_VERSION)])


def _cache_batch(t: pa.Table, address: list[str]) -> pa.RecordBatch:
    """One record batch of the cache from a block of manifest rows (nulls filled, strings
    dictionary-encoded with the block's own dictionary)."""
    n = t.num_rows

    def number(name: str, typ: pa.DataType, fill: float) -> pa.Array:
        if name not in t.column_names:
            return pa.array(np.full(n, fill), typ)
        return pc.fill_null(t.column(name).cast(typ), fill).combine_chunks()

    container = t.column("container") if "container" in address else pa.chunked_array([pa.nulls(n, pa.string())])
    return pa.RecordBatch.from_arrays(
        [
            _encoded(t.column("audio_path")),
            number("offset", pa.float64(), 0.0),
            number("duration", pa.float64(), 0.0),
            pc.fill_null(t.column("text").cast(pa.large_string()), "").combine_chunks(),
            _encoded(t.column("lang")),
            number("num_tokens", pa.int32(), 0),
            _encoded(container),
            number("member_offset", pa.int64(), -1),
            number("member_size", pa.int64(), -1),
            number("row_group", pa.int32(), -1),
            number("group_row", pa.int64(), -1),
        ],
        schema=CACHE_SCHEMA,
    )


def _hash_of(path: Path) -> str:
    """The manifest content hash a cache file's name starts with."""
    return path.name.split(".", 1)[0]


def with_cache_facts(schema: pa.Schema, key: str, version: int, path: Path,
                     manifest: str | os.PathLike[str]) -> pa.Schema:
    """``schema`` carrying a cache file's facts under metadata ``key``: its layout ``version``,
    the manifest content hash ``path``'s name starts with and the manifest's rows (checked on
    open by :func:`check_cache_facts`)."""
    return schema.with_metadata({key: json.dumps(
        {"version": version, "content_hash": _hash_of(path), "rows": manifest_num_rows(manifest)}, sort_keys=True)})


def remove_older_versions(path: Path, suffixes: Iterable[str]) -> None:
    """Remove the cache files ``<content hash>.<suffix>`` of older layouts next to ``path`` (once
    the current one is written: an older layout is rebuilt, never read)."""
    for suffix in suffixes:
        with contextlib.suppress(OSError):
            path.with_name(f"{_hash_of(path)}.{suffix}").unlink()


def write_ipc_file(path: Path, schema: pa.Schema, batches: Iterable[pa.RecordBatch], *, stream: bool = False) -> None:
    """Write record batches as an uncompressed Arrow IPC file (``stream``: the IPC stream format,
    which allows a new dictionary per batch) at ``path``: atomic (temporary file + rename), not
    fsynced (a cache a crash left unreadable is found on open and rebuilt)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        with pa.OSFile(tmp, "wb") as sink, (pa.ipc.new_stream if stream else pa.ipc.new_file)(sink, schema) as writer:
            for batch in batches:
                writer.write_batch(batch)
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class CacheInvalid(Exception):
    """A cache file that is present but not a whole, current cache of the manifest."""


def check_cache_facts(schema: pa.Schema, key: str, version: int, expected: pa.Schema | None, path: Path,
                      batches: Sequence[pa.RecordBatch], *, nulls: bool) -> dict[str, Any]:
    """Check a mapped cache file against what it must be: the facts recorded under metadata
    ``key`` (layout ``version``, the manifest hash ``path``'s name gives, rows), its columns
    (``expected``, metadata aside; None: not checked here), that ``batches`` hold together
    (buffers long enough for their lengths and offsets; no nulls unless ``nulls``) and, when
    they are every batch of the file, that they hold the recorded rows. No column is read:
    Arrow's check reads only a string column's end offsets, a few pages per record batch.
    Returns the facts; raises :class:`CacheInvalid` with the reason."""
    try:
        facts = json.loads((schema.metadata or {}).get(key.encode(), b"{}"))
    except ValueError:
        facts = {}
    if not isinstance(facts, dict) or facts.get("version") != version:
        got = facts.get("version") if isinstance(facts, dict) else None
        raise CacheInvalid(f"layout version {got!r}, this tool writes {version}")
    if facts.get("content_hash") != _hash_of(path):
        raise CacheInvalid("made from another manifest (its recorded content hash differs from its name)")
    if expected is not None and schema.remove_metadata() != expected.remove_metadata():
        raise CacheInvalid("columns differ from the cache's")
    if type(facts.get("rows")) is not int or facts["rows"] < 0:
        raise CacheInvalid(f"records {str(facts.get('rows'))[:40]} rows")
    check_batches(batches, nulls=nulls)
    return facts


def check_batches(batches: Iterable[pa.RecordBatch], *, nulls: bool) -> None:
    """Each of ``batches`` holds together (and has no nulls unless ``nulls``), else :class:`CacheInvalid`."""
    for b in batches:
        try:
            b.validate()
        except pa.ArrowInvalid as exc:
            raise CacheInvalid(f"a record batch does not hold together ({str(exc)[:120]})") from None
        if not nulls and any(c.null_count for c in b.columns):
            raise CacheInvalid("a column has nulls")


def open_or_none(read: Callable[[], T], path: Path, what: str, logger: logging.Logger) -> T | None:
    """``read()``, or ``None`` when the file is missing or ``read`` finds it is not a whole,
    current cache (:class:`CacheInvalid`: then logged with the reason, and rebuilt by the caller)."""
    try:
        return read()
    except FileNotFoundError:
        return None
    except CacheInvalid as exc:
        logger.warning("%s: %s is refused (%s); rebuilding it", path, what, exc)
        return None


def not_whole(kind: str, exc: Exception) -> CacheInvalid:
    """The refusal of a file Arrow cannot read as a whole IPC ``kind`` (its first error line)."""
    return CacheInvalid(f"not a whole Arrow IPC {kind} ({str(exc).strip().splitlines()[0][:120] if str(exc) else exc})")


def _read_cache(path: Path, manifest: str) -> ColumnCache:
    """The mapped cache, every stored fact checked against what it must be: format version,
    the manifest hash its name gives, row count, schema, each batch's buffers, null counts and
    place in the mapping (metadata only: no value is read). Raises ``FileNotFoundError`` or
    :class:`CacheInvalid`."""
    try:
        with pa.memory_map(str(path), "r") as source:
            mapped = source.read_buffer()
            reader = pa.ipc.open_stream(mapped)
            batches = list(reader)  # zero-copy: slices of the mapping
            schema = reader.schema
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowInvalid) as exc:
        raise not_whole("stream", exc) from None
    facts = check_cache_facts(schema, CACHE_META, CACHE_VERSION, CACHE_SCHEMA, path, batches, nulls=False)
    total = sum(b.num_rows for b in batches)
    if total != facts["rows"]:
        raise CacheInvalid(f"holds {total} rows where its facts say the manifest has {facts['rows']}")
    return ColumnCache(pa.Table.from_batches(batches, schema), manifest, mapped)


def _open_cache(path: Path, manifest: str) -> ColumnCache | None:
    """The mapped cache table, or ``None`` when the file is missing or is not a whole, current
    cache of this manifest (then logged with the reason, and rebuilt by the caller)."""
    return open_or_none(lambda: _read_cache(path, manifest), path, "the loader's column cache", log)
