"""A Lhotse ``AudioSource`` that reads a manifest row held in a container lazily, where the audio is decoded.

:class:`ContainerSource` holds the address of a tar member (container path, byte offset and size
of its data) or of a Hugging Face Parquet row (row group, row); nothing is read when the cut is
built. ``Recording.load_audio`` (in a DataLoader worker, after the sampler's ``CutSet`` was
pickled there) fetches exactly that member with one ``pread`` (or that row from its row group)
through :func:`manifests.audio.process_reader` (one per process) and decodes it in memory as Lhotse
decodes a file: no extraction to disk, no scan of the tar, no shell command.

``to_dict()`` writes the source Lhotse and NeMo open without our code
(:func:`manifests.records.container_source_dict`: a tar member as a ``command`` source reading
its byte range); a Parquet row cannot be written so (one-line error naming ``dataprep pack``).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from lhotse.audio.source import AudioSource

from manifests.audio import process_reader
from manifests.records import CONTAINER_SOURCE, container_source_dict

@dataclass
class ContainerSource(AudioSource):  # type: ignore[misc]
    """The audio of one container row (module docstring); ``source`` names it for messages
    (``<container>:<member>``); ``container`` and the address fields locate its bytes."""

    container: str = ""
    member_offset: int | None = None
    member_size: int | None = None
    row_group: int | None = None
    group_row: int | None = None

    def data(self) -> bytes:
        """The bytes of the whole audio file the row lives in (one ranged read)."""
        held = process_reader().held(str(self.source), self.container, self.member_offset, self.member_size,
                             self.row_group, self.group_row)
        assert held is not None  # a container is always set
        return held

    def _prepare_for_reading(self, offset: float, duration: float | None) -> Any:
        return io.BytesIO(self.data())

    def _get_format(self) -> str:
        import soundfile

        return str(soundfile.info(io.BytesIO(self.data())).format).lower()

    def to_dict(self) -> dict[str, Any]:
        """The form Lhotse and NeMo open without our code (module docstring)."""
        return container_source_dict(str(self.source), self.container, self.member_offset, self.member_size,
                                     list(self.channels))

    def __repr__(self) -> str:
        return f"ContainerSource(channels={self.channels}, source='{self.source}')"


def source_from_dict(d: dict[str, Any]) -> AudioSource:
    """An ``AudioSource`` of a source dict: a :class:`ContainerSource` for our ``container`` type
    (:func:`manifests.records.recording_dict`), Lhotse's own otherwise."""
    return ContainerSource(**d) if d["type"] == CONTAINER_SOURCE else AudioSource(**d)
