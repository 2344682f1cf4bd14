"""Parted compile: per-file work split by a stable hash of the id into parts, resumable, merged exactly.

Each part reads every source, keeps the rows whose id hashes to it, runs
:func:`dataprep.compile.validate.process_chunk` on them and rejects duplicate ids locally (all
copies of an id fall in one part). Parts keep the global input row ``__row``; the merge streams
them in that order (:func:`merged_tables`) into a manifest byte-identical to one compile. Memory
is bounded (:class:`dataprep.compile.spool.AcceptedSpool`). Part of a row:
``fmix64(fnv1a64(utf8(id))) mod num_parts``, computed with numpy over the Arrow string buffers;
a row without an id goes to ``__row mod num_parts``. Files of part ``i`` of ``n``:
``part-0000i-of-0000n.parquet``, ``.rejects.parquet`` and ``.done.json`` (the marker, written
last: fingerprint, counts, part hashes). A finished part is skipped; a folder holding markers
of another fingerprint is refused in one line. ``--num-shards`` / ``--shard-index`` are hidden
aliases of ``--num-parts`` / ``--part-index``.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dataprep import __version__
from dataprep.compile.audio_checks import unchecked_audio
from dataprep.compile.single import CompileSummary
from dataprep.compile.spool import AcceptedSpool, finish_spool, open_parquet, spool_chunks, spool_folder
from dataprep.compile.validate import (
    PART_REJECTS_SCHEMA,
    PART_SCHEMA,
    ROW,
    CompileOptions,
    compile_provenance,
    expand_sources,
    iter_rows,
)
from dataprep.tokenize import Tokenizers
from manifests import storage
from manifests.arrow_views import string_buffers
from manifests.atomic_files import atomic_path
from manifests.errors import DataprepError
from manifests.manifest_write import ROW_GROUP_ROWS, reasons_count, write_parquet_stream, write_rejects
from manifests.outputs import publish_together
from manifests.parted_run import PartedRun, check_split, part_name
from manifests.rebatch import rebatch
from manifests.schema import manifest_schema, trim_containers

#: the part hash, recorded in every fingerprint so a change of scheme is never mixed
PART_HASH = "fmix64(fnv1a64(utf8(id))) mod n"
#: testing hook: seconds to sleep inside a part's atomic write (before the rename)
WRITE_DELAY_ENV = "DATAPREP_PART_WRITE_DELAY"

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


# --------------------------------------------------------------------------- hashing

def fnv1a64(strings: pa.Array | pa.ChunkedArray | Sequence[str | None]) -> npt.NDArray[np.uint64]:
    """FNV-1a 64-bit hash of each string's UTF-8 bytes (null -> the hash of ``b""``).

    Vectorized over the Arrow buffers: one numpy step per byte position, not per string.
    """
    arr = strings if isinstance(strings, (pa.Array, pa.ChunkedArray)) else pa.array(list(strings), pa.large_string())
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    arr = arr.cast(pa.large_string())
    n = len(arr)
    h = np.full(n, _FNV_OFFSET, dtype=np.uint64)
    if n == 0:
        return h
    arr = arr.fill_null("")
    offsets, data = string_buffers(arr)
    starts, lengths = offsets[:-1], np.diff(offsets)
    order = np.argsort(-lengths, kind="stable")  # longest first: active rows are a prefix
    starts, lengths = starts[order], lengths[order]
    hs = h[order]
    with np.errstate(over="ignore"):
        for j in range(int(lengths[0]) if n else 0):
            k = int(np.searchsorted(-lengths, -j, side="left"))  # rows with length > j
            hs[:k] = (hs[:k] ^ data[starts[:k] + j].astype(np.uint64)) * _FNV_PRIME
    h[order] = hs
    return h


def fmix64(h: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """MurmurHash3's 64-bit finalizer (a bijection that spreads every input bit)."""
    with np.errstate(over="ignore"):
        h = h ^ (h >> np.uint64(33))
        h = h * np.uint64(0xFF51AFD7ED558CCD)
        h = h ^ (h >> np.uint64(33))
        h = h * np.uint64(0xC4CEB93FE53B94CF)
        return h ^ (h >> np.uint64(33))


def part_of(ids: pl.Series, rows: pl.Series, num_parts: int) -> npt.NDArray[np.int64]:
    """Part index of each row: by the stable hash of ``ids``; by ``rows`` where the id is null."""
    h = fmix64(fnv1a64(ids.cast(pl.String).to_arrow()))
    part = (h % np.uint64(num_parts)).astype(np.int64)
    null = ids.is_null().to_numpy()
    if null.any():
        part[null] = rows.to_numpy()[null] % num_parts
    return part


# --------------------------------------------------------------------------- fingerprints and names

@dataclass(frozen=True)
class PartPaths:
    part: Path
    rejects: Path
    marker: Path

    @classmethod
    def of(cls, folder: str | os.PathLike[str], part_index: int, num_parts: int) -> PartPaths:
        stem = Path(folder) / part_name(part_index, num_parts)
        return cls(stem.with_name(stem.name + ".parquet"), stem.with_name(stem.name + ".rejects.parquet"),
                   stem.with_name(stem.name + ".done.json"))


def fingerprint(provenance: dict[str, Any], opts: CompileOptions, num_parts: int) -> dict[str, Any]:
    """Everything that changes a part's output: inputs' and tokenizers' hashes, tool version,
    number of parts, the part hash and the output-changing options."""
    o = asdict(opts)
    for runtime_only in ("probe_threads", "tokenizer_threads", "chunk_rows"):
        o.pop(runtime_only)
    o["tarred_audio"] = list(o["tarred_audio"])  # as its JSON reads back (a marker's copy compares equal)
    if o.get("prompt_format") is None:  # unset: the fingerprint of runs that predate the option
        o.pop("prompt_format", None)
    return {"tool": f"speech-dataprep {__version__}", "num_shards": num_parts, "shard_hash": PART_HASH,
            "sources": provenance["sources"], "tokenizers": provenance["tokenizers"], "options": o}


def _write_part(tables: Iterable[pa.Table], path: Path, schema: pa.Schema, kind: str) -> int:
    """Write a part (row groups of :data:`ROW_GROUP_ROWS`), atomically; returns its rows."""
    full = schema.with_metadata({b"speech_dataprep.kind": kind.encode()})
    rows = 0
    with atomic_path(path) as tmp:
        with pq.ParquetWriter(tmp, full, compression="zstd") as writer:
            for group in rebatch(tables, ROW_GROUP_ROWS):
                writer.write_table(group.cast(full))
                rows += group.num_rows
        delay = float(os.environ.get(WRITE_DELAY_ENV, "0") or 0)
        if delay:
            time.sleep(delay)
    return rows


def _remove_stale_tmp(paths: PartPaths) -> None:
    """Temporary files and spool folders a killed run of this part left (``atomic_path`` names
    them ``.<name>.*.tmp``, the spool ``.<name>.*.spool``)."""
    for p in (paths.part, paths.rejects, paths.marker):
        for tmp in p.parent.glob(f".{p.name}.*.tmp"):
            tmp.unlink(missing_ok=True)
        for spool in p.parent.glob(f".{p.name}.*.spool"):
            shutil.rmtree(spool, ignore_errors=True)


def resolve_part(
    num_parts: int | None, part_index: int | None, env: Mapping[str, str]
) -> tuple[int, int] | None:
    """(num_parts, part_index) of a one-part run, or None for a run of all parts here.

    ``--part-index`` without ``--num-parts`` takes ``$SLURM_ARRAY_TASK_COUNT``; ``--num-parts``
    without ``--part-index`` takes ``$SLURM_ARRAY_TASK_ID - $SLURM_ARRAY_TASK_MIN`` inside a
    Slurm array job (so ``--array=1-64`` works too), else means "all parts here".
    """
    check_split(num_parts, part_index)

    def _int(name: str) -> int:
        try:
            return int(env[name])
        except ValueError:
            raise DataprepError(f"${name}={env[name]!r} is not an integer") from None

    if part_index is None:
        if num_parts is None or "SLURM_ARRAY_TASK_ID" not in env:
            return None
        part_index = _int("SLURM_ARRAY_TASK_ID") - (_int("SLURM_ARRAY_TASK_MIN") if "SLURM_ARRAY_TASK_MIN" in env else 0)
    if num_parts is None:
        if "SLURM_ARRAY_TASK_COUNT" not in env:
            raise DataprepError("--part-index needs --num-parts (or $SLURM_ARRAY_TASK_COUNT)")
        num_parts = _int("SLURM_ARRAY_TASK_COUNT")
    check_split(num_parts, part_index)
    return num_parts, part_index


# --------------------------------------------------------------------------- one part

def run_part(
    sources: Sequence[str | os.PathLike[str]],
    tokenizer_specs: Sequence[str],
    opts: CompileOptions,
    num_parts: int,
    part_index: int,
    folder: str | os.PathLike[str],
    *,
    on_chunk: Callable[[int], None] | None = None,
    on_probe: Callable[[int], None] | None = None,
) -> CompileSummary:
    """Compile the rows of part ``part_index`` of ``num_parts`` into ``folder``; skip it if done.

    Invariant: the part's rows in = its kept + rejected rows (checked).
    """
    check_split(num_parts, part_index)
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise DataprepError(f"{folder}: exists and is not a folder (a parted compile writes parts into a folder)")
    for src in expand_sources(sources):
        if not (storage.exists_or_folder(src) if storage.is_url(src) else Path(src).exists()):
            raise DataprepError(f"{src}: no such file or directory")
    tokenizers = Tokenizers.from_specs(tokenizer_specs)
    provenance = compile_provenance(sources, tokenizers, opts)
    run = PartedRun(folder, fingerprint(provenance, opts, num_parts), num_parts)
    run.check_folder()
    paths = PartPaths.of(folder, part_index, num_parts)
    if run.is_done(part_index, (paths.part, paths.rejects)):
        m = run.marker(part_index)
        assert m is not None
        return _part_summary(m["rows_in"], m["rows_kept"], provenance, num_parts, part_index, skipped=True)
    folder.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(paths)
    run.forget(part_index)

    def mine() -> Iterator[tuple[pl.DataFrame, int]]:
        for chunk in iter_rows(sources, opts):
            yield chunk.filter(pl.Series(part_of(chunk["id"], chunk[ROW], num_parts) == part_index)), chunk.height

    with spool_folder(paths.part) as spool_dir:
        spool = AcceptedSpool(spool_dir)
        try:
            rows_in, rejected = spool_chunks(mine(), spool, tokenizers, opts, on_chunk=on_chunk, on_probe=on_probe)
        finally:
            spool.close()
        drop, rejects = finish_spool(spool, rows_in, rejected, opts, what=f"part {part_index}")
        kept = _write_part(spool.tables(drop, keep_row=True), paths.part, PART_SCHEMA, "manifest_part")
    _write_part([rejects.to_arrow()], paths.rejects, PART_REJECTS_SCHEMA, "rejects_part")
    run.mark_done(part_index, (paths.part, paths.rejects), provenance=provenance, rows_in=rows_in, rows_kept=kept,
                  rows_rejected=rejects.height, containers=spool.containers, corpus=spool.corpus,
                  modality=spool.modality)
    return _part_summary(rows_in, kept, provenance, num_parts, part_index, skipped=False)


def _part_summary(rows_in: int, rows_kept: int, provenance: dict[str, Any], num_parts: int, part_index: int,
                  *, skipped: bool) -> CompileSummary:
    """A one-part run's summary: counts only (no manifest written, so no hash, hours or reasons)."""
    return CompileSummary(rows_in=int(rows_in), rows_kept=int(rows_kept), hours=0.0, reasons={},
                          provenance=provenance, content_hash="", num_parts=num_parts, part_index=part_index,
                          skipped=skipped)


# --------------------------------------------------------------------------- merge

@dataclass
class MergeResult:
    manifest: pl.DataFrame
    rejects: pl.DataFrame
    rows_in: int
    reasons: dict[str, int]
    provenance: dict[str, Any]
    num_parts: int


def _complete_parts(folder: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], list[PartPaths]]:
    """Markers (by part index) and paths of a complete, consistent set of parts
    (:meth:`PartedRun.complete`: refuses missing parts, mixed runs and changed files)."""
    markers = PartedRun.complete(folder, what="compile parts")
    n = markers[0]["num_parts"]
    return markers, [PartPaths.of(folder, m["part_index"], n) for m in markers]


def load_parts(folder: str | os.PathLike[str]) -> MergeResult:
    """Read a complete set of parts into memory; the manifest and rejects in global input order
    (small sets and tests; :func:`merge_parts` streams). Refuses what :func:`merge_parts` refuses."""
    markers, all_paths = _complete_parts(folder)
    parts = [pq.read_table(p.part).cast(PART_SCHEMA) for p in all_paths]
    rejects = [pq.read_table(p.rejects).cast(PART_REJECTS_SCHEMA) for p in all_paths]
    manifest, rej = _in_row_order(parts, PART_SCHEMA), _in_row_order(rejects, PART_REJECTS_SCHEMA)
    manifest, rej = trim_containers(manifest), trim_containers(rej)
    rows_in = sum(int(m["rows_in"]) for m in markers)
    if manifest.height + rej.height != rows_in:
        raise DataprepError(f"{folder}: parts hold {manifest.height + rej.height} rows, markers say {rows_in}")
    reasons = reasons_count(rej)
    return MergeResult(manifest, rej, rows_in, reasons, dict(markers[0]["provenance"]), len(markers))


def merged_tables(parts: Sequence[str | os.PathLike[str]], *, window: int = 1 << 17,
                  batch_rows: int = 1 << 16) -> Iterator[pa.Table]:
    """The rows of ``parts`` (each sorted by ``__row``) merged in ``__row`` order, without ``__row``.

    A k-way merge by windows of ``window`` input row numbers: memory about one window plus one
    batch per part, whatever the total.
    """
    readers = [open_parquet(p).iter_batches(batch_size=batch_rows) for p in parts]
    buffers: list[pa.Table | None] = [None] * len(readers)
    done = [False] * len(readers)
    lo = 0
    while True:
        hi = lo + window
        pieces = []
        for i, reader in enumerate(readers):
            while not done[i] and (buffers[i] is None or buffers[i].num_rows == 0  # type: ignore[union-attr]
                                   or buffers[i][ROW][-1].as_py() < hi):  # type: ignore[index]
                try:
                    batch = pa.Table.from_batches([next(reader)])
                except StopIteration:
                    done[i] = True
                    break
                buffers[i] = batch if buffers[i] is None else pa.concat_tables([buffers[i], batch])  # type: ignore[list-item]
            buf = buffers[i]
            if buf is not None and buf.num_rows:
                cut = int(np.searchsorted(buf[ROW].to_numpy(), hi, side="left"))
                pieces.append(buf.slice(0, cut))
                buffers[i] = buf.slice(cut)
        table = pa.concat_tables(pieces) if pieces else None
        if table is not None and table.num_rows:
            yield table.take(pc.sort_indices(table[ROW])).drop_columns([ROW])
        if all(done) and all(b is None or b.num_rows == 0 for b in buffers):
            return
        lo = hi


def _in_row_order(tables: list[pa.Table], schema: pa.Schema) -> pl.DataFrame:
    """Concatenate parts and sort by ``__row`` (the content hash is of values, so any layout does)."""
    table = pa.concat_tables([t.replace_schema_metadata(None) for t in tables]) if tables else schema.empty_table()
    table = table.take(pc.sort_indices(table[ROW])).drop_columns([ROW]).combine_chunks()
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame


def merge_parts(
    folder: str | os.PathLike[str], output: str | os.PathLike[str], rejects: str | os.PathLike[str]
) -> CompileSummary:
    """Merge a parts folder into the manifest and rejects a single-machine compile writes
    (byte-identical, same provenance), streaming the manifest (bounded memory; rejects in memory)."""
    markers, all_paths = _complete_parts(folder)
    provenance = dict(markers[0]["provenance"])
    rows_in = sum(int(m["rows_in"]) for m in markers)
    kept = sum(int(m["rows_kept"]) for m in markers)
    rej = _in_row_order([pq.read_table(p.rejects).cast(PART_REJECTS_SCHEMA) for p in all_paths],
                        PART_REJECTS_SCHEMA)
    if kept + rej.height != rows_in:
        raise DataprepError(f"{folder}: parts hold {kept + rej.height} rows, markers say {rows_in}")
    seconds = 0.0
    for p in all_paths:
        for batch in open_parquet(p.part).iter_batches(columns=["duration"]):
            seconds += float(pc.sum(batch.column(0)).as_py() or 0.0)
    parts = [p.part for p in all_paths]
    schema = manifest_schema(any(bool(m.get("containers")) for m in markers),
                             any(bool(m.get("corpus")) for m in markers),
                             any(bool(m.get("modality")) for m in markers))
    with publish_together(output, rejects) as (tmp_out, tmp_rejects):  # visible together or not at all
        written = write_parquet_stream(lambda: (t.select(schema.names) for t in merged_tables(parts)), tmp_out,
                                       schema, "manifest", provenance)
        if written.rows != kept:
            raise DataprepError(f"{folder}: parts hold {written.rows} kept rows, markers say {kept}")
        write_rejects(rej, tmp_rejects, provenance)
    reasons = reasons_count(rej)
    return CompileSummary(rows_in, kept, seconds / 3600, reasons, provenance, written.content_hash,
                          num_parts=len(markers), audio=unchecked_audio(output, str(provenance.get("probe", "auto"))))
