"""One manifest row's audio, torch-free: its bytes and samples, from a loose file, a tar member or a Parquet row.

The one reader of audio for the loader, pack and every other consumer:

- :func:`not_regular`: why a path cannot be audio without opening it (a FIFO would block), or ``None``;
- :class:`AudioReader`: a container row's bytes in one ranged read (a tar member: one ``pread`` at
  ``member_offset`` / ``member_size``, at most ``max_open`` descriptors; a Hugging Face Parquet row:
  from its row group, the last one kept); ``None`` for a loose file, read from its path;
- :func:`load_audio`: samples of ``offset`` s for ``duration`` s (seek + read, never the whole file),
  decoded by soundfile alike from a path or bytes: mono mix (``channel="mix"``), one channel
  (``channel=k``) or all (``channel="all"``, frames x channels), resampled by soxr to ``sample_rate``;
- :func:`process_reader`: this process's :class:`AudioReader` (a forked DataLoader worker opens its own).

Every failure is an :class:`AudioError` of one line naming the utterance and the file.
"""

from __future__ import annotations

import io
import os
import stat
import threading
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, Literal

import numpy as np
import numpy.typing as npt
import soundfile

from manifests import storage
from manifests.containers import read_range
from manifests.errors import DataprepError

#: a decoded segment may fall short of the manifest duration by this much (s) before it is an error
#: (MP3 encoder padding: a header saying 2.380 s for 2.376 s of samples)
SHORT_READ_TOLERANCE = 0.05

Channel = int | Literal["mix", "all"]


class AudioError(DataprepError):
    """Audio of one utterance cannot be read (message names id and file)."""


def not_regular(path: str) -> str | None:
    """Why ``path`` cannot be audio without opening it (a FIFO would block the reader forever, a
    directory or device is no audio file), or ``None`` for a regular file (links followed) or a
    missing one (reported as missing by whoever reads it)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot stat ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return None
    kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else
            "not a regular file")
    return f"is {kind}, not a regular audio file" if kind != "not a regular file" else kind


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def load_audio(utt_id: str, path: str, offset: float, duration: float | None, sample_rate: int | None = None,
               *, data: bytes | None = None, channel: Channel = "mix",
               dtype: str = "float32") -> npt.NDArray[Any]:
    """Samples of ``path`` from ``offset`` s for ``duration`` s (``None``: to the end).

    With ``data`` (the bytes of an audio file held in a container) these are decoded from memory
    and ``path`` only names them. ``channel``: ``"mix"`` (the mean of the channels, 1-D), an index
    (that channel, 1-D) or ``"all"`` (frames x channels). ``sample_rate``: resample to it (soxr HQ,
    float32 only); ``None`` keeps the file's rate. Raises :class:`AudioError` naming the utterance
    and file when it is missing, undecodable, has no such channel or is too short.
    """
    problem = not_regular(path) if data is None else None
    if problem is not None:
        raise AudioError(f"utterance {utt_id!r}: {path}: {problem}")
    source: str | IO[bytes] = path if data is None else io.BytesIO(data)
    try:
        with soundfile.SoundFile(source) as f:
            sr = f.samplerate
            start = int(round(offset * sr))
            want = -1 if duration is None else int(round(duration * sr))
            if start > 0:
                if f.frames and start >= f.frames:
                    raise AudioError(f"utterance {utt_id!r}: {path}: offset {offset:.3f} s is past the end "
                                     f"({f.frames / sr:.3f} s)")
                f.seek(start)
            samples = f.read(want, dtype=dtype, always_2d=True)
    except AudioError:
        raise
    except FileNotFoundError:
        raise AudioError(f"utterance {utt_id!r}: {path}: audio file not found") from None
    except (soundfile.LibsndfileError, RuntimeError, OSError) as exc:
        problem = _first_line(exc)
        if data is None and not Path(path).exists():
            problem = "audio file not found"
        raise AudioError(f"utterance {utt_id!r}: {path}: cannot decode audio ({problem})") from None
    got = samples.shape[0]
    if want >= 0 and got < want - SHORT_READ_TOLERANCE * sr:
        raise AudioError(f"utterance {utt_id!r}: {path}: decoded {got / sr:.3f} s from offset {offset:.3f} s, "
                         f"manifest says {duration:.3f} s (truncated file?)")
    if got == 0:
        raise AudioError(f"utterance {utt_id!r}: {path}: no samples at offset {offset:.3f} s")
    out = _select(samples, channel, utt_id, path)
    if sample_rate is not None and sr != sample_rate:
        if out.dtype != np.float32:
            raise AudioError(f"utterance {utt_id!r}: {path}: resampling needs float32 samples (asked {dtype})")
        import soxr

        out = soxr.resample(out, sr, sample_rate, quality="HQ").astype(np.float32, copy=False)
    return np.ascontiguousarray(out)


def _select(samples: npt.NDArray[Any], channel: Channel, utt_id: str, path: str) -> npt.NDArray[Any]:
    n = samples.shape[1]
    if channel == "all":
        return samples
    if channel == "mix":
        return samples.mean(axis=1, dtype=np.float32).astype(samples.dtype, copy=False) if n > 1 else samples[:, 0]
    if isinstance(channel, bool) or not isinstance(channel, int) or not 0 <= channel < n:
        raise AudioError(f"utterance {utt_id!r}: {path}: has {n} channel(s), channel {channel!r} asked for")
    return samples[:, channel]


class AudioReader:
    """Bytes of manifest rows' audio, by their address. Thread-safe; one per process (descriptors
    and Parquet readers are opened on first use and kept, at most ``max_open`` of each)."""

    def __init__(self, max_open: int = 256) -> None:
        self.max_open = max_open
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._parquet: OrderedDict[str, Any] = OrderedDict()
        self._groups: dict[tuple[str, int], Any] = {}
        self._lock = threading.Lock()

    def _fd(self, utt_id: str, path: str) -> int:
        with self._lock:
            fd = self._fds.get(path)
            if fd is not None:
                self._fds.move_to_end(path)
                return fd
            problem = not_regular(path)  # checked once per container opened (a FIFO would block open)
            if problem is not None:
                raise AudioError(f"utterance {utt_id!r}: {path}: {problem}")
            fd = os.open(path, os.O_RDONLY)
            self._fds[path] = fd
            if len(self._fds) > self.max_open:
                _, old = self._fds.popitem(last=False)
                os.close(old)
            return fd

    def member(self, utt_id: str, container: str, offset: int, size: int) -> bytes:
        """The ``size`` bytes at ``offset`` of the tar ``container`` (one ``pread``, or one range
        request of a store URL: a store fault past its retries is a :class:`StoreError` line)."""
        if storage.is_url(container):
            if not storage.exists(container):
                raise AudioError(f"utterance {utt_id!r}: {container}: container not found")
            try:
                return storage.read_ranges(container, [(offset, size)])[0]
            except storage.StoreError as exc:
                if "past the object's end" in str(exc):
                    raise AudioError(f"utterance {utt_id!r}: {container}: member at byte {offset} is cut short "
                                     "(truncated tar?)") from None
                raise
        try:
            data = read_range(self._fd(utt_id, container), offset, size)
        except FileNotFoundError:
            raise AudioError(f"utterance {utt_id!r}: {container}: container not found") from None
        except OSError as exc:
            raise AudioError(f"utterance {utt_id!r}: {container}: cannot read ({exc.strerror})") from None
        if len(data) != size:
            raise AudioError(f"utterance {utt_id!r}: {container}: member at byte {offset} is cut short "
                             f"({len(data)} of {size} bytes; truncated tar?)")
        return data

    def parquet_row(self, utt_id: str, container: str, row_group: int, row: int) -> bytes:
        """The ``audio.bytes`` of row ``row`` of row group ``row_group`` of a Parquet file."""
        import pyarrow.parquet as pq

        key = (container, row_group)
        with self._lock:
            column = self._groups.get(key)
            if column is None:
                try:
                    pf = self._parquet.get(container)
                    if pf is None:  # a store's Parquet: its footer and row group by range requests
                        pf = pq.ParquetFile(storage.open_input(container) if storage.is_url(container) else container)
                        self._parquet[container] = pf
                        if len(self._parquet) > self.max_open:
                            self._parquet.popitem(last=False)
                    column = pf.read_row_group(row_group, columns=["audio"]).column("audio").combine_chunks().field("bytes")
                except storage.StoreError:
                    raise  # the store failed past its retries: one line, never a row's "changed audio"
                except (OSError, ValueError, KeyError) as exc:
                    raise AudioError(f"utterance {utt_id!r}: {container}: cannot read row group {row_group} "
                                     f"({_first_line(exc)})") from None
                self._groups = {key: column}  # keep the last group read: a batch's rows sit together
        value = column[row].as_py() if 0 <= row < len(column) else None
        if value is None:
            raise AudioError(f"utterance {utt_id!r}: {container}: no audio bytes at row group {row_group} row {row}")
        return value  # type: ignore[no-any-return]

    def held(self, utt_id: str, container: str | None, member_offset: int | None, member_size: int | None,
             row_group: int | None, group_row: int | None) -> bytes | None:
        """The bytes of a row held in a container (a tar member, else a Parquet row), or ``None``
        for a loose file (``container`` null). Negative or null addresses count as absent."""
        if container is None:
            return None
        if member_offset is not None and member_offset >= 0 and member_size is not None:
            return self.member(utt_id, container, int(member_offset), int(member_size))
        if row_group is not None and row_group >= 0 and group_row is not None:
            return self.parquet_row(utt_id, container, int(row_group), int(group_row))
        raise AudioError(f"utterance {utt_id!r}: {container}: no member offset or row group to read")

    def held_of_row(self, row: Mapping[str, Any]) -> bytes | None:
        """:meth:`held` of a manifest row (a dict of its columns)."""
        return self.held(row["id"], row.get("container"), row.get("member_offset"), row.get("member_size"),
                         row.get("row_group"), row.get("group_row"))

    def file_bytes(self, row: Mapping[str, Any]) -> bytes:
        """The whole audio file a manifest row lives in: the loose file's bytes, or its member's."""
        data = self.held_of_row(row)
        if data is not None:
            return data
        path = row["audio_path"]
        if storage.is_url(path):
            if not storage.exists(path):
                raise AudioError(f"utterance {row['id']!r}: {path}: audio object not found")
            return storage.read_bytes(path)
        problem = not_regular(path)
        if problem is not None:
            raise AudioError(f"utterance {row['id']!r}: {path}: {problem}")
        try:
            with open(path, "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            raise AudioError(f"utterance {row['id']!r}: {path}: audio file not found") from None
        except OSError as exc:
            raise AudioError(f"utterance {row['id']!r}: {path}: cannot read ({exc.strerror})") from None

    def samples(self, row: Mapping[str, Any], sample_rate: int | None = None, *, channel: Channel = "mix",
                dtype: str = "float32") -> npt.NDArray[Any]:
        """:func:`load_audio` of a manifest row (its ``offset`` / ``duration``), wherever it lives."""
        data = self.file_bytes(row) if storage.is_url(str(row["audio_path"])) else self.held_of_row(row)
        return load_audio(row["id"], row["audio_path"], float(row.get("offset") or 0.0), row.get("duration"),
                          sample_rate, data=data, channel=channel, dtype=dtype)

    def close(self) -> None:
        """Close every descriptor held."""
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
            self._parquet.clear()
            self._groups.clear()


_PROCESS_READER: tuple[int, AudioReader] | None = None


def process_reader() -> AudioReader:
    """This process's :class:`AudioReader`, made on first use (again in a forked child)."""
    global _PROCESS_READER
    if _PROCESS_READER is None or _PROCESS_READER[0] != os.getpid():
        _PROCESS_READER = (os.getpid(), AudioReader())
    return _PROCESS_READER[1]
