"""Source readers: NeMo JSONL, Lhotse cuts, Kaldi data dirs, CSV/TSV, Parquet, and audio in
containers: NeMo tarred datasets, Lhotse Shar, WebDataset tars, Hugging Face audio Parquet.

:func:`iter_source` streams a source as polars frames with exactly the columns of
:data:`manifests.schema.REJECTS_POLARS_SCHEMA` (containers: ``FULL_REJECTS_POLARS_SCHEMA``), in
source order, one row per non-blank line (per utterance for Kaldi, per row for Parquet). A parsed
row has ``reason``/``detail`` null; else ``reason`` is ``malformed_line``, ``non_utf8`` or
``missing_field`` and ``detail`` ``"<file>:<line>: <problem>"``. ``origin``: ``<source path>:<line>``
(1-based, every line counted; Parquet ``path:<row + 1>``); ``id``: the source's, else the audio
path as written plus ``#<offset:.3f>`` when the offset is non-zero; ``audio_path`` absolute (joined
to ``audio_root`` or the source's folder); ``offset`` null where the source gives none (a whole file);
``num_tokens``/``tps`` null (compile fills them); ``extra`` a JSON object (sorted keys) of the
unmapped fields, or null. Numbers: JSON numbers or numeric strings; a null counts as absent. BOM,
CRLF, no final newline and gzip (by magic bytes) are handled. Conventions: docs/compile.md.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from pathlib import Path

import polars as pl

from manifests.errors import DataprepError
from manifests.options import check_int
from manifests.containers import expand_paths
from manifests.readers._blend import Blend, Leaf, check_exists, is_blend_path, iter_blend
from manifests.readers._jsonl import iter_lhotse, iter_lhotse_recipe, iter_nemo
from manifests.readers._kaldi import iter_kaldi
from manifests.readers._text import iter_text_leaf
from manifests import storage, store_facts
from manifests.readers._normalize import corpus_from_extra, relabel
from manifests.readers._lines import open_binary
from manifests.readers._containers import (
    is_hf_audio,
    iter_hf_parquet,
    iter_nemo_tarred,
    iter_shar,
    iter_shar_fields,
    iter_webdataset,
)
from manifests.readers._store import iter_url_files, read_blend
from manifests.readers._tabular import iter_delimited, iter_parquet

SOURCE_FORMATS = ("nemo", "lhotse", "kaldi", "csv", "tsv", "parquet", "shar", "webdataset", "hf-parquet", "input_cfg",
                  "lhotse-recipe")

__all__ = ["SOURCE_FORMATS", "Blend", "Leaf", "detect_format", "is_blend_path", "iter_leaf", "iter_nemo_tarred",
           "iter_source", "read_blend", "recipe_sources"]


def _is_shar(p: Path) -> bool:
    return any(p.glob("cuts.*.jsonl*"))


def _parquet_kind(p: Path) -> str:
    import pyarrow.parquet as pq

    try:
        return "hf-parquet" if is_hf_audio(pq.read_schema(p)) else "parquet"
    except Exception:  # noqa: BLE001 (an unreadable file is reported by the reader)
        return "parquet"

_LHOTSE_TYPES = ("MonoCut", "MultiCut", "MixedCut", "PaddingCut")


def _partner(path: Path) -> Path:
    """The recordings manifest of a supervisions manifest (or the reverse), by Lhotse's naming
    (``librispeech_supervisions_dev-clean.jsonl.gz`` / ``librispeech_recordings_dev-clean.jsonl.gz``)."""
    name = path.name
    if "supervisions" in name:
        return path.with_name(name.replace("supervisions", "recordings"))
    return path.with_name(name.replace("recordings", "supervisions"))


def _recipe_files(folder: Path) -> list[Path]:
    """The supervisions manifests of a recipe's output folder that have their recordings beside them."""
    return sorted(p for p in folder.glob("*supervisions*.jsonl*") if _partner(p).exists())


def recipe_sources(sources: list[str]) -> list[str]:
    """``sources`` less each Lhotse recordings manifest given together with its supervisions
    manifest (read as one source, :func:`iter_source` finds the recordings by name)."""
    given = {str(Path(s).resolve()) for s in sources}
    out = []
    for s in sources:
        p = Path(s)
        if ("recordings" in p.name and p.is_file() and str(_partner(p).resolve()) in given
                and _sniff_json(p) == "lhotse-recordings"):
            continue
        out.append(s)
    return out


def _sniff_json(path: Path, max_lines: int = 100) -> str | None:
    """'nemo' / 'lhotse' / 'lhotse-recipe' (supervisions) / 'lhotse-recordings' from the first
    JSON object lines of a (gzipped) JSONL file."""
    try:
        with open_binary(path) as fh:
            for i, raw in enumerate(fh):
                if i >= max_lines:
                    break
                try:
                    obj = json.loads(raw.decode("utf-8-sig"))
                except (UnicodeDecodeError, json.JSONDecodeError):
                    continue
                if not isinstance(obj, dict):
                    continue
                if "audio_filepath" in obj:
                    return "nemo"
                if "recording_id" in obj and "start" in obj and "recording" not in obj:
                    return "lhotse-recipe"
                if "sources" in obj and "sampling_rate" in obj:
                    return "lhotse-recordings"
                if "recording" in obj or "supervisions" in obj or obj.get("type") in _LHOTSE_TYPES:
                    return "lhotse"
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error):
        return None  # the reader says what is wrong with the file
    return None


def detect_format(path: str | Path) -> str:
    """The source format of ``path``: by suffix, then by content; a Kaldi dir has ``wav.scp``.

    Raises :class:`DataprepError` naming the path when the format cannot be told.
    """
    p = Path(path)
    if p.is_dir():
        if (p / "wav.scp").exists():
            return "kaldi"
        if _is_shar(p):
            return "shar"
        if _recipe_files(p):
            return "lhotse-recipe"
        raise DataprepError(f"{p}: a directory but not a Kaldi data dir (no wav.scp), Lhotse Shar (no cuts.*.jsonl.gz) "
                            "nor a Lhotse recipe's output (no *supervisions*.jsonl.gz)")
    if not p.exists():
        raise DataprepError(f"{p}: no such file")
    suffixes = [s.lower() for s in p.suffixes]
    last = suffixes[-2] if suffixes[-1:] == [".gz"] and len(suffixes) > 1 else (suffixes[-1] if suffixes else "")
    if last in (".parquet", ".pq"):
        return _parquet_kind(p)
    if is_blend_path(p):
        return "input_cfg"
    if last == ".tar":
        return "webdataset"
    if last == ".csv":
        return "csv"
    if last == ".tsv":
        return "tsv"
    sniffed = _sniff_json(p)
    if sniffed == "lhotse-recordings":
        raise DataprepError(f"{p}: a Lhotse recordings manifest: give it with its supervisions manifest "
                            f"({_partner(p).name}), or their folder")
    if sniffed is not None:
        return sniffed
    raise DataprepError(
        f"{p}: cannot tell the source format (expected NeMo/Lhotse JSONL, a Kaldi dir, .csv, .tsv "
        f"or .parquet); pass the format explicitly ({', '.join(SOURCE_FORMATS)})"
    )


def iter_source(
    path: str | Path,
    fmt: str = "auto",
    *,
    text_field: str = "text",
    audio_root: str | Path | None = None,
    chunk_rows: int = 500_000,
    corpus_field: bool = True,
) -> Iterator[pl.DataFrame]:
    """Stream ``path`` as frames of at most ``chunk_rows`` rows in the rejects schema (plus the
    container columns for the container formats; NeMo tarred datasets: :func:`iter_nemo_tarred`).
    ``corpus_field``: a row's string ``corpus`` field goes to a ``corpus`` column
    (:func:`corpus_from_extra`); off for a blend's corpora, which the blend names.

    Memory is bounded by ``chunk_rows`` (and a 16 MiB read block), except for Kaldi lookup
    files, which are read whole. Frames are never empty; an empty source yields none.
    """
    check_int("chunk_rows", chunk_rows, ge=1, le=None)
    if storage.is_url(str(path)):
        yield from _iter_url(str(path), fmt, text_field=text_field, audio_root=audio_root, chunk_rows=chunk_rows,
                             corpus_field=corpus_field)
        return
    p = Path(path)
    if fmt == "auto":
        fmt = detect_format(p)
    if fmt not in SOURCE_FORMATS:
        raise DataprepError(f"unknown source format {fmt!r} (expected one of {', '.join(SOURCE_FORMATS)})")
    if not p.exists():
        raise DataprepError(f"{p}: no such file or directory")
    if fmt == "lhotse-recipe":
        sups = _recipe_files(p) if p.is_dir() else [p]
        frames = (f for sup in sups for f in iter_lhotse_recipe(sup, _partner(sup), audio_root=audio_root,
                                                                 chunk_rows=chunk_rows))
    elif fmt == "input_cfg":
        blend = read_blend(p)
        check_exists(blend)
        frames = iter_blend(blend, lambda leaf: iter_leaf(leaf, chunk_rows=chunk_rows))
    elif fmt == "kaldi":
        if not p.is_dir():
            raise DataprepError(f"{p}: a Kaldi source must be a data directory")
        frames = iter_kaldi(p, audio_root=audio_root, chunk_rows=chunk_rows)
    elif fmt == "shar":
        if not p.is_dir():
            raise DataprepError(f"{p}: a Lhotse Shar source must be a directory")
        frames = iter_shar(p, chunk_rows=chunk_rows)
    elif p.is_dir():
        raise DataprepError(f"{p}: is a directory, expected a {fmt} file")
    elif fmt == "nemo":
        frames = iter_nemo(p, text_field=text_field, audio_root=audio_root, chunk_rows=chunk_rows)
    elif fmt == "lhotse":
        frames = iter_lhotse(p, audio_root=audio_root, chunk_rows=chunk_rows)
    elif fmt == "webdataset":
        frames = iter_webdataset(p, chunk_rows=chunk_rows)
    elif fmt == "hf-parquet" or (fmt == "parquet" and _parquet_kind(p) == "hf-parquet"):
        frames = iter_hf_parquet(p, text_field=text_field, chunk_rows=chunk_rows)
    elif fmt in ("csv", "tsv"):
        frames = iter_delimited(p, sep="," if fmt == "csv" else "\t", text_field=text_field,
                                audio_root=audio_root, chunk_rows=chunk_rows)
    else:
        frames = iter_parquet(p, text_field=text_field, audio_root=audio_root, chunk_rows=chunk_rows)
    for frame in frames:
        if frame.height:
            yield corpus_from_extra(frame) if corpus_field and fmt != "input_cfg" else frame


#: formats read from a store's local copy (the others hold audio or folders: read in place or refused)
_COPIED_FORMATS = ("nemo", "lhotse", "csv", "tsv", "parquet", "hf-parquet")


def _iter_url(url: str, fmt: str, *, text_field: str, audio_root: str | Path | None, chunk_rows: int,
              corpus_field: bool) -> Iterator[pl.DataFrame]:
    """A source in a store: a Shar folder read in place (its tars indexed by range reads), a
    manifest file read from its local copy (:func:`manifests.storage.fetch_local`, cached by
    ETag) with relative audio paths resolved against the URL's folder and rows naming the URL;
    a WebDataset tar read in place; Kaldi folders, Lhotse recipes and ``input_cfg`` YAML files
    from local copies of their text files (:mod:`manifests.readers._store`)."""
    if fmt in ("auto", "input_cfg") and is_blend_path(url):
        blend = read_blend(url)
        check_exists(blend)
        yield from (f for f in iter_blend(blend, lambda leaf: iter_leaf(leaf, chunk_rows=chunk_rows)) if f.height)
        return
    if fmt in ("auto", "webdataset") and url.lower().endswith(".tar"):
        if not storage.exists(url):
            raise DataprepError(f"{url}: no such object")
        yield from (corpus_from_extra(f) if corpus_field else f for f in iter_webdataset(url, chunk_rows=chunk_rows))
        return
    files = iter_url_files(url, fmt, audio_root=audio_root, chunk_rows=chunk_rows)
    if files is not None:
        yield from (corpus_from_extra(f) if corpus_field else f for f in files if f.height)
        return
    if fmt in ("auto", "shar") and not storage.exists(url):
        if not storage.is_folder(url):
            raise DataprepError(f"{url}: no such object or folder")
        yield from iter_shar(url, chunk_rows=chunk_rows)
        return
    local = store_facts.fetch_local(url)
    kind = detect_format(local) if fmt == "auto" else fmt
    if kind not in _COPIED_FORMATS:
        raise DataprepError(f"{url}: a {kind} source cannot be read from a store in this form; name it by its folder "
                            "or .tar/.yaml URL, or copy it locally")
    root = audio_root if audio_root is not None else storage.parent(url)
    yield from relabel(iter_source(local, kind, text_field=text_field, audio_root=root, chunk_rows=chunk_rows,
                                   corpus_field=corpus_field), str(local), url)


def iter_leaf(leaf: Leaf, *, chunk_rows: int = 500_000) -> Iterator[pl.DataFrame]:
    """One corpus of an ``input_cfg`` blend read with its reader (NeMo brace paths expanded)."""
    if leaf.is_text:
        yield from iter_text_leaf(leaf, chunk_rows=chunk_rows)
        return
    if leaf.type == "nemo_tarred":
        yield from iter_nemo_tarred(expand_paths(list(leaf.paths)), expand_paths(list(leaf.tars)),
                                    text_field=leaf.text_field, chunk_rows=chunk_rows, corpus_field=False)
        return
    if leaf.type == "lhotse_shar" and leaf.tars:  # shar_path: {cuts: [...], recording: [...]}
        yield from (f for f in iter_shar_fields(expand_paths(list(leaf.paths)), expand_paths(list(leaf.tars)),
                                                 chunk_rows=chunk_rows) if f.height)
        return
    if leaf.type == "lhotse_shar":
        for path in leaf.paths:
            yield from iter_source(path, "shar", chunk_rows=chunk_rows, corpus_field=False)
        return
    fmt = "nemo" if leaf.type == "nemo" else "lhotse"
    for path in expand_paths(list(leaf.paths)):
        yield from iter_source(path, fmt, text_field=leaf.text_field, chunk_rows=chunk_rows, corpus_field=False)
