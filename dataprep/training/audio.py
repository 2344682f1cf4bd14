"""Reading one utterance's audio at training time: a mono 16 kHz segment, or :class:`AudioError`.

Segments are read with soundfile (``offset`` + ``duration`` only, never the whole file),
mixed down to mono and resampled to 16 kHz with soxr where needed. A missing, unreadable or
too-short file raises :class:`AudioError` naming the utterance id and the file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import soundfile

from dataprep.training.features import SAMPLE_RATE
from manifests.errors import DataprepError

#: a decoded segment may fall short of the manifest duration by this much (s) before it is an error
#: (MP3 encoder padding: a header saying 2.380 s for 2.376 s of samples)
SHORT_READ_TOLERANCE = 0.05


class AudioError(DataprepError):
    """Audio of one utterance cannot be used at training time (message names id and file)."""


def load_audio(utt_id: str, path: str, offset: float, duration: float | None,
               sample_rate: int = SAMPLE_RATE) -> npt.NDArray[np.float32]:
    """Mono float32 samples at ``sample_rate`` of ``path`` from ``offset`` s for ``duration`` s.

    Reads only the segment (seek + read), never the whole file. Raises :class:`AudioError`
    naming the utterance and file when the file is missing, undecodable or too short.
    """
    try:
        with soundfile.SoundFile(path) as f:
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
        if not Path(path).exists():
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
