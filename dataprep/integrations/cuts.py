"""Compiled-manifest rows -> Lhotse cuts: a row's Recording (from its header) and the cut Lhotse loads.

Used by :class:`dataprep.integrations.lhotse.PlanSampler` and ``dataprep export lhotse``. The
cut's fields are :func:`manifests.records.cut_dict`'s (shared with ``dataprep pack``); here
only the recording is found: sample rate, channels and length from the manifest for a probed
whole-file row, else from the file's header (``soundfile.info``, cached per file). A
``MonoCut`` (``channel=k`` picks one channel; by default the row's own, ``extra.channel``) or
a ``MultiCut`` of every channel spans the row's ``offset`` and ``duration``.

Audio addressing lives in :func:`recording_dict_for_row` only. A row inside a container (a tar
member, a Parquet audio row) gets a ``container`` source
(:class:`dataprep.integrations.lhotse_source.ContainerSource`: read when the audio is loaded,
in the DataLoader worker); ``to_dict`` writes it as :func:`manifests.records.container_source_dict`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

import pyarrow as pa
import soundfile

from manifests.audio import process_reader
from manifests.errors import DataprepError
from manifests.records import CONTAINER_ADDRESS, CONTAINER_SOURCE, cut_dict, recording_dict, row_channel


@lru_cache(maxsize=1 << 16)
def audio_header(path: str) -> tuple[int, int, int]:
    """(sample rate, frames, channels) of an audio file from its header; one-line error if unreadable."""
    try:
        info = soundfile.info(path)
    except FileNotFoundError:
        raise DataprepError(f"{path}: audio file not found") from None
    except (soundfile.LibsndfileError, RuntimeError, OSError) as exc:
        if not os.path.exists(path):  # libsndfile says "System error" for a missing MP3
            raise DataprepError(f"{path}: audio file not found") from None
        problem = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataprepError(f"{path}: cannot read the audio header ({problem})") from None
    return int(info.samplerate), int(info.frames), int(info.channels)


@lru_cache(maxsize=1 << 16)
def member_header(name: str, container: str, member_offset: int | None, member_size: int | None,
                  row_group: int | None, group_row: int | None) -> tuple[int, int, int]:
    """(sample rate, frames, channels) of the audio held at a container address (one ranged read)."""
    data = process_reader().held(name, container, member_offset, member_size, row_group, group_row)
    assert data is not None  # a container is always set
    return bytes_header(name, data)


def bytes_header(name: str, data: bytes) -> tuple[int, int, int]:
    """(sample rate, frames, channels) of an audio file held in memory."""
    import io

    try:
        info = soundfile.info(io.BytesIO(data))
    except (soundfile.LibsndfileError, RuntimeError, OSError) as exc:
        problem = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataprepError(f"{name}: cannot read the audio header ({problem})") from None
    return int(info.samplerate), int(info.frames), int(info.channels)


def row_header(row: Mapping[str, Any]) -> tuple[int, int, int]:
    """(sample rate, frames, channels) of the whole file (or member) a row's audio lives in."""
    if row.get("container") is not None:
        return member_header(row["audio_path"], *(row.get(k) for k in CONTAINER_ADDRESS))
    return audio_header(row["audio_path"])


def recording_dict_for_row(row: Mapping[str, Any], data: bytes | None = None) -> dict[str, Any]:
    """The ``Recording.to_dict()`` of the file a manifest row's audio lives in; with ``data``
    (that file's bytes, already fetched) its header is read from them and its source holds them."""
    from lhotse.utils import compute_num_samples

    path = row["audio_path"]
    if path is None:
        raise DataprepError(f"utterance {row['id']!r}: no audio path")
    offset = float(row.get("offset") or 0.0)
    sr, ch = row.get("sample_rate"), row.get("channels")
    if offset == 0.0 and sr and ch and row_channel(row) is None:  # a whole file whose header compile read: no I/O
        duration = float(row["duration"])
        num_samples = compute_num_samples(duration, int(sr))
    else:
        sr, frames, ch = row_header(row) if data is None else bytes_header(str(path), data)
        num_samples, duration = frames, frames / sr
    # Lhotse rounds a supervision's end to 8 decimals: a recording length rounded up the same
    # way (far below one sample) keeps a supervision that ends with the file inside it
    duration = math.ceil(duration * 1e8) / 1e8
    held = row.get("container") is not None  # schema v2: a tar member or a Parquet audio row
    if data is not None:
        return recording_dict(path, source_type="memory", source=data,  # type: ignore[arg-type]
                              sampling_rate=int(sr), num_samples=num_samples, duration=duration, channels=int(ch))
    return recording_dict(path, source_type=CONTAINER_SOURCE if held else "file", source=path,
                          sampling_rate=int(sr), num_samples=num_samples, duration=duration, channels=int(ch),
                          address={k: row.get(k) for k in CONTAINER_ADDRESS} if held else None)


def recording_for_row(row: Mapping[str, Any]) -> Any:
    """The Lhotse ``Recording`` a manifest row's audio lives in."""
    from lhotse import Recording

    from dataprep.integrations.lhotse_source import source_from_dict

    r = recording_dict_for_row(row)
    return Recording(**{**r, "sources": [source_from_dict(s) for s in r["sources"]]})


def cut_dict_for_row(row: Mapping[str, Any], channel: int | None = None,
                     custom: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One manifest row as the dict of its Lhotse cut (:func:`manifests.records.cut_dict`)."""
    return cut_dict(row, recording_dict_for_row(row), channel, custom)


def cut_for_row(row: Mapping[str, Any], channel: int | None = None, custom: Mapping[str, Any] | None = None,
                data: bytes | None = None) -> Any:
    """One manifest row as a Lhotse cut (see the module docstring); ``custom`` adds keys;
    ``data``: the bytes of the row's audio file, already fetched (an in-memory source)."""
    from lhotse import MonoCut, MultiCut, Recording, SupervisionSegment

    from dataprep.integrations.lhotse_source import source_from_dict

    d = cut_dict(row, recording_dict_for_row(row, data), channel, custom)
    r = d["recording"]
    rec = Recording(**{**r, "sources": [source_from_dict(s) for s in r["sources"]]})
    cls = MultiCut if d["type"] == "MultiCut" else MonoCut
    return cls(id=d["id"], start=d["start"], duration=d["duration"], channel=d["channel"], recording=rec,
               supervisions=[SupervisionSegment(**s) for s in d["supervisions"]], custom=d["custom"])


def cuts_for_rows(rows: pa.Table | Iterable[Mapping[str, Any]], channel: int | None = None) -> list[Any]:
    """Cuts of manifest rows, in order (a table of manifest columns, or row dicts)."""
    records = rows.to_pylist() if isinstance(rows, pa.Table) else rows
    return [cut_for_row(r, channel) for r in records]
