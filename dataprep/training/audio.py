"""The loader's view of :mod:`manifests.audio`: one utterance's segment, mono at the model's 16 kHz.

Reading (loose files, tar members by byte range, Parquet rows), channel mixing, resampling and
the errors all live in :mod:`manifests.audio`; this adapter only fixes the training defaults.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from dataprep.training.features import SAMPLE_RATE
from manifests.audio import AudioError, AudioReader
from manifests.audio import load_audio as _load

__all__ = ["AudioError", "AudioReader", "load_audio"]


def load_audio(utt_id: str, path: str, offset: float, duration: float | None,
               sample_rate: int = SAMPLE_RATE, *, data: bytes | None = None) -> npt.NDArray[np.float32]:
    """Mono float32 samples at ``sample_rate`` (default 16 kHz) of ``path`` from ``offset`` s for
    ``duration`` s (:func:`manifests.audio.load_audio`, channels mixed)."""
    return _load(utt_id, path, offset, duration, sample_rate, data=data, channel="mix")
