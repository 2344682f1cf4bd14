"""Reading one utterance's audio at training time: a mono 16 kHz segment, or :class:`AudioError`.

Segments are read with soundfile (``offset`` + ``duration`` only, never the whole file),
mixed down to mono and resampled to 16 kHz with soxr where needed. A missing, unreadable or
too-short file raises :class:`AudioError` naming the utterance id and the file.

Audio inside containers (:class:`ContainerReader`) is one ranged read: a tar member's bytes are
one ``pread`` at its recorded offset and size (descriptors kept open per process), a Hugging Face
Parquet row is taken from its row group (the last group read is kept); the bytes are decoded from
memory with soundfile, exactly as the loose file would be.
"""

from __future__ import annotations

import io
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt
import soundfile

from dataprep.training.features import SAMPLE_RATE
from dataprep.compile.probe import not_regular
from manifests.containers import read_range
from manifests.errors import DataprepError

#: a decoded segment may fall short of the manifest duration by this much (s) before it is an error
#: (MP3 encoder padding: a header saying 2.380 s for 2.376 s of samples)
SHORT_READ_TOLERANCE = 0.05


class AudioError(DataprepError):
    """Audio of one utterance cannot be used at training time (message names id and file)."""


def load_audio(utt_id: str, path: str, offset: float, duration: float | None,
               sample_rate: int = SAMPLE_RATE, *, data: bytes | None = None) -> npt.NDArray[np.float32]:
    """Mono float32 samples at ``sample_rate`` of ``path`` from ``offset`` s for ``duration`` s.

    Reads only the segment (seek + read), never the whole file. With ``data`` (the bytes of an
    audio file held in a container) these are decoded from memory and ``path`` only names them.
    Raises :class:`AudioError` naming the utterance and file when the file is missing,
    undecodable or too short.
    """
    problem = not_regular(path) if data is None else None
    if problem is not None:  # a FIFO would block this reader forever
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
            data = f.read(want, dtype="float32", always_2d=True)
    except AudioError:
        raise
    except FileNotFoundError:
        raise AudioError(f"utterance {utt_id!r}: {path}: audio file not found") from None
    except (soundfile.LibsndfileError, RuntimeError, OSError) as exc:
        problem = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if data is None and not Path(path).exists():
            problem = "audio file not found"
        raise AudioError(f"utterance {utt_id!r}: {path}: cannot decode audio ({problem})") from None
    got = data.shape[0]
    if want >= 0 and got < want - SHORT_READ_TOLERANCE * sr:
        raise AudioError(f"utterance {utt_id!r}: {path}: decoded {got / sr:.3f} s from offset {offset:.3f} s, "
                         f"manifest says {duration:.3f} s (truncated file?)")
    if got == 0:
        raise AudioError(f"utterance {utt_id!r}: {path}: no samples at offset {offset:.3f} s")
    mono = data.mean(axis=1) if data.shape[1] > 1 else data[:, 0]
    if sr != sample_rate:
        import soxr

        mono = soxr.resample(mono, sr, sample_rate, quality="HQ").astype(np.float32, copy=False)
    return np.ascontiguousarray(mono, dtype=np.float32)


class ContainerReader:
    """Bytes of utterances held in containers, by their manifest address. Thread-safe; one per
    process (descriptors and Parquet readers are opened on first use and kept, at most
    ``max_open`` of each)."""

    def __init__(self, max_open: int = 256) -> None:
        self.max_open = max_open
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._parquet: OrderedDict[str, Any] = OrderedDict()
        self._groups: dict[tuple[str, int], Any] = {}
        self._lock = threading.Lock()

    def _fd(self, path: str) -> int:
        with self._lock:
            fd = self._fds.get(path)
            if fd is not None:
                self._fds.move_to_end(path)
                return fd
            fd = os.open(path, os.O_RDONLY)
            self._fds[path] = fd
            if len(self._fds) > self.max_open:
                _, old = self._fds.popitem(last=False)
                os.close(old)
            return fd

    def member(self, utt_id: str, container: str, offset: int, size: int) -> bytes:
        """The ``size`` bytes at ``offset`` of the tar ``container`` (one ``pread``)."""
        try:
            data = read_range(self._fd(container), offset, size)
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
                    if pf is None:
                        pf = pq.ParquetFile(container)
                        self._parquet[container] = pf
                        if len(self._parquet) > self.max_open:
                            self._parquet.popitem(last=False)
                    column = pf.read_row_group(row_group, columns=["audio"]).column("audio").combine_chunks().field("bytes")
                except (OSError, ValueError, KeyError) as exc:
                    raise AudioError(f"utterance {utt_id!r}: {container}: cannot read row group {row_group} "
                                     f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
                self._groups = {key: column}  # keep the last group read: a batch's rows sit together
        value = column[row].as_py() if 0 <= row < len(column) else None
        if value is None:
            raise AudioError(f"utterance {utt_id!r}: {container}: no audio bytes at row group {row_group} row {row}")
        return value  # type: ignore[no-any-return]

    def close(self) -> None:
        """Close every descriptor held."""
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
            self._parquet.clear()
            self._groups.clear()
