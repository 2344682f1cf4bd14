"""Rows whose audio was never checked, and the one rule every command applies to them.

A kept row's audio counts as checked when its sample rate is known (compile read its header, or
the source gave it, as Lhotse recordings do). :func:`unchecked_audio` counts the others in a
compiled manifest: rows naming no audio file (metadata only) and rows whose header was not read
(``--probe never``, or ``--probe auto`` with the source's duration), and stats a spread sample of
at most :data:`SAMPLE_FILES` of their loose files to say how many do not exist. Commands that
work from durations (stats, filter, buckets, padding, plans) use such rows as they are; commands
that read audio (``pack``, ``export``) call :func:`require_audio` first, which refuses in one
line naming the fix.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import polars as pl

from manifests.schema import MODALITY_COLUMN
from manifests import storage, store_facts
from manifests.errors import DataprepError

#: most distinct audio files a check stats (spread evenly over the manifest)
SAMPLE_FILES = 1000


@dataclass(frozen=True)
class UncheckedAudio:
    """Counts over a manifest's ``rows``: ``no_path`` name no audio, ``not_read`` name audio whose
    header no one read; of ``sampled`` of those files (loose, distinct), ``absent`` do not exist
    (``first_absent``: one of them)."""

    rows: int
    no_path: int
    not_read: int
    sampled: int
    absent: int
    first_absent: str | None
    probe: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def lines(self) -> list[str]:
        """What a user reads after compile (nothing when every row's audio was checked)."""
        out = []
        if self.no_path:
            out.append(f"audio not checked: {self.no_path:,} of {self.rows:,} kept rows name no audio file "
                       "(metadata only): stats, filter, buckets and plans use their durations; pack and "
                       "export need the audio")
        if self.not_read:
            why = ("--probe never" if self.probe == "never"
                   else "durations taken from the source; --probe auto reads a header only where one is missing")
            out.append(f"audio not checked: {self.not_read:,} of {self.rows:,} kept rows, headers not read "
                       f"({why}); --probe always reads every file")
        if self.absent:
            out.append(f"audio missing: {self.absent:,} of {self.sampled:,} sampled files do not exist "
                       f"(e.g. {self.first_absent}): mount the audio or compile with --audio-root DIR")
        return out


def _absent(paths: list[str], threads: int = 8) -> list[str]:
    """The paths that name no file; store URLs asked of their store by one listing per folder."""
    urls = [p for p in paths if storage.is_url(p)]
    listed = store_facts.infos(urls) if urls else {}
    with ThreadPoolExecutor(max_workers=threads) as pool:
        exists = list(pool.map(lambda p: listed[p] is not None or storage.exists(p) if p in listed
                               else os.path.exists(p), paths))
    return [p for p, e in zip(paths, exists) if not e]


def unchecked_audio(manifest: str | os.PathLike[str], probe: str = "auto", *,
                    sample: int = SAMPLE_FILES) -> UncheckedAudio:
    """Count ``manifest``'s rows whose audio was not checked (module docstring); columns scanned
    lazily. Text-only rows (``modality`` text) have no audio: they are not counted."""
    lf = pl.scan_parquet(manifest)
    names = lf.collect_schema().names()
    if MODALITY_COLUMN in names:
        lf = lf.filter(pl.col(MODALITY_COLUMN) != "text")
    loose = pl.col("container").is_null() if "container" in names else pl.lit(True)
    has_path = pl.col("audio_path").is_not_null()
    not_read = has_path & pl.col("sample_rate").is_null()
    counts = lf.select(pl.len().alias("rows"), (~has_path).sum().alias("no_path"),
                       not_read.sum().alias("not_read"), (not_read & loose).sum().alias("loose")).collect().row(0)
    rows, no_path, n_read, n_loose = (int(x) for x in counts)
    paths: list[str] = []
    if n_loose and sample > 0:
        step = max(1, n_loose // sample)
        paths = (lf.filter(not_read & loose).select("audio_path").gather_every(step).head(sample)
                 .collect()["audio_path"].unique(maintain_order=True).to_list())
    absent = _absent(paths)
    return UncheckedAudio(rows=rows, no_path=no_path, not_read=n_read, sampled=len(paths), absent=len(absent),
                          first_absent=absent[0] if absent else None, probe=probe)


def require_audio(manifest: str | os.PathLike[str], command: str) -> None:
    """Refuse, in one line naming the fix, a manifest whose rows name no audio or most of whose
    audio files (a sample of those no header was read for) do not exist, i.e. the audio is not
    mounted: ``command`` reads the audio. A few absent files are the command's per-row rejects.
    Text-only rows (``modality`` text) are refused too: they have no audio to read."""
    name = Path(manifest)
    lf = pl.scan_parquet(manifest)
    if MODALITY_COLUMN in lf.collect_schema().names():
        text = int(lf.select((pl.col(MODALITY_COLUMN) == "text").sum()).collect().item() or 0)
        if text:
            raise DataprepError(f"{name}: {text:,} rows are text-only (modality text, a blend's text corpora): "
                                f"{command} reads the audio; run it on a manifest of the speech rows "
                                "(compile a blend of the speech corpora alone)")
    u = unchecked_audio(manifest)
    if u.no_path:
        raise DataprepError(
            f"{name}: {u.no_path:,} of {u.rows:,} rows name no audio file (a metadata-only manifest): {command} "
            "reads the audio; compile a source that names each row's audio (NeMo audio_filepath, an 'audio' "
            "column), or plan from this manifest as it is")
    if u.absent * 2 > u.sampled:  # most of it absent: not mounted (a few: pack rejects those rows, each)
        raise DataprepError(
            f"{name}: {u.absent:,} of {u.sampled:,} sampled audio files do not exist (e.g. {u.first_absent}): "
            f"{command} reads the audio; mount it where the manifest says, or compile again with --audio-root DIR")
