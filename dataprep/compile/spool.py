"""Bounded-memory spooling of accepted rows, and the duplicate-id pass over them.

:class:`AcceptedSpool` appends each chunk's accepted rows (manifest columns + ``__row``) to a
local Parquet file, finds repeated ids with DuckDB under a memory limit (it spills to disk) and
streams the rows back in input order without the duplicates. :func:`spool_chunks` runs
:func:`dataprep.compile.validate.process_chunk` over chunks into a spool; :func:`finish_spool`
rejects the duplicates and checks conservation (rows in = kept + rejected). Used by the
streaming single-process compile and by each part of a parted compile.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from dataprep.compile.validate import (
    PART_POLARS_SCHEMA,
    PART_SCHEMA,
    REJECTS_ROW_POLARS_SCHEMA,
    ROW,
    CompileOptions,
    process_chunk,
    reject_duplicates,
    stop_if_strict,
)
from dataprep.tokenize import Tokenizers
from manifests.atomic_files import glob_escape, sweep_stale_temps, temp_prefix
from manifests.errors import DataprepError
from manifests.schema import conform, has_containers, has_corpus, has_modality, manifest_schema

#: DuckDB's memory limit for the duplicate-id pass (it spills to the spool folder beyond it)
DUPLICATES_MEMORY_LIMIT = "256MB"  # measured: 10M distinct ids in ~4 s, ~320 MiB RSS


class AcceptedSpool:
    """Accepted rows (manifest columns + ``__row``) spooled to one local Parquet file, in input order.

    Memory: one chunk at a time. :meth:`duplicates` finds repeated ids with DuckDB under
    :data:`DUPLICATES_MEMORY_LIMIT`; :meth:`tables` streams the rows back without the duplicates.
    """

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.path = self.folder / "accepted.parquet"
        self._writer: pq.ParquetWriter | None = pq.ParquetWriter(self.path, PART_SCHEMA, compression="lz4")
        self.rows = 0
        self.seconds = 0.0  # total duration of the spooled rows
        self.containers = False  # whether any spooled row is addressed inside a container
        self.corpus = False  # whether any spooled row names its corpus
        self.modality = False  # whether any spooled row says its modality (a manifest with text rows)
        self._last_row = -1

    def add(self, accepted: pl.DataFrame) -> None:
        """Append a chunk's accepted rows (their ``__row`` after every row added before)."""
        if not accepted.height:
            return
        assert self._writer is not None, "spool already closed"
        frame = conform(accepted, PART_POLARS_SCHEMA).sort(ROW)
        first = int(frame[ROW][0])
        if first <= self._last_row:
            raise AssertionError(f"spool rows out of input order ({first} after {self._last_row})")
        self._last_row = int(frame[ROW][-1])
        self._writer.write_table(frame.to_arrow().cast(PART_SCHEMA))
        self.rows += frame.height
        self.seconds += float(frame["duration"].sum() or 0.0)
        self.containers = self.containers or has_containers(frame)
        self.corpus = self.corpus or has_corpus(frame)
        self.modality = self.modality or has_modality(frame)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def duplicates(self) -> pl.DataFrame:
        """Reject rows (rejects columns + ``__row``, input order) of every id's 2nd, 3rd... copy.

        DuckDB groups the ids out of core; only the rows of repeated ids come back to Python.
        """
        import duckdb

        self.close()
        src = "read_parquet('" + str(self.path).replace("'", "''") + "')"
        con = duckdb.connect()
        try:
            con.execute(f"SET memory_limit = '{DUPLICATES_MEMORY_LIMIT}'")
            con.execute("SET temp_directory = '" + str(self.folder / "duckdb").replace("'", "''") + "'")
            con.execute("SET preserve_insertion_order = false")
            rel = con.sql(f"SELECT * FROM {src} WHERE id IN (SELECT id FROM {src} GROUP BY id HAVING count(*) > 1)")
            table = rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.fetch_arrow_table()
        finally:
            con.close()
        copies = pl.from_arrow(table)
        assert isinstance(copies, pl.DataFrame)
        copies = conform(copies, PART_POLARS_SCHEMA).sort(ROW)
        _, dups = reject_duplicates(copies)
        return conform(dups, REJECTS_ROW_POLARS_SCHEMA)

    def tables(self, drop_rows: npt.NDArray[np.int64] | None = None, *, keep_row: bool = False,
               batch_rows: int = 1 << 16) -> Iterator[pa.Table]:
        """The spooled rows in input order, less those whose ``__row`` is in ``drop_rows``
        (with the container columns only when a spooled row has a container, or ``keep_row``)."""
        self.close()
        schema = PART_SCHEMA if keep_row else manifest_schema(self.containers, self.corpus, self.modality)
        drop = np.sort(np.asarray(drop_rows if drop_rows is not None else [], dtype=np.int64))
        for batch in open_parquet(self.path).iter_batches(batch_size=batch_rows):
            table = pa.Table.from_batches([batch])
            if drop.size:
                rows = table[ROW].to_numpy()
                table = table.filter(pa.array(~np.isin(rows, drop, assume_unique=False)))
            yield table.select(schema.names).cast(schema)


def open_parquet(path: str | os.PathLike[str]) -> pq.ParquetFile:
    """A Parquet file for one streaming pass: no pre-buffering (pyarrow's pre-buffer cache keeps
    every range it read until the file is closed: memory growing with the file)."""
    return pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 20)


@contextlib.contextmanager
def spool_folder(near: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary folder next to ``near`` (same disk as the output), removed afterwards, also
    when a signal (SIGTERM unwinds as an exception) lands between its making and its use: every
    spool of this process for ``near`` is removed, so no window leaves one behind."""
    target = Path(near)
    target.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_temps(target)  # spools of killed runs
    try:
        yield Path(tempfile.mkdtemp(prefix=temp_prefix(target), suffix=".spool", dir=target.parent))
    finally:
        for folder in target.parent.glob(glob_escape(temp_prefix(target)) + "*.spool"):
            shutil.rmtree(folder, ignore_errors=True)


def spool_chunks(
    chunks: Iterable[tuple[pl.DataFrame, int]],
    spool: AcceptedSpool,
    tokenizers: Tokenizers,
    opts: CompileOptions,
    *,
    on_chunk: Callable[[int], None] | None = None,
    on_probe: Callable[[int], None] | None = None,
) -> tuple[int, list[pl.DataFrame]]:
    """Process ``(rows, rows read)`` chunks: accepted rows into ``spool``; returns (rows in, rejects)."""
    rows_in = 0
    rejected: list[pl.DataFrame] = []
    for rows, read in chunks:
        rows_in += rows.height
        if rows.height:
            ok, bad = process_chunk(rows, tokenizers, opts, on_probe)
            stop_if_strict(opts, bad)
            spool.add(ok)
            rejected.extend(bad)
        if on_chunk:
            on_chunk(read)
    return rows_in, rejected


def finish_spool(
    spool: AcceptedSpool, rows_in: int, rejected: Sequence[pl.DataFrame], opts: CompileOptions, what: str = "compile"
) -> tuple[npt.NDArray[np.int64], pl.DataFrame]:
    """Reject duplicate ids; returns (``__row`` of the duplicates, all rejects with ``__row`` in input order).

    Checks conservation: rows in = spooled - duplicates + rejects.
    """
    dups = spool.duplicates()
    if opts.strict and dups.height:
        raise DataprepError(str(dups.row(0, named=True)["detail"]))
    rejects = pl.concat([conform(r, REJECTS_ROW_POLARS_SCHEMA) for r in [*rejected, dups]], how="vertical_relaxed")
    rejects = rejects.sort(ROW)
    kept = spool.rows - dups.height
    if kept + rejects.height != rows_in:
        raise AssertionError(f"conservation broken in {what}: {rows_in} in, {kept} kept, {rejects.height} rejected")
    return dups[ROW].to_numpy(), rejects
