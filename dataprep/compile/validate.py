"""Per-chunk validation of source rows: what makes a row a reject, and why.

:func:`process_chunk` takes one chunk of reader rows (vectorized polars) and splits it into
accepted rows (durations filled from audio headers where needed, token counts, TPS) and
rejected rows with their ``reason`` and one-line ``detail``. :func:`reject_duplicates` rejects
every id's 2nd, 3rd... copy (the first in input order wins). Rows carry their global input
row number in the :data:`ROW` column (from :func:`iter_rows`) so outputs keep input order.
Also here: :class:`CompileOptions` (checked once, when built) and the provenance a compiled
manifest records.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import polars as pl
import pyarrow as pa

from dataprep import __version__
from dataprep.compile.probe import PROBE_SCHEMA, probe_headers, probe_members, probe_thread_count
from dataprep.compile.prompts import CONTEXT_FIELD, prompt_format_tokens
from manifests.readers._text import CONTEXT_KEY
from dataprep.tokenize import Tokenizers
from manifests import storage, store_facts
from manifests.containers import expand_paths
from manifests.content_hash import file_sha256
from manifests.errors import DataprepError
from manifests.readers import is_blend_path, iter_nemo_tarred, iter_source, read_blend, recipe_sources
from manifests.schema import (
    FULL_MANIFEST_SCHEMA,
    FULL_POLARS_SCHEMA,
    FULL_REJECTS_POLARS_SCHEMA,
    FULL_REJECTS_SCHEMA,
    MODALITY_COLUMN,
)

ProbeMode = Literal["auto", "always", "never"]
PROBE_MODES: tuple[str, ...] = ("auto", "always", "never")

#: column of the global input row number (keeps outputs in input order; never in a manifest)
ROW = "__row"
#: column of whether a row is a segment of its file (the source gave an offset, 0 included; never in a manifest)
SEGMENT = "__segment"
#: accepted rows with their global input row (spool files and parts), container columns included
#: (null for loose files; dropped from the outputs when no row has a container)
PART_SCHEMA = pa.schema([*FULL_MANIFEST_SCHEMA, pa.field(ROW, pa.int64(), nullable=False)])
PART_REJECTS_SCHEMA = pa.schema([*FULL_REJECTS_SCHEMA, pa.field(ROW, pa.int64(), nullable=False)])
#: polars schemas of the same (accepted rows + ROW, rejected rows + ROW)
PART_POLARS_SCHEMA = {**FULL_POLARS_SCHEMA, ROW: pl.Int64()}
REJECTS_ROW_POLARS_SCHEMA = {**FULL_REJECTS_POLARS_SCHEMA, ROW: pl.Int64()}


#: the default of ``--max-plausible-duration``: 6 hours (a long audiobook chapter or meeting is less)
DEFAULT_MAX_PLAUSIBLE_DURATION = 6 * 3600.0


@dataclass
class CompileOptions:
    """How sources become a manifest. Durations in seconds."""

    prompt_tokens: int = 0
    prompt_format: str | None = None  # none | canary | canary2 (dataprep.compile.prompts); adds to prompt_tokens
    fmt: str = "auto"
    text_field: str = "text"
    audio_root: str | None = None
    probe: ProbeMode = "auto"  # auto: header only where the source has no duration
    probe_threads: int = 0  # 0 = 8 on local disk, 64 for audio in a store
    tokenizer_threads: int = 0  # 0 = all cores
    mismatch_tolerance: float = 0.05  # s, for --probe always on whole-file rows
    max_plausible_duration: float = DEFAULT_MAX_PLAUSIBLE_DURATION  # s; longer rows are rejected (implausible_duration)
    chunk_rows: int = 500_000
    strict: bool = False
    #: NeMo tarred dataset: the tars (NeMo's brace syntax allowed); the sources are its manifests
    tarred_audio: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.tarred_audio = tuple(str(t) for t in self.tarred_audio)
        if self.probe not in PROBE_MODES:
            raise DataprepError(f"--probe must be auto, always or never (got {self.probe!r})")
        if self.prompt_format is not None:
            prompt_format_tokens(self.prompt_format)
            if self.prompt_tokens:
                raise DataprepError("give --prompt-format or --prompt-tokens, not both")

    @property
    def fixed_prompt_tokens(self) -> int:
        """Tokens added to every utterance's pieces (the format's, else ``prompt_tokens``)."""
        return self.prompt_tokens if self.prompt_format is None else prompt_format_tokens(self.prompt_format)


def expand_sources(sources: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Sources with NeMo's brace syntax expanded (``manifest__OP_0..7_CL_.json``, ``m_{0..7}.json``);
    a path that exists as written is kept as is. A Lhotse recordings manifest given with its
    supervisions manifest is read with it (one source)."""
    return recipe_sources(source_files(sources))


def source_files(sources: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Every source file named, NeMo's brace syntax expanded (what provenance fingerprints)."""
    out: list[str] = []
    for s in sources:
        out.extend([str(s)] if _exists(s) else expand_paths([str(s)]))
    return out


def _exists(path: str | os.PathLike[str]) -> bool:
    """Whether a source exists: a file or folder, an object or a non-empty URL prefix."""
    return storage.exists_or_folder(os.fspath(path)) if storage.is_url(os.fspath(path)) else Path(path).exists()


def source_fingerprint(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a source file, or of a directory's files (names and contents, sorted)."""
    if storage.is_url(os.fspath(path)):
        return store_facts.fingerprint(os.fspath(path))
    p = Path(path)
    if p.is_dir():
        digest = hashlib.sha256()
        for f in sorted(q for q in p.rglob("*") if q.is_file()):
            digest.update(f.relative_to(p).as_posix().encode() + b"\0" + file_sha256(f).encode())
        return digest.hexdigest()
    return file_sha256(p)


def _reject(df: pl.DataFrame, mask: pl.Expr, reason: str, detail: pl.Expr) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Split ``df`` into (rows kept, rows rejected with ``reason``/``detail``)."""
    flagged = df.with_columns(mask.fill_null(False).alias("__bad"))
    bad = flagged.filter(pl.col("__bad")).with_columns(
        pl.lit(reason).alias("reason"), detail.alias("detail")
    ).drop("__bad")
    return flagged.filter(~pl.col("__bad")).drop("__bad"), bad


def _at(problem: pl.Expr | str) -> pl.Expr:
    """``origin: problem`` as a one-line detail."""
    prob = pl.lit(problem) if isinstance(problem, str) else problem
    return pl.concat_str([pl.col("origin"), pl.lit(": "), prob])


def _fmt(expr: pl.Expr, decimals: int = 3) -> pl.Expr:
    return expr.round(decimals).cast(pl.String)


def stop_if_strict(opts: CompileOptions, rejects: list[pl.DataFrame]) -> None:
    """With ``--strict``, raise the first (in input order) reject's one-line detail."""
    if opts.strict and rejects:
        first = pl.concat(rejects, how="vertical_relaxed").sort(ROW).row(0, named=True)
        raise DataprepError(str(first["detail"]))


def process_chunk(
    chunk: pl.DataFrame,
    tokenizers: Tokenizers,
    opts: CompileOptions,
    on_probe: Callable[[int], None] | None = None,
) -> tuple[pl.DataFrame, list[pl.DataFrame]]:
    """Validate, probe and tokenize one chunk of reader rows. Returns (accepted, rejects)."""
    # a row whose source gives an offset (0 included: NeMo's explicit offset, a Kaldi segment, a
    # Lhotse cut or supervision) is a segment of its file; the readers leave it null otherwise
    chunk = chunk.with_columns(pl.col("offset").is_not_null().alias(SEGMENT),
                               pl.col("offset").fill_null(0.0))
    rejects: list[pl.DataFrame] = [chunk.filter(pl.col("reason").is_not_null())]
    df = chunk.filter(pl.col("reason").is_null())
    # a text-only row (a blend's text corpus): no audio, duration 0 by rule, no TPS
    text_row = (pl.col(MODALITY_COLUMN) == "text").fill_null(False) if MODALITY_COLUMN in df.columns else pl.lit(False)

    df, bad = _reject(df, pl.col("text").is_null() | (pl.col("text").str.strip_chars() == ""), "empty_text",
                      _at("empty text"))
    rejects.append(bad)
    d = pl.col("duration")
    df, bad = _reject(df, d.is_not_null() & (d.is_nan() | d.is_infinite() | (d <= 0)) & ~text_row, "invalid_duration",
                      _at(pl.concat_str([pl.lit("duration "), d.cast(pl.String), pl.lit(" s is not a positive number")])))
    rejects.append(bad)
    o = pl.col("offset")
    df, bad = _reject(df, o.is_nan() | o.is_infinite() | (o < 0), "invalid_duration",
                      _at(pl.concat_str([pl.lit("offset "), o.cast(pl.String), pl.lit(" s is negative or not a number")])))
    rejects.append(bad)
    df, bad = _reject(df, d.is_null() & pl.col("audio_path").is_null(), "missing_field",
                      _at("no duration and no audio path to probe"))
    rejects.append(bad)

    df, probe_rejects = _probe(df, opts, on_probe)
    rejects.extend(probe_rejects)
    if "__audio_bytes" in df.columns:  # Hugging Face rows' audio, needed only by the probe
        df = df.drop("__audio_bytes")
    limit = opts.max_plausible_duration
    df, bad = _reject(df, d > limit, "implausible_duration",
                      _at(pl.concat_str([pl.lit("duration "), d.cast(pl.String),
                                         pl.lit(f" s exceeds --max-plausible-duration {limit:g} s")])))
    rejects.append(bad)

    # NeMo's choice (canary2's prompt language slot): the row's ``lang`` first, then ``target_lang``
    lang_for_tokens = pl.coalesce(pl.col("lang"), pl.col("target_lang"))
    langs = df.select(lang_for_tokens).to_series()  # a Series: no Python str per row
    pieces = tokenizers.count(df["text"].to_list(), langs, opts.tokenizer_threads)
    df = df.with_columns(pl.Series("__pieces", pieces))
    # a blend with text or conversation corpora (rows with a modality): a row's context counts too
    in_mixed = pl.col(MODALITY_COLUMN).is_not_null() if MODALITY_COLUMN in df.columns else pl.lit(False)
    ctx = _context_pieces(df, in_mixed, tokenizers, opts)  # -1: no tokenizer for the context's language
    df = df.with_columns(pl.when(ctx < 0).then(-1).otherwise(pl.col("__pieces") + ctx).alias("__pieces"))
    df, bad = _reject(df, pl.col("__pieces") < 0, "no_tokenizer",
                      _at(pl.concat_str([pl.lit("no tokenizer for language "), lang_for_tokens.fill_null("<none>")])))
    rejects.append(bad.drop("__pieces"))
    if opts.prompt_format in CONTEXT_FIELD:  # e.g. canary2's decodercontext slot, from the source's other fields
        ctx = df.select(pl.col("extra").str.json_path_match(f"$.{CONTEXT_FIELD[opts.prompt_format]}")).to_series()
        has = ctx.is_not_null() & (ctx != "")
        extra_pieces = np.zeros(df.height, dtype=np.int64)
        if has.any():
            kept_langs = df.select(lang_for_tokens).to_series().filter(has)
            extra_pieces[has.to_numpy()] = tokenizers.count(ctx.filter(has).to_list(), kept_langs, opts.tokenizer_threads)
        df = df.with_columns(pl.col("__pieces") + pl.Series(extra_pieces))
    df = df.with_columns(
        (pl.col("__pieces") + opts.fixed_prompt_tokens).cast(pl.Int32).alias("num_tokens"),
    ).with_columns(pl.when(~text_row).then(pl.col("num_tokens") / pl.col("duration")).alias("tps")
                   ).drop("__pieces", SEGMENT)
    return df, [r.drop("__audio_bytes", SEGMENT, strict=False) for r in rejects if r.height]


def _context_pieces(df: pl.DataFrame, rows: pl.Expr, tokenizers: Tokenizers, opts: CompileOptions) -> pl.Series:
    """Pieces of the context of ``rows`` (``extra``'s :data:`CONTEXT_KEY`: a pair's source, a
    conversation's system prompt and user turns), by the tokenizer of its source language
    (else its language); 0 for other rows, -1 where no tokenizer has that language. Such a
    row's tokens: context + answer + the prompt's."""
    pieces = np.zeros(df.height, dtype=np.int64)
    if not df.height or not df.select(rows.any()).item():
        return pl.Series(pieces)
    ctx = df.select(pl.when(rows).then(pl.col("extra").str.json_path_match(f"$.{CONTEXT_KEY}"))).to_series()
    has = (ctx.is_not_null() & (ctx != "")).fill_null(False)
    if has.any():
        langs = df.select(pl.coalesce("source_lang", "lang", "target_lang")).to_series().filter(has)
        counts = np.asarray(tokenizers.count(ctx.filter(has).to_list(), langs, opts.tokenizer_threads), dtype=np.int64)
        pieces[has.to_numpy()] = np.maximum(counts, -1)
    return pl.Series(pieces)


def _probe(
    df: pl.DataFrame, opts: CompileOptions, on_probe: Callable[[int], None] | None
) -> tuple[pl.DataFrame, list[pl.DataFrame]]:
    """Read audio headers where needed; fill duration, sample_rate, channels."""
    if opts.probe == "never":
        df, bad = _reject(df, pl.col("duration").is_null(), "missing_field",
                          _at("no duration in the source and --probe never"))
        return df, [bad]
    need = pl.col("audio_path").is_not_null() & (
        pl.col("duration").is_null() | pl.lit(opts.probe == "always")
    )
    loose = pl.col("container").is_null() if "container" in df.columns else pl.lit(True)
    paths = df.filter(need & loose)["audio_path"].unique(maintain_order=True).to_list()
    members = df.filter(need & ~loose).unique("audio_path", maintain_order=True) if "container" in df.columns \
        else df.clear()
    if not paths and not members.height:
        return df, []
    infos = [pl.DataFrame(schema=PROBE_SCHEMA)]
    if paths:
        infos.append(probe_headers(paths, threads=probe_thread_count(opts.probe_threads, pl.Series(paths, dtype=pl.String)),
                                   on_progress=on_probe, verify_length=opts.probe == "always"))
    if members.height:
        infos.append(probe_members(members, threads=probe_thread_count(opts.probe_threads, members["container"]),
                                   on_progress=on_probe))
    info = pl.concat(infos)
    df = df.join(info, on="audio_path", how="left", maintain_order="left", suffix="__p")
    df = df.with_columns(
        pl.when(need).then(pl.col("sample_rate__p")).otherwise(pl.col("sample_rate")).alias("sample_rate"),
        pl.when(need).then(pl.col("channels__p")).otherwise(pl.col("channels")).alias("channels"),
    ).drop("sample_rate__p", "channels__p")
    rejects = []
    df, bad = _reject(df, need & pl.col("probe_reason").is_not_null(), "__probe", _at(pl.col("probe_detail")))
    rejects.append(bad.with_columns(pl.col("probe_reason").alias("reason")))
    fd, o, d = pl.col("file_duration"), pl.col("offset"), pl.col("duration")
    df = df.with_columns(pl.when(d.is_null()).then(fd - o).otherwise(d).alias("duration"))
    tol, seg = opts.mismatch_tolerance, pl.col(SEGMENT)
    # a segment is bounded by its file (offset + duration <= the header's length); a whole file's
    # duration is compared with the header's (--probe always; auto reads only rows without one)
    df, bad = _reject(df, fd.is_not_null() & seg & ((d <= 0) | (o + d > fd + tol)), "segment_out_of_range",
                      _at(pl.concat_str([pl.lit("segment "), _fmt(o), pl.lit("+"), _fmt(d),
                                         pl.lit(" s exceeds the audio ("), _fmt(fd), pl.lit(" s)")])))
    rejects.append(bad)
    if opts.probe == "always":
        df, bad = _reject(df, fd.is_not_null() & ~seg & ((d - fd).abs() > tol), "duration_mismatch",
                          _at(pl.concat_str([pl.lit("manifest says "), _fmt(d), pl.lit(" s, audio header says "),
                                             _fmt(fd), pl.lit(" s")])))
        rejects.append(bad)
    drop = ["file_duration", "probe_reason", "probe_detail"]
    return df.drop(drop), [r.drop(drop) for r in rejects]


def reject_duplicates(accepted: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Keep each id's first row (in input order); reject the others naming the first."""
    # the first origin is taken before the split: after it, the first *rejected* copy would be named
    marked = accepted.with_columns(pl.col("origin").first().over("id").alias("__first"))
    ok, bad = _reject(
        marked,
        ~pl.col("id").is_first_distinct(),
        "duplicate_id",
        _at(pl.concat_str([pl.lit("duplicate id "), pl.col("id"), pl.lit(" (first at "), pl.col("__first"),
                           pl.lit(")")])),
    )
    return ok.drop("__first"), bad.drop("__first")


def iter_rows(sources: Sequence[str | os.PathLike[str]], opts: CompileOptions) -> Iterator[pl.DataFrame]:
    """Reader chunks of every source in order, numbered with a global input row index."""
    start = 0
    sources = expand_sources(sources)
    check_sources(sources, opts)
    if opts.tarred_audio:
        frames = iter_nemo_tarred(sources, expand_paths(opts.tarred_audio), text_field=opts.text_field,
                                  chunk_rows=opts.chunk_rows)
        for chunk in frames:
            if chunk.height:
                yield chunk.with_columns(pl.int_range(start, start + chunk.height, dtype=pl.Int64).alias(ROW))
                start += chunk.height
        return
    for src in sources:
        if not _exists(src):
            raise DataprepError(f"{src}: no such file or directory")
        for chunk in iter_source(src, opts.fmt, text_field=opts.text_field, audio_root=opts.audio_root,
                                 chunk_rows=opts.chunk_rows):
            yield chunk.with_columns(pl.int_range(start, start + chunk.height, dtype=pl.Int64).alias(ROW))
            start += chunk.height


def check_sources(sources: Sequence[str | os.PathLike[str]], opts: CompileOptions) -> None:
    """An ``input_cfg`` blend is the only source of a compile (it names its corpora itself)."""
    blends = [s for s in sources if is_blend_path(s)]
    if blends and (len(sources) > 1 or opts.tarred_audio):
        raise DataprepError(f"{blends[0]}: an input_cfg blend must be the only source (list the other corpora in it)")


def blend_provenance(path: str | os.PathLike[str]) -> dict[str, object]:
    """What a manifest records of its ``input_cfg`` blend: the file, the weight tree (weights,
    temperatures, corpus names) and each corpus's type, tags and files with their SHA-256."""
    blend = read_blend(path)
    corpora = []
    for leaf in blend.leaves:
        files = expand_paths([*leaf.paths, *leaf.targets, *leaf.tars])
        corpora.append({"corpus": leaf.corpus, "type": leaf.type, "tags": leaf.tags,
                        "files": [{"path": f, "sha256": source_fingerprint(f) if Path(f).exists() else None}
                                  for f in files]})
    return {"path": str(path), "tree": blend.tree(), "corpora": corpora}


def compile_provenance(
    sources: Sequence[str | os.PathLike[str]], tokenizers: Tokenizers, opts: CompileOptions
) -> dict[str, object]:
    """What a compiled manifest records about its inputs (Parquet metadata)."""
    sources = source_files(sources)
    extra: dict[str, object] = {}
    blends = [s for s in sources if is_blend_path(s)]
    if blends:
        extra["blend"] = blend_provenance(blends[0])
    if opts.tarred_audio:
        extra["tarred_audio"] = [{"path": t, "sha256": source_fingerprint(t) if _exists(t) else None}
                                 for t in expand_paths(opts.tarred_audio)]
    return {
        **extra,
        "tool": f"speech-dataprep {__version__}",
        "sources": [{"path": str(s), "sha256": source_fingerprint(s)} for s in sources],
        "tokenizers": tokenizers.hashes,
        "prompt_tokens": opts.fixed_prompt_tokens,
        **({"prompt_format": opts.prompt_format} if opts.prompt_format is not None else {}),
        "probe": opts.probe,
        "text_field": opts.text_field,
    }
