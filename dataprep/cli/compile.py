"""Commands: ``train-tokenizer`` and ``compile``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import polars as pl
import typer
from rich.table import Table

from dataprep.cli.app import app, out, user_errors
from dataprep.cli.progress import progress_counter

SourcesArg = Annotated[list[Path], typer.Argument(help="Source manifests: NeMo JSONL, Lhotse cuts JSONL(.gz), Kaldi data dir, CSV/TSV or Parquet.", show_default=False)]
FormatOpt = Annotated[str, typer.Option("--format", help="Source format: auto, nemo, lhotse, kaldi, csv, tsv, parquet.")]
TextFieldOpt = Annotated[str, typer.Option(help="Field holding the decoder's target text (e.g. 'answer' for speech translation).")]


@app.command("train-tokenizer")
@user_errors
def train_tokenizer_cmd(
    sources: SourcesArg,
    output: Annotated[Path, typer.Option("-o", "--output", help="Where to write the sentencepiece model.")],
    vocab_size: Annotated[int, typer.Option(help="Number of pieces.")] = 1024,
    model_type: Annotated[str, typer.Option(help="unigram or bpe.")] = "unigram",
    fmt: FormatOpt = "auto",
    text_field: TextFieldOpt = "text",
    threads: Annotated[int, typer.Option(help="Trainer threads.")] = 2,
) -> None:
    """Train a sentencepiece model on the sources' transcripts (when you have none)."""
    from dataprep.tokenize import train_model
    from manifests.readers import iter_source

    texts: list[str] = []
    for src in sources:
        for chunk in iter_source(src, fmt, text_field=text_field):
            texts.extend(chunk.filter(pl.col("reason").is_null())["text"].drop_nulls().to_list())
    info = train_model(texts, output, vocab_size=vocab_size, model_type=model_type, threads=threads)
    out.print(f"trained {model_type} sentencepiece model, {vocab_size} pieces, on {info['sentences']:,} transcripts -> {output}")


@app.command("compile")
@user_errors
def compile_cmd(
    sources: SourcesArg,
    tokenizer: Annotated[list[str], typer.Option(help="Sentencepiece model, or LANG=MODEL once per language (chosen by target_lang, else lang).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Compiled manifest (Parquet).")],
    rejects: Annotated[Optional[Path], typer.Option(help="Rejected rows with their reason (Parquet). Default: <output>.rejects.parquet.")] = None,
    prompt_tokens: Annotated[int, typer.Option(help="Fixed decoder prompt length added to every utterance's tokens (Canary: 9).")] = 0,
    fmt: FormatOpt = "auto",
    text_field: TextFieldOpt = "text",
    audio_root: Annotated[Optional[Path], typer.Option(help="Resolve relative audio paths against this folder (default: the source's folder).")] = None,
    probe: Annotated[str, typer.Option(help="auto: read audio headers only where the source has no duration; always: verify every file; never.")] = "auto",
    threads: Annotated[int, typer.Option(help="Threads for audio header reads.")] = 8,
    mismatch_tolerance: Annotated[float, typer.Option(help="Seconds a manifest duration may differ from the header with --probe always.")] = 0.05,
    strict: Annotated[bool, typer.Option(help="Stop at the first bad row with a one-line error instead of writing it to the rejects file.")] = False,
    num_shards: Annotated[Optional[int], typer.Option(help="Split the rows by a stable hash of the id into this many shards (default: $SLURM_ARRAY_TASK_COUNT with --shard-index; 4 x --workers for a local pool).", show_default=False)] = None,
    shard_index: Annotated[Optional[int], typer.Option(help="Run only this shard (0-based; default: $SLURM_ARRAY_TASK_ID when --num-shards is given); -o is then a folder of parts for `dataprep merge`.", show_default=False)] = None,
    executor: Annotated[str, typer.Option(help="local: this machine (--workers processes); ray: Ray Data map_batches (the `ray` extra).")] = "local",
    workers: Annotated[int, typer.Option(help="Local worker processes, each running whole shards (threads inside for header reads).")] = 1,
) -> None:
    """Compile sources into one Parquet manifest: durations, token counts (incl. prompt), TPS.

    Every input row ends in the manifest or in the rejects file with its reason.
    """
    if shard_index is not None or num_shards is not None or executor != "local" or workers != 1:
        _compile_distributed(sources, tokenizer, output, rejects, prompt_tokens=prompt_tokens, fmt=fmt,
                            text_field=text_field, audio_root=audio_root, probe=probe, threads=threads,
                            mismatch_tolerance=mismatch_tolerance, strict=strict, num_shards=num_shards,
                            shard_index=shard_index, executor=executor, workers=workers)
        return
    from dataprep.compile import CompileOptions, compile_to_files
    from dataprep.tokenize import Tokenizers

    if probe not in ("auto", "always", "never"):
        raise typer.BadParameter("--probe must be auto, always or never")
    opts = CompileOptions(prompt_tokens=prompt_tokens, fmt=fmt, text_field=text_field,
                          audio_root=str(audio_root) if audio_root else None, probe=probe,  # type: ignore[arg-type]
                          probe_threads=threads, mismatch_tolerance=mismatch_tolerance, strict=strict)
    toks = Tokenizers.from_specs(tokenizer)
    rejects_path = rejects or output.with_name(output.stem + ".rejects.parquet")
    with progress_counter("reading rows") as on_chunk, progress_counter("probing audio headers") as on_probe:
        result = compile_to_files(sources, toks, opts, output, rejects_path, on_chunk=on_chunk, on_probe=on_probe)
    _print_summary(result.rows_in, result.rows_kept, result.hours, result.reasons)
    out.print(f"manifest -> {output} (content hash {result.content_hash[:16]})")
    out.print(f"rejects  -> {rejects_path}")


def _print_summary(rows_in: int, rows_kept: int, hours: float, reasons: dict[str, int]) -> None:
    table = Table(title="compile", show_header=True)
    table.add_column("rows")
    table.add_column("count", justify="right")
    table.add_row("in", f"{rows_in:,}")
    table.add_row("kept", f"{rows_kept:,} ({hours:,.2f} h)")
    for reason, n in reasons.items():
        table.add_row(f"rejected: {reason}", f"{n:,}")
    out.print(table)


def _compile_distributed(
    sources: list[Path], tokenizer: list[str], output: Path, rejects: Optional[Path], *, prompt_tokens: int,
    fmt: str, text_field: str, audio_root: Optional[Path], probe: str, threads: int, mismatch_tolerance: float,
    strict: bool, num_shards: Optional[int], shard_index: Optional[int], executor: str, workers: int,
) -> None:
    """``compile`` with --num-shards / --shard-index / --executor / --workers (dataprep.shards, dataprep.executors)."""
    import os

    from dataprep.compile import CompileOptions
    from dataprep.shards import resolve_shard, run_shard
    from manifests.io import write_manifest, write_rejects

    if probe not in ("auto", "always", "never"):
        raise typer.BadParameter("--probe must be auto, always or never")
    if executor not in ("local", "ray"):
        raise typer.BadParameter("--executor must be local or ray")
    opts = CompileOptions(prompt_tokens=prompt_tokens, fmt=fmt, text_field=text_field,
                          audio_root=str(audio_root) if audio_root else None, probe=probe,  # type: ignore[arg-type]
                          probe_threads=threads, mismatch_tolerance=mismatch_tolerance, strict=strict)
    shard = resolve_shard(num_shards, shard_index, os.environ)
    if shard is not None:
        n, i = shard
        if executor != "local":
            raise typer.BadParameter("--shard-index runs one shard here; it does not combine with --executor ray")
        with progress_counter("reading rows") as on_chunk, progress_counter("probing audio headers") as on_probe:
            res = run_shard(sources, tokenizer, opts, n, i, output, on_chunk=on_chunk, on_probe=on_probe)
        state = "already done, skipped" if res.skipped else "done"
        out.print(f"shard {i} of {n} {state}: {res.rows_in:,} rows in, {res.rows_kept:,} kept, "
                  f"{res.rows_rejected:,} rejected -> {output}/")
        return
    rejects_path = rejects or output.with_name(output.stem + ".rejects.parquet")
    if executor == "ray":
        from dataprep.executors import compile_ray

        with progress_counter("reading rows") as on_chunk:
            result = compile_ray(sources, tokenizer, opts, on_chunk=on_chunk)
        content_hash = write_manifest(result.manifest, output, result.provenance)
        write_rejects(result.rejects, rejects_path, result.provenance)
        rows_in, kept, hours, reasons = (result.rows_in, result.manifest.height,
                                         float(result.manifest["duration"].sum() or 0.0) / 3600, result.reasons)
    else:
        from dataprep.executors import compile_local, default_shards, remove_parts

        total = num_shards or default_shards(workers)
        with progress_counter("shards", total=total) as on_shard_done:
            merged = compile_local(sources, tokenizer, opts, output, rejects_path, workers=workers, num_shards=total,
                                   on_shard=lambda r: on_shard_done(1))
        remove_parts(output)
        rows_in, kept, hours, reasons, content_hash = (merged.rows_in, merged.rows_kept, merged.hours,
                                                       merged.reasons, merged.content_hash)
    _print_summary(rows_in, kept, hours, reasons)
    out.print(f"manifest -> {output} (content hash {content_hash[:16]})")
    out.print(f"rejects  -> {rejects_path}")


@app.command("merge")
@user_errors
def merge_cmd(
    parts: Annotated[Path, typer.Argument(help="Folder of shard parts written by `compile --num-shards N --shard-index I -o FOLDER`.", show_default=False)],
    output: Annotated[Path, typer.Option("-o", "--output", help="Compiled manifest (Parquet).")],
    rejects: Annotated[Optional[Path], typer.Option(help="Rejected rows with their reason (Parquet). Default: <output>.rejects.parquet.")] = None,
) -> None:
    """Merge a complete set of shard parts into the manifest a single-machine compile writes (byte-identical).

    Refuses a set with missing shards (named) or parts from different runs.
    """
    from dataprep.shards import merge_parts

    rejects_path = rejects or output.with_name(output.stem + ".rejects.parquet")
    result = merge_parts(parts, output, rejects_path)
    _print_summary(result.rows_in, result.rows_kept, result.hours, result.reasons)
    out.print(f"merged {result.num_shards} shards; manifest -> {output} (content hash {result.content_hash[:16]})")
    out.print(f"rejects  -> {rejects_path}")
