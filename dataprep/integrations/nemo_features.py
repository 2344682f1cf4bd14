"""NeMo: a drop-in preprocessor for dynamic resolution, and the Lightning callback that hands
it each training batch's ``target_frames``.

``DynamicResolutionPreprocessor`` subclasses NeMo's ``AudioToMelSpectrogramPreprocessor``
(same arguments, plus ``min_rate`` / ``max_rate`` / ``floor_rate`` in Hz). A training batch
carrying ``target_frames`` is featurized per utterance at the rate that brings it to that
length (:func:`bucketing.dynres.resolve`, :meth:`dataprep.training.features.LogMel.at_hops`
of :meth:`FeatureConfig.nemo`); otherwise, and in eval mode, it is NeMo's preprocessor.
``DynamicResolutionCallback.on_train_batch_start`` hands every such preprocessor the batch's
``target_frames`` and scales integer SpecAugment time-mask widths with the batch's rate.
A Canary config changes two things::

    model.preprocessor._target_: dataprep.integrations.nemo_features.DynamicResolutionPreprocessor
    trainer callbacks: + dataprep.integrations.nemo_features.DynamicResolutionCallback()
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from nemo.collections.asr.modules import AudioToMelSpectrogramPreprocessor
from nemo.collections.asr.parts.submodules.spectr_augment import SpecAugment

from bucketing.dynres import DynResConfig, resolve, time_mask_widths
from dataprep.training.features import FeatureConfig, LogMel

__all__ = ["DynamicResolutionCallback", "DynamicResolutionPreprocessor", "target_frames_of"]

_NOT_FEATURES = ("min_rate", "max_rate", "floor_rate")


def target_frames_of(batch: Any) -> int | None:
    """The ``target_frames`` a batch carries (attribute or dict key), or None."""
    value = batch.get("target_frames") if isinstance(batch, dict) else getattr(batch, "target_frames", None)
    return None if value is None else int(value)


class DynamicResolutionPreprocessor(AudioToMelSpectrogramPreprocessor):  # type: ignore[misc]
    """NeMo's preprocessor that featurizes a training batch carrying ``target_frames`` at its
    own hop (see the module docstring). ``last_rates`` (Hz per utterance) after such a batch."""

    def __init__(self, *args: Any, min_rate: float = 70.0, max_rate: float = 130.0, floor_rate: float = 50.0,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        f = self.featurizer
        self.dynres = DynResConfig(frames_per_second=f.sample_rate / f.hop_length, min_rate=min_rate,
                                   max_rate=max_rate, floor_rate=floor_rate, sample_rate=f.sample_rate)
        self.front_end = LogMel(FeatureConfig.nemo(
            sample_rate=f.sample_rate, n_window_size=f.win_length, n_window_stride=f.hop_length, n_fft=f.n_fft,
            window=kwargs.get("window", "hann"), normalize=f.normalize, preemph=f.preemph, features=f.nfilt,
            lowfreq=kwargs.get("lowfreq", 0), highfreq=kwargs.get("highfreq"), dither=f.dither, pad_to=f.pad_to,
            pad_value=f.pad_value, mag_power=f.mag_power, log_zero_guard_type=f.log_zero_guard_type,
            log_zero_guard_value=f.log_zero_guard_value, window_size=None, window_stride=None,
            **{k: kwargs[k] for k in ("log", "frame_splicing", "exact_pad", "mel_norm") if k in kwargs}))
        self.target_frames: int | None = None
        self.last_rates: torch.Tensor | None = None

    def use_batch(self, batch: Any) -> None:
        """Featurize the next forward at ``batch``'s ``target_frames`` (None: as NeMo)."""
        self.target_frames = target_frames_of(batch)

    def get_features(self, input_signal: torch.Tensor, length: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        target, self.target_frames = self.target_frames, None
        self.last_rates = None
        if target is None or not self.training or input_signal.shape[0] == 0:
            return super().get_features(input_signal, length)
        n = length.detach().cpu().numpy().astype(np.int64)
        res = resolve(n / self.dynres.sample_rate, np.array([0, n.shape[0]]), np.array([target]), self.dynres)
        if bool(res.fallback[0]):
            return super().get_features(input_signal, length)
        self.front_end.train(self.training)  # dither as NeMo: training only
        self.front_end.to(input_signal.device)
        feats, lens = self.front_end.at_hops(input_signal, length, torch.from_numpy(res.hop(self.dynres.sample_rate)),
                                             torch.from_numpy(res.frames))
        width = int(res.length[0])
        pad_to = self.front_end.config.pad_to
        if pad_to > 0 and width % pad_to:
            width += pad_to - width % pad_to
        if feats.shape[-1] < width:  # every utterance clamped at the max rate: the batch keeps its target length
            feats = torch.nn.functional.pad(feats, (0, width - feats.shape[-1]), value=self.front_end.config.pad_value)
        self.last_rates = torch.from_numpy(res.rate)
        return feats, lens.to(length.device)


class DynamicResolutionCallback(Callback):  # type: ignore[misc]
    """Before each training batch: the batch's ``target_frames`` to every
    :class:`DynamicResolutionPreprocessor` of the model, and integer SpecAugment time-mask
    widths scaled to the batch's rate (that of its longest utterance)."""

    def __init__(self) -> None:
        super().__init__()
        self._widths: dict[int, int] = {}

    def on_train_batch_start(self, trainer: Any, pl_module: torch.nn.Module, batch: Any, batch_idx: int) -> None:
        self.apply(pl_module, batch)

    def apply(self, module: torch.nn.Module, batch: Any, audio_lens: torch.Tensor | None = None) -> None:
        """What ``on_train_batch_start`` does (``audio_lens``: samples per utterance, default the
        batch's ``audio_lens`` / ``audio_signal_length`` / second element)."""
        pres = [m for m in module.modules() if isinstance(m, DynamicResolutionPreprocessor)]
        target = target_frames_of(batch)
        for p in pres:
            p.use_batch(batch)
        rate = None
        if target is not None and pres:
            lens = audio_lens if audio_lens is not None else _audio_lens(batch)
            if lens is not None and lens.numel():
                cfg = pres[0].dynres
                T = float(lens.max()) / cfg.sample_rate
                res = resolve(np.array([T]), np.array([0, 1]), np.array([target]), cfg)
                rate = float(res.rate[0])
        for m in module.modules():
            if isinstance(m, SpecAugment) and isinstance(m.time_width, int):
                base = self._widths.setdefault(id(m), m.time_width)
                m.time_width = base if rate is None else int(time_mask_widths(base, [rate], pres[0].dynres.frames_per_second)[0])


def _audio_lens(batch: Any) -> torch.Tensor | None:
    for name in ("audio_lens", "audio_signal_length"):
        v = batch.get(name) if isinstance(batch, dict) else getattr(batch, name, None)
        if isinstance(v, torch.Tensor):
            return v
    if isinstance(batch, (tuple, list)) and len(batch) > 1 and isinstance(batch[1], torch.Tensor):
        return batch[1]
    return None
