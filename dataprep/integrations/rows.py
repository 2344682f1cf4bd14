"""Every column of a compiled manifest, memory-mapped, for consumers that build whole records.

The training loader maps only the columns it needs (:class:`dataprep.training.cache.ManifestColumns`);
samplers that hand trainers Lhotse cuts need all of them (languages, task, ``extra``,
sample rate, channels). :class:`ManifestRows` converts the manifest once into an uncompressed
Arrow IPC file (``<cache dir>/<content hash>.rows.v1.arrow``, built in 65,536-row record
batches, so memory stays bounded whatever the corpus size) and maps it; a batch's rows are one
``take``: no Parquet row group is decoded per batch, and opening takes constant time.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from dataprep.training.cache import _file_lock, default_cache_dir
from manifests.errors import DataprepError
from manifests.io import current_umask, manifest_hash

#: layout version of the row cache files
ROWS_CACHE_VERSION = 1
#: rows per record batch of the cache (bounded memory while building)
ROWS_PER_BATCH = 65_536


class ManifestRows:
    """All columns of a compiled manifest, mapped from the row cache (see the module docstring)."""

    def __init__(self, table: pa.Table, source: str) -> None:
        self.table = table
        self.source = source
        self.num_rows = table.num_rows

    @classmethod
    def open(cls, manifest: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None) -> ManifestRows:
        """Open (building on first use, under a file lock) the mapped rows of ``manifest``."""
        digest = manifest_hash(manifest)
        if not digest:
            raise DataprepError(f"{manifest}: no content hash in its metadata (write it with `dataprep compile`)")
        cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        path = cache / f"{digest}.rows.v{ROWS_CACHE_VERSION}.arrow"
        num_rows = pq.ParquetFile(manifest).metadata.num_rows
        table = _open(path, num_rows)
        if table is None:
            cache.mkdir(parents=True, exist_ok=True)
            with _file_lock(path.with_name(path.name + ".lock")):
                table = _open(path, num_rows)
                if table is None:
                    build_rows_cache(manifest, path)
                    table = _open(path, num_rows)
            if table is None:
                raise DataprepError(f"{path}: the row cache of {manifest} cannot be read back")
        return cls(table, str(manifest))

    def take(self, rows: npt.ArrayLike) -> pa.Table:
        """Manifest rows ``rows`` (row numbers), in that order, as one table."""
        idx = np.asarray(rows, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_rows):
            raise DataprepError(f"{self.source}: row {int(idx.max())} asked for, the manifest has {self.num_rows} rows "
                                "(plan made from another manifest?)")
        return self.table.take(pa.array(idx))


def build_rows_cache(manifest: str | os.PathLike[str], path: Path) -> None:
    """Write the row cache of ``manifest`` to ``path`` atomically, one record batch at a time."""
    try:
        pf = pq.ParquetFile(manifest)
    except (OSError, pa.ArrowInvalid) as exc:
        raise DataprepError(f"{manifest}: not a readable Parquet file ({exc})") from None
    schema = pf.schema_arrow.remove_metadata()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            for batch in pf.iter_batches(batch_size=ROWS_PER_BATCH):
                writer.write_batch(batch)
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _open(path: Path, num_rows: int) -> pa.Table | None:
    """The mapped table, or ``None`` when the file is missing or not a whole cache."""
    try:
        with pa.memory_map(str(path), "r") as source:
            table = pa.ipc.open_file(source).read_all()
    except (OSError, pa.ArrowInvalid):
        return None
    return table if table.num_rows == num_rows else None
