"""The memory-mapped manifest column cache: the loader's manifest columns, built once per manifest.

Manifest metadata is not re-read per run: the columns the loader needs are converted once
into an uncompressed Arrow IPC file keyed by the manifest's content hash and memory-mapped,
so the time to the first batch does not grow with the corpus (see ``benchmarks/bench_loader.py``).
A batch's metadata (:class:`RowsMeta`) is numpy takes from that mapping; Python strings
(audio paths, texts) are made only when the batch's audio is read and its text tokenized.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from manifests.arrow_views import numpy_view, single_chunk
from manifests.errors import DataprepError
from manifests.io import current_umask, default_cache_dir, file_lock, manifest_hash

#: manifest columns the loader reads (ids come from the plan, which holds them per batch)
LOADER_COLUMNS = ("audio_path", "offset", "duration", "text", "lang", "num_tokens")
#: container addressing columns (schema version 2); a version-1 manifest caches them as "" / -1
ADDRESS_COLUMNS = ("container", "member_offset", "member_size", "row_group", "group_row")
#: every column of a cache file, in order
CACHE_COLUMNS = LOADER_COLUMNS + ADDRESS_COLUMNS
#: layout version of the manifest column cache files
CACHE_VERSION = 4
#: audio file dictionaries up to this many paths are kept as Python strings per process
SMALL_DICTIONARY = 1 << 16


@dataclass(frozen=True)
class RowsMeta:
    """Manifest fields of one batch's rows, in batch order: the metadata path of a batch.

    Numbers are numpy arrays (seconds for ``offsets`` / ``durations``); strings stay in the
    mapped cache until asked for: ``audio_codes`` index :attr:`ManifestColumns.audio_files`
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
    columns: ManifestColumns = field(repr=False, compare=False)
    #: container of each row (codes into :attr:`ManifestColumns.containers`, -1 = a loose file)
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
        return self.columns.text.take(pa.array(self.rows)).to_pylist()  # type: ignore[no-any-return]

    @cached_property
    def langs(self) -> list[str | None]:
        """Language of each row, ``None`` where the manifest has none."""
        names = self.columns.langs
        return [names[i] for i in self.lang_codes.tolist()]


class ManifestColumns:
    """The loader's manifest columns, memory-mapped from an Arrow IPC cache file.

    The cache (``<cache_dir>/<content hash>.v4.arrow``) holds one record batch with no nulls:
    ``offset``, ``duration`` (float64, s), ``num_tokens`` (int32), ``text`` (large_string),
    ``audio_path``, ``lang`` and ``container`` dictionary-encoded (int32 codes; ``""`` = no
    language / no container), ``member_offset``, ``member_size``, ``row_group``, ``group_row``
    (-1 where the row is not in a container). It is
    built once per manifest content (a few seconds at 10M rows: only these columns are read,
    paths straight from the Parquet dictionary pages) and shared by every rank and run; one
    process builds it under a file lock while the others wait, and the file appears atomically.
    Opening maps it (no read): constant time whatever the corpus size.
    """

    def __init__(self, table: pa.Table, source: str) -> None:
        self.source = source
        self.num_rows = table.num_rows
        cols = {name: single_chunk(table.column(name)) for name in LOADER_COLUMNS}
        self._offset = numpy_view(cols["offset"], np.float64)
        self._duration = numpy_view(cols["duration"], np.float64)
        self._num_tokens = numpy_view(cols["num_tokens"], np.int32)
        self._audio = numpy_view(cols["audio_path"].indices, np.int32)
        self._lang = numpy_view(cols["lang"].indices, np.int32)
        #: distinct audio files (mapped strings); ``RowsMeta.audio_codes`` index it
        self.audio_files: pa.Array = cols["audio_path"].dictionary
        #: transcripts (mapped strings), one per manifest row
        self.text: pa.Array = cols["text"]
        #: distinct languages (``None`` = none given); ``RowsMeta.lang_codes`` index it
        self.langs: list[str | None] = [x or None for x in cols["lang"].dictionary.to_pylist()]
        self._file_names: list[str] | None = None
        self._container = numpy_view(single_chunk(table.column("container")).indices, np.int32)
        #: distinct containers (``""`` stands for none)
        self.containers: list[str] = single_chunk(table.column("container")).dictionary.to_pylist()
        empty = self.containers.index("") if "" in self.containers else -2
        self._member_offset = numpy_view(single_chunk(table.column("member_offset")), np.int64)
        self._member_size = numpy_view(single_chunk(table.column("member_size")), np.int64)
        self._row_group = numpy_view(single_chunk(table.column("row_group")), np.int32)
        self._group_row = numpy_view(single_chunk(table.column("group_row")), np.int64)
        self._no_container = empty

    def audio_names(self, codes: npt.NDArray[np.int32]) -> list[str]:
        """Paths of ``audio_codes``. A small dictionary (many utterances per file) becomes Python
        strings once, on first use; a large one (one file per utterance) is decoded per call."""
        if len(self.audio_files) <= SMALL_DICTIONARY:
            if self._file_names is None:
                self._file_names = self.audio_files.to_pylist()
            names = self._file_names
            return [names[c] for c in codes.tolist()]
        return self.audio_files.take(pa.array(codes)).to_pylist()  # type: ignore[no-any-return]

    @classmethod
    def open(cls, manifest: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None) -> ManifestColumns:
        """Open (building on first use) the memory-mapped columns of a compiled manifest."""
        table = open_or_build_cache(manifest, cache_dir, f"v{CACHE_VERSION}.arrow", _open_cache, build_column_cache,
                                    "the loader's column cache")
        return cls(table, str(manifest))

    def gather(self, rows: npt.NDArray[np.int64], ids: Sequence[str]) -> RowsMeta:
        """Fields of manifest ``rows`` (row numbers) in the given order; ``ids`` are the plan's
        ids of those rows. Numpy takes only: no Python string is made here."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(ids) != rows.shape[0]:
            raise DataprepError(f"{self.source}: {len(ids)} ids for {rows.shape[0]} rows")
        if rows.size and (rows.min() < 0 or rows.max() >= self.num_rows):
            raise DataprepError(f"{self.source}: plan refers to row {int(rows.max())} but the manifest has "
                                f"{self.num_rows} rows (plan made from another manifest?)")
        return RowsMeta(
            ids=list(ids), rows=rows, offsets=self._offset[rows], durations=self._duration[rows],
            num_tokens=self._num_tokens[rows].astype(np.int64), audio_codes=self._audio[rows],
            lang_codes=self._lang[rows], columns=self,
            container_codes=np.where(self._container[rows] == self._no_container, -1, self._container[rows]).astype(np.int32),
            member_offsets=self._member_offset[rows], member_sizes=self._member_size[rows],
            row_groups=self._row_group[rows], group_rows=self._group_row[rows],
        )


def open_or_build_cache(
    manifest: str | os.PathLike[str],
    cache_dir: str | os.PathLike[str] | None,
    suffix: str,
    open_fn: Callable[[Path, int], pa.Table | None],
    build_fn: Callable[[str | os.PathLike[str], Path], None],
    what: str,
) -> pa.Table:
    """The mapped cache file ``<cache_dir>/<content hash>.<suffix>`` of a compiled manifest:
    ``open_fn(path, num_rows)`` maps it (``None``: missing or not whole); on a miss one process
    builds it with ``build_fn(manifest, path)`` under a file lock while the others wait, then all
    map it. ``what`` names the cache in the one-line errors."""
    digest = manifest_hash(manifest)  # recomputed from the rows unless the file is unchanged since verified
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = cache / f"{digest}.{suffix}"
    num_rows = pq.ParquetFile(manifest).metadata.num_rows
    table = open_fn(path, num_rows)
    if table is None:
        cache.mkdir(parents=True, exist_ok=True)
        with file_lock(path.with_name(path.name + ".lock")):
            table = open_fn(path, num_rows)  # another rank may have built it while we waited
            if table is None:
                build_fn(manifest, path)
                table = open_fn(path, num_rows)
        if table is None:
            raise DataprepError(f"{path}: {what} of {manifest} cannot be read back")
    return table


def _encoded(col: pa.ChunkedArray) -> pa.DictionaryArray:
    """One dictionary<int32, string> array of ``col`` with no nulls (null -> ``""``)."""
    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col)
    col = pa.chunked_array(col.chunks, col.type) if col.num_chunks else pa.chunked_array([], col.type)
    arr = pa.Table.from_arrays([col], ["c"]).unify_dictionaries().column(0).combine_chunks()
    values, codes = arr.dictionary, arr.indices.cast(pa.int32())
    if arr.null_count:  # rows without a value (no lang given): point them at ""
        empty = pc.index(values, "").as_py()
        if empty < 0:
            empty = len(values)
            values = pa.concat_arrays([values, pa.array([""], values.type)])
        codes = pc.fill_null(codes, empty)
    return pa.DictionaryArray.from_arrays(codes, values)


def build_column_cache(manifest: str | os.PathLike[str], path: Path) -> None:
    """Write the loader's column cache of ``manifest`` to ``path`` (atomically).

    Reads only :data:`LOADER_COLUMNS` (and the container columns of a version-2 manifest);
    audio paths and languages come dictionary-encoded from the Parquet dictionary pages where
    the writer made them (no hashing of 10M strings).
    """
    try:
        names = pq.read_schema(manifest).names
        address = [c for c in ADDRESS_COLUMNS if c in names]
        t = pq.read_table(manifest, columns=list(LOADER_COLUMNS) + address,
                          read_dictionary=["audio_path", "lang"] + (["container"] if "container" in address else []))
    except (OSError, pa.ArrowInvalid, KeyError) as exc:
        raise DataprepError(f"{manifest}: cannot read the loader's columns ({exc})") from None
    n = t.num_rows
    text = pc.fill_null(t.column("text").cast(pa.large_string()), "")

    def number(name: str, typ: pa.DataType) -> pa.Array:
        if name not in address:
            return pa.array(np.full(n, -1), typ)
        return pc.fill_null(t.column(name).cast(typ), -1).combine_chunks()

    container = t.column("container") if "container" in address else pa.chunked_array([pa.nulls(n, pa.string())])
    table = pa.Table.from_arrays(
        [
            _encoded(t.column("audio_path")),
            pc.fill_null(t.column("offset"), 0.0).combine_chunks(),
            pc.fill_null(t.column("duration"), 0.0).combine_chunks(),
            text.combine_chunks(),
            _encoded(t.column("lang")),
            pc.fill_null(t.column("num_tokens").cast(pa.int32()), 0).combine_chunks(),
            _encoded(container),
            number("member_offset", pa.int64()),
            number("member_size", pa.int64()),
            number("row_group", pa.int32()),
            number("group_row", pa.int64()),
        ],
        names=list(CACHE_COLUMNS),
    )
    # atomic (temporary file + rename) but not fsynced, unlike ``manifests.io.atomic_path``: the
    # fsync of a 0.6 GB cache costs more than writing it, and a file a crash left unreadable is
    # found by ``_open_cache`` and rebuilt
    write_ipc_file(path, table.schema, table.to_batches(max_chunksize=max(1, table.num_rows)))


def write_ipc_file(path: Path, schema: pa.Schema, batches: Iterable[pa.RecordBatch]) -> None:
    """Write record batches as an uncompressed Arrow IPC file at ``path``: atomic (temporary
    file + rename), not fsynced (a cache a crash left unreadable is found on open and rebuilt)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            for batch in batches:
                writer.write_batch(batch)
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)

def _open_cache(path: Path, num_rows: int) -> pa.Table | None:
    """The mapped cache table, or ``None`` when the file is missing or not a whole cache."""
    try:
        with pa.memory_map(str(path), "r") as source:
            table = pa.ipc.open_file(source).read_all()
    except FileNotFoundError:
        return None
    except (OSError, pa.ArrowInvalid):
        return None
    if table.num_rows != num_rows or table.schema.names != list(CACHE_COLUMNS):
        return None
    return table
