"""Where the per-file work of ``compile`` runs: a local process pool of parts, or Ray Data.

Both give the bytes a single-process :func:`dataprep.compile.single.compile_sources` gives.

- :func:`compile_pool`: ``num_parts`` part tasks (:func:`dataprep.compile.parts.run_part`) on a
  pool of ``workers`` processes (threads inside each for header reads), parts in a folder
  next to the output, then the streaming merge (bounded memory). More parts than workers, so a slow part does not
  hold the others; an interrupted run resumes from the finished parts.
- :func:`compile_ray`: the sources read once on the driver, the pure per-batch function
  :func:`dataprep.compile.validate.process_chunk` mapped over batches with Ray Data ``map_batches``,
  duplicates rejected and rows ordered on the driver, in memory (``pip install 'speech-dataprep[ray]'``).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from dataprep.compile.parts import merge_parts, run_part
from dataprep.compile.single import CompileResult, CompileSummary, assemble
from dataprep.compile.validate import (
    REJECTS_ROW_POLARS_SCHEMA,
    CompileOptions,
    compile_provenance,
    iter_rows,
    process_chunk,
)
from dataprep.tokenize import Tokenizers
from manifests.errors import DataprepError
from manifests.manifest_write import reasons_count
from manifests.optional import require
from manifests.parted_run import check_split
from manifests.schema import conform


def default_parts(workers: int) -> int:
    """Parts for a local pool: 4 per worker, so stragglers are a small share of the run."""
    return max(1, 4 * workers)


def parts_folder(output: str | os.PathLike[str]) -> Path:
    """Where a local pool keeps its parts: ``<output>.parts/`` (removed after the merge)."""
    out = Path(output)
    return out.with_name(out.name + ".parts")


def _part_task(args: tuple[Any, ...]) -> CompileSummary:
    return run_part(*args)


def run_parts(
    sources: Sequence[str | os.PathLike[str]],
    tokenizer_specs: Sequence[str],
    opts: CompileOptions,
    num_parts: int,
    folder: str | os.PathLike[str],
    *,
    workers: int = 1,
    on_part: Callable[[CompileSummary], None] | None = None,
) -> list[CompileSummary]:
    """Run every part of ``num_parts`` into ``folder`` on ``workers`` processes (finished ones skip).

    ``workers`` = 1 runs them in this process. Tokenizer threads are split between workers.
    """
    check_split(num_parts, workers=workers)
    cpus = os.cpu_count() or 1
    if opts.tokenizer_threads == 0:
        opts = replace(opts, tokenizer_threads=max(1, cpus // workers))
    srcs = [str(s) for s in sources]
    tasks = [(srcs, list(tokenizer_specs), opts, num_parts, i, str(folder)) for i in range(num_parts)]
    results: list[CompileSummary] = []
    if workers == 1:
        for t in tasks:
            results.append(_part_task(t))
            if on_part:
                on_part(results[-1])
        return sorted(results, key=lambda r: r.part_index)
    # spawn: polars and sentencepiece hold threads that fork would copy in a broken state
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, num_parts), mp_context=ctx) as pool:
        futures = [pool.submit(_part_task, t) for t in tasks]
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_EXCEPTION)
            for f in done:
                if f.exception() is not None:
                    for p in pending:
                        p.cancel()
                    raise f.exception()  # type: ignore[misc]
                results.append(f.result())
                if on_part:
                    on_part(results[-1])
    return sorted(results, key=lambda r: r.part_index)


def compile_pool(
    sources: Sequence[str | os.PathLike[str]],
    tokenizer_specs: Sequence[str],
    opts: CompileOptions,
    output: str | os.PathLike[str],
    rejects: str | os.PathLike[str],
    *,
    workers: int = 2,
    num_parts: int | None = None,
    on_part: Callable[[CompileSummary], None] | None = None,
) -> CompileSummary:
    """Compile on a local process pool: parts into ``<output>.parts/``, then the streaming merge
    into ``output`` and ``rejects``. The caller may then remove the parts folder (:func:`remove_parts`)."""
    folder = parts_folder(output)
    run_parts(sources, tokenizer_specs, opts, num_parts or default_parts(workers), folder,
               workers=workers, on_part=on_part)
    return merge_parts(folder, output, rejects)


def remove_parts(output: str | os.PathLike[str]) -> None:
    """Remove the parts folder of a local pool run (after its merge was written)."""
    shutil.rmtree(parts_folder(output), ignore_errors=True)


# --------------------------------------------------------------------------- Ray

class _RayBatch:
    """Ray Data callable: loads the tokenizers once per actor, runs ``process_chunk`` per batch.

    Returns accepted and rejected rows together (``reason`` null = accepted)."""

    def __init__(self, tokenizer_specs: Sequence[str], opts: CompileOptions) -> None:
        self.tokenizers = Tokenizers.from_specs(tokenizer_specs)
        self.opts = opts

    def __call__(self, batch: pa.Table) -> pa.Table:
        chunk = pl.from_arrow(batch)
        assert isinstance(chunk, pl.DataFrame)
        ok, bad = process_chunk(chunk, self.tokenizers, self.opts)
        both = pl.concat([conform(f, REJECTS_ROW_POLARS_SCHEMA) for f in (ok, *bad)], how="vertical_relaxed")
        return both.to_arrow()


def compile_ray(
    sources: Sequence[str | os.PathLike[str]],
    tokenizer_specs: Sequence[str],
    opts: CompileOptions,
    *,
    batch_rows: int = 50_000,
    concurrency: int | None = None,
    on_chunk: Callable[[int], None] | None = None,
) -> CompileResult:
    """Compile through Ray Data ``map_batches`` (a local Ray instance unless one is running).

    Same manifest, rejects and provenance as :func:`dataprep.compile.single.compile_sources`.
    """
    ray = require("ray", "--executor ray")
    tokenizers = Tokenizers.from_specs(tokenizer_specs)  # fail early, on the driver, on a bad model
    if opts.strict:
        raise DataprepError("--strict is not supported with --executor ray (run it locally)")
    chunks: list[pa.Table] = []
    rows_in = 0
    for chunk in iter_rows(sources, opts):
        rows_in += chunk.height
        chunks.append(chunk.to_arrow())
        if on_chunk:
            on_chunk(chunk.height)
    started = not ray.is_initialized()
    if started:  # a local instance, shut down afterwards; on a cluster, ray.init() before calling
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        logging.getLogger("ray.data").setLevel(logging.WARNING)
    try:
        ds = ray.data.from_arrow(chunks).map_batches(
            _RayBatch, fn_constructor_args=(list(tokenizer_specs), opts), batch_format="pyarrow",
            batch_size=batch_rows, concurrency=concurrency or max(1, (os.cpu_count() or 1)),
        )
        tables = [t for t in ray.get(ds.to_arrow_refs()) if t.num_rows]
    finally:
        if started:
            ray.shutdown()
    frames = [pl.from_arrow(t) for t in tables]
    both = pl.concat([f for f in frames if isinstance(f, pl.DataFrame)], how="vertical_relaxed") if frames \
        else pl.DataFrame(schema=REJECTS_ROW_POLARS_SCHEMA)
    ok = both.filter(pl.col("reason").is_null())
    bad = both.filter(pl.col("reason").is_not_null())
    manifest, rejects = assemble([ok], [bad], opts)
    if manifest.height + rejects.height != rows_in:
        raise AssertionError(f"conservation broken: {rows_in} in, {manifest.height} kept, {rejects.height} rejected")
    reasons = reasons_count(rejects)
    return CompileResult(manifest=manifest, rejects=rejects, rows_in=rows_in, reasons=reasons,
                         provenance=compile_provenance(sources, tokenizers, opts))
