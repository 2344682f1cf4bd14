"""The loader's view of :mod:`manifests.audio`: one utterance's segment, mono at the model's 16 kHz.

Reading (loose files, tar members by byte range, Parquet rows), channel mixing and the errors
live in :mod:`manifests.audio`. ``resampler`` picks how a segment at another rate reaches
``sample_rate``: ``"soxr"`` (default: soxr HQ, the segment's samples only) or ``"lhotse"``,
the samples NeMo's Lhotse dataloader gives (``cut.resample(sr).load_audio()``): segment
bounds rounded half up, a segment within 1 ms of the file's length read to the file's end,
Lhotse's own ``Resample`` transform (its backend: lhotse's sinc kernel where torchaudio is
installed, else ``scipy.signal.resample_poly``, or sox by ``LHOTSE_RESAMPLING_BACKEND``), then
cut or reflect-padded to ``round_half_up(duration * sample_rate)`` samples. Channels are
selected (or mixed) before resampling; at the target rate both are the file's samples.
"""

from __future__ import annotations

import io
import math
from decimal import ROUND_HALF_UP, Decimal
from typing import Literal

import numpy as np
import numpy.typing as npt
import soundfile

from dataprep.training.features import SAMPLE_RATE
from dataprep.training_config import RESAMPLERS
from manifests.audio import AudioError, AudioReader, not_regular
from manifests.audio import load_audio as _load
from manifests.optional import require
from manifests.options import check_choice

__all__ = ["RESAMPLERS", "AudioError", "AudioReader", "half_up", "load_audio"]

Resampler = Literal["soxr", "lhotse"]
#: Lhotse reads a segment this close (s) to the whole recording to the recording's end
_WHOLE_FILE_TOLERANCE = 1e-3


def load_audio(utt_id: str, path: str, offset: float, duration: float | None,
               sample_rate: int = SAMPLE_RATE, *, data: bytes | None = None,
               resampler: Resampler = "soxr") -> npt.NDArray[np.float32]:
    """Mono float32 samples at ``sample_rate`` (default 16 kHz) of ``path`` from ``offset`` s for
    ``duration`` s (:func:`manifests.audio.load_audio`, channels mixed), resampled by
    ``resampler`` (see the module docstring)."""
    check_choice("resampler", resampler, RESAMPLERS)
    if resampler == "soxr":
        return _load(utt_id, path, offset, duration, sample_rate, data=data, channel="mix")
    header = _header(path, data)
    if header is None or header[0] == sample_rate:  # unreadable: the reader's one-line error; or no resampling
        return _load(utt_id, path, offset, duration, sample_rate, data=data, channel="mix")
    return _lhotse_resampled(utt_id, path, offset, duration, sample_rate, data, *header)


def _header(path: str, data: bytes | None) -> tuple[int, int] | None:
    """(sample rate, frames) of the file, or None where it cannot be read (nor a FIFO opened)."""
    if data is None and not_regular(path) is not None:
        return None
    try:
        info = soundfile.info(path if data is None else io.BytesIO(data))
    except (soundfile.LibsndfileError, RuntimeError, OSError):
        return None
    return int(info.samplerate), int(info.frames)


def half_up(seconds: float, rate: int) -> int:
    """Lhotse's ``compute_num_samples``: ``seconds * rate`` rounded to 8 decimals, then half up."""
    return int(Decimal(round(seconds * rate, ndigits=8)).quantize(0, rounding=ROUND_HALF_UP))


def _lhotse_resampled(utt_id: str, path: str, offset: float, duration: float | None, sample_rate: int,
                      data: bytes | None, source_rate: int, frames: int) -> npt.NDArray[np.float32]:
    resample = require("lhotse.augmentation.torchaudio", "the lhotse resampler").Resample
    start = half_up(offset, source_rate) / source_rate
    whole = duration is None or math.isclose(duration, frames / source_rate, abs_tol=_WHOLE_FILE_TOLERANCE)
    length = None if whole else half_up(duration, source_rate) / source_rate  # type: ignore[arg-type]
    samples = _load(utt_id, path, start, length, None, data=data, channel="mix")
    out = resample(source_sampling_rate=source_rate, target_sampling_rate=sample_rate)(samples[None], sample_rate)[0]
    want = half_up(duration if duration is not None else frames / source_rate - start, sample_rate)
    if out.shape[0] > want:
        out = out[:want]
    elif out.shape[0] < want:
        out = np.pad(out, (0, want - out.shape[0]), mode="reflect")
    return np.ascontiguousarray(out, dtype=np.float32)
