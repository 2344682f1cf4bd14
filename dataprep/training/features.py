"""Log-mel features in pure torch (no torchaudio): :class:`FeatureConfig` and :class:`LogMel`.

- :meth:`FeatureConfig.ours` (the loop's default): 16 kHz, 25 ms Hann window (400 samples),
  10 ms hop (160 samples), n_fft 512, power spectrum, Slaney mel scale and area normalization,
  ``log(x + 2**-24)``, reflect-padded edges, ``1 + samples // hop`` frames.
- :meth:`FeatureConfig.nemo`: NeMo's ``AudioToMelSpectrogramPreprocessor`` (pre-emphasis 0.97,
  dither in training, centered STFT, librosa's Slaney filter bank, per-feature normalization
  over valid frames, ``samples // hop`` valid frames, ``pad_to``); overrides take NeMo's
  argument names. :meth:`FeatureConfig.canary_1b` is Canary-1B's preprocessor (128 mels).

``LogMel(config)(input_signal, length)`` -> ``(features (B, n_mels, frames), frame_lengths)``
as NeMo's; on one 1-D wave it gives ``(frames, n_mels)``. :meth:`LogMel.at_hops` runs the
same pipeline at a fractional hop per signal (frame ``k`` centered at sample
``round(k * hop)``), for dynamic resolution.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
from torch import nn

from manifests.errors import OptionError
from manifests.options import check_choice, check_int, check_number, check_sample_rate

SAMPLE_RATE = 16000
HOP = 160  # samples (10 ms at 16 kHz)
WIN = 400  # samples (25 ms at 16 kHz)
N_FFT = 512
LOG_GUARD = 2.0**-24
NORM_GUARD = 1e-5  # NeMo's CONSTANT: added to the per-feature std

_WINDOWS = {"hann": torch.hann_window, "hamming": torch.hamming_window, "blackman": torch.blackman_window,
            "bartlett": torch.bartlett_window}


def hz_to_mel(f: torch.Tensor) -> torch.Tensor:
    """Slaney mel scale: linear below 1 kHz, logarithmic above."""
    f_sp = 200.0 / 3
    min_log_hz, min_log_mel, logstep = 1000.0, 1000.0 / f_sp, math.log(6.4) / 27.0
    lin = f / f_sp
    return torch.where(f >= min_log_hz, min_log_mel + torch.log(f.clamp(min=1e-10) / min_log_hz) / logstep, lin)


def mel_to_hz(m: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`hz_to_mel`."""
    f_sp = 200.0 / 3
    min_log_hz, min_log_mel, logstep = 1000.0, 1000.0 / f_sp, math.log(6.4) / 27.0
    return torch.where(m >= min_log_mel, min_log_hz * torch.exp(logstep * (m - min_log_mel)), f_sp * m)


def mel_filterbank(n_mels: int = 80, n_fft: int = N_FFT, sample_rate: int = SAMPLE_RATE,
                   f_min: float = 0.0, f_max: float | None = None) -> torch.Tensor:
    """(n_mels, n_fft // 2 + 1) triangular filters, Slaney area-normalized, float32 (librosa's
    ``filters.mel(norm="slaney")``).

    Filter ``m`` rises from mel point ``m`` to ``m + 1`` and falls to ``m + 2`` (points equally
    spaced in mel between ``f_min`` and ``f_max`` Hz).
    """
    f_max = sample_rate / 2 if f_max is None else f_max
    fft_freqs = torch.linspace(0, sample_rate / 2, n_fft // 2 + 1, dtype=torch.float64)
    mels = torch.linspace(float(hz_to_mel(torch.tensor(f_min, dtype=torch.float64))),
                          float(hz_to_mel(torch.tensor(f_max, dtype=torch.float64))), n_mels + 2,
                          dtype=torch.float64)
    pts = mel_to_hz(mels)
    lower, center, upper = pts[:-2, None], pts[1:-1, None], pts[2:, None]
    up = (fft_freqs[None, :] - lower) / (center - lower)
    down = (upper - fft_freqs[None, :]) / (upper - center)
    fb = torch.clamp(torch.minimum(up, down), min=0.0)
    fb = fb * (2.0 / (upper - lower))  # Slaney: each filter has unit area in Hz
    return fb.to(torch.float32)


@dataclass(frozen=True)
class FeatureConfig:
    """What a log-mel front end computes. Sizes in samples, rates in Hz; field names follow
    NeMo's ``FilterbankFeatures`` (``features`` = mel bands). ``edge_padding``: ``reflect`` (ours)
    or ``constant`` (NeMo: zeros) for the centered STFT; ``valid_frames``: ``plus_one``
    (``1 + samples // hop``, ours) or ``floor`` (``samples // hop``, NeMo)."""

    sample_rate: int = SAMPLE_RATE
    n_window_size: int = WIN
    n_window_stride: int = HOP
    n_fft: int = N_FFT
    features: int = 80
    window: str = "hann"
    lowfreq: float = 0.0
    highfreq: float | None = None
    preemph: float | None = None
    dither: float = 0.0
    normalize: str | None = None
    log_zero_guard_type: str = "add"
    log_zero_guard_value: float = LOG_GUARD
    mag_power: float = 2.0
    pad_to: int = 0
    pad_value: float = 0.0
    edge_padding: str = "reflect"
    valid_frames: str = "plus_one"

    def __post_init__(self) -> None:
        """Every field checked where the config is built (:class:`OptionError` naming it)."""
        check_sample_rate("features.sample_rate", self.sample_rate)
        check_int("features.n_window_size", self.n_window_size, ge=1)
        check_int("features.n_window_stride", self.n_window_stride, ge=1)
        check_int("features.n_fft", self.n_fft, ge=self.n_window_size)
        check_int("features.features", self.features, ge=1, le=4096)
        check_choice("features.window", self.window, tuple(_WINDOWS))
        check_number("features.lowfreq", self.lowfreq, ge=0, le=self.sample_rate / 2)
        check_number("features.highfreq", self.highfreq, gt=self.lowfreq, le=self.sample_rate / 2, optional=True)
        check_number("features.preemph", self.preemph, ge=0, le=1, optional=True)
        check_number("features.dither", self.dither, ge=0)
        if self.normalize is not None:
            check_choice("features.normalize", self.normalize, ("per_feature", "all_features"))
        check_choice("features.log_zero_guard_type", self.log_zero_guard_type, ("add", "clamp"))
        check_number("features.log_zero_guard_value", self.log_zero_guard_value, gt=0)
        check_number("features.mag_power", self.mag_power, gt=0)
        check_int("features.pad_to", self.pad_to, ge=0)
        check_number("features.pad_value", self.pad_value)
        check_choice("features.edge_padding", self.edge_padding, ("reflect", "constant"))
        check_choice("features.valid_frames", self.valid_frames, ("plus_one", "floor"))

    @classmethod
    def ours(cls, n_mels: int = 80) -> FeatureConfig:
        """Today's features of our loop (see the module docstring)."""
        return cls(features=n_mels)

    @classmethod
    def nemo(cls, **overrides: Any) -> FeatureConfig:
        """NeMo's ``AudioToMelSpectrogramPreprocessor`` with its defaults (20 ms window, 10 ms
        hop, 64 mels, pre-emphasis 0.97, dither 1e-5, per-feature normalization, ``pad_to`` 16),
        ``overrides`` in NeMo's argument names: ``sample_rate``, ``window_size`` /
        ``window_stride`` (s) or ``n_window_size`` / ``n_window_stride`` (samples), ``window``,
        ``normalize``, ``n_fft``, ``preemph``, ``features``, ``lowfreq``, ``highfreq``,
        ``log_zero_guard_type``, ``log_zero_guard_value``, ``dither``, ``pad_to``, ``pad_value``,
        ``mag_power``; ``log``, ``frame_splicing``, ``exact_pad``, ``mel_norm``,
        ``nb_augmentation_prob`` only at their defaults. Anything else is an error."""
        o = dict(overrides)
        fixed = {"log": True, "frame_splicing": 1, "exact_pad": False, "mel_norm": "slaney", "nb_augmentation_prob": 0.0,
                 "stft_exact_pad": False, "stft_conv": False, "use_torchaudio": False}
        for k, default in fixed.items():
            if k in o and o.pop(k) != default:
                raise OptionError(f"features.{k}", f"NeMo's {k} is supported at its default {default!r} only")
        o.pop("_target_", None)
        o.pop("rng", None)
        o.pop("nb_max_freq", None)
        sr = int(o.pop("sample_rate", SAMPLE_RATE))
        for secs, samples, default in (("window_size", "n_window_size", 0.02), ("window_stride", "n_window_stride", 0.01)):
            if o.get(secs) and o.get(samples):
                raise OptionError(f"features.{secs}", f"give {secs} or {samples}, not both")
            s = o.pop(secs, None)
            n = o.pop(samples, None)
            o[samples] = int(n) if n else int((s if s else default) * sr)  # NeMo: int(seconds * rate)
        if o.get("n_fft") is None:
            o["n_fft"] = 2 ** math.ceil(math.log2(o["n_window_size"]))
        if "highfreq" in o and not o["highfreq"]:
            o["highfreq"] = None
        if "normalize" in o and o["normalize"] not in ("per_feature", "all_features"):
            o["normalize"] = None  # NeMo: every other value disables normalization
        unknown = set(o) - {f.name for f in fields(cls)} - {"edge_padding", "valid_frames"}
        if unknown:
            raise OptionError("features", f"unknown NeMo preprocessor argument(s): {', '.join(sorted(unknown))}")
        base = {"preemph": 0.97, "dither": 1e-5, "normalize": "per_feature", "features": 64, "pad_to": 16,
                "edge_padding": "constant", "valid_frames": "floor"}
        return cls(sample_rate=sr, **{**base, **o})

    @classmethod
    def canary_1b(cls, **overrides: Any) -> FeatureConfig:
        """The ``preprocessor`` section of Canary-1B's config: 16 kHz, 25 ms / 10 ms, 128 mels,
        n_fft 512, per-feature normalization, dither 1e-5, ``pad_to`` 0, ``pad_value`` 0."""
        return cls.nemo(**{"window_size": 0.025, "window_stride": 0.01, "features": 128, "n_fft": 512,
                           "normalize": "per_feature", "dither": 1e-5, "pad_to": 0, "pad_value": 0.0, **overrides})

    @classmethod
    def named(cls, name: str, **overrides: Any) -> FeatureConfig:
        """A front end by name (``TrainConfig.features``, ``dataprep train --features``):
        ``ours`` (:meth:`ours`), ``nemo`` (:meth:`nemo`), ``canary-1b`` (:meth:`canary_1b`), with
        ``overrides`` (e.g. ``features=``: the model's mel count)."""
        if name == "ours":
            return cls(**overrides)
        if name == "nemo":
            return cls.nemo(**overrides)
        if name == "canary-1b":
            return cls.canary_1b(**overrides)
        raise OptionError("features", f"must be ours, nemo or canary-1b, got {name!r}")

    @property
    def frames_per_second(self) -> float:
        return self.sample_rate / self.n_window_stride

    def num_frames(self, samples: torch.Tensor | int) -> torch.Tensor | int:
        """Valid frames for ``samples`` samples at the configured hop."""
        return samples // self.n_window_stride + (1 if self.valid_frames == "plus_one" else 0)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class LogMel(nn.Module):
    """The front end of a :class:`FeatureConfig` (an int: :meth:`FeatureConfig.ours` with that
    many mels). ``forward(input_signal (B, T), length (B,))`` -> ``(features (B, n_mels, frames),
    frame_lengths (B,))``; ``forward(wave)`` on one 1-D wave -> ``(frames, n_mels)``. Dither only
    in training mode (``.train()``), as NeMo."""

    def __init__(self, config: FeatureConfig | int = 80) -> None:
        super().__init__()
        self.config = FeatureConfig.ours(config) if isinstance(config, int) else config
        c = self.config
        self.n_mels = c.features
        self.register_buffer("fb", mel_filterbank(c.features, c.n_fft, c.sample_rate, c.lowfreq, c.highfreq),
                             persistent=False)
        self.register_buffer("window", _WINDOWS[c.window](c.n_window_size, periodic=False), persistent=False)
        left = (c.n_fft - c.n_window_size) // 2  # torch.stft centers a shorter window inside n_fft
        self.register_buffer("fft_window", nn.functional.pad(self.window, (left, c.n_fft - c.n_window_size - left)),
                             persistent=False)
        self.train(False)

    def num_frames(self, samples: int) -> int:
        """Frames of one wave of ``samples`` samples (:meth:`FeatureConfig.num_frames`)."""
        return int(self.config.num_frames(samples))

    def forward(self, input_signal: torch.Tensor, length: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
        if length is None:
            if input_signal.dim() != 1:
                raise ValueError("LogMel(wave): one 1-D wave, or (input_signal (B, T), length (B,))")
            feats, lens = self.forward(input_signal[None], torch.tensor([input_signal.shape[0]]))
            return feats[0, :, : int(lens[0])].T.contiguous()
        c = self.config
        x = self._prepare(input_signal, length)
        if c.edge_padding == "reflect" and x.shape[1] < c.n_fft // 2 + 1:  # reflect needs half a window
            x = nn.functional.pad(x, (0, c.n_fft // 2 + 1 - x.shape[1]))
        spec = torch.stft(x, c.n_fft, hop_length=c.n_window_stride, win_length=c.n_window_size,
                          window=self.window, center=True, pad_mode=c.edge_padding, return_complex=True)
        lens = self.config.num_frames(length.to(torch.int64))
        return self._finish(self._log_mel(spec), lens)

    def at_hops(self, input_signal: torch.Tensor, length: torch.Tensor, hops: torch.Tensor,
                frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The same pipeline with signal ``i``'s frames ``hops[i]`` samples apart (fractional:
        frame ``k`` centered at sample ``round(k * hop)``) and ``frames[i]`` valid frames ->
        ``(features (B, n_mels, max frames), frames)``. At the configured hop and
        :meth:`num_frames` frames it equals :meth:`forward` up to float rounding. A frame
        centered past a signal's end is an error."""
        c = self.config
        hops = torch.as_tensor(hops, dtype=torch.float64)
        frames = torch.as_tensor(frames, dtype=torch.int64)
        if (hops <= 0).any() or (frames < 1).any():
            raise ValueError("hops must be > 0 samples and frames >= 1")
        x = self._prepare(input_signal, length)
        half = c.n_fft // 2
        n_max = int(frames.max()) if frames.numel() else 0
        power = torch.zeros(x.shape[0], c.n_fft // 2 + 1, n_max, dtype=torch.float32, device=x.device)
        offsets = torch.arange(c.n_fft, device=x.device)
        for i in range(x.shape[0]):  # one gather + rfft per signal (a batch, not a corpus)
            n, f = int(length[i]), int(frames[i])
            centers = torch.round(torch.arange(f, dtype=torch.float64) * float(hops[i])).to(torch.int64)
            if int(centers[-1]) > n:
                raise ValueError(f"{f} frames at a {float(hops[i]):.3f}-sample hop need {int(centers[-1])} samples, "
                                 f"signal {i} has {n}")
            w = x[i, :n]
            if c.edge_padding == "reflect" and n < half + 1:
                w = nn.functional.pad(w, (0, half + 1 - n))
            padded = nn.functional.pad(w[None, None], (half, half), mode=c.edge_padding)[0, 0]
            spec = torch.fft.rfft(padded[centers[:, None] + offsets[None, :]] * self.fft_window, n=c.n_fft)
            power[i, :, :f] = self._magnitude(spec).T
        return self._finish(self._mel_log(power), frames.to(x.device))

    def at_hop(self, wave: torch.Tensor, hop: float, num_frames: int) -> torch.Tensor:
        """:meth:`at_hops` of one 1-D wave -> ``(num_frames, n_mels)``."""
        feats, _ = self.at_hops(wave[None], torch.tensor([wave.shape[0]]), torch.tensor([float(hop)], dtype=torch.float64),
                                torch.tensor([int(num_frames)]))
        return feats[0, :, :num_frames].T.contiguous()

    def _prepare(self, input_signal: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        """float32, dithered in training mode, pre-emphasized with the samples past each end zeroed."""
        c = self.config
        x = input_signal.to(torch.float32)
        if self.training and c.dither > 0:
            x = x + c.dither * torch.randn_like(x)
        if c.preemph is not None:
            keep = torch.arange(x.shape[1], device=x.device)[None, :] < length.to(x.device)[:, None]
            x = torch.cat((x[:, :1], x[:, 1:] - c.preemph * x[:, :-1]), dim=1).masked_fill(~keep, 0.0)
        return x

    def _magnitude(self, spec: torch.Tensor) -> torch.Tensor:
        power = spec.real.square() + spec.imag.square()
        if self.config.mag_power == 2.0:  # NeMo: sqrt, then ** 2 (equal up to float rounding)
            return power
        return torch.sqrt(power).pow(self.config.mag_power)

    def _log_mel(self, spec: torch.Tensor) -> torch.Tensor:
        return self._mel_log(self._magnitude(spec))

    def _mel_log(self, power: torch.Tensor) -> torch.Tensor:
        c = self.config
        x = torch.matmul(self.fb.to(power.dtype), power)
        if c.log_zero_guard_type == "add":
            return torch.log(x + c.log_zero_guard_value)
        return torch.log(torch.clamp(x, min=c.log_zero_guard_value))

    def _finish(self, x: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalize over the valid frames, set the rest to ``pad_value``, pad to ``pad_to``."""
        c = self.config
        valid = torch.arange(x.shape[-1], device=x.device)[None, :] < lens[:, None]  # (B, frames)
        if c.normalize == "per_feature":
            count = valid.sum(dim=1, keepdim=True).to(x.dtype)  # (B, 1)
            mean = torch.where(valid[:, None], x, 0.0).sum(dim=2) / count
            var = torch.where(valid[:, None], x - mean[:, :, None], 0.0).square().sum(dim=2) / (count - 1.0)
            std = torch.sqrt(var).nan_to_num(0.0) + NORM_GUARD
            x = (x - mean[:, :, None]) / std[:, :, None]
        elif c.normalize == "all_features":
            count = valid.sum(dim=1).to(x.dtype) * x.shape[1]
            mean = torch.where(valid[:, None], x, 0.0).sum(dim=(1, 2)) / count
            var = torch.where(valid[:, None], x - mean[:, None, None], 0.0).square().sum(dim=(1, 2)) / (count - 1.0)
            x = (x - mean[:, None, None]) / (torch.sqrt(var) + NORM_GUARD)[:, None, None]
        x = x.masked_fill(~valid[:, None], c.pad_value)
        if c.pad_to > 0 and x.shape[-1] % c.pad_to:
            x = nn.functional.pad(x, (0, c.pad_to - x.shape[-1] % c.pad_to), value=c.pad_value)
        return x, lens
