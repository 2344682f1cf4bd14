"""Kaldi data directories: ``text`` (+ ``wav.scp``, optional ``segments``, ``utt2dur``,
``utt2lang``, ``utt2spk``).

Rows are the utterances of ``text``, in its order, ``origin`` = ``text:<line>``. Lookup files
are read whole (they are maps keyed by id); a bad line in one of them (a pipe command in
``wav.scp``, a segment with the wrong field count, a non-numeric duration) rejects the
utterances that use it, naming that file and line. Utterances of ``segments`` with no line in
``text`` and undecodable lookup lines become extra reject rows after the ``text`` rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import polars as pl

from manifests.errors import DataprepError
from manifests.readers._lines import iter_lines
from manifests.readers._normalize import base_dir_for, finish

_BIG = 1 << 62


def _keyed(path: Path, chunk_rows: int) -> pl.DataFrame:
    """lineno, key, value (rest of the line, stripped), origin, utf8_error."""
    frames = list(iter_lines(path, chunk_rows))
    df = pl.concat(frames) if frames else pl.DataFrame(
        schema={"lineno": pl.Int64, "line": pl.String, "utf8_error": pl.String})
    parts = pl.col("line").str.strip_chars().str.extract_groups(r"^(\S+)\s*(.*)$")
    return df.with_columns(
        parts.struct.field("1").alias("key"),
        parts.struct.field("2").alias("value"),
        pl.format("{}:{}", pl.lit(str(path)), pl.col("lineno")).alias("origin"),
    )


def _wav_scp(path: Path) -> pl.DataFrame:
    """rec, audio, wav_err: one row per recording of ``wav.scp`` (first line wins)."""
    return _keyed(path, _BIG).filter(pl.col("key").is_not_null()).with_columns(
        pl.when(pl.col("value") == "").then(pl.format("{}: expected '<recording-id> <path>'", pl.col("origin")))
        .when(pl.col("value").str.ends_with("|")).then(pl.format("{}: pipe commands not supported", pl.col("origin")))
        .alias("wav_err")
    ).select(pl.col("key").alias("rec"), pl.col("value").alias("audio"), "wav_err").unique(
        "rec", keep="first", maintain_order=True)


def _segments(path: Path) -> pl.DataFrame:
    """key (utterance), rec, start, end (s), seg_err, origin: the lines of ``segments``."""
    f = pl.col("value").str.split(" ").list.eval(pl.element().filter(pl.element() != ""))
    return _keyed(path, _BIG).with_columns(
        f.list.get(0, null_on_oob=True).alias("rec"),
        f.list.get(1, null_on_oob=True).cast(pl.Float64, strict=False).alias("start"),
        f.list.get(2, null_on_oob=True).cast(pl.Float64, strict=False).alias("end"),
        f.list.len().alias("_n"),
    ).with_columns(
        pl.when((pl.col("_n") != 3) | pl.col("start").is_null() | pl.col("end").is_null())
        .then(pl.format("{}: expected '<utt> <recording> <start> <end>' with numbers", pl.col("origin")))
        .alias("seg_err")
    )


_AUX = ("utt2dur", "utt2lang", "utt2spk")


def _aux(path: Path, name: str) -> pl.DataFrame:
    """utt, <name>, <name>_err: a per-utterance lookup file (``utt2dur`` as seconds)."""
    d = _keyed(path, _BIG).filter(pl.col("key").is_not_null())
    err: pl.Expr = pl.lit(None, pl.String)
    if name == "utt2dur":
        d = d.with_columns(pl.col("value").cast(pl.Float64, strict=False).alias("utt2dur"))
        err = pl.when(pl.col("utt2dur").is_null()).then(pl.format("{}: duration is not a number", pl.col("origin")))
    else:
        d = d.with_columns(pl.when(pl.col("value") != "").then(pl.col("value")).alias(name))
    return d.with_columns(err.alias(f"{name}_err")).select(pl.col("key").alias("utt"), name, f"{name}_err").unique(
        "utt", keep="first", maintain_order=True)


def _reason_and_detail(has_seg: bool) -> tuple[pl.Expr, pl.Expr]:
    """The first problem of a joined utterance row, in order, as (reason, detail)."""
    checks = [(pl.col("utf8_error").is_not_null(), "non_utf8",
               pl.format("{}: {}", pl.col("origin"), pl.col("utf8_error")))]
    if has_seg:
        checks += [
            (pl.col("rec").is_null() & pl.col("seg_err").is_null(), "missing_field",
             pl.format("{}: utterance {} has no line in segments", pl.col("origin"), pl.col("utt"))),
            (pl.col("seg_err").is_not_null(), "malformed_line", pl.col("seg_err")),
        ]
    checks += [
        (pl.col("wav_err").is_not_null(), "malformed_line", pl.col("wav_err")),
        (pl.col("audio").is_null(), "missing_field",
         pl.format("{}: no wav.scp entry for recording {}", pl.col("origin"), pl.col("rec"))),
        (pl.col("utt2dur_err").is_not_null(), "malformed_line", pl.col("utt2dur_err")),
    ]
    reason: pl.Expr = pl.lit(None, pl.String)
    detail: pl.Expr = pl.lit(None, pl.String)
    for cond, code, msg in reversed(checks):
        reason = pl.when(cond).then(pl.lit(code)).otherwise(reason)
        detail = pl.when(cond).then(msg).otherwise(detail)
    return reason, detail


def _raw_rows(t: pl.DataFrame, has_seg: bool) -> pl.DataFrame:
    """A joined ``text`` chunk as raw reader columns (value + type tag) for ``finish``."""
    duration = (pl.col("end") - pl.col("start")) if has_seg else pl.col("utt2dur")
    reason, detail = _reason_and_detail(has_seg)
    ok = pl.col("utf8_error").is_null()
    return t.select(
        "origin", reason.alias("reason"), detail.alias("detail"),
        pl.col("utt").alias("id"), pl.when(ok).then(pl.lit("VARCHAR")).alias("id__t"),
        pl.when(pl.col("wav_err").is_null()).then(pl.col("audio")).alias("audio"),
        pl.when(ok).then(pl.lit("VARCHAR")).alias("audio__t"),
        pl.col("text"), pl.when(ok).then(pl.lit("VARCHAR")).alias("text__t"),
        pl.col("utt2lang").alias("lang"),
        pl.when(pl.col("utt2lang").is_not_null()).then(pl.lit("VARCHAR")).alias("lang__t"),
        (pl.col("start") if has_seg else pl.lit(None, pl.Float64)).cast(pl.String).alias("offset"),
        pl.when(pl.col("start").is_not_null() if has_seg else pl.lit(False)).then(pl.lit("DOUBLE")).alias("offset__t"),
        duration.cast(pl.String).alias("duration"),
        pl.when(duration.is_not_null()).then(pl.lit("DOUBLE")).alias("duration__t"),
        pl.when(pl.col("utt2spk").is_not_null())
        .then(pl.struct(pl.col("utt2spk").alias("speaker")).struct.json_encode()).alias("extra"),
    )


def _join_chunk(chunk: pl.DataFrame, text_path: Path, seg: pl.DataFrame | None, wav: pl.DataFrame,
                aux: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """Lines of ``text`` joined with their segment, recording and lookup values."""
    t = chunk.with_columns(
        pl.col("line").str.strip_chars().str.extract_groups(r"^(\S+)\s*(.*)$").alias("p"),
        pl.format("{}:{}", pl.lit(str(text_path)), pl.col("lineno")).alias("origin"),
    ).with_columns(pl.col("p").struct.field("1").alias("utt"), pl.col("p").struct.field("2").alias("text"))
    if seg is not None:
        t = t.join(seg.select(pl.col("key").alias("utt"), "rec", "start", "end", "seg_err")
                   .unique("utt", keep="first", maintain_order=True), on="utt", how="left", maintain_order="left")
    else:
        t = t.with_columns(pl.col("utt").alias("rec"))
    t = t.join(wav, on="rec", how="left", maintain_order="left")
    for name in _AUX:
        if name in aux:
            t = t.join(aux[name], on="utt", how="left", maintain_order="left")
        else:
            t = t.with_columns(pl.lit(None, pl.String if name != "utt2dur" else pl.Float64).alias(name),
                               pl.lit(None, pl.String).alias(f"{name}_err"))
    return t


def _leftovers(path: Path, seg: pl.DataFrame | None, text_keys: list[pl.Series]) -> pl.DataFrame | None:
    """Lines that are not utterances of ``text`` but must not vanish: segments without a
    ``text`` line, and undecodable lines of the lookup files."""
    parts = []
    if seg is not None:
        known = pl.concat(text_keys) if text_keys else pl.Series([], dtype=pl.String)
        orphan = seg.filter(pl.col("key").is_not_null() & ~pl.col("key").is_in(known.implode()))
        parts.append(orphan.select(
            "origin", pl.col("key").alias("id"), pl.lit("VARCHAR").alias("id__t"),
            pl.lit("missing_field").alias("reason"),
            pl.format("{}: utterance {} has no line in text", pl.col("origin"), pl.col("key")).alias("detail")))
    for name in ("wav.scp", "segments", *_AUX):
        p = path / name
        if p.exists():
            bad = _keyed(p, _BIG).filter(pl.col("utf8_error").is_not_null())
            parts.append(bad.select("origin", pl.lit(None, pl.String).alias("id"),
                                    pl.lit(None, pl.String).alias("id__t"), pl.lit("non_utf8").alias("reason"),
                                    pl.format("{}: {}", pl.col("origin"), pl.col("utf8_error")).alias("detail")))
    rows = [df for df in parts if df.height]
    return pl.concat(rows) if rows else None


def iter_kaldi(path: Path, *, audio_root: str | Path | None, chunk_rows: int) -> Iterator[pl.DataFrame]:
    """Yield utterance rows of a Kaldi data dir (see the module docstring)."""
    text_path = path / "text"
    if not text_path.exists():
        raise DataprepError(f"{path}: Kaldi data dir has no 'text' file")
    base = base_dir_for(path / "wav.scp", audio_root)
    wav = _wav_scp(path / "wav.scp")
    seg = _segments(path / "segments") if (path / "segments").exists() else None
    aux = {name: _aux(path / name, name) for name in _AUX if (path / name).exists()}
    text_keys: list[pl.Series] = []
    for chunk in iter_lines(text_path, chunk_rows):
        t = _join_chunk(chunk, text_path, seg, wav, aux)
        text_keys.append(t["utt"].drop_nulls())
        yield finish(_raw_rows(t, seg is not None), base_dir=base, labels=_LABELS, require_audio=False)
    leftovers = _leftovers(path, seg, text_keys)
    if leftovers is not None:
        yield finish(leftovers, base_dir=base, labels=_LABELS, require_audio=False)


_LABELS = {"id": "utt-id", "audio": "wav.scp", "text": "text", "offset": "segments", "duration": "utt2dur",
           "lang": "utt2lang", "source_lang": "source_lang", "target_lang": "target_lang", "task": "task",
           "sample_rate": "sample_rate", "channels": "channels"}
