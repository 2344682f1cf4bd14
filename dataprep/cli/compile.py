"""Commands: ``train-tokenizer`` and ``compile``."""

from __future__ import annotations

import contextlib
import os

from pathlib import Path
from typing import Annotated, Optional

import polars as pl
import typer

from dataprep.cli.app import alias, app, check_range, defaults_of, option_flags, out, user_errors
from dataprep.cli.fmt import Table
from dataprep.cli.progress import progress_counter
from dataprep.compile.validate import DEFAULT_MAX_PLAUSIBLE_DURATION, CompileOptions

SourcesArg = Annotated[list[str], typer.Argument(help="Source manifests (local paths or s3:// gs:// az:// URLs): NeMo JSONL, Lhotse cuts JSONL(.gz), Kaldi data dir, CSV/TSV, Parquet (Hugging Face audio Parquet too), Lhotse Shar dir, WebDataset tars; NeMo tarred manifests with --tarred-audio (brace syntax 'manifest__OP_0..7_CL_.json' accepted).", show_default=False)]
FormatOpt = Annotated[str, typer.Option("--format", help="Source format: auto, nemo, lhotse, kaldi, csv, tsv, parquet, hf-parquet, shar, webdataset.")]
TextFieldOpt = Annotated[str, typer.Option(help="Field holding the decoder's target text (e.g. 'answer' for speech translation).")]

_COMPILE = defaults_of(CompileOptions)


@app.command("train-tokenizer")
@user_errors
def train_tokenizer_cmd(
    sources: SourcesArg,
    output: Annotated[Path, typer.Option("-o", "--output", help="Where to write the sentencepiece model.")],
    vocab_size: Annotated[int, typer.Option(help="Number of pieces.")] = 1024,
    model_type: Annotated[str, typer.Option(help="unigram, bpe, char or word.")] = "unigram",
    fmt: FormatOpt = "auto",
    text_field: TextFieldOpt = "text",
    threads: Annotated[int, typer.Option(help="Trainer threads (the model depends on them: the same number reproduces a model).")] = 2,
) -> None:
    """Train a sentencepiece model on the sources' transcripts (when you have none)."""
    from dataprep.tokenize import train_model
    from manifests.outputs import refuse_same_paths

    check_range("--vocab-size", vocab_size, ge=2)
    check_range("--threads", threads, ge=1)
    refuse_same_paths({f"SOURCE {s}": s for s in sources}, {"-o": output})
    from manifests.readers import iter_source

    texts: list[str] = []
    for src in sources:
        for chunk in iter_source(src, fmt, text_field=text_field):
            texts.extend(chunk.filter(pl.col("reason").is_null())["text"].drop_nulls().to_list())
    with option_flags():
        info = train_model(texts, output, vocab_size=vocab_size, model_type=model_type, threads=threads)
    out.print(f"trained {model_type} sentencepiece model, {vocab_size} pieces, on {info['sentences']:,} transcripts -> {output}")


@app.command("compile")
@user_errors
def compile_cmd(
    sources: SourcesArg,
    tokenizer: Annotated[list[str], typer.Option(help="Sentencepiece model, or LANG=MODEL once per language (chosen by lang, else target_lang, as NeMo does).")],
    output: Annotated[str, typer.Option("-o", "--output", help="Compiled manifest (Parquet; a path or an s3:// gs:// az:// URL).")],
    rejects: Annotated[Optional[str], typer.Option(help="Rejected rows with their reason (Parquet). Default: <output stem>.rejects.parquet next to -o.")] = None,
    prompt_tokens: Annotated[int, typer.Option(help="Fixed decoder prompt length added to every utterance's tokens (a custom format; see --prompt-format).")] = 0,
    prompt_format: Annotated[Optional[str], typer.Option(help="Count tokens as NeMo's prompt formatter does: canary2 (pieces + 10 + decodercontext), canary (pieces + 6), none (pieces).", show_default=False)] = None,
    fmt: FormatOpt = "auto",
    text_field: TextFieldOpt = "text",
    audio_root: Annotated[Optional[str], typer.Option(help="Resolve relative audio paths against this folder or URL (default: the source's folder).")] = None,
    probe: Annotated[str, typer.Option(help="auto: read audio headers only where the source has no duration; always: verify every file; never.")] = "auto",
    probe_threads: Annotated[Optional[int], typer.Option("--probe-threads", help="Threads for audio header reads (I/O bound; default 8 on local disk, 64 when the audio is in a store).", show_default=False)] = None,
    threads: Annotated[Optional[int], typer.Option("--threads", hidden=True, help="Old name of --probe-threads.", show_default=False)] = None,
    mismatch_tolerance: Annotated[float, typer.Option(help="Seconds a manifest duration may differ from the header with --probe always.")] = 0.05,
    max_plausible_duration: Annotated[float, typer.Option(help="Reject rows longer than this many seconds (reason implausible_duration): a typo or a unit error, not a recording.")] = DEFAULT_MAX_PLAUSIBLE_DURATION,
    strict: Annotated[bool, typer.Option(help="Stop at the first bad row with a one-line error instead of writing it to the rejects file.")] = False,
    num_parts: Annotated[Optional[int], typer.Option("--num-parts", help="Split the rows by a stable hash of the id into this many parts (default: $SLURM_ARRAY_TASK_COUNT with --part-index; 4 x --workers for a local pool).", show_default=False)] = None,
    part_index: Annotated[Optional[int], typer.Option("--part-index", help="Run only this part (0-based; default: $SLURM_ARRAY_TASK_ID when --num-parts is given); -o is then a folder of parts for `dataprep merge`.", show_default=False)] = None,
    num_shards: Annotated[Optional[int], typer.Option("--num-shards", hidden=True, help="Old name of --num-parts.", show_default=False)] = None,
    shard_index: Annotated[Optional[int], typer.Option("--shard-index", hidden=True, help="Old name of --part-index.", show_default=False)] = None,
    executor: Annotated[str, typer.Option(help="local: this machine (--workers processes); ray: Ray Data map_batches (the `ray` extra).")] = "local",
    workers: Annotated[int, typer.Option(help="Local worker processes, each running whole parts (threads inside for header reads).")] = 1,
    tarred_audio: Annotated[Optional[list[str]], typer.Option("--tarred-audio", help="NeMo tarred dataset: its audio tars (NeMo's brace syntax 'audio__OP_0..7_CL_.tar' or a list); the sources are then its manifests (matched by shard_id and file name, as NeMo does).", show_default=False)] = None,
) -> None:
    """Compile sources into one Parquet manifest: durations, token counts (incl. prompt), TPS.

    Every input row ends in the manifest or in the rejects file with its reason.
    """
    from dataprep.compile import CompileOptions, compile
    from manifests.manifest_write import default_rejects_path
    from manifests.outputs import refuse_same_paths
    from manifests.readers import is_blend_path, read_blend

    check_range("--prompt-tokens", prompt_tokens, ge=0)
    check_range("--mismatch-tolerance", mismatch_tolerance, ge=0)
    check_range("--max-plausible-duration", max_plausible_duration, gt=0)
    probe_threads = alias("--probe-threads", probe_threads, "--threads", threads)
    if probe_threads is not None:
        check_range("--probe-threads", probe_threads, ge=1)
    probe_threads = _COMPILE.probe_threads if probe_threads is None else probe_threads
    num_parts = alias("--num-parts", num_parts, "--num-shards", num_shards)
    part_index = alias("--part-index", part_index, "--shard-index", shard_index)
    opts = CompileOptions(prompt_tokens=prompt_tokens, prompt_format=prompt_format, fmt=fmt, text_field=text_field,
                          audio_root=str(audio_root) if audio_root else None, probe=probe,  # type: ignore[arg-type]
                          probe_threads=probe_threads, mismatch_tolerance=mismatch_tolerance, strict=strict,
                          tarred_audio=tuple(tarred_audio or ()), max_plausible_duration=max_plausible_duration)
    rejects_path = rejects or default_rejects_path(output)
    refuse_same_paths({**{f"SOURCE {s}": s for s in sources}, **{f"--tokenizer {t}": t.partition("=")[2] or t
                                                                 for t in tokenizer},
                       **{f"--tarred-audio {t}": t for t in tarred_audio or ()}},
                      {"-o": output, "--rejects": None if part_index is not None else rejects_path})
    for src in sources:  # a blend's keys it does not use, corpora it renamed: one line each
        if is_blend_path(src) and Path(src).is_file():
            for w in read_blend(src).warnings:
                out.print(f"warning: {w}", markup=False)
    pooled = executor == "local" and part_index is None and (workers != 1 or num_parts is not None) \
        and "SLURM_ARRAY_TASK_ID" not in os.environ  # only picks the progress bars shown
    with contextlib.ExitStack() as bars:
        on_chunk = on_probe = on_part = None
        if pooled:
            on_part_done = bars.enter_context(progress_counter("parts", total=num_parts or 4 * workers))
            on_part = lambda r: on_part_done(1)  # noqa: E731
        else:
            on_chunk = bars.enter_context(progress_counter("reading rows"))
            if executor != "ray":
                on_probe = bars.enter_context(progress_counter("probing audio headers"))
        result = compile(sources, tokenizer, output, rejects_path, opts, executor=executor, workers=workers,
                         num_parts=num_parts, part_index=part_index, on_chunk=on_chunk, on_probe=on_probe,
                         on_part=on_part)
    if result.part_index is not None:
        state = "already done, skipped" if result.skipped else "done"
        out.print(f"part {result.part_index} of {result.num_parts} {state}: {result.rows_in:,} rows in, "
                  f"{result.rows_kept:,} kept, {result.rows_rejected:,} rejected -> {output}/")
        return
    _print_summary(result.rows_in, result.rows_kept, result.hours, result.reasons)
    for line in result.notes():
        out.print(line)
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


@app.command("merge")
@user_errors
def merge_cmd(
    parts: Annotated[Path, typer.Argument(help="Folder of parts written by `compile --num-parts N --part-index I -o FOLDER`.", show_default=False)],
    output: Annotated[Path, typer.Option("-o", "--output", help="Compiled manifest (Parquet).")],
    rejects: Annotated[Optional[Path], typer.Option(help="Rejected rows with their reason (Parquet). Default: <output stem>.rejects.parquet next to -o.")] = None,
) -> None:
    """Merge a complete set of parts into the manifest a single-machine compile writes (byte-identical).

    Refuses a set with missing parts (named) or parts from different runs.
    """
    from dataprep.compile import merge_parts
    from manifests.manifest_write import default_rejects_path
    from manifests.outputs import refuse_same_paths

    rejects_path = rejects or default_rejects_path(output)
    refuse_same_paths({"PARTS": parts}, {"-o": output, "--rejects": rejects_path})
    result = merge_parts(parts, output, rejects_path)
    _print_summary(result.rows_in, result.rows_kept, result.hours, result.reasons)
    for line in result.notes():
        out.print(line)
    out.print(f"merged {result.num_parts} parts; manifest -> {output} (content hash {result.content_hash[:16]})")
    out.print(f"rejects  -> {rejects_path}")
