"""``dataprep compile``: sources -> one compiled manifest + one rejects file, the public entry.

:func:`compile` runs it whatever the executor: this process (streaming, bounded memory), a
local pool of ``workers`` processes over hashed parts, one part of a parted run (for a Slurm
array; ``dataprep merge`` / :func:`merge_parts` combines the parts), or Ray Data. Every way
writes the same bytes and returns a :class:`CompileSummary`. Options are checked here, once,
raising :class:`manifests.errors.DataprepError`.

Modules: :mod:`.validate` (per-chunk validation, rejects), :mod:`.probe` (audio headers),
:mod:`.spool` (spooling accepted rows, duplicate ids), :mod:`.single` (the one-process
compile), :mod:`.parts` (hashed parts, markers, merge), :mod:`.executors` (pool and Ray),
:mod:`.audio_checks` (rows whose audio was not checked).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from dataprep.compile.audio_checks import UncheckedAudio, require_audio, unchecked_audio
from dataprep.compile.parts import merge_parts, resolve_part, run_part
from manifests.parted_run import check_split
from dataprep.compile.probe import probe_headers
from dataprep.compile.single import CompileResult, CompileSummary, compile_sources, compile_to_files
from dataprep.compile.validate import PROBE_MODES, CompileOptions, ProbeMode, process_chunk
from dataprep.tokenize import Tokenizers
from manifests.errors import DataprepError
from manifests.manifest_write import default_rejects_path
from manifests import storage, store_facts
from manifests.outputs import refuse_directory_outputs, staged

__all__ = [
    "EXECUTORS",
    "PROBE_MODES",
    "UncheckedAudio",
    "CompileOptions",
    "CompileResult",
    "CompileSummary",
    "ProbeMode",
    "compile",
    "compile_sources",
    "compile_to_files",
    "merge_parts",
    "probe_headers",
    "process_chunk",
    "require_audio",
    "unchecked_audio",
]

EXECUTORS: tuple[str, ...] = ("local", "ray")

Progress = Callable[[int], None]


def _check(executor: str, workers: int, num_parts: int | None, part_index: int | None) -> None:
    if executor not in EXECUTORS:
        raise DataprepError(f"--executor must be local or ray (got {executor!r})")
    check_split(num_parts, part_index, workers=workers)


def compile(  # noqa: A001 - the stage's name
    sources: Sequence[str | os.PathLike[str]],
    tokenizer_specs: Sequence[str],
    output: str | os.PathLike[str],
    rejects: str | os.PathLike[str] | None = None,
    opts: CompileOptions | None = None,
    *,
    executor: str = "local",
    workers: int = 1,
    num_parts: int | None = None,
    part_index: int | None = None,
    env: Mapping[str, str] | None = None,
    on_chunk: Progress | None = None,
    on_probe: Progress | None = None,
    on_part: Callable[[CompileSummary], None] | None = None,
) -> CompileSummary:
    """Compile ``sources`` with the tokenizers ``tokenizer_specs`` (``MODEL`` or ``LANG=MODEL``).

    - one part (``part_index`` given, or ``num_parts`` inside a Slurm array: ``env``, default
      ``os.environ``): that part into the folder ``output`` (skipped if already done);
    - ``executor="ray"``: Ray Data ``map_batches``, then ``output`` and ``rejects``;
    - ``workers`` > 1 or ``num_parts``: a local pool over ``num_parts`` parts (default 4 x workers)
      in ``<output>.parts/``, merged into ``output`` and ``rejects``, the parts folder then removed;
    - otherwise this process, streaming.

    ``rejects`` defaults to :func:`manifests.manifest_write.default_rejects_path` of ``output``.
    ``on_chunk`` / ``on_probe`` count rows read / headers probed (not from pool workers);
    ``on_part`` gets each finished part of a pool run. The summary's ``audio`` counts the kept
    rows whose audio was not checked (:func:`unchecked_audio`; not for a one-part run).
    """
    opts = opts or CompileOptions()
    tokenizer_specs = [_local_spec(spec) for spec in tokenizer_specs]
    rejects = rejects if rejects is not None else default_rejects_path(output)
    if storage.is_url(os.fspath(output)) and (part_index is not None or "SLURM_ARRAY_TASK_ID" in (env or os.environ)
                                              and num_parts is not None):
        raise DataprepError(f"{output}: -o: a part's folder is written locally (merge its parts to a URL instead)")
    with staged({"--rejects": rejects, "-o": output}) as local:  # a URL: written here, uploaded whole, -o last
        summary = _compile(sources, tokenizer_specs, local["-o"], local["--rejects"], opts, executor=executor,
                           workers=workers, num_parts=num_parts, part_index=part_index, env=env, on_chunk=on_chunk,
                           on_probe=on_probe, on_part=on_part)
        if summary.part_index is not None or summary.audio is not None:
            return summary
        return dataclasses.replace(summary, audio=unchecked_audio(local["-o"], opts.probe))  # type: ignore[arg-type]


def _local_spec(spec: str) -> str:
    """A tokenizer spec (``MODEL`` or ``LANG=MODEL``) whose model is a store URL read from its
    local copy (cached by ETag; the manifest records the model's content hash, not its path)."""
    lang, sep, model = spec.partition("=") if not storage.is_url(spec) else ("", "", spec)
    model = model if sep else spec
    if not storage.is_url(model):
        return spec
    local = str(store_facts.fetch_local(model))
    return f"{lang}={local}" if sep else local


def _compile(
    sources: Sequence[str | os.PathLike[str]], tokenizer_specs: Sequence[str], output: str | os.PathLike[str],
    rejects: str | os.PathLike[str] | None, opts: CompileOptions, *, executor: str, workers: int,
    num_parts: int | None, part_index: int | None, env: Mapping[str, str] | None, on_chunk: Progress | None,
    on_probe: Progress | None, on_part: Callable[[CompileSummary], None] | None,
) -> CompileSummary:
    """:func:`compile` without the audio check of its output."""
    _check(executor, workers, num_parts, part_index)
    rejects_path = Path(rejects) if rejects is not None else default_rejects_path(output)
    part = resolve_part(num_parts, part_index, os.environ if env is None else env)
    if part is not None:
        if executor != "local":
            raise DataprepError("--part-index runs one part here; it does not combine with --executor ray")
        n, i = part
        return run_part(sources, tokenizer_specs, opts, n, i, output, on_chunk=on_chunk, on_probe=on_probe)
    refuse_directory_outputs({"-o": output, "--rejects": rejects_path})  # files here (a part's -o is a folder)
    if executor == "ray":
        return _compile_ray(sources, tokenizer_specs, opts, output, rejects_path, on_chunk)
    if workers != 1 or num_parts is not None:
        from dataprep.compile.executors import compile_pool, default_parts, remove_parts

        summary = compile_pool(sources, tokenizer_specs, opts, output, rejects_path, workers=workers,
                               num_parts=num_parts or default_parts(workers), on_part=on_part)
        remove_parts(output)
        return summary
    tokenizers = Tokenizers.from_specs(tokenizer_specs)
    return compile_to_files(sources, tokenizers, opts, output, rejects_path, on_chunk=on_chunk, on_probe=on_probe)


def _compile_ray(
    sources: Sequence[str | os.PathLike[str]], tokenizer_specs: Sequence[str], opts: CompileOptions,
    output: str | os.PathLike[str], rejects: Path, on_chunk: Progress | None,
) -> CompileSummary:
    """Ray Data in memory on the driver, then the manifest and rejects written."""
    from dataprep.compile.executors import compile_ray
    from manifests.manifest_write import write_manifest, write_rejects
    from manifests.outputs import publish_together

    result = compile_ray(sources, tokenizer_specs, opts, on_chunk=on_chunk)
    with publish_together(output, rejects) as (tmp_out, tmp_rejects):
        content_hash = write_manifest(result.manifest, tmp_out, result.provenance)
        write_rejects(result.rejects, tmp_rejects, result.provenance)
    return CompileSummary(rows_in=result.rows_in, rows_kept=result.manifest.height,
                          hours=float(result.manifest["duration"].sum() or 0.0) / 3600, reasons=result.reasons,
                          provenance=result.provenance, content_hash=content_hash)
