"""Compiled-manifest rows -> Lhotse cuts: a row's Recording (from its header) and the cut Lhotse loads.

Used by :class:`dataprep.integrations.lhotse.PlanSampler` (each step's ``CutSet``) and by
``dataprep export lhotse``. The cut's fields are :func:`manifests.records.cut_dict`'s (the one
writer of a Lhotse cut, shared with ``dataprep pack``); here only the recording is found:

- a :class:`lhotse.Recording` of its audio file: sample rate, channels and length from the
  manifest for a whole-file row whose header was probed, else from the file's header
  (``soundfile.info``, never a decode; cached per file);
- a ``MonoCut`` (mono audio, or ``channel=k`` picks one channel of multi-channel audio) or a
  ``MultiCut`` holding every channel (multi-channel audio, ``channel=None``), starting at the
  row's ``offset`` for its ``duration``, one supervision covering it, ``custom`` with the
  languages, task, the source's other fields and ``num_tokens``.

Audio addressing lives in :func:`recording_dict_for_row` only: container rows (schema version 2:
tar members, Parquet audio rows) are refused there with a one-line error until they are added
there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

import pyarrow as pa
import soundfile

from manifests.errors import DataprepError
from manifests.records import cut_dict, recording_dict


@lru_cache(maxsize=1 << 16)
def audio_header(path: str) -> tuple[int, int, int]:
    """(sample rate, frames, channels) of an audio file from its header; one-line error if unreadable."""
    try:
        info = soundfile.info(path)
    except FileNotFoundError:
        raise DataprepError(f"{path}: audio file not found") from None
    except (soundfile.LibsndfileError, RuntimeError, OSError) as exc:
        problem = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataprepError(f"{path}: cannot read the audio header ({problem})") from None
    return int(info.samplerate), int(info.frames), int(info.channels)


def recording_dict_for_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """The ``Recording.to_dict()`` of the file a manifest row's audio lives in."""
    from lhotse.utils import compute_num_samples

    if row.get("container") is not None:  # schema v2: a tar member or a Parquet audio row
        raise DataprepError(f"utterance {row['id']!r}: audio inside {row['container']} (a container): "
                            "Lhotse cuts of container rows are not supported yet")
    path = row["audio_path"]
    if path is None:
        raise DataprepError(f"utterance {row['id']!r}: no audio path")
    offset = float(row.get("offset") or 0.0)
    sr, ch = row.get("sample_rate"), row.get("channels")
    if offset == 0.0 and sr and ch:  # a whole file whose header compile read: no I/O
        duration = float(row["duration"])
        num_samples = compute_num_samples(duration, int(sr))
    else:
        sr, frames, ch = audio_header(path)
        num_samples, duration = frames, frames / sr
    # Lhotse rounds a supervision's end to 8 decimals: a recording length rounded up the same
    # way (far below one sample) keeps a supervision that ends with the file inside it
    duration = math.ceil(duration * 1e8) / 1e8
    return recording_dict(path, source_type="file", source=path, sampling_rate=int(sr), num_samples=num_samples,
                          duration=duration, channels=int(ch))


def recording_for_row(row: Mapping[str, Any]) -> Any:
    """The Lhotse ``Recording`` a manifest row's audio lives in."""
    from lhotse import Recording

    return Recording.from_dict(recording_dict_for_row(row))


def cut_dict_for_row(row: Mapping[str, Any], channel: int | None = None,
                     custom: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One manifest row as the dict of its Lhotse cut (:func:`manifests.records.cut_dict`)."""
    return cut_dict(row, recording_dict_for_row(row), channel, custom)


def cut_for_row(row: Mapping[str, Any], channel: int | None = None, custom: Mapping[str, Any] | None = None) -> Any:
    """One manifest row as a Lhotse cut (see the module docstring); ``custom`` adds keys."""
    from lhotse import AudioSource, MonoCut, MultiCut, Recording, SupervisionSegment

    d = cut_dict_for_row(row, channel, custom)
    r = d["recording"]
    rec = Recording(**{**r, "sources": [AudioSource(**s) for s in r["sources"]]})
    cls = MultiCut if d["type"] == "MultiCut" else MonoCut
    return cls(id=d["id"], start=d["start"], duration=d["duration"], channel=d["channel"], recording=rec,
               supervisions=[SupervisionSegment(**s) for s in d["supervisions"]], custom=d["custom"])


def cuts_for_rows(rows: pa.Table | Iterable[Mapping[str, Any]], channel: int | None = None) -> list[Any]:
    """Cuts of manifest rows, in order (a table of manifest columns, or row dicts)."""
    records = rows.to_pylist() if isinstance(rows, pa.Table) else rows
    return [cut_for_row(r, channel) for r in records]
