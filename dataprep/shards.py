"""Sharded compile: per-file work split by a stable hash of the id, resumable, merged exactly.

Each shard reads every source (reading is cheap next to header reads and tokenizing), keeps
the rows whose id hashes to it, runs :func:`dataprep.compile.process_chunk` on them and
rejects duplicate ids locally: all copies of an id fall in one shard, so "the first in
global input order wins" holds per shard. Parts keep the global input row ``__row``; the
merge sorts by it and writes the manifest byte-identical to a single-machine compile.

Shard of a row: ``fmix64(fnv1a64(utf8(id))) mod num_shards`` (FNV-1a 64-bit over the id's
UTF-8 bytes, then MurmurHash3's 64-bit finalizer to mix the low bits), computed with numpy
over the Arrow string buffers: stable across Python, polars and machines. A row without an
id (a malformed line, already a reject) goes to ``__row mod num_shards``.

Files in a parts folder, for shard ``i`` of ``n``::

    part-0000i-of-0000n.parquet          accepted rows (manifest columns + __row)
    part-0000i-of-0000n.rejects.parquet  rejected rows (rejects columns + __row)
    part-0000i-of-0000n.done.json        completion marker: fingerprint, counts, part hashes

Parts are written atomically and the marker last, so a killed shard leaves no marker and
the re-run redoes it; a finished shard (marker + parts with their recorded hashes) is skipped.
A folder holding markers of a different fingerprint (other inputs, tokenizer, options,
tool version or number of shards) is refused with a one-line error.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
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
from dataprep.compile import _ROW, CompileOptions, assemble, compile_provenance, iter_rows, process_chunk
from dataprep.tokenize import Tokenizers
from manifests.errors import DataprepError
from manifests.io import atomic_path, file_sha256, write_json, write_manifest, write_rejects
from manifests.schema import MANIFEST_SCHEMA, REJECTS_SCHEMA

MARKER_VERSION = 1
#: the shard hash, recorded in every fingerprint so a change of scheme is never mixed
SHARD_HASH = "fmix64(fnv1a64(utf8(id))) mod n"
#: testing hook: seconds to sleep inside a part's atomic write (before the rename)
WRITE_DELAY_ENV = "DATAPREP_SHARD_WRITE_DELAY"

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_PART_SCHEMA = pa.schema([*MANIFEST_SCHEMA, pa.field(_ROW, pa.int64(), nullable=False)])
_PART_REJECTS_SCHEMA = pa.schema([*REJECTS_SCHEMA, pa.field(_ROW, pa.int64(), nullable=False)])


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
    _, offsets_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64)[arr.offset: arr.offset + n + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
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


def shard_of(ids: pl.Series, rows: pl.Series, num_shards: int) -> npt.NDArray[np.int64]:
    """Shard index of each row: by the stable hash of ``ids``; by ``rows`` where the id is null."""
    h = fmix64(fnv1a64(ids.cast(pl.String).to_arrow()))
    shard = (h % np.uint64(num_shards)).astype(np.int64)
    null = ids.is_null().to_numpy()
    if null.any():
        shard[null] = rows.to_numpy()[null] % num_shards
    return shard


# --------------------------------------------------------------------------- fingerprints and names

def part_name(shard_index: int, num_shards: int) -> str:
    """``part-00003-of-00064`` (the stem shared by a shard's part, rejects and marker)."""
    return f"part-{shard_index:05d}-of-{num_shards:05d}"


@dataclass(frozen=True)
class ShardPaths:
    part: Path
    rejects: Path
    marker: Path

    @classmethod
    def of(cls, folder: str | os.PathLike[str], shard_index: int, num_shards: int) -> ShardPaths:
        stem = Path(folder) / part_name(shard_index, num_shards)
        return cls(stem.with_name(stem.name + ".parquet"), stem.with_name(stem.name + ".rejects.parquet"),
                   stem.with_name(stem.name + ".done.json"))


def fingerprint(provenance: dict[str, Any], opts: CompileOptions, num_shards: int) -> dict[str, Any]:
    """Everything that changes a shard's output: inputs' and tokenizers' hashes, tool version,
    number of shards, the shard hash and the output-changing options."""
    o = asdict(opts)
    for runtime_only in ("probe_threads", "tokenizer_threads", "chunk_rows"):
        o.pop(runtime_only)
    return {"tool": f"speech-dataprep {__version__}", "num_shards": num_shards, "shard_hash": SHARD_HASH,
            "sources": provenance["sources"], "tokenizers": provenance["tokenizers"], "options": o}


def fingerprint_id(fp: dict[str, Any]) -> str:
    """SHA-256 of the fingerprint's canonical JSON."""
    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()


def _read_marker(path: Path) -> dict[str, Any]:
    try:
        marker = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(marker, dict) or marker.get("version") != MARKER_VERSION:
            raise ValueError("unknown marker version")
        return marker
    except (OSError, ValueError) as exc:
        raise DataprepError(f"{path}: not a shard completion marker ({exc})") from None


def _markers(folder: Path) -> list[Path]:
    return sorted(folder.glob("part-*-of-*.done.json")) if folder.is_dir() else []


def _differs(a: dict[str, Any], b: dict[str, Any]) -> str:
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return ", ".join(keys) or "fingerprint"


def check_folder(folder: Path, fp: dict[str, Any]) -> None:
    """Refuse a parts folder holding a marker of another fingerprint (one line naming what changed)."""
    fid = fingerprint_id(fp)
    for path in _markers(folder):
        marker = _read_marker(path)
        if marker.get("fingerprint_id") != fid:
            raise DataprepError(
                f"{path}: written by a different run ({_differs(marker.get('fingerprint', {}), fp)} changed); "
                "use a new output folder or delete this one"
            )


def _is_done(paths: ShardPaths, fid: str) -> bool:
    if not paths.marker.exists():
        return False
    marker = _read_marker(paths.marker)
    files = marker.get("files", {})
    return marker.get("fingerprint_id") == fid and all(
        p.exists() and file_sha256(p) == files.get(p.name) for p in (paths.part, paths.rejects)
    )


def _write_part(df: pl.DataFrame, path: Path, schema: pa.Schema, kind: str) -> None:
    table = df.to_arrow().cast(schema).replace_schema_metadata({b"speech_dataprep.kind": kind.encode()})
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")
        delay = float(os.environ.get(WRITE_DELAY_ENV, "0") or 0)
        if delay:
            time.sleep(delay)


def _remove_stale_tmp(paths: ShardPaths) -> None:
    """Temporary files a killed run of this shard left (``atomic_path`` names them ``.<name>.*.tmp``)."""
    for p in (paths.part, paths.rejects, paths.marker):
        for tmp in p.parent.glob(f".{p.name}.*.tmp"):
            tmp.unlink(missing_ok=True)


def resolve_shard(
    num_shards: int | None, shard_index: int | None, env: Mapping[str, str]
) -> tuple[int, int] | None:
    """(num_shards, shard_index) of a one-shard run, or None for a run of all shards here.

    ``--shard-index`` without ``--num-shards`` takes ``$SLURM_ARRAY_TASK_COUNT``; ``--num-shards``
    without ``--shard-index`` takes ``$SLURM_ARRAY_TASK_ID - $SLURM_ARRAY_TASK_MIN`` inside a
    Slurm array job (so ``--array=1-64`` works too), else means "all shards here".
    """
    def _int(name: str) -> int:
        try:
            return int(env[name])
        except ValueError:
            raise DataprepError(f"${name}={env[name]!r} is not an integer") from None

    if shard_index is None:
        if num_shards is None or "SLURM_ARRAY_TASK_ID" not in env:
            return None
        shard_index = _int("SLURM_ARRAY_TASK_ID") - (_int("SLURM_ARRAY_TASK_MIN") if "SLURM_ARRAY_TASK_MIN" in env else 0)
    if num_shards is None:
        if "SLURM_ARRAY_TASK_COUNT" not in env:
            raise DataprepError("--shard-index needs --num-shards (or $SLURM_ARRAY_TASK_COUNT)")
        num_shards = _int("SLURM_ARRAY_TASK_COUNT")
    if num_shards < 1 or not 0 <= shard_index < num_shards:
        raise DataprepError(f"shard index {shard_index} is not in [0, {num_shards}) (--num-shards {num_shards})")
    return num_shards, shard_index


# --------------------------------------------------------------------------- one shard

@dataclass
class ShardResult:
    shard_index: int
    num_shards: int
    skipped: bool
    rows_in: int
    rows_kept: int
    rows_rejected: int


def run_shard(
    sources: Sequence[str | os.PathLike[str]],
    tokenizer_specs: Sequence[str],
    opts: CompileOptions,
    num_shards: int,
    shard_index: int,
    folder: str | os.PathLike[str],
    *,
    on_chunk: Callable[[int], None] | None = None,
    on_probe: Callable[[int], None] | None = None,
) -> ShardResult:
    """Compile the rows of shard ``shard_index`` of ``num_shards`` into ``folder``; skip it if done.

    Invariant: the shard's rows in = its kept + rejected rows (checked).
    """
    if num_shards < 1 or not 0 <= shard_index < num_shards:
        raise DataprepError(f"--shard-index {shard_index} is not in [0, {num_shards}) (--num-shards {num_shards})")
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise DataprepError(f"{folder}: exists and is not a folder (a sharded compile writes parts into a folder)")
    for src in sources:
        if not Path(src).exists():
            raise DataprepError(f"{src}: no such file or directory")
    tokenizers = Tokenizers.from_specs(tokenizer_specs)
    provenance = compile_provenance(sources, tokenizers, opts)
    fp = fingerprint(provenance, opts, num_shards)
    fid = fingerprint_id(fp)
    check_folder(folder, fp)
    paths = ShardPaths.of(folder, shard_index, num_shards)
    if _is_done(paths, fid):
        m = _read_marker(paths.marker)
        return ShardResult(shard_index, num_shards, True, m["rows_in"], m["rows_kept"], m["rows_rejected"])
    folder.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(paths)
    paths.marker.unlink(missing_ok=True)

    accepted: list[pl.DataFrame] = []
    rejected: list[pl.DataFrame] = []
    rows_in = 0
    for chunk in iter_rows(sources, opts):
        mine = chunk.filter(pl.Series(shard_of(chunk["id"], chunk[_ROW], num_shards) == shard_index))
        rows_in += mine.height
        if mine.height:
            ok, bad = process_chunk(mine, tokenizers, opts, on_probe)
            if opts.strict and bad:
                first = pl.concat(bad, how="vertical_relaxed").sort(_ROW).row(0, named=True)
                raise DataprepError(str(first["detail"]))
            accepted.append(ok)
            rejected.extend(bad)
        if on_chunk:
            on_chunk(chunk.height)
    manifest, rejects = assemble(accepted, rejected, opts, keep_row=True)
    if manifest.height + rejects.height != rows_in:
        raise AssertionError(f"conservation broken in shard {shard_index}: {rows_in} in, "
                             f"{manifest.height} kept, {rejects.height} rejected")
    _write_part(manifest, paths.part, _PART_SCHEMA, "manifest_part")
    _write_part(rejects, paths.rejects, _PART_REJECTS_SCHEMA, "rejects_part")
    write_json({
        "version": MARKER_VERSION,
        "shard_index": shard_index,
        "num_shards": num_shards,
        "fingerprint_id": fid,
        "fingerprint": fp,
        "provenance": provenance,
        "rows_in": rows_in,
        "rows_kept": manifest.height,
        "rows_rejected": rejects.height,
        "files": {p.name: file_sha256(p) for p in (paths.part, paths.rejects)},
    }, paths.marker)
    return ShardResult(shard_index, num_shards, False, rows_in, manifest.height, rejects.height)


# --------------------------------------------------------------------------- merge

@dataclass
class MergeResult:
    manifest: pl.DataFrame
    rejects: pl.DataFrame
    rows_in: int
    reasons: dict[str, int]
    provenance: dict[str, Any]
    num_shards: int


def load_parts(folder: str | os.PathLike[str]) -> MergeResult:
    """Read a complete set of parts; the manifest and rejects in global input order.

    Refuses (one line) a folder without markers, a missing shard (named), mixed fingerprints
    and a part whose bytes differ from its marker's record.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise DataprepError(f"{folder}: no such folder of shard parts")
    markers = [_read_marker(p) | {"__path": p} for p in _markers(folder)]
    if not markers:
        raise DataprepError(f"{folder}: no completed shards (no part-*-of-*.done.json)")
    first = markers[0]
    for m in markers[1:]:
        if m["fingerprint_id"] != first["fingerprint_id"]:
            raise DataprepError(f"{folder}: parts from different runs ({m['__path'].name} vs {first['__path'].name}: "
                                f"{_differs(m['fingerprint'], first['fingerprint'])} differ)")
    n = int(first["num_shards"])
    have = {int(m["shard_index"]) for m in markers}
    missing = [i for i in range(n) if i not in have]
    if missing:
        shown = ", ".join(map(str, missing[:20])) + (", ..." if len(missing) > 20 else "")
        raise DataprepError(f"{folder}: {len(missing)} of {n} shards not done: {shown}")
    parts, rejects = [], []
    for m in sorted(markers, key=lambda m: int(m["shard_index"])):
        paths = ShardPaths.of(folder, int(m["shard_index"]), n)
        for p in (paths.part, paths.rejects):
            if not p.exists() or file_sha256(p) != m["files"].get(p.name):
                raise DataprepError(f"{p}: missing or changed since its shard finished; re-run that shard")
        parts.append(pq.read_table(paths.part).cast(_PART_SCHEMA))
        rejects.append(pq.read_table(paths.rejects).cast(_PART_REJECTS_SCHEMA))
    manifest, rej = _in_row_order(parts, _PART_SCHEMA), _in_row_order(rejects, _PART_REJECTS_SCHEMA)
    rows_in = sum(int(m["rows_in"]) for m in markers)
    if manifest.height + rej.height != rows_in:
        raise DataprepError(f"{folder}: parts hold {manifest.height + rej.height} rows, markers say {rows_in}")
    reasons = dict(sorted(rej.group_by("reason").len().iter_rows())) if rej.height else {}
    return MergeResult(manifest, rej, rows_in, reasons, dict(first["provenance"]), n)


def _in_row_order(tables: list[pa.Table], schema: pa.Schema) -> pl.DataFrame:
    """Concatenate parts and sort by ``__row`` in Arrow (its ``take`` leaves null slots empty, so the
    buffers, and with them the content hash, equal those of a single-machine compile)."""
    table = pa.concat_tables([t.replace_schema_metadata(None) for t in tables]) if tables else schema.empty_table()
    table = table.take(pc.sort_indices(table[_ROW])).drop_columns([_ROW]).combine_chunks()
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame


def merge_parts(
    folder: str | os.PathLike[str], output: str | os.PathLike[str], rejects: str | os.PathLike[str]
) -> tuple[MergeResult, str]:
    """Merge a parts folder into the manifest and rejects a single-machine compile writes
    (byte-identical, same provenance). Returns (result, manifest content hash)."""
    result = load_parts(folder)
    content_hash = write_manifest(result.manifest, output, result.provenance)
    write_rejects(result.rejects, rejects, result.provenance)
    return result, content_hash
