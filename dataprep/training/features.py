"""Log-mel features in pure torch (no torchaudio): a mel filterbank and ``log_mel``.

Conventions (NeMo's ``AudioToMelSpectrogramPreprocessor`` defaults): 16 kHz input, 25 ms Hann
window (400 samples), 10 ms hop (160 samples), n_fft 512, power spectrum, Slaney-style mel
scale and area normalization, ``log(x + 2**-24)``. Frames: ``1 + samples // hop`` (centered
STFT), i.e. 100 frames per second of audio.

:meth:`LogMel.at_hop` extracts the same features at any (fractional) hop, for dynamic
resolution (:mod:`dataprep.training.dynres`): frame ``k`` is centered at sample
``round(k * hop)``; window, n_fft and filter bank are unchanged.
"""

from __future__ import annotations

import math

import torch

SAMPLE_RATE = 16000
HOP = 160  # samples (10 ms at 16 kHz)
WIN = 400  # samples (25 ms at 16 kHz)
N_FFT = 512
LOG_GUARD = 2.0**-24


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
    """(n_mels, n_fft // 2 + 1) triangular filters, Slaney area-normalized, float32.

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


class LogMel:
    """Callable: mono float waveform (samples,) at 16 kHz -> (frames, n_mels) log-mel."""

    def __init__(self, n_mels: int = 80) -> None:
        self.n_mels = n_mels
        self.fb = mel_filterbank(n_mels)
        self.window = torch.hann_window(WIN, periodic=False)
        left = (N_FFT - WIN) // 2  # torch.stft centers a shorter window inside n_fft
        self.fft_window = torch.nn.functional.pad(self.window, (left, N_FFT - WIN - left))

    def num_frames(self, samples: int) -> int:
        """Frames for ``samples`` samples (centered STFT, 10 ms hop)."""
        return 1 + samples // HOP

    def __call__(self, wave: torch.Tensor) -> torch.Tensor:
        if wave.shape[0] < N_FFT // 2 + 1:  # reflect padding needs more samples than half a window
            wave = torch.nn.functional.pad(wave, (0, N_FFT // 2 + 1 - wave.shape[0]))
        spec = torch.stft(wave, N_FFT, hop_length=HOP, win_length=WIN, window=self.window,
                          center=True, pad_mode="reflect", return_complex=True)
        power = spec.real.square() + spec.imag.square()  # (freq, frames)
        return torch.log(self.fb @ power + LOG_GUARD).T.contiguous()

    def at_hop(self, wave: torch.Tensor, hop: float, num_frames: int) -> torch.Tensor:
        """(num_frames, n_mels) log-mel of ``wave`` (16 kHz) with frames ``hop`` samples apart
        (fractional: frame ``k`` centered at sample ``round(k * hop)``, reflect-padded edges as
        the centered STFT). At an integer hop and ``num_frames(len(wave))`` frames it equals
        ``self(wave)`` up to float rounding. Frames centered past the end are an error."""
        if hop <= 0 or num_frames < 1:
            raise ValueError(f"hop must be > 0 samples and frames >= 1 (got {hop}, {num_frames})")
        if wave.shape[0] < N_FFT // 2 + 1:
            wave = torch.nn.functional.pad(wave, (0, N_FFT // 2 + 1 - wave.shape[0]))
        centers = torch.round(torch.arange(num_frames, dtype=torch.float64) * hop).to(torch.int64)
        if int(centers[-1]) > wave.shape[0]:
            raise ValueError(f"{num_frames} frames at a {hop:.3f}-sample hop need {int(centers[-1])} samples, "
                             f"the wave has {wave.shape[0]}")
        half = N_FFT // 2
        padded = torch.nn.functional.pad(wave[None, None], (half, half), mode="reflect")[0, 0]
        frames = padded[centers[:, None] + torch.arange(N_FFT)[None, :]] * self.fft_window  # (frames, n_fft)
        spec = torch.fft.rfft(frames, n=N_FFT)
        power = spec.real.square() + spec.imag.square()  # (frames, freq)
        return torch.log(power @ self.fb.T + LOG_GUARD).contiguous()
