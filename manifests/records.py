"""Manifest row -> a record of a foreign format, in one place: a NeMo manifest line, a Lhotse cut dict.

Used by ``dataprep export`` (:mod:`dataprep.integrations.export`), the Lhotse cut builder
(:mod:`dataprep.integrations.cuts`) and ``dataprep pack`` (whose rows point at the packed member),
so every writer keeps the same fields. Pure: no I/O, no Lhotse import; a row is a dict of
manifest columns.

- :func:`nemo_line`: ``audio_filepath``, ``offset``, ``duration``, ``text`` (``""`` when null),
  ``lang`` / ``source_lang`` / ``target_lang`` / ``taskname`` where set, ``sampling_rate`` for a
  whole mono file whose rate is known (NeMo then trusts ``duration`` without a header read), then
  every ``extra`` field the row does not already set.
- :func:`cut_dict`: the dict Lhotse's ``cut.to_dict()`` gives for a ``MonoCut`` (one channel) or a
  ``MultiCut`` (a list of channels) with one supervision covering the cut (``start`` 0, the text,
  ``language`` = ``lang``) and ``custom`` = :func:`custom_for_row` plus the caller's keys;
  :func:`recording_dict` the ``Recording`` it holds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from manifests.errors import DataprepError

#: manifest columns written to a NeMo line (manifest name -> NeMo key)
NEMO_KEYS = {"lang": "lang", "source_lang": "source_lang", "target_lang": "target_lang", "task": "taskname"}
#: manifest columns copied into ``cut.custom`` (manifest name -> custom key, NeMo's names)
CUSTOM_COLUMNS = {"source_lang": "source_lang", "target_lang": "target_lang", "task": "taskname"}


def _extra(row: Mapping[str, Any]) -> dict[str, Any]:
    """The row's ``extra`` JSON object ({} when null); one line when it is not an object."""
    if not row.get("extra"):
        return {}
    try:
        value = json.loads(row["extra"])
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise DataprepError(f"utterance {row['id']!r}: extra is not a JSON object")
    return value


def nemo_line(row: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """One manifest row as a NeMo JSONL object (module docstring), and whether it holds
    ``sampling_rate``. Keys the row sets win over equally named ``extra`` fields."""
    offset = float(row["offset"] or 0.0)
    rec: dict[str, Any] = {"audio_filepath": row["audio_path"], "offset": offset, "duration": float(row["duration"]),
                           "text": row["text"] if row["text"] is not None else ""}
    for col, key in NEMO_KEYS.items():
        if row.get(col) is not None:
            rec[key] = row[col]
    writes_rate = offset == 0.0 and bool(row.get("sample_rate")) and row.get("channels") == 1
    if writes_rate:
        rec["sampling_rate"] = int(row["sample_rate"])
    for k, v in _extra(row).items():
        rec.setdefault(k, v)
    return rec, writes_rate


def custom_for_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """``cut.custom`` of a row: languages, task, the source's other fields (``extra``), ``num_tokens``."""
    custom: dict[str, Any] = {}
    for col, key in CUSTOM_COLUMNS.items():
        if row.get(col) is not None:
            custom[key] = row[col]
    custom.update(_extra(row))
    if row.get("num_tokens") is not None:
        custom["num_tokens"] = int(row["num_tokens"])
    return custom


def recording_dict(rec_id: str, *, source_type: str, source: str, sampling_rate: int, num_samples: int,
                   duration: float, channels: int) -> dict[str, Any]:
    """A Lhotse ``Recording.to_dict()``: one audio source holding ``channels`` channels."""
    ids = list(range(int(channels)))
    return {"id": rec_id, "sources": [{"type": source_type, "channels": ids, "source": source}],
            "sampling_rate": int(sampling_rate), "num_samples": int(num_samples), "duration": float(duration),
            "channel_ids": list(ids)}


def cut_dict(row: Mapping[str, Any], recording: Mapping[str, Any], channel: int | None = None,
             custom: Mapping[str, Any] | None = None, *, cut_id: str | None = None, start: float | None = None,
             duration: float | None = None) -> dict[str, Any]:
    """A row as Lhotse's ``cut.to_dict()`` (module docstring). ``channel``: one channel of the
    recording (a ``MonoCut``), ``None`` = every channel (a ``MultiCut`` when there are several).
    ``cut_id`` / ``start`` / ``duration`` default to the row's ``id`` / ``offset`` / ``duration``."""
    ids: Sequence[int] = recording["channel_ids"]
    n = len(ids)
    if channel is not None and (isinstance(channel, bool) or not 0 <= channel < n):
        raise DataprepError(f"utterance {row['id']!r}: {row['audio_path']}: has {n} channel(s), "
                            f"--channel {channel} asked for")
    cut_channel: int | list[int] = (0 if n == 1 else list(ids)) if channel is None else channel
    cid = row["id"] if cut_id is None else cut_id
    length = float(row["duration"]) if duration is None else float(duration)
    sup: dict[str, Any] = {"id": cid, "recording_id": recording["id"], "start": 0.0, "duration": length,
                           "channel": list(cut_channel) if isinstance(cut_channel, list) else cut_channel}
    if row.get("text") is not None:
        sup["text"] = row["text"]
    if row.get("lang") is not None:
        sup["language"] = row["lang"]
    return {"id": cid, "start": float(row.get("offset") or 0.0) if start is None else float(start),
            "duration": length, "channel": cut_channel, "supervisions": [sup], "recording": dict(recording),
            "custom": {**custom_for_row(row), **(custom or {})},
            "type": "MultiCut" if isinstance(cut_channel, list) else "MonoCut"}
