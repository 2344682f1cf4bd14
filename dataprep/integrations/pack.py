"""``dataprep pack``: a compiled manifest's audio written into containers NeMo, Lhotse or WebDataset read.

Layouts (part ``i`` = one container): ``nemo-tarred`` (``audio_<i>.tar`` + ``manifest_<i>.json``
of :func:`manifests.records.nemo_line`, ``shard_id`` = i), ``shar`` (``recording.<i:06d>.tar``
+ ``cuts.<i:06d>.jsonl.gz`` of :func:`manifests.records.cut_dict`) and ``webdataset``
(``shard-<i:06d>.tar``, ``<key>.<ext>`` + ``<key>.json``). Every layout's manifest is
compile-ready and keeps every field of a row, its id as ``source_id``. Whole files keep their
bytes; segments are cut and written as FLAC. Rows are ordered by bucket, duration and tokens
and cut into containers of about ``container_size`` bytes. Each part is written atomically,
then a :class:`manifests.parted_run.PartedRun` marker in ``.<name>.pack/`` beside the output,
so a run splits over machines (``part_index``) and resumes. An output folder over the inputs
is refused first (:func:`manifests.outputs.refuse_folder_over_inputs`); a source that no
longer matches its row goes to ``<out>.rejects.parquet`` (``audio_changed``).
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import soundfile

from dataprep import __version__
from dataprep.compile.audio_checks import require_audio
from manifests.atomic_files import atomic_path
from manifests.audio import AudioError, AudioReader, load_audio
from manifests.content_hash import file_sha256
from manifests.errors import DataprepError
from manifests.options import check_choice, check_int
from manifests.hash_cache import manifest_hash
from manifests.manifest_read import read_manifest
from manifests.manifest_write import write_rejects
from manifests.outputs import refuse_folder_over_inputs
from manifests.parted_run import PartedRun, check_split
from manifests.records import cut_dict, extra_fields, nemo_line, recording_dict

LAYOUTS: tuple[str, ...] = ("nemo-tarred", "shar", "webdataset")
#: seconds a whole-file row may differ from its header before it is cut as a segment
WHOLE_FILE_TOLERANCE = 0.05
_FORMAT_EXT = {"FLAC": "flac", "WAV": "wav", "WAVEX": "wav", "MP3": "mp3", "OGG": "ogg", "AIFF": "aiff",
               "NIST": "sph"}


@dataclass
class PackSummary:
    """What a pack run did: parts (one container each) written and skipped (already done), rows packed."""

    layout: str
    num_parts: int
    written: list[int]
    skipped: list[int]
    rows: int
    compile_hint: str
    rejected: int = 0


def container_files(out: Path, layout: str, i: int) -> tuple[Path, Path]:
    """(tar, layout manifest) of part ``i``; the WebDataset manifest is inside the tar (returns it twice)."""
    if layout == "nemo-tarred":
        return out / f"audio_{i}.tar", out / f"manifest_{i}.json"
    if layout == "shar":
        return out / f"recording.{i:06d}.tar", out / f"cuts.{i:06d}.jsonl.gz"
    tar = out / f"shard-{i:06d}.tar"
    return tar, tar


def marker_folder(out: Path) -> Path:
    """Where the completion markers of a pack into ``out`` live: ``.<name>.pack/`` beside it."""
    return out.parent / f".{out.name}.pack"


def compile_hint(out: Path, layout: str, n: int) -> str:
    """How ``dataprep compile`` reads the packed copy."""
    if layout == "nemo-tarred":
        return (f"dataprep compile '{out}/manifest__OP_0..{n - 1}_CL_.json' "
                f"--tarred-audio '{out}/audio__OP_0..{n - 1}_CL_.tar' ...")
    if layout == "shar":
        return f"dataprep compile {out} ..."
    return f"dataprep compile {out}/shard-*.tar ..."


def _member_names(ids: pl.Series, rows: np.ndarray) -> pl.Series:
    """File-name-safe, unique member stems (no dots: WebDataset keys end at the first dot)."""
    safe = ids.str.replace_all(r"[^A-Za-z0-9_-]", "_").str.slice(0, 120)
    dup = safe.is_duplicated()
    return pl.select(pl.when(pl.lit(dup)).then(safe + "-" + pl.lit(rows).cast(pl.String)).otherwise(safe)).to_series()


def _order(df: pl.DataFrame, buckets: str | os.PathLike[str] | None) -> np.ndarray:
    """Row order: by bucket (when ``buckets`` is given), then duration, tokens and row."""
    bucket = np.zeros(df.height, dtype=np.int64)
    if buckets is not None:
        from bucketing.allocate import assign
        from bucketing.fit import grid_from_spec
        from manifests.buckets_file import read_buckets

        spec = read_buckets(buckets)
        grid = grid_from_spec(spec)
        bucket = assign(df["duration"].to_numpy(), df["num_tokens"].fill_null(0).to_numpy(), grid,
                        spec.batch_sizes()).bucket
    keys = (np.arange(df.height), df["num_tokens"].fill_null(0).to_numpy(), df["duration"].to_numpy(), bucket)
    return np.lexsort(keys)


def _estimated_bytes(df: pl.DataFrame) -> np.ndarray:
    """Bytes each row will take in a container (file or member size; 16-bit PCM for segments)."""
    pcm = (df["duration"] * df["sample_rate"].fill_null(16000) * 2 * df["channels"].fill_null(1)).to_numpy()
    out = pcm.astype(np.int64)
    size = df["member_size"].to_numpy() if "member_size" in df.columns else np.full(df.height, -1)
    loose = df["container"].is_null().to_numpy() if "container" in df.columns else np.ones(df.height, bool)
    offsets = df["offset"].fill_null(0.0).to_numpy()
    paths = df["audio_path"].to_list()
    for i in np.flatnonzero(loose & (offsets == 0)):
        try:
            out[i] = os.stat(paths[i]).st_size
        except OSError:
            pass
    has = ~np.isnan(size.astype(float)) & (size.astype(float) >= 0)
    out[has] = size[has]
    return np.maximum(out, 1)


class AudioChanged(DataprepError):
    """A row's audio no longer matches the manifest (reason ``audio_changed``)."""


def rejects_path(out: Path) -> Path:
    """Where a pack into ``out`` lists the rows it could not pack: ``<out>.rejects.parquet`` beside it."""
    return out.parent / f"{out.name}.rejects.parquet"


def _check_unchanged(row: dict[str, Any], info: Any) -> None:
    """Raise :class:`AudioChanged` when a source's header disagrees with the manifest: shorter than
    the row's end (beyond the decoder's tolerance), another sample rate or channel count."""
    offset, duration = float(row["offset"] or 0.0), float(row["duration"])
    seconds = info.frames / info.samplerate
    where = f"{row['origin']}: {row['audio_path']}"
    if row.get("sample_rate") and int(row["sample_rate"]) != info.samplerate:
        raise AudioChanged(f"{where}: {info.samplerate} Hz now, {row['sample_rate']} Hz when compiled")
    if row.get("channels") and int(row["channels"]) != info.channels:
        raise AudioChanged(f"{where}: {info.channels} channel(s) now, {row['channels']} when compiled")
    if seconds < offset + duration - WHOLE_FILE_TOLERANCE:
        raise AudioChanged(f"{where}: {seconds:.3f} s long now, the manifest reads {offset:.3f} s + {duration:.3f} s")


def _member_audio(row: dict[str, Any], source: AudioReader) -> tuple[bytes, str, int, int, int]:
    """(bytes, extension, sample rate, frames, channels) of a row as it goes into a container:
    the source bytes when the row is the whole file, else its segment as FLAC (same bit depth).
    :class:`AudioChanged` when the source no longer reads or no longer matches the manifest."""
    try:
        data = source.file_bytes(row)
    except AudioError as exc:
        raise AudioChanged(f"{row['origin']}: {exc}") from None
    try:
        info = soundfile.info(io.BytesIO(data))
    except (OSError, RuntimeError, ValueError, soundfile.LibsndfileError) as exc:
        raise AudioChanged(f"{row['origin']}: {row['audio_path']}: cannot read audio to pack ({exc})") from None
    _check_unchanged(row, info)
    offset, duration = float(row["offset"] or 0.0), float(row["duration"])
    file_seconds = info.frames / info.samplerate
    ext = _FORMAT_EXT.get(info.format)
    if offset == 0 and abs(file_seconds - duration) <= WHOLE_FILE_TOLERANCE and ext is not None:
        return data, ext, info.samplerate, info.frames, info.channels
    wide = info.subtype == "PCM_24"
    samples = load_audio(row["id"], row["audio_path"], offset, duration, data=data, channel="all",
                         dtype="int32" if wide else "int16")
    buf = io.BytesIO()
    soundfile.write(buf, samples, info.samplerate, format="FLAC", subtype="PCM_24" if wide else "PCM_16")
    return buf.getvalue(), "flac", info.samplerate, samples.shape[0], info.channels


def _add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    tf.addfile(info, io.BytesIO(data))


def source_id(row: dict[str, Any]) -> Any:
    """The id a packed member records: the row's ``source_id`` when it came from a pack already (the
    first id is kept through repacks), else its id."""
    return extra_fields(row).get("source_id", row["id"])


def _wds_meta(row: dict[str, Any], duration: float) -> dict[str, Any]:
    """A WebDataset ``.json`` member: ``source_id``, ``text``, ``duration``, languages, ``task``, and
    every ``extra`` field (the WebDataset reader takes unknown keys back into ``extra``)."""
    meta: dict[str, Any] = {**extra_fields(row), "source_id": source_id(row), "text": row["text"], "duration": duration}
    for k in ("lang", "source_lang", "target_lang", "task"):
        if row.get(k) is not None:
            meta[k] = row[k]
    return meta


def _write_container(rows: list[dict[str, Any]], layout: str, out: Path, i: int,
                     source: AudioReader) -> tuple[list[Path], list[tuple[dict[str, Any], str]]]:
    """Write part ``i``'s container (tar, then its manifest), each atomically; returns the files and
    the rows left out (row, detail): their audio changed since compile."""
    tar_path, manifest_path = container_files(out, layout, i)
    lines: list[str] = []
    changed: list[tuple[dict[str, Any], str]] = []
    with atomic_path(tar_path) as tmp, tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tf:
        for row in rows:
            try:
                data, ext, rate, frames, channels = _member_audio(row, source)
            except AudioChanged as exc:
                changed.append((row, str(exc)))
                continue
            stem = row["__member"]
            seconds = frames / rate
            duration = min(float(row["duration"]), seconds)
            _add(tf, f"{stem}.{ext}", data)
            packed = {**row, "audio_path": f"{stem}.{ext}", "offset": 0.0, "duration": duration,
                      "sample_rate": rate, "channels": channels}  # the row as its member now holds it
            if layout == "nemo-tarred":
                line, _ = nemo_line(packed)
                lines.append(json.dumps({**line, "shard_id": i, "source_id": source_id(row)}, ensure_ascii=False))
            elif layout == "shar":
                recording = recording_dict(stem, source_type="shar", source="", sampling_rate=rate,
                                           num_samples=frames, duration=seconds, channels=channels)
                _add(tf, f"{stem}.json", json.dumps(recording).encode())
                cut = cut_dict(packed, recording, custom={"source_id": source_id(row)}, cut_id=stem)
                lines.append(json.dumps(cut, ensure_ascii=False))
            else:
                _add(tf, f"{stem}.json", json.dumps(_wds_meta(row, duration), ensure_ascii=False).encode())
    if layout == "webdataset":
        return [tar_path], changed
    body = ("\n".join(lines) + "\n" if lines else "").encode()
    with atomic_path(manifest_path) as tmp:
        if layout == "shar":
            with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
                gz.write(body)
        else:
            tmp.write_bytes(body)
    return [tar_path, manifest_path], changed


def pack(
    manifest: str | os.PathLike[str],
    output: str | os.PathLike[str],
    layout: str,
    *,
    container_size: int = 1 << 30,
    num_parts: int | None = None,
    part_index: int | None = None,
    buckets: str | os.PathLike[str] | None = None,
    on_part: Callable[[int], None] | None = None,
) -> PackSummary:
    """Pack ``manifest``'s audio into ``output`` in ``layout``: ``num_parts`` parts of one container
    each (default: total bytes / ``container_size``, rounded up), only part ``part_index`` when
    given. Finished parts (marker with this fingerprint, files unchanged) are skipped; a folder
    packed with another fingerprint is refused."""
    check_choice("layout", layout, LAYOUTS)
    check_int("container_size", container_size, ge=1, le=None)
    check_split(num_parts, part_index)
    out = Path(output)
    if out.exists() and not out.is_dir():
        raise DataprepError(f"{out}: exists and is not a folder")
    df = read_manifest(manifest)
    if not df.height:
        raise DataprepError(f"{manifest}: no rows to pack")
    require_audio(manifest, "pack")
    refuse_folder_over_inputs(out, "-o", _inputs(df, manifest, buckets))
    order = _order(df, buckets)
    df = df[order].with_columns(_member_names(df["id"][order], order).alias("__member"),
                                pl.Series("__row", order, dtype=pl.Int64))
    sizes = _estimated_bytes(df)
    total = int(sizes.sum())
    n = num_parts if num_parts is not None else max(1, math.ceil(total / container_size))
    check_split(n, part_index, max_parts=df.height, max_what="the number of rows")
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    part = np.minimum((starts * n) // max(total, 1), n - 1).astype(np.int64)
    if len(np.unique(part)) != n:  # a few huge rows left a container empty: equal row counts instead
        part = np.minimum(np.arange(df.height) * n // df.height, n - 1)
    fp = {"tool": f"speech-dataprep {__version__}", "manifest_hash": manifest_hash(manifest), "layout": layout,
          "num_shards": n, "order": "bucket, duration, num_tokens, row",
          "buckets_sha256": file_sha256(buckets) if buckets is not None else None}
    run = PartedRun(marker_folder(out), fp, n, files_folder=out)
    run.check_folder()
    out.mkdir(parents=True, exist_ok=True)
    todo = [part_index] if part_index is not None else list(range(n))
    written, skipped = [], []
    source = AudioReader()
    try:
        for i in todo:
            part_rejects = run.folder / f"rejects-{i:05d}.parquet"
            if run.is_done(i, sorted({*container_files(out, layout, i), part_rejects})):
                skipped.append(i)
                continue
            run.forget(i)
            part_df = df.filter(pl.lit(part == i))
            rows = part_df.to_dicts()
            paths, changed = _write_container(rows, layout, out, i, source)
            run.folder.mkdir(parents=True, exist_ok=True)
            _write_part_rejects(part_df, changed, part_rejects)
            run.mark_done(i, [*paths, part_rejects], rows=len(rows) - len(changed), rejected=len(changed),
                          ids_first_last=[rows[0]["id"], rows[-1]["id"]])
            written.append(i)
            if on_part:
                on_part(1)
    finally:
        source.close()
    rejected = _gather_rejects(run, out)
    return PackSummary(layout, n, written, skipped, int(sum(int((part == i).sum()) for i in todo)) - rejected,
                       compile_hint(out, layout, n), rejected)


def _inputs(df: pl.DataFrame, manifest: str | os.PathLike[str], buckets: str | os.PathLike[str] | None) -> list[str]:
    """Every file a pack reads: the manifest, ``buckets.json``, each container and loose audio file (once)."""
    files = [str(manifest), *([str(buckets)] if buckets is not None else [])]
    if "container" in df.columns:
        files += df["container"].drop_nulls().unique().to_list()
        loose = df.filter(pl.col("container").is_null())["audio_path"]
    else:
        loose = df["audio_path"]
    return files + loose.drop_nulls().unique().to_list()


def _write_part_rejects(part_df: pl.DataFrame, changed: list[tuple[dict[str, Any], str]], path: Path) -> None:
    """The rows of one part whose audio changed (reason ``audio_changed``), as a rejects file."""
    detail = {r["__row"]: d for r, d in changed}
    frame = part_df.filter(pl.col("__row").is_in(list(detail))).with_columns(
        pl.lit("audio_changed").alias("reason"),
        pl.col("__row").replace_strict(detail, default=None, return_dtype=pl.String).alias("detail"))
    write_rejects(frame.drop("__member", "__row"), path)


def _gather_rejects(run: PartedRun, out: Path) -> int:
    """Once every part is done: their rejects in one ``<out>.rejects.parquet``; returns the rows in it
    (0 while parts remain)."""
    parts = [run.folder / f"rejects-{i:05d}.parquet" for i in range(run.num_parts)]
    if any(run.marker(i) is None for i in range(run.num_parts)) or not all(p.exists() for p in parts):
        return 0
    frames = [pl.read_parquet(p) for p in parts]
    merged = pl.concat([f for f in frames if f.height], how="diagonal_relaxed") if any(f.height for f in frames) \
        else frames[0]
    write_rejects(merged, rejects_path(out))
    return merged.height

