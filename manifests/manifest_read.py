"""Reading compiled manifests: their metadata, whole or in blocks of N rows, their row count.

Every reader first checks the file is a compiled manifest of a schema version this tool
reads (:func:`check_manifest_file`); any decoding error is a one-line :class:`ManifestError`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from manifests.errors import ManifestError
from manifests.rebatch import rebatch
from manifests.schema import META_CONTENT_HASH, META_KIND, META_PROVENANCE, META_SCHEMA_VERSION, SCHEMA_VERSION


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
    read, derive = _columns_to_read(path, columns)
    try:
        df = pl.read_parquet(path, columns=read)
    except (OSError, pl.exceptions.PolarsError, pa.ArrowException) as exc:
        raise ManifestError(f"{path}: rows cannot be read ({str(exc).strip().splitlines()[0][:160]})") from None
    return pl.from_arrow(_derived(df.to_arrow(), columns)) if derive else df  # type: ignore[return-value]


#: columns computed from others when a manifest lacks them: name -> (the columns it needs)
DERIVED = {"tps": ("num_tokens", "duration")}


def _columns_to_read(path: str | os.PathLike[str], columns: list[str] | None) -> tuple[list[str] | None, bool]:
    """The columns to read for ``columns`` (None: all) and whether one is derived
    (:data:`DERIVED`: ``tps`` = ``num_tokens / duration``); a one-line error for a column the
    file lacks and no rule derives."""
    names = set(pq.read_schema(path).names)
    if columns is None:  # every column: the derivable ones the file lacks computed too
        return None, any(c not in names and set(need) <= names for c, need in DERIVED.items())
    derive = [c for c in columns if c not in names and c in DERIVED and set(DERIVED[c]) <= names]
    missing = [c for c in columns if c not in names and c not in derive]
    if missing:
        raise ManifestError(f"{path}: lacks column(s) {', '.join(missing)} (not a manifest `dataprep compile` "
                            "wrote? compile it again)")
    need = [c for d in derive for c in DERIVED[d]]
    return [*(c for c in columns if c not in derive), *(c for c in need if c not in columns)], bool(derive)


def _derived(t: pa.Table, columns: list[str] | None) -> pa.Table:
    """``t`` with the :data:`DERIVED` columns of ``columns`` computed, in ``columns``' order."""
    import pyarrow.compute as pc

    if "tps" not in t.column_names:
        t = t.append_column("tps", pc.divide(pc.cast(t.column("num_tokens"), pa.float64()),
                                             pc.cast(t.column("duration"), pa.float64())))
    return t.select(columns) if columns is not None else t


def iter_manifest(path: str | os.PathLike[str], columns: list[str] | None, rows: int,
                  dictionary: Sequence[str] = ()) -> Iterator[pa.Table]:
    """A compiled manifest's ``columns`` (None: all) in consecutive tables of exactly ``rows`` rows
    (the last shorter), checked as :func:`read_manifest` checks it; memory: one table and one row
    group being decoded, not the file (no pre-buffering of the whole file's column chunks).
    ``dictionary``: string columns read dictionary-encoded (a few distinct values: faster)."""
    check_manifest_file(path)
    read, derive = _columns_to_read(path, columns)
    try:
        pf = pq.ParquetFile(path, pre_buffer=False, read_dictionary=list(dictionary) or None)
        for t in rebatch(pf.iter_batches(batch_size=rows, columns=read), rows):
            yield _derived(t, columns) if derive else t
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
