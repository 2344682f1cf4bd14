"""Dynamic-resolution features for a batch: each utterance's log-mel at the frame rate that
brings it to the batch's target frames, padded only where a clamp binds.

:func:`collate_dynamic_resolution` is the helper any trainer can call on a batch's waves
(ours calls it from :class:`~dataprep.training.batches.BatchBuilder` for plans made with
``plan-batches --dynamic-resolution``). The rates, clamps and fallback come from
:func:`bucketing.dynres.resolve` with each utterance's duration taken from its decoded samples
(``len(wave) / sample_rate`` seconds), so the unclamped utterances come out at exactly the
target length; the features are :meth:`~dataprep.training.features.LogMel.at_hop` at
``sample_rate / rate`` samples per hop (filter bank, window and n_fft unchanged).
Evaluation never uses it: ``evaluation=True`` gives ordinary padding at the base rate.
SpecAugment: :func:`time_mask_widths` scales a time-mask width (frames at the base rate)
to each utterance's rate, so a mask covers the same seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from bucketing.dynres import DynResConfig, resolve, target_frames, time_mask_widths
from dataprep.training.features import FeatureConfig, LogMel

__all__ = ["DynResConfig", "DynResFeatures", "collate_dynamic_resolution", "time_mask_widths"]


@dataclass
class DynResFeatures:
    """A batch's features: ``features`` (B, L, n_mels) float32 zero-padded, ``feature_lens``
    (B,) int64 frames, ``rates`` (B,) float64 Hz, ``clamped`` (B,) bool, ``target_frames``
    (the batch's target), ``fallback`` (True: ordinary padding at the base rate)."""

    features: torch.Tensor
    feature_lens: torch.Tensor
    rates: torch.Tensor
    clamped: torch.Tensor
    target_frames: int
    fallback: bool

    def time_mask_widths(self, width: int, frames_per_second: float = 100.0) -> torch.Tensor:
        """Per-utterance SpecAugment time-mask width (frames) for ``width`` frames at the base rate."""
        return torch.from_numpy(time_mask_widths(width, self.rates.numpy(), frames_per_second))


def collate_dynamic_resolution(
    waves: Sequence[npt.NDArray[np.float32] | torch.Tensor],
    target: int | None = None,
    *,
    config: DynResConfig | None = None,
    features: FeatureConfig | LogMel | None = None,
    evaluation: bool = False,
) -> DynResFeatures:
    """Log-mel features of ``waves`` (mono, ``config.sample_rate`` Hz, one per utterance) at
    dynamic resolution.

    ``target``: the batch's target frames (a plan's ``target_frames``); None = the longest wave
    at the base rate. ``config``: the rates (default :class:`DynResConfig`: 100 Hz base,
    70-130 Hz, floor 50 Hz); its base rate and sample rate must be the front end's.
    ``features``: the front end (a :class:`FeatureConfig`, or a :class:`LogMel` to reuse;
    default :meth:`FeatureConfig.ours`). ``evaluation``: ordinary padding at the base rate
    (eval loaders must not change the frame rate).

    Valid frames: an utterance at its dynamic rate has ``resolve``'s frames (exactly ``target``
    unless clamped); at the base rate (``evaluation``, or a batch that fell back) it is the front
    end's own forward with its own count (:meth:`FeatureConfig.num_frames`: ``1 + n // hop``
    for ours, ``n // hop`` for NeMo's).
    """
    config = config or DynResConfig()
    mel = features if isinstance(features, LogMel) else LogMel(features or FeatureConfig.ours())
    fc = mel.config
    if config.sample_rate != fc.sample_rate or abs(config.frames_per_second - fc.frames_per_second) > 1e-9:
        raise ValueError(f"dynamic resolution at {config.sample_rate} Hz audio, {config.frames_per_second:g} frames/s; "
                         f"the features are at {fc.sample_rate} Hz, {fc.frames_per_second:g} frames/s")
    ws = [w if isinstance(w, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(w)) for w in waves]
    n = np.array([w.shape[0] for w in ws], dtype=np.int64)
    dur = n / config.sample_rate  # seconds, from the decoded samples
    off = np.array([0, n.shape[0]], dtype=np.int64)
    if target is None:
        target = int(target_frames(dur.max() if n.shape[0] else 0.0, config.frames_per_second))
    if evaluation:
        rate, clamped, fallback = np.full(n.shape[0], config.frames_per_second), np.zeros(n.shape[0], dtype=bool), True
    else:
        res = resolve(dur, off, np.array([target]), config)
        rate, clamped, fallback = res.rate, res.clamped, bool(res.fallback[0])
    if fallback:  # the front end as it is, its own valid-frame count
        feats = [mel(w) for w in ws]
        frames = np.array([x.shape[0] for x in feats], dtype=np.int64)
    else:
        frames = res.frames
        feats = [mel(w) if float(r) == fc.frames_per_second and f == mel.num_frames(w.shape[0])
                 else mel.at_hop(w, config.sample_rate / float(r), int(f)) for w, r, f in zip(ws, rate, frames)]
    length = 0 if not feats else int(frames.max())  # the longest utterance's frames (bucketing.dynres.resolve)
    out = torch.zeros(len(feats), length, mel.n_mels, dtype=torch.float32)
    for i, x in enumerate(feats):
        out[i, : x.shape[0]] = x
    return DynResFeatures(out, torch.from_numpy(frames.astype(np.int64)), torch.from_numpy(rate.astype(np.float64)),
                          torch.from_numpy(clamped), int(target), fallback)
