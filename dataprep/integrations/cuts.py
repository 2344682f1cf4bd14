"""Compiled-manifest rows -> Lhotse cuts: the one place where a row becomes a Recording and a cut.

Used by :class:`dataprep.integrations.lhotse.PlanSampler` (each step's ``CutSet``) and by
``dataprep export lhotse``. A row becomes:

- a :class:`lhotse.Recording` of its audio file: sample rate, channels and length from the
  manifest for a whole-file row whose header was probed, else from the file's header
  (``soundfile.info``, never a decode; cached per file);
- a ``MonoCut`` (mono audio, or ``channel=k`` picks one channel of multi-channel audio) or a
  ``MultiCut`` holding every channel (multi-channel audio, ``channel=None``), starting at the
  row's ``offset`` for its ``duration``;
- one ``SupervisionSegment`` covering the cut (``start=0``: supervisions are relative to the
  cut), with the text and ``language=lang``, as NeMo's own manifest reader makes it;
- ``custom``: ``source_lang``, ``target_lang``, ``taskname`` (where set), every field of
  ``extra`` (the source's other fields, e.g. ``pnc``) and ``num_tokens`` (ours, incl. prompt),
  so NeMo's Canary prompt formats find their slots.

Audio addressing lives in :func:`recording_for_row` only: container rows (schema version 2:
tar members, Parquet audio rows) are refused there with a one-line error until they are added
there.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

import pyarrow as pa
import soundfile

from manifests.errors import DataprepError

#: manifest columns copied into ``cut.custom`` (manifest name -> custom key, NeMo's names)
CUSTOM_COLUMNS = {"source_lang": "source_lang", "target_lang": "target_lang", "task": "taskname"}


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


def recording_for_row(row: Mapping[str, Any]) -> Any:
    """The Lhotse ``Recording`` a manifest row's audio lives in."""
    from lhotse import AudioSource, Recording
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
    channels = list(range(int(ch)))
    return Recording(id=path, sources=[AudioSource(type="file", channels=channels, source=path)],
                     sampling_rate=int(sr), num_samples=num_samples, duration=duration, channel_ids=channels)


def custom_for_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """``cut.custom`` of a row: languages, task, the source's other fields, ``num_tokens``."""
    custom: dict[str, Any] = {}
    for col, key in CUSTOM_COLUMNS.items():
        if row.get(col) is not None:
            custom[key] = row[col]
    if row.get("extra"):
        try:
            custom.update(json.loads(row["extra"]))
        except json.JSONDecodeError:
            raise DataprepError(f"utterance {row['id']!r}: extra is not a JSON object") from None
    if row.get("num_tokens") is not None:
        custom["num_tokens"] = int(row["num_tokens"])
    return custom


def cut_for_row(row: Mapping[str, Any], channel: int | None = None, custom: Mapping[str, Any] | None = None) -> Any:
    """One manifest row as a Lhotse cut (see the module docstring); ``custom`` adds keys."""
    from lhotse import MonoCut, MultiCut, SupervisionSegment

    rec = recording_for_row(row)
    n = len(rec.channel_ids)
    if channel is not None and not 0 <= channel < n:
        raise DataprepError(f"utterance {row['id']!r}: {row['audio_path']}: has {n} channel(s), "
                            f"--channel {channel} asked for")
    cut_channel: Any = (0 if n == 1 else list(rec.channel_ids)) if channel is None else channel
    offset, duration = float(row.get("offset") or 0.0), float(row["duration"])
    sup = SupervisionSegment(id=row["id"], recording_id=rec.id, start=0.0, duration=duration, channel=cut_channel,
                             text=row.get("text"), language=row.get("lang"))
    cls = MultiCut if isinstance(cut_channel, list) else MonoCut
    return cls(id=row["id"], start=offset, duration=duration, channel=cut_channel, recording=rec, supervisions=[sup],
               custom={**custom_for_row(row), **(custom or {})})


class CutSerializer:
    """``cut.to_dict()`` of the cuts :func:`cut_for_row` makes, without Lhotse's deep copies.

    Lhotse's ``to_dict`` deep-copies the cut with ``dataclasses.asdict`` (the recording twice),
    most of an export's time. Here each recording's dict is made once per file and shape (cached)
    and the cut and supervision dicts are assembled from their fields; the result equals
    ``cut.to_dict()`` (tests compare them on every kind of row).
    """

    def __init__(self, max_recordings: int = 1 << 14) -> None:
        self._recordings: dict[tuple[str, int, int], dict[str, Any]] = {}
        self._max = max_recordings

    def _recording(self, rec: Any) -> dict[str, Any]:
        key = (rec.id, rec.num_samples, rec.sampling_rate)
        d = self._recordings.get(key)
        if d is None:
            if len(self._recordings) >= self._max:
                self._recordings.clear()
            d = self._recordings[key] = rec.to_dict()
        return d

    def to_dict(self, cut: Any) -> dict[str, Any]:
        """The dict Lhotse's ``cut.to_dict()`` gives for a cut of :func:`cut_for_row`."""
        sups = [{k: (list(v) if isinstance(v, list) else v) for k, v in vars(s).items() if v is not None}
                for s in cut.supervisions]
        d: dict[str, Any] = {"id": cut.id, "start": cut.start, "duration": cut.duration,
                             "channel": list(cut.channel) if isinstance(cut.channel, list) else cut.channel,
                             "supervisions": sups, "recording": self._recording(cut.recording)}
        if cut.custom is not None:
            d["custom"] = cut.custom
        return {**d, "type": type(cut).__name__}


def cuts_for_rows(rows: pa.Table | Iterable[Mapping[str, Any]], channel: int | None = None) -> list[Any]:
    """Cuts of manifest rows, in order (a table of manifest columns, or row dicts)."""
    records = rows.to_pylist() if isinstance(rows, pa.Table) else rows
    return [cut_for_row(r, channel) for r in records]
