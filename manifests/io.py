"""Atomic Parquet/JSON writes, manifest reading and content hashing.

Every file the toolchain writes goes through :func:`atomic_path`: the data is written to a
temporary file in the destination folder and renamed over the target, so a crash never
leaves a half-written manifest, rejects file or plan.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from manifests.errors import ManifestError
from manifests.schema import (
    META_CONTENT_HASH,
    META_KIND,
    META_PROVENANCE,
    META_SCHEMA_VERSION,
    POLARS_SCHEMA,
    REJECTS_POLARS_SCHEMA,
    SCHEMA_VERSION,
    CONTAINER_POLARS_SCHEMA,
    conform,
    CORPUS_COLUMN,
    has_containers,
    has_corpus,
    manifest_schema,
    rejects_schema,
    schema_version,
)


def current_umask() -> int:
    """The process umask (read without changing it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = current_umask()


def temp_prefix(target: Path) -> str:
    """Name prefix of this process's temporary files and folders for ``target``:
    ``.<name>.<pid>.`` (the pid lets the next run tell a killed writer's litter from a live one's)."""
    return f".{target.name}.{os.getpid()}."


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # another user's process (or not a pid we can ask about): leave its files
    return True


def sweep_stale_temps(target: str | os.PathLike[str], suffixes: tuple[str, ...] = (".tmp", ".spool", ".old")) -> int:
    """Remove the temporary files / folders a killed writer of ``target`` left next to it
    (``.<name>.<pid>.*<suffix>`` whose pid is no longer running on this machine); returns how many.
    Called before every atomic write, so litter lasts only until the next run."""
    t = Path(target)
    removed = 0
    if not t.parent.is_dir():
        return 0
    for p in t.parent.glob(f".{glob_escape(t.name)}.*"):
        rest = p.name[len(t.name) + 2:]
        pid_text, _, tail = rest.partition(".")
        if not pid_text.isdigit() or not tail.endswith(suffixes) or _pid_alive(int(pid_text)):
            continue
        with contextlib.suppress(OSError):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
            removed += 1
    return removed


def glob_escape(name: str) -> str:
    """``name`` with glob metacharacters escaped."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Flush a written file's bytes to disk."""
    with open(path, "rb+") as fh:
        os.fsync(fh.fileno())


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], *, fsync: bool = True) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it over ``path`` on success.

    On an exception the temporary file is removed and ``path`` is left untouched.
    ``fsync=False``: the caller flushes the file before the rename (e.g. many files at once,
    :func:`fsync_file` from several threads: a flush of the disk's journal serves them all).
    """
    target = Path(path)
    if target.is_dir():  # os.replace would fail at the very end, after the work
        raise ManifestError(f"{target}: is an existing directory; give a file path")
    target.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_temps(target)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(target), suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        if fsync:
            fsync_file(tmp_path)
        os.chmod(tmp_path, 0o666 & ~_UMASK)  # mkstemp makes 0600; outputs are ordinary files
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_json(obj: Any, path: str | os.PathLike[str]) -> None:
    """Write ``obj`` as indented, key-sorted JSON, atomically (byte-stable for equal input)."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


#: rows per block of the content hash (the last block of a table may be shorter)
HASH_BLOCK_ROWS = 1 << 16
#: rows per Parquet row group of a manifest or rejects file
ROW_GROUP_ROWS = 1 << 20
_HASH_DOMAIN = b"speech_dataprep content hash v2\n"
_CANONICAL_TYPES = {pa.large_string(): pa.string(), pa.string_view(): pa.string(), pa.large_binary(): pa.binary(),
                    pa.binary_view(): pa.binary()}


def _canonical_type(t: pa.DataType) -> pa.DataType:
    return _CANONICAL_TYPES.get(t, t)


class Rebatcher:
    """Tables pushed in any split, regrouped into consecutive tables of exactly ``rows`` rows:
    :meth:`push` yields each block as it fills, :meth:`rest` returns the short last one (None
    when nothing is pending). Holds at most ``rows`` rows + the table being pushed."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self._pending: list[pa.Table] = []
        self._have = 0

    def push(self, table: pa.Table | pa.RecordBatch) -> Iterator[pa.Table]:
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        while table.num_rows:
            take = min(self.rows - self._have, table.num_rows)
            self._pending.append(table.slice(0, take))
            self._have += take
            table = table.slice(take)
            if self._have == self.rows:
                yield self._take()

    def rest(self) -> pa.Table | None:
        return self._take() if self._have else None

    def _take(self) -> pa.Table:
        block = pa.concat_tables(self._pending) if len(self._pending) > 1 else self._pending[0]
        self._pending, self._have = [], 0
        return block


def rebatch(tables: Iterable[pa.Table | pa.RecordBatch], rows: int) -> Iterator[pa.Table]:
    """Regroup a stream of tables into consecutive tables of exactly ``rows`` rows (the last
    one shorter; none for an empty stream). Holds at most ``rows`` + one input table."""
    blocks = Rebatcher(rows)
    for t in tables:
        yield from blocks.push(t)
    last = blocks.rest()
    if last is not None:
        yield last


class ContentHasher:
    """Incremental content hash of a table's VALUES (schema and rows, not layout or metadata).

    Definition (hex SHA-256), so any tool can recompute it::

        "speech_dataprep content hash v2\n"
        for each field: utf8(name) + b"\0" + str(type) + b"\n"     (large_string/string_view -> string)
        for each consecutive block of 65,536 rows (the last one shorter), for each column:
            validity: np.packbits(is_valid)                  (1 bit per row, MSB first)
            values, nulls filled:  fixed width: fill_null(0) as little-endian numpy bytes
                                   string/binary: fill_null("") then int64 offsets - offsets[0]
                                   (little-endian, rows + 1 of them) and the data bytes they span
        the total number of rows as 8 bytes little-endian

    Equal values give the equal hash whatever the chunking, slicing, bytes under null slots,
    string vs large_string layout or Parquet row groups; ``update`` may be fed any split.
    """

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self._digest = hashlib.sha256(_HASH_DOMAIN)
        for f in schema:
            self._digest.update(f.name.encode() + b"\0" + str(_canonical_type(f.type)).encode() + b"\n")
        self._blocks = Rebatcher(HASH_BLOCK_ROWS)
        self.rows = 0

    def update(self, table: pa.Table | pa.RecordBatch) -> None:
        """Add the next rows (columns in schema order, same names)."""
        if table.schema.names != self.schema.names:
            raise ValueError(f"columns {table.schema.names} differ from the hasher's {self.schema.names}")
        for block in self._blocks.push(table):
            self._block(block)

    def _block(self, block: pa.Table) -> None:
        for column in block.columns:
            arr = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
            self._column(arr)
        self.rows += block.num_rows

    def _column(self, arr: pa.Array) -> None:
        d = self._digest
        valid = arr.is_valid().to_numpy(zero_copy_only=False)
        d.update(np.packbits(valid).tobytes())
        t = arr.type
        if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
            arr = arr.cast(pa.large_binary() if pa.types.is_binary_view(t) else pa.large_string())
            t = arr.type
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
            offsets, data = self._offsets(arr)
            if arr.null_count and (np.diff(offsets)[~valid] != 0).any():  # bytes under a null slot
                binary = pa.types.is_binary(t) or pa.types.is_large_binary(t)
                offsets, data = self._offsets(pc.fill_null(arr, b"" if binary else ""))
            d.update((offsets - offsets[0]).astype("<i8", copy=False).tobytes())
            if data is not None and offsets[-1] > offsets[0]:
                d.update(memoryview(data)[int(offsets[0]): int(offsets[-1])])
        elif pa.types.is_boolean(t):
            d.update(pc.fill_null(arr, False).to_numpy(zero_copy_only=False).astype(np.uint8).tobytes())
        elif pa.types.is_integer(t) or pa.types.is_floating(t):
            values = (pc.fill_null(arr, 0) if arr.null_count else arr).to_numpy(zero_copy_only=False)
            d.update(values.astype(values.dtype.newbyteorder("<"), copy=False).tobytes())
        elif pa.types.is_null(t):
            pass
        else:
            raise TypeError(f"content hash: unsupported column type {t}")

    @staticmethod
    def _offsets(arr: pa.Array) -> tuple[npt.NDArray[np.int64], pa.Buffer | None]:
        """(int64 offsets of the array's rows, its data buffer)."""
        _, offsets_buf, data_buf = arr.buffers()
        width = "<i8" if pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type) else "<i4"
        offsets = np.frombuffer(offsets_buf, dtype=width)[arr.offset: arr.offset + len(arr) + 1].astype(np.int64)
        return offsets, data_buf

    def hexdigest(self) -> str:
        """The hash of every row added so far (``update`` may not be called afterwards)."""
        last = self._blocks.rest()
        if last is not None:
            self._block(last)
        self._digest.update(self.rows.to_bytes(8, "little"))
        return self._digest.hexdigest()


def table_hash(table: pa.Table) -> str:
    """Content hash of a table's values (see :class:`ContentHasher` for the definition), as hex."""
    hasher = ContentHasher(table.schema)
    hasher.update(table)
    return hasher.hexdigest()


def file_metadata(content_hash: str, kind: str, provenance: Mapping[str, Any] | None,
                   version: int) -> dict[bytes, bytes]:
    return {
        META_SCHEMA_VERSION: str(version).encode(),
        META_CONTENT_HASH: content_hash.encode(),
        META_KIND: kind.encode(),
        META_PROVENANCE: json.dumps(dict(provenance or {}), sort_keys=True).encode(),
    }


@dataclass
class StreamWritten:
    """What :func:`write_parquet_stream` wrote: the content hash and the number of rows."""

    content_hash: str
    rows: int


def write_parquet_stream(
    make_tables: Callable[[], Iterable[pa.Table | pa.RecordBatch]],
    path: str | os.PathLike[str],
    schema: pa.Schema,
    kind: str,
    provenance: Mapping[str, Any] | None = None,
    *,
    row_group_size: int = ROW_GROUP_ROWS,
) -> StreamWritten:
    """Write the rows ``make_tables()`` yields as one Parquet file, atomically, in bounded memory.

    ``make_tables`` is called twice (the content hash goes into the schema metadata, which a
    Parquet writer fixes when it opens: first pass hashes, second writes) and must yield the same
    rows both times. Rows are cast to ``schema`` and written in row groups of exactly
    ``row_group_size`` rows (the last shorter), zstd: the bytes equal ``pq.write_table`` of the
    whole table with that row group size. Memory: about one row group.
    """
    hasher = ContentHasher(schema)
    for t in make_tables():
        hasher.update(t.cast(schema) if t.schema != schema else t)
    content_hash = hasher.hexdigest()
    full = schema.with_metadata(file_metadata(content_hash, kind, provenance, schema_version(schema)))
    with atomic_path(path) as tmp:
        with RowGroupWriter(tmp, full, row_group_size) as writer:
            for t in make_tables():
                writer.write(t)
        rows = writer.rows
        if rows != hasher.rows:
            raise AssertionError(f"{path}: the second pass gave {rows} rows, the first {hasher.rows}")
    remember_verified(path, content_hash)
    return StreamWritten(content_hash, rows)


class RowGroupWriter:
    """A Parquet file (zstd) written from tables pushed in any split, as row groups of exactly
    ``row_group_size`` rows (the last shorter; one empty group for no rows): the bytes of
    ``pq.write_table`` of the whole table. ``schema`` carries the file's metadata; pushed
    tables are cast to it. Memory: about one row group. Use as a context manager."""

    def __init__(self, path: str | os.PathLike[str], schema: pa.Schema, row_group_size: int = ROW_GROUP_ROWS) -> None:
        self.schema, self.size = schema, row_group_size
        self._writer = pq.ParquetWriter(path, schema, compression="zstd")
        self._groups = Rebatcher(row_group_size)
        self.rows = 0

    def write(self, table: pa.Table | pa.RecordBatch) -> None:
        """Append rows."""
        for group in self._groups.push(table):
            self._flush(group)

    def _flush(self, group: pa.Table) -> None:
        group = pa.Table.from_arrays([c.combine_chunks() for c in group.columns], names=group.schema.names)
        self._writer.write_table(group.cast(self.schema), row_group_size=self.size)
        self.rows += group.num_rows

    def close(self) -> None:
        """Write the last row group and the footer."""
        last = self._groups.rest()
        if last is not None:
            self._flush(last)
        if self.rows == 0:  # pq.write_table writes one empty row group for an empty table
            self._writer.write_table(self.schema.empty_table(), row_group_size=self.size)
        self._writer.close()

    def __enter__(self) -> RowGroupWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:
            self._writer.close()


def output_schemas(kind: str, containers: bool, corpus: bool) -> tuple[dict[str, pl.DataType], pa.Schema]:
    """The polars and Arrow schemas of a ``"manifest"`` or ``"rejects"`` file, with or without
    the container columns and ``corpus`` (what :func:`write_manifest` / :func:`write_rejects`
    write for a frame with rows in containers / naming their corpus)."""
    base = POLARS_SCHEMA if kind == "manifest" else REJECTS_POLARS_SCHEMA
    schema = {**base, **(CONTAINER_POLARS_SCHEMA if containers else {}), **({CORPUS_COLUMN: pl.String()} if corpus else {})}
    return schema, (manifest_schema if kind == "manifest" else rejects_schema)(containers, corpus)


def _write_parquet(
    df: pl.DataFrame,
    path: str | os.PathLike[str],
    schema: pa.Schema,
    kind: str,
    provenance: Mapping[str, Any] | None,
    row_group_size: int = ROW_GROUP_ROWS,
) -> str:
    table = df.to_arrow().cast(schema)
    return write_parquet_stream(lambda: [table], path, schema, kind, provenance,
                                row_group_size=row_group_size).content_hash


def write_manifest(
    df: pl.DataFrame, path: str | os.PathLike[str], provenance: Mapping[str, Any] | None = None,
    *, row_group_size: int = ROW_GROUP_ROWS,
) -> str:
    """Write a compiled manifest atomically; return its content hash.

    ``df`` is conformed to :data:`MANIFEST_SCHEMA` (column order and dtypes), plus the container
    columns (schema version 2) when any row has a ``container``. For a manifest too large for
    memory, stream it with :func:`write_parquet_stream` (same bytes).
    """
    schema, arrow = output_schemas("manifest", has_containers(df), has_corpus(df))
    return _write_parquet(conform(df, schema), path, arrow, "manifest", provenance, row_group_size)


def write_rejects(
    df: pl.DataFrame, path: str | os.PathLike[str], provenance: Mapping[str, Any] | None = None,
    *, row_group_size: int = ROW_GROUP_ROWS,
) -> str:
    """Write a rejects file (manifest columns + ``reason`` + ``detail``, plus the container
    columns when any row has a ``container``) atomically."""
    schema, arrow = output_schemas("rejects", has_containers(df), has_corpus(df))
    return _write_parquet(conform(df, schema), path, arrow, "rejects", provenance, row_group_size)


def default_rejects_path(output: str | os.PathLike[str]) -> Path:
    """Where a command writing ``output`` puts its rejected rows by default:
    ``<output stem>.rejects.parquet`` next to it (``kept.parquet`` -> ``kept.rejects.parquet``)."""
    out = Path(output)
    return out.with_name(out.stem + ".rejects.parquet")


def reasons_count(rejects: pl.DataFrame) -> dict[str, int]:
    """Rejected rows per ``reason``, sorted by reason (empty for no rows)."""
    return dict(sorted(rejects.group_by("reason").len().iter_rows())) if rejects.height else {}


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Schema version, content hash, kind and provenance of a file we wrote."""
    p = Path(path)
    if p.exists() and not p.is_file():
        raise ManifestError(f"{path}: not a regular file")
    try:
        meta = pq.read_schema(path).metadata or {}
    except FileNotFoundError:
        raise ManifestError(f"{path}: no such file") from None
    except (OSError, pa.ArrowException) as exc:
        raise ManifestError(f"{path}: not a readable Parquet file ({str(exc).strip().splitlines()[0][:160]})") from None
    try:
        version = int(meta.get(META_SCHEMA_VERSION, b"0").decode("ascii"))
        provenance = json.loads(meta.get(META_PROVENANCE, b"{}"))
        out = {"schema_version": version, "content_hash": meta.get(META_CONTENT_HASH, b"").decode("ascii"),
               "kind": meta.get(META_KIND, b"").decode("ascii"), "provenance": provenance}
    except (ValueError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{path}: speech_dataprep metadata is corrupt ({exc})") from None
    if not isinstance(provenance, dict):
        raise ManifestError(f"{path}: speech_dataprep.provenance: expected an object")
    return out


def read_manifest(path: str | os.PathLike[str], columns: list[str] | None = None,
                  *, allow_rejects: bool = False, optional: Sequence[str] = ()) -> pl.DataFrame:
    """Read a compiled manifest; raise :class:`ManifestError` (one line) if it is not one. A
    rejects file is refused unless ``allow_rejects`` (its rows are what a manifest must not hold).
    ``optional``: columns added to ``columns`` when the file has them (e.g. ``corpus``)."""
    check_manifest_file(path, allow_rejects=allow_rejects)
    if columns is not None and optional:
        names = pq.read_schema(path).names
        columns = [*columns, *(c for c in optional if c in names and c not in columns)]
    try:
        return pl.read_parquet(path, columns=columns)
    except (OSError, pl.exceptions.PolarsError, pa.ArrowException) as exc:
        raise ManifestError(f"{path}: rows cannot be read ({str(exc).strip().splitlines()[0][:160]})") from None


def iter_manifest(path: str | os.PathLike[str], columns: list[str] | None, rows: int,
                  dictionary: Sequence[str] = ()) -> Iterator[pa.Table]:
    """A compiled manifest's ``columns`` (None: all) in consecutive tables of exactly ``rows`` rows
    (the last shorter), checked as :func:`read_manifest` checks it; memory: one table and one row
    group being decoded, not the file (no pre-buffering of the whole file's column chunks).
    ``dictionary``: string columns read dictionary-encoded (a few distinct values: faster)."""
    check_manifest_file(path)
    try:
        pf = pq.ParquetFile(path, pre_buffer=False, read_dictionary=list(dictionary) or None)
        yield from rebatch(pf.iter_batches(batch_size=rows, columns=columns), rows)
    except (OSError, pa.ArrowException) as exc:
        raise ManifestError(f"{path}: rows cannot be read ({str(exc).strip().splitlines()[0][:160]})") from None


def manifest_num_rows(path: str | os.PathLike[str]) -> int:
    """Rows of a compiled manifest, from its Parquet footer (checked as :func:`read_manifest`)."""
    check_manifest_file(path)
    try:
        return int(pq.ParquetFile(path).metadata.num_rows)
    except (OSError, pa.ArrowException) as exc:
        raise ManifestError(f"{path}: rows cannot be read ({str(exc).strip().splitlines()[0][:160]})") from None


def check_manifest_file(path: str | os.PathLike[str], *, allow_rejects: bool = False) -> dict[str, Any]:
    """The metadata of a compiled manifest (:func:`read_metadata`), or a one-line error if the
    file is not one (a rejects file unless ``allow_rejects``, or a newer schema version)."""
    meta = read_metadata(path)
    if meta["kind"] == "rejects" and not allow_rejects:
        raise ManifestError(f"{path}: is a rejects file, not a compiled manifest (its rows were rejected; "
                            f"give the manifest written with -o)")
    if meta["kind"] not in ("manifest", "rejects"):
        raise ManifestError(f"{path}: not a compiled manifest (run `dataprep compile` first)")
    if meta["schema_version"] > SCHEMA_VERSION:
        raise ManifestError(
            f"{path}: schema version {meta['schema_version']} is newer than this tool's {SCHEMA_VERSION}"
        )
    return meta


def recorded_hash(path: str | os.PathLike[str]) -> str:
    """The content hash recorded in a file's metadata, unchecked (see :func:`manifest_hash`)."""
    return str(read_metadata(path)["content_hash"])


def recompute_hash(path: str | os.PathLike[str]) -> str:
    """Content hash of a Parquet file's rows, recomputed from the values, streamed one hash
    block (:data:`HASH_BLOCK_ROWS` rows) at a time: memory about one block of rows plus a
    column page being decoded, not a row group and never the file."""
    try:
        pf = pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 20)
        hasher = ContentHasher(pf.schema_arrow.remove_metadata())
        for batch in pf.iter_batches(batch_size=HASH_BLOCK_ROWS, use_threads=False):
            hasher.update(batch)
    except (OSError, pa.ArrowException, ValueError, TypeError) as exc:
        raise ManifestError(f"{path}: rows cannot be read back ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    return hasher.hexdigest()


def verify_manifest_rows(path: str | os.PathLike[str], expected: str, what: str) -> None:
    """Refuse ``path`` unless every row, read block by block (:func:`recompute_hash`; cached
    facts are not trusted), hashes both to the hash its metadata records and to ``expected``
    (``what`` names the owner of that expectation, e.g. "the plan's manifest"). Memory: one
    block of rows. A file that passes is remembered as verified (:func:`remember_verified`)."""
    recorded = str(check_manifest_file(path)["content_hash"])
    if not recorded:
        raise ManifestError(f"{path}: no content hash in its metadata (write it with `dataprep compile`)")
    got = recompute_hash(path)
    if got != recorded:
        raise ManifestError(_rows_differ(path, recorded, got))
    if got != expected:
        raise ManifestError(f"{path}: content hash {got[:12]}... differs from {what} ({expected[:12]}...)")
    remember_verified(path, got)


def _rows_differ(path: str | os.PathLike[str], recorded: str, got: str) -> str:
    return (f"{path}: content_hash: the metadata records {recorded[:12]}... but the rows hash "
            f"to {got[:12]}... (edited after it was written? re-run the command that wrote it)")


def default_cache_dir() -> Path:
    """``$SPEECH_DATAPREP_CACHE`` or ``$XDG_CACHE_HOME/speech-dataprep`` (``~/.cache`` by default)."""
    env = os.environ.get("SPEECH_DATAPREP_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "speech-dataprep"


def file_facts(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Cheap facts that change whenever a Parquet file's bytes do: size, mtime (ns) and the
    SHA-256 of its footer (schema, metadata, row-group offsets and statistics)."""
    try:
        st = os.stat(path)
        with open(path, "rb") as fh:
            if st.st_size < 12:
                raise ManifestError(f"{path}: not a Parquet file ({st.st_size} bytes)")
            fh.seek(st.st_size - 8)
            tail = fh.read(8)
            footer_len = int.from_bytes(tail[:4], "little")
            if tail[4:] != b"PAR1" or footer_len > st.st_size - 12:
                raise ManifestError(f"{path}: not a Parquet file (no footer)")
            fh.seek(st.st_size - 8 - footer_len)
            footer = hashlib.sha256(fh.read(footer_len + 8)).hexdigest()
    except FileNotFoundError:
        raise ManifestError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ManifestError(f"{path}: is a directory, not a Parquet file") from None
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "footer_sha256": footer}


_VERIFIED: dict[str, str] = {}  # facts -> hash, this process, for the default cache directory only


def _facts_key(facts: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(dict(facts), sort_keys=True).encode()).hexdigest()[:32]


def _verified_entry(facts: Mapping[str, Any], cache_dir: str | os.PathLike[str] | None) -> Path:
    store = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return store / "content-hash" / f"{_facts_key(facts)}.json"


def remember_verified(path: str | os.PathLike[str], content_hash: str,
                      cache_dir: str | os.PathLike[str] | None = None) -> None:
    """Record that the file now at ``path`` (by its facts, :func:`file_facts`) holds rows hashing
    to ``content_hash``: the writer knows it, so the first check of a file we wrote is free.
    A rename keeps the facts; any rewrite changes them. Written under ``cache_dir`` only
    (None: :func:`default_cache_dir`, resolved now, and this process's memory)."""
    facts = file_facts(path)
    if cache_dir is None:
        _VERIFIED[_facts_key(facts)] = content_hash
    with contextlib.suppress(OSError):  # a read-only cache only costs a recomputation later
        write_json({"facts": facts, "content_hash": content_hash}, _verified_entry(facts, cache_dir))


def manifest_hash(path: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None) -> str:
    """The content hash of a file we wrote, VERIFIED: the recorded hash is trusted only when the
    rows hash to it. A verification is remembered by the file's facts (size, mtime, footer
    SHA-256; :func:`file_facts`) under ``<cache_dir>/content-hash/`` (writers record theirs), so
    an unchanged file is checked in about a millisecond and a changed one is recomputed
    (:func:`recompute_hash`). A file whose rows no longer match its recorded hash (edited with
    its metadata kept) is refused. ``cache_dir`` None: :func:`default_cache_dir` (resolved at
    each call) plus an in-process memo; a given ``cache_dir`` is the only place read or
    written (no memo shared with other directories)."""
    recorded = recorded_hash(path)
    if not recorded:
        raise ManifestError(f"{path}: no content hash in its metadata (write it with `dataprep compile`)")
    facts = file_facts(path)
    key = _facts_key(facts)
    memo = _VERIFIED if cache_dir is None else {}
    if memo.get(key) == recorded:
        return recorded
    entry = _verified_entry(facts, cache_dir)
    if _cached_verification(entry, facts, recorded):
        memo[key] = recorded
        return recorded
    # ranks of one machine opening the same copied manifest: one recomputes, the others wait
    # for its verification instead of hashing every row again
    with file_lock(entry.parent.with_name("content-hash-locks") / f"{entry.stem}.lock"):
        if _cached_verification(entry, facts, recorded):
            memo[key] = recorded
            return recorded
        got = recompute_hash(path)
        if got != recorded:
            raise ManifestError(_rows_differ(path, recorded, got))
        remember_verified(path, got, cache_dir)
    return got


def _cached_verification(entry: Path, facts: Mapping[str, Any], recorded: str) -> bool:
    """``entry`` says these facts were verified to hash to ``recorded``."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        cached = json.loads(entry.read_text(encoding="utf-8"))
        return bool(cached.get("facts") == facts and cached.get("content_hash") == recorded)
    return False


@contextlib.contextmanager
def file_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """Exclusive advisory lock on ``path`` (POSIX ``flock``), created with its folder. Where
    there is no lock (not POSIX, a read-only folder) it does nothing: the callers publish
    atomically anyway, so a lost lock only costs duplicated work."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fh = open(path, "a+b")
    except OSError:
        yield
        return
    with fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file's bytes, as hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def require_manifest_hash(path: str | os.PathLike[str], expected: str, what: str) -> None:
    """Refuse ``path`` unless its content hash is ``expected`` (``what`` names the owner of
    the expectation in the one-line error, e.g. "the plan's manifest")."""
    got = manifest_hash(path)
    if got != expected:
        raise ManifestError(f"{path}: content hash {got[:12]}... differs from {what} ({expected[:12]}...)")


def read_corpus_codes(path: str | os.PathLike[str], names: Sequence[str] | None = None
                      ) -> tuple[npt.NDArray[np.int32], list[str]] | None:
    """The ``corpus`` column of a manifest as codes (int32, 4 bytes a row: read dictionary-
    encoded, never as strings) and the names they index; None when the manifest has no corpus.

    ``names`` given: codes index them, -1 for a corpus not among them; else the corpora in
    order of first appearance. A row without a corpus is a one-line error.
    """
    known = list(names) if names is not None else []
    parts = _corpus_code_parts(path, known, grow=names is None)
    if parts is None:
        return None
    got = list(parts)
    codes = np.concatenate(got) if got else np.empty(0, np.int32)
    return codes, known


def corpus_names(path: str | os.PathLike[str]) -> list[str] | None:
    """The corpora of a manifest in order of first appearance (the names
    :func:`read_corpus_codes` returns), read in blocks without keeping the codes; None when
    the manifest has no corpus."""
    known: list[str] = []
    parts = _corpus_code_parts(path, known, grow=True)
    if parts is None:
        return None
    for _ in parts:
        pass
    return known


def iter_corpus_codes(path: str | os.PathLike[str], names: Sequence[str], rows: int
                      ) -> Iterator[npt.NDArray[np.int32]] | None:
    """The codes of :func:`read_corpus_codes` (indexing ``names``, -1 for another corpus) in
    consecutive blocks of ``rows`` rows (the last shorter): memory about one block, whatever the
    manifest's size. None when the manifest has no corpus."""
    parts = _corpus_code_parts(path, list(names), grow=False)
    if parts is None:
        return None

    def blocks(parts: Iterator[npt.NDArray[np.int32]]) -> Iterator[npt.NDArray[np.int32]]:
        pending: list[npt.NDArray[np.int32]] = []
        have = 0
        for part in parts:
            while part.size:
                take = min(rows - have, part.size)
                pending.append(part[:take])
                have += take
                part = part[take:]
                if have == rows:
                    yield np.concatenate(pending)
                    pending, have = [], 0
        if have:
            yield np.concatenate(pending)

    return blocks(parts)


def _corpus_code_parts(path: str | os.PathLike[str], known: list[str], *, grow: bool
                       ) -> Iterator[npt.NDArray[np.int32]] | None:
    """Corpus codes of consecutive Parquet batches (indexing ``known``, -1 for another corpus;
    ``grow``: a new corpus is appended to ``known`` instead); None without a corpus column."""
    check_manifest_file(path)
    if CORPUS_COLUMN not in pq.read_schema(path).names:
        return None
    index = {n: i for i, n in enumerate(known)}

    def parts() -> Iterator[npt.NDArray[np.int32]]:
        file = pq.ParquetFile(path, read_dictionary=[CORPUS_COLUMN], pre_buffer=False, buffer_size=1 << 20)
        for batch in file.iter_batches(batch_size=1 << 20, columns=[CORPUS_COLUMN], use_threads=False):
            chunk = batch.column(0)
            if chunk.null_count:
                raise ManifestError(f"{path}: corpus: a row has no corpus")
            values = chunk.dictionary.to_pylist()
            if grow:
                for v in values:
                    if v not in index:
                        index[v] = len(known)
                        known.append(v)
            lut = np.asarray([index.get(v, -1) for v in values] or [-1], dtype=np.int32)
            yield lut[chunk.indices.to_numpy(zero_copy_only=False)]

    return parts()
