"""Manifest row -> a record of a foreign format, in one place: a NeMo manifest line, a Lhotse cut dict.

Used by ``dataprep export`` (:mod:`dataprep.integrations.export`), the Lhotse cut builder
(:mod:`dataprep.integrations.cuts`) and ``dataprep pack``, so every writer keeps the same fields.
Pure: no I/O, no Lhotse import; a row is a dict of manifest columns.

- :func:`nemo_line`: ``audio_filepath``, ``offset`` (segments only: an explicit offset, even 0,
  is a segment to NeMo and to compile), ``duration``, ``text`` (``""`` when null), ``lang`` /
  ``source_lang`` / ``target_lang`` / ``taskname`` / ``corpus`` where set, ``sampling_rate`` for a
  whole mono file of known rate, then every ``extra`` field the row does not already set.
- :func:`webdataset_meta`: the same fields as a WebDataset ``.json`` member.
- :func:`cut_dict`: Lhotse's ``cut.to_dict()`` of a ``MonoCut`` (one channel) or ``MultiCut``
  with one supervision covering the cut (``start`` 0, the text, ``language`` = ``lang``) and
  ``custom`` = :func:`custom_for_row` plus the caller's keys; :func:`recording_dict` its ``Recording``.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from manifests.errors import DataprepError

#: manifest columns written to a NeMo line (manifest name -> NeMo key)
NEMO_KEYS = {"lang": "lang", "source_lang": "source_lang", "target_lang": "target_lang", "task": "taskname",
             "corpus": "corpus"}
#: manifest columns copied into ``cut.custom`` (manifest name -> custom key, NeMo's names): the
#: NeMo keys but ``lang``, which a cut keeps as its supervision's ``language``
CUSTOM_COLUMNS = {k: v for k, v in NEMO_KEYS.items() if k != "lang"}
#: the source type of a row held in a container, inside our process (read lazily by
#: :class:`dataprep.integrations.lhotse_source.ContainerSource`); never written to a file
CONTAINER_SOURCE = "container"
#: the address fields a ``container`` source carries besides ``source`` (= ``<container>:<member>``)
CONTAINER_ADDRESS = ("container", "member_offset", "member_size", "row_group", "group_row")


#: ``extra`` keys a writer sets itself from the row as it is written, never copied: a NeMo tarred
#: line's ``shard_id``, ``sampling_rate`` (true only of a whole mono file), the row's ``channel``
#: (:func:`row_channel`: the cut's channel)
LAYOUT_KEYS = ("shard_id", "sampling_rate", "channel")


def extra_fields(row: Mapping[str, Any]) -> dict[str, Any]:
    """The row's ``extra`` JSON object ({} when null) less :data:`LAYOUT_KEYS`; one line when it
    is not an object."""
    if not row.get("extra"):
        return {}
    try:
        value = json.loads(row["extra"])
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise DataprepError(f"utterance {row['id']!r}: extra is not a JSON object")
    return {k: v for k, v in value.items() if k not in LAYOUT_KEYS}



def row_channel(row: Mapping[str, Any]) -> int | None:
    """The one channel of a multi-channel file a row is (``extra.channel``: a Lhotse supervision's
    ``channel``); ``None`` when the row is every channel of its file."""
    if not row.get("extra"):
        return None
    try:
        value = json.loads(row["extra"])
    except json.JSONDecodeError:
        return None
    channel = value.get("channel") if isinstance(value, dict) else None
    return channel if isinstance(channel, int) and not isinstance(channel, bool) else None


def nemo_line(row: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """One manifest row as a NeMo JSONL object (module docstring), and whether it holds
    ``sampling_rate``. Keys the row sets win over equally named ``extra`` fields."""
    offset = float(row["offset"] or 0.0)
    rec: dict[str, Any] = {"audio_filepath": row["audio_path"], "offset": offset, "duration": float(row["duration"]),
                           "text": row["text"] if row["text"] is not None else ""}
    if offset == 0.0 and not str(row.get("id", "")).endswith("#0.000"):
        del rec["offset"]  # a whole file: an explicit offset (even 0) makes NeMo (and compile) read a segment
    for col, key in NEMO_KEYS.items():
        if row.get(col) is not None:
            rec[key] = row[col]
    writes_rate = offset == 0.0 and bool(row.get("sample_rate")) and row.get("channels") == 1
    if writes_rate:
        rec["sampling_rate"] = int(row["sample_rate"])
    for k, v in extra_fields(row).items():
        rec.setdefault(k, v)
    return rec, writes_rate


def webdataset_meta(row: Mapping[str, Any], custom: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A WebDataset sample's ``.json`` member: :func:`nemo_line`'s fields less the audio address
    (``audio_filepath``, ``offset``, ``sampling_rate``: the member itself is the audio), with
    ``custom``'s keys added."""
    line, _ = nemo_line(row)
    for key in ("audio_filepath", "offset", "sampling_rate"):
        line.pop(key, None)
    return {**line, **(custom or {})}


def custom_for_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """``cut.custom`` of a row: languages, task, the source's other fields (``extra``), ``num_tokens``."""
    custom: dict[str, Any] = {}
    for col, key in CUSTOM_COLUMNS.items():
        if row.get(col) is not None:
            custom[key] = row[col]
    custom.update(extra_fields(row))
    if row.get("num_tokens") is not None:
        custom["num_tokens"] = int(row["num_tokens"])
    return custom


def recording_dict(rec_id: str, *, source_type: str, source: str, sampling_rate: int, num_samples: int,
                   duration: float, channels: int, address: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A Lhotse ``Recording.to_dict()``: one audio source holding ``channels`` channels
    (``address``: the :data:`CONTAINER_ADDRESS` fields of a ``container`` source)."""
    ids = list(range(int(channels)))
    src: dict[str, Any] = {"type": source_type, "channels": ids, "source": source, **(address or {})}
    return {"id": rec_id, "sources": [src], "sampling_rate": int(sampling_rate), "num_samples": int(num_samples),
            "duration": float(duration), "channel_ids": list(ids)}


def container_source_dict(name: str, container: str, member_offset: int | None, member_size: int | None,
                          channels: list[int]) -> dict[str, Any]:
    """The source of a tar member as Lhotse and NeMo open it without our code: a ``command``
    source printing the member's byte range (``tail -c +N`` seeks, ``head -c`` stops: only the
    member's bytes are read; paths shell-quoted). A Parquet row has no such form: one-line error."""
    if member_offset is None or member_offset < 0 or member_size is None or member_size < 0:
        raise DataprepError(f"{name}: a Parquet audio row has no source Lhotse or NeMo can open; write the "
                            "audio into tars first: dataprep pack MANIFEST -o DIR --layout shar (or nemo-tarred)")
    command = f"tail -c +{int(member_offset) + 1} {shlex.quote(container)} | head -c {int(member_size)}"
    return {"type": "command", "channels": list(channels), "source": command}


def cut_dict(row: Mapping[str, Any], recording: Mapping[str, Any], channel: int | None = None,
             custom: Mapping[str, Any] | None = None, *, cut_id: str | None = None, start: float | None = None,
             duration: float | None = None) -> dict[str, Any]:
    """A row as Lhotse's ``cut.to_dict()`` (module docstring). ``channel``: one channel of the
    recording (a ``MonoCut``), ``None`` = the row's own (:func:`row_channel`), else every channel
    (a ``MultiCut`` when there are several).
    ``cut_id`` / ``start`` / ``duration`` default to the row's ``id`` / ``offset`` / ``duration``."""
    ids: Sequence[int] = recording["channel_ids"]
    n = len(ids)
    channel = row_channel(row) if channel is None else channel
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
