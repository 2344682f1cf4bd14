"""Compile in one process: sources -> one compiled manifest + one rejects file.

:func:`compile_to_files` streams (memory bounded whatever the number of rows): accepted rows
of each chunk are spooled to a local Parquet file (:class:`dataprep.compile.spool.AcceptedSpool`,
in a temporary folder next to the output), duplicate ids found over that file, then the
manifest is streamed from the spool in input order, its content hash computed on the way. Only
rejected rows are held in memory. :func:`compile_sources` does the same in memory and returns
frames (tests, small inputs, the Ray driver). Every input row ends in exactly one output.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import polars as pl

from dataprep.compile.audio_checks import UncheckedAudio
from dataprep.compile.spool import AcceptedSpool, finish_spool, spool_chunks, spool_folder
from dataprep.compile.validate import (
    ROW,
    CompileOptions,
    compile_provenance,
    iter_rows,
    process_chunk,
    reject_duplicates,
    stop_if_strict,
)
from dataprep.tokenize import Tokenizers
from manifests.errors import DataprepError
from manifests.manifest_write import reasons_count, write_parquet_stream, write_rejects
from manifests.outputs import publish_together
from manifests.schema import FULL_POLARS_SCHEMA, FULL_REJECTS_POLARS_SCHEMA, conform, manifest_schema, trim_containers


@dataclass
class CompileResult:
    """An in-memory compile (:func:`compile_sources`): the frames, not files."""

    manifest: pl.DataFrame
    rejects: pl.DataFrame
    rows_in: int
    reasons: dict[str, int] = field(default_factory=dict)
    provenance: dict[str, object] = field(default_factory=dict)


@dataclass
class CompileSummary:
    """What a compile wrote, whatever ran it. ``hours``: total duration of kept rows / 3600.

    A one-part run (``part_index`` set) writes a part into a folder, not a manifest: its
    ``content_hash`` is empty, ``hours`` 0, ``reasons`` empty and ``audio`` None; ``skipped``
    says it was already done. ``num_parts``: the parts a parted compile or a merge combined (1 otherwise).
    """

    rows_in: int
    rows_kept: int
    hours: float
    reasons: dict[str, int]
    provenance: dict[str, object]
    content_hash: str
    num_parts: int = 1
    part_index: int | None = None
    skipped: bool = False
    #: kept rows whose audio was not checked (:mod:`dataprep.compile.audio_checks`); None for a part
    audio: UncheckedAudio | None = None

    def notes(self) -> list[str]:
        """Lines a user reads after the counts: what was not checked, and why."""
        return self.audio.lines() if self.audio is not None else []

    @property
    def rows_rejected(self) -> int:
        return self.rows_in - self.rows_kept


def compile_sources(
    sources: Sequence[str | os.PathLike[str]],
    tokenizers: Tokenizers,
    opts: CompileOptions | None = None,
    *,
    on_chunk: Callable[[int], None] | None = None,
    on_probe: Callable[[int], None] | None = None,
) -> CompileResult:
    """Compile ``sources`` into (manifest, rejects). Invariant: rows_in = kept + rejected.

    With ``opts.strict`` the first problem (in input order) raises :class:`DataprepError`
    with its one-line detail ("file:line: problem") instead of becoming a reject row.
    """
    opts = opts or CompileOptions()
    accepted: list[pl.DataFrame] = []
    rejected: list[pl.DataFrame] = []
    rows_in = 0
    for chunk in iter_rows(sources, opts):
        rows_in += chunk.height
        ok, bad = process_chunk(chunk, tokenizers, opts, on_probe)
        stop_if_strict(opts, bad)
        accepted.append(ok)
        rejected.extend(bad)
        if on_chunk:
            on_chunk(chunk.height)
    manifest, rejects = assemble(accepted, rejected, opts)
    if manifest.height + rejects.height != rows_in:
        raise AssertionError(f"conservation broken: {rows_in} in, {manifest.height} kept, {rejects.height} rejected")
    reasons = reasons_count(rejects)
    provenance = compile_provenance(sources, tokenizers, opts)
    return CompileResult(manifest=manifest, rejects=rejects, rows_in=rows_in, reasons=reasons,
                         provenance=provenance)


def assemble(
    accepted: Sequence[pl.DataFrame], rejected: Sequence[pl.DataFrame], opts: CompileOptions,
    *, keep_row: bool = False,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(manifest, rejects) from processed chunks: duplicate ids rejected (first in input order
    wins), both sorted by the global input row. ``keep_row`` keeps the ``__row`` column.

    Rows of one id must all be in ``accepted`` (a part by id holds every copy of its ids).
    """
    row_schema = {ROW: pl.Int64()}
    template = pl.DataFrame(schema={**FULL_REJECTS_POLARS_SCHEMA, **row_schema})
    all_ok = pl.concat([template.select(accepted[0].columns) if accepted else template] + list(accepted),
                       how="vertical_relaxed").sort(ROW)
    all_ok, dups = reject_duplicates(all_ok)
    if opts.strict and dups.height:
        raise DataprepError(str(dups.sort(ROW).row(0, named=True)["detail"]))
    rejected = [*rejected, dups]
    rejects = pl.concat([conform(r, {**FULL_REJECTS_POLARS_SCHEMA, **row_schema}) for r in rejected] or
                        [template], how="vertical_relaxed").sort(ROW)
    extra = row_schema if keep_row else {}
    return (trim_containers(conform(all_ok, {**FULL_POLARS_SCHEMA, **extra})),
            trim_containers(conform(rejects, {**FULL_REJECTS_POLARS_SCHEMA, **extra})))


def compile_to_files(
    sources: Sequence[str | os.PathLike[str]],
    tokenizers: Tokenizers,
    opts: CompileOptions,
    output: str | os.PathLike[str],
    rejects: str | os.PathLike[str],
    *,
    on_chunk: Callable[[int], None] | None = None,
    on_probe: Callable[[int], None] | None = None,
) -> CompileSummary:
    """Compile ``sources`` into the manifest ``output`` and the rejects file ``rejects``, streaming.

    Byte-identical to ``write_manifest(compile_sources(...).manifest)`` (and the rejects); memory
    about one reader chunk + one row group + the rejected rows, whatever the number of rows.
    """
    with spool_folder(output) as folder:
        spool = AcceptedSpool(folder)
        try:
            chunks = ((c, c.height) for c in iter_rows(sources, opts))
            rows_in, rejected = spool_chunks(chunks, spool, tokenizers, opts, on_chunk=on_chunk, on_probe=on_probe)
        finally:
            spool.close()
        drop, reject_rows = finish_spool(spool, rows_in, rejected, opts)
        dup_seconds = float(reject_rows.filter(pl.col("reason") == "duplicate_id")["duration"].sum() or 0.0)
        provenance = compile_provenance(sources, tokenizers, opts)
        with publish_together(output, rejects) as (tmp_out, tmp_rejects):  # visible together or not at all
            written = write_parquet_stream(lambda: spool.tables(drop), tmp_out, manifest_schema(spool.containers, spool.corpus, spool.modality),
                                           "manifest", provenance)
            write_rejects(reject_rows.drop(ROW), tmp_rejects, provenance)
    reasons = reasons_count(reject_rows)
    return CompileSummary(rows_in=rows_in, rows_kept=written.rows, hours=(spool.seconds - dup_seconds) / 3600,
                          reasons=reasons, provenance=provenance, content_hash=written.content_hash)
