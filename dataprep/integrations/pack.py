"""``dataprep pack``: a compiled manifest's audio written into containers NeMo, Lhotse or WebDataset read.

Layouts (part ``i`` = one container): ``nemo-tarred`` (``audio_<i>.tar`` + ``manifest_<i>.json``
of :func:`manifests.records.nemo_line`, ``shard_id`` = i), ``shar`` (``recording.<i:06d>.tar``
+ ``cuts.<i:06d>.jsonl.gz`` of :func:`manifests.records.cut_dict`) and ``webdataset``
(``shard-<i:06d>.tar``, ``<key>.<ext>`` + ``<key>.json`` of :func:`manifests.records.webdataset_meta`).
Every layout's manifest is compile-ready and keeps every field of a row, its id as
``source_id``. Whole files keep their bytes; segments are cut and written as FLAC. Rows are
ordered by bucket, duration and tokens and cut every ``container_size`` estimated bytes; the
split is recorded (``split.json``) and reused by a resume. Each part is written atomically, then
a :class:`manifests.parted_run.PartedRun` marker in ``.<name>.pack/`` beside the output, so a
run splits over machines (``part_index``) and resumes. An output folder over the inputs is
refused first (:func:`manifests.outputs.refuse_folder_over_inputs`); a source that no longer
matches what compile recorded goes to ``<out>.rejects.parquet`` (``audio_changed``).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import itertools
import json
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
from manifests import storage
from manifests.atomic_files import atomic_path, write_json
from manifests.audio import AudioError, AudioReader, load_audio
from manifests.content_hash import file_sha256
from manifests.errors import DataprepError
from manifests.options import check_choice, check_int
from manifests.hash_cache import manifest_hash
from manifests.manifest_read import read_manifest
from manifests.manifest_write import write_rejects
from manifests.outputs import refuse_folder_over_inputs
from manifests.parted_run import PartedRun, check_split
from manifests.records import cut_dict, extra_fields, nemo_line, recording_dict, row_channel, webdataset_meta

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


#: bytes a member adds beside its data: its 512-byte header and on average half a 512-byte block
#: of padding, and for Shar and WebDataset its ``.json`` member (header, a few hundred bytes, padding)
MEMBER_OVERHEAD = {"nemo-tarred": 768, "shar": 768 + 1280, "webdataset": 768 + 1280}


def _estimated_bytes(df: pl.DataFrame, layout: str) -> np.ndarray:
    """Bytes each row will take in its container: its share of the file (or member) it is cut
    from, at that file's bytes per second (its size over its length: the header's for a file
    that rows are segments of, else the latest end of a row in it), plus
    :data:`MEMBER_OVERHEAD`; 16-bit PCM when the file's size cannot be had."""
    pcm = (df["duration"] * df["sample_rate"].fill_null(16000) * 2 * df["channels"].fill_null(1)).to_numpy()
    held = df["container"].is_not_null() if "container" in df.columns else pl.Series([False] * df.height)
    frame = df.select(pl.col("audio_path").alias("key"),  # a member's audio_path names it: one key per file or member
                      pl.col("offset").fill_null(0.0).alias("offset"),
                      (pl.col("offset").fill_null(0.0) + pl.col("duration")).alias("end"),
                      pl.col("duration"), pl.lit(held).alias("held"),
                      (pl.col("member_size") if "member_size" in df.columns else pl.lit(None, pl.Int64)).alias("msize"))
    files = frame.group_by("key", maintain_order=True).agg(
        pl.col("end").max().alias("file_end"), pl.col("held").first(), pl.col("msize").first(),
        ((pl.col("offset") > 0) | (pl.len() > 1)).any().alias("cut"))
    sizes, ends = [], []
    for path, is_held, msize, end, cut in files.select("key", "held", "msize", "file_end", "cut").iter_rows():
        # one stat (and for a file cut into segments one header read) per file, not per row
        if is_held:
            sizes.append(float(msize) if msize is not None and msize >= 0 else np.nan)
            ends.append(end)
            continue
        size, length = np.nan, end
        try:
            if storage.is_url(str(path)):  # the object's size only: no audio read to estimate
                size = float(storage.stat(str(path)).size)
            else:
                size = float(os.stat(path).st_size)
                length = max(end, soundfile.info(path).duration) if cut else end
        except (OSError, TypeError, ValueError, RuntimeError, soundfile.LibsndfileError):
            pass  # a file gone or unreadable: estimated as PCM (pack then rejects it)
        sizes.append(size)
        ends.append(length)
    files = files.with_columns(pl.Series("file_bytes", sizes, dtype=pl.Float64),
                               pl.Series("file_end", ends, dtype=pl.Float64))
    share = frame.join(files.select("key", "file_end", "file_bytes"), on="key", how="left", maintain_order="left")
    est = (share["file_bytes"] * share["duration"] / share["file_end"]).to_numpy()
    est = np.where(np.isfinite(est) & (est > 0), est, pcm)
    return np.maximum(est.astype(np.int64), 1) + MEMBER_OVERHEAD[layout]


class AudioChanged(DataprepError):
    """A row's audio no longer matches the manifest (reason ``audio_changed``)."""


def rejects_path(out: Path) -> Path:
    """Where a pack into ``out`` lists the rows it could not pack: ``<out>.rejects.parquet`` beside it."""
    return out.parent / f"{out.name}.rejects.parquet"


def _check_member(row: dict[str, Any]) -> None:
    """Raise :class:`AudioChanged` unless the tar header just before a member row's data still
    declares what compile recorded: a valid header of ``member_size`` bytes named as the member
    (a tar rewritten or reordered since compile would hand over another member's bytes)."""
    container, offset, size = row.get("container"), row.get("member_offset"), row.get("member_size")
    if container is None or offset is None or offset < 512 or size is None:
        return  # a loose file or a Parquet row: no tar header to check
    member = str(row["audio_path"])[len(str(container)) + 1:]
    where = f"{row['origin']}: {row['audio_path']}"
    try:
        if storage.is_url(str(container)):  # one range request for the header in the store
            if not storage.exists(str(container)):
                raise FileNotFoundError(container)
            block = storage.read_ranges(str(container), [(int(offset) - 512, 512)])[0]
        else:
            with open(container, "rb") as fh:
                fh.seek(int(offset) - 512)
                block = fh.read(512)
        header = tarfile.TarInfo.frombuf(block, tarfile.ENCODING, "surrogateescape")
    except storage.StoreError:
        raise  # the store failed past its retries: one line, the pack stops
    except FileNotFoundError:
        raise AudioChanged(f"{where}: container not found") from None
    except (OSError, tarfile.TarError) as exc:
        raise AudioChanged(f"{where}: no tar header before byte {offset} now ({exc})") from None
    # a long or non-ASCII name lives in a PAX / GNU header before this one, which holds a stand-in
    extended = len(member) >= 99 or not member.isascii()
    if header.size != size or not (header.name == member or extended):
        raise AudioChanged(f"{where}: the tar now holds {header.name!r} ({header.size} bytes) at byte {offset}, "
                           f"{member!r} ({size} bytes) when compiled")


def _check_unchanged(row: dict[str, Any], info: Any) -> None:
    """Raise :class:`AudioChanged` when a source's header disagrees with the manifest: shorter than
    the row's end (beyond the decoder's tolerance), another sample rate or channel count (or
    fewer channels than the row's own, :func:`manifests.records.row_channel`)."""
    offset, duration = float(row["offset"] or 0.0), float(row["duration"])
    seconds = info.frames / info.samplerate
    where = f"{row['origin']}: {row['audio_path']}"
    channel = row_channel(row)
    if row.get("sample_rate") and int(row["sample_rate"]) != info.samplerate:
        raise AudioChanged(f"{where}: {info.samplerate} Hz now, {row['sample_rate']} Hz when compiled")
    if channel is not None and channel >= info.channels:
        raise AudioChanged(f"{where}: {info.channels} channel(s) now, the row is channel {channel}")
    if channel is None and row.get("channels") and int(row["channels"]) != info.channels:
        raise AudioChanged(f"{where}: {info.channels} channel(s) now, {row['channels']} when compiled")
    if seconds < offset + duration - WHOLE_FILE_TOLERANCE:
        raise AudioChanged(f"{where}: {seconds:.3f} s long now, the manifest reads {offset:.3f} s + {duration:.3f} s")


def _member_audio(row: dict[str, Any], source: AudioReader) -> tuple[bytes, str, int, int, int]:
    """(bytes, extension, sample rate, frames, channels) of a row as it goes into a container:
    the source bytes when the row is the whole file, else its segment (its own channel only,
    :func:`manifests.records.row_channel`) as FLAC (same bit depth). :class:`AudioChanged` when
    the source no longer reads or no longer matches the manifest."""
    _check_member(row)
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
    channel = row_channel(row)
    if offset == 0 and abs(file_seconds - duration) <= WHOLE_FILE_TOLERANCE and ext is not None and channel is None:
        return data, ext, info.samplerate, info.frames, info.channels
    wide = info.subtype == "PCM_24"
    samples = load_audio(row["id"], row["audio_path"], offset, duration, data=data,
                         channel="all" if channel is None else channel, dtype="int32" if wide else "int16")
    buf = io.BytesIO()
    soundfile.write(buf, samples, info.samplerate, format="FLAC", subtype="PCM_24" if wide else "PCM_16")
    return buf.getvalue(), "flac", info.samplerate, samples.shape[0], 1 if samples.ndim == 1 else samples.shape[1]


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
            fields = extra_fields(row)  # the layout keys (shard_id, a channel now cut out) are the member's own
            packed = {**row, "audio_path": f"{stem}.{ext}", "offset": 0.0, "duration": duration,
                      "sample_rate": rate, "channels": channels,
                      "extra": json.dumps(fields, ensure_ascii=False) if fields else None}  # as its member holds it
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
                meta = webdataset_meta(packed, {"source_id": source_id(row)})
                _add(tf, f"{stem}.json", json.dumps(meta, ensure_ascii=False).encode())
    if layout == "webdataset":
        return [tar_path], changed
    body = ("\n".join(lines) + "\n" if lines else "").encode()
    with atomic_path(manifest_path) as tmp:
        if layout == "shar":
            with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:  # no temp name inside
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
    key = {"tool": f"speech-dataprep {__version__}", "manifest_hash": manifest_hash(manifest), "layout": layout,
           "order": "bucket, duration, num_tokens, row",
           "buckets_sha256": file_sha256(buckets) if buckets is not None else None,
           "asked": {"num_parts": num_parts} if num_parts is not None else {"container_size": container_size}}
    split_file = marker_folder(out) / "split.json"
    bounds = _recorded_split(split_file, key, df.height)
    if bounds is None:
        bounds = _split(_estimated_bytes(df, layout), num_parts, container_size)
    n = len(bounds) - 1
    check_split(n, part_index, max_parts=df.height, max_what="the number of rows")
    part = np.searchsorted(np.asarray(bounds), np.arange(df.height), side="right") - 1
    fp = {**{k: v for k, v in key.items() if k != "asked"}, "num_shards": n,
          "split_sha256": hashlib.sha256(json.dumps(bounds).encode()).hexdigest()}
    run = PartedRun(marker_folder(out), fp, n, files_folder=out)
    run.check_folder()
    if _recorded_split(split_file, key, df.height) != bounds:
        write_json({**key, "bounds": bounds}, split_file)
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


def _split(sizes: np.ndarray, num_parts: int | None, container_size: int) -> list[int]:
    """Where each part starts in pack order, and the end (part count + 1 row positions). With
    ``num_parts``: parts of about equal estimated bytes (equal row counts when a few huge rows
    would leave one empty). Else parts cut in order every ``container_size`` bytes: a row goes
    to the part its middle byte falls in, so every part but the last holds the size give or take
    half a row at each end (a row larger than the size is a part of its own)."""
    total = int(sizes.sum())
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    if num_parts is not None:
        part = np.minimum((starts * num_parts) // max(total, 1), num_parts - 1).astype(np.int64)
        if len(np.unique(part)) != num_parts:
            part = np.minimum(np.arange(len(sizes)) * num_parts // max(len(sizes), 1), num_parts - 1)
    else:
        part = np.unique((starts + sizes // 2) // container_size, return_inverse=True)[1]
    n = int(part[-1]) + 1 if len(part) else 1
    return [int(b) for b in np.searchsorted(part, np.arange(n), side="left")] + [len(sizes)]


def _recorded_split(path: Path, key: dict[str, Any], rows: int) -> list[int] | None:
    """The part boundaries an earlier run of the same manifest, layout, order and request recorded
    (so a resume cuts the parts as the run it resumes did, whatever happened to the audio since);
    ``None`` when there is none for ``key``."""
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(recorded, dict) or {k: recorded.get(k) for k in key} != key:
        return None
    bounds = recorded.get("bounds")
    ok = (isinstance(bounds, list) and len(bounds) >= 2 and all(type(b) is int for b in bounds)
          and bounds[0] == 0 and bounds[-1] == rows and all(a <= b for a, b in itertools.pairwise(bounds)))
    return bounds if ok else None


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

