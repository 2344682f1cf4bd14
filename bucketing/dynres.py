"""Dynamic-resolution batching, the pure math: per-utterance frame rates that bring every
utterance of a batch to the batch's target length, with clamps and a per-batch fallback.

Instead of padding each utterance to the longest of its batch, each is featurized at its own
frame rate so that all come out at the batch's *target frames* ``F``:

- ``F = 1 + floor(T * base + 1e-6)`` frames for a batch whose longest utterance lasts ``T``
  seconds at the base rate ``base`` (``frames_per_second``, 100 Hz = a 10 ms hop): the longest
  utterance at the base rate, the same worst case :mod:`oom.step` sizes batches by.
- Utterance ``i`` (``d_i`` seconds) needs the rate ``r_i = (F - 1) / d_i`` Hz (``F`` centered
  frames span ``F - 1`` hops; the hop is ``sample_rate / r_i`` samples, fractional): exactly
  ``F`` frames. ``r_i >= base`` (up to rounding) whenever ``F`` is the longest at the base rate.
- Rates are clamped to ``[min_rate, max_rate]`` Hz. Where the clamp binds the utterance has
  ``1 + floor(d_i * rate + 1e-6)`` frames: fewer than ``F`` at ``max_rate`` (the remainder is
  zero-padded, as today), more at ``min_rate`` (the batch then grows to its longest).
- A batch in which some utterance needs less than ``floor_rate`` Hz falls back to ordinary
  padding: every utterance at the base rate.

Everything is vectorized over all utterances of all batches (CSR: ``offsets``), no torch;
feature extraction lives in :mod:`dataprep.training.dynres`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from manifests.options import check_int, check_number

#: Highest audio sample rate (Hz) a dynamic-resolution config takes.
MAX_SAMPLE_RATE = 384_000

#: a rate differing from the base by more than this share counts as "off the base rate"
OFF_RATE_TOLERANCE = 0.10
_EPS = 1e-6


@dataclass(frozen=True)
class DynResConfig:
    """Rates in frames per second (Hz); ``sample_rate`` in samples per second."""

    frames_per_second: float = 100.0
    min_rate: float = 70.0
    max_rate: float = 130.0
    floor_rate: float = 50.0
    sample_rate: int = 16000

    def __post_init__(self) -> None:
        check_int("sample_rate", self.sample_rate, ge=1, le=MAX_SAMPLE_RATE)
        for name in ("frames_per_second", "min_rate", "max_rate", "floor_rate"):  # finite, at most a frame per sample
            check_number(name, getattr(self, name), gt=0, le=self.sample_rate)
        if not (0 < self.floor_rate <= self.min_rate <= self.max_rate) or self.frames_per_second <= 0:
            raise ValueError(
                f"dynamic resolution needs 0 < floor rate <= min rate <= max rate and a positive base rate "
                f"(got floor {self.floor_rate:g}, min {self.min_rate:g}, max {self.max_rate:g}, "
                f"base {self.frames_per_second:g} Hz)")

    @property
    def base_hop(self) -> float:
        """Samples per frame at the base rate (160 for 100 Hz at 16 kHz)."""
        return self.sample_rate / self.frames_per_second

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> DynResConfig:
        """From :meth:`to_json` (unknown keys ignored)."""
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in obj.items() if k in names})


def frames_at_rate(duration: npt.ArrayLike, rate: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Centered-STFT frames of ``duration`` seconds at ``rate`` Hz: ``1 + floor(d * rate)``."""
    d = np.asarray(duration, dtype=np.float64)
    return 1 + np.floor(d * np.asarray(rate, dtype=np.float64) + _EPS).astype(np.int64)


def target_frames(max_duration: npt.ArrayLike, frames_per_second: float = 100.0) -> npt.NDArray[np.int64]:
    """Target frames per batch: its longest utterance (``max_duration`` s) at the base rate."""
    return frames_at_rate(max_duration, frames_per_second)


@dataclass(frozen=True)
class Resolution:
    """Per utterance (rows order): ``rate`` (Hz), ``frames``, ``clamped``; per batch:
    ``target`` frames, ``length`` (frames of the batch tensor: max of target and frames in
    batch), ``fallback`` (every utterance at the base rate)."""

    rate: npt.NDArray[np.float64]
    frames: npt.NDArray[np.int64]
    clamped: npt.NDArray[np.bool_]
    target: npt.NDArray[np.int64]
    length: npt.NDArray[np.int64]
    fallback: npt.NDArray[np.bool_]

    def hop(self, sample_rate: int = 16000) -> npt.NDArray[np.float64]:
        """Samples between frame centers (fractional) per utterance."""
        return sample_rate / self.rate


def _batch_of(offsets: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    return np.repeat(np.arange(offsets.shape[0] - 1, dtype=np.int64), np.diff(offsets))


def _segment_reduce(ufunc: np.ufunc, values: npt.NDArray[Any], offsets: npt.NDArray[np.int64],
                    empty: Any) -> npt.NDArray[Any]:
    """``ufunc.reduceat`` over CSR segments; ``empty`` for empty segments."""
    n = offsets.shape[0] - 1
    out = np.full(n, empty, dtype=np.result_type(values.dtype, np.asarray(empty).dtype))
    nonempty = np.flatnonzero(np.diff(offsets) > 0)
    if nonempty.shape[0]:
        out[nonempty] = ufunc.reduceat(values, offsets[nonempty])
    return out


def resolve(duration: npt.ArrayLike, offsets: npt.ArrayLike, target: npt.ArrayLike | None = None,
            config: DynResConfig = DynResConfig()) -> Resolution:
    """Rates, frames, clamps and fallbacks for batches in CSR layout.

    ``duration``: seconds of each utterance, batch after batch (``duration[offsets[b]:offsets[b+1]]``
    is batch ``b``); ``target``: frames per batch (default: :func:`target_frames` of each batch's
    longest). See the module docstring for the rules.
    """
    d = np.maximum(np.asarray(duration, dtype=np.float64), 1e-9)
    off = np.asarray(offsets, dtype=np.int64)
    if off.ndim != 1 or off.shape[0] < 1 or off[0] != 0 or off[-1] != d.shape[0] or (np.diff(off) < 0).any():
        raise ValueError("offsets must rise from 0 to the number of utterances")
    if target is None:
        target = target_frames(_segment_reduce(np.maximum, d, off, 0.0), config.frames_per_second)
    F = np.asarray(target, dtype=np.int64)
    if F.shape != (off.shape[0] - 1,) or (F < 1).any():
        raise ValueError("target frames: one value >= 1 per batch")
    b = _batch_of(off)
    need = (F[b] - 1) / d  # Hz: exactly F frames
    fallback = _segment_reduce(np.minimum, need, off, np.inf) < config.floor_rate
    fb = fallback[b]
    clipped = np.clip(need, config.min_rate, config.max_rate)
    clamped = ~fb & (clipped != need)
    rate = np.where(fb, config.frames_per_second, clipped)
    frames = np.where(fb | clamped, frames_at_rate(d, rate), F[b])
    length = np.maximum(F, _segment_reduce(np.maximum, frames, off, 0))
    return Resolution(rate=rate, frames=frames, clamped=clamped, target=F, length=length, fallback=fallback)


@dataclass(frozen=True)
class ResolutionTotals:
    """Sums behind the dynamic-resolution figures (frames, utterances, batches), addable
    across epochs or chunks; ratios via :meth:`to_json`."""

    real_frames: int = 0  # frames holding audio, dynamic resolution
    padded_frames: int = 0  # batch size x batch length, summed
    base_frames: int = 0  # frames holding audio at the base rate (no dynamic resolution)
    base_padded_frames: int = 0  # batch size x target frames, summed (ordinary padding)
    off_rate_frames: int = 0  # frames at a rate more than OFF_RATE_TOLERANCE off the base
    utterances: int = 0
    clamped: int = 0
    batches: int = 0
    fallback_batches: int = 0

    def __add__(self, other: ResolutionTotals) -> ResolutionTotals:
        return ResolutionTotals(**{k: getattr(self, k) + getattr(other, k) for k in self.__dataclass_fields__})

    def to_json(self) -> dict[str, Any]:
        """``frame_padding`` (dynamic resolution), ``frame_padding_base`` (ordinary padding
        at the base rate), ``clamped_share`` (of utterances), ``fallback_share`` (of batches),
        ``off_rate_share`` (of real frames), plus the counts."""
        def ratio(a: int, b: int) -> float:
            return round(a / b, 6) if b else 0.0

        return {"frame_padding": round(1 - self.real_frames / self.padded_frames, 6) if self.padded_frames else 0.0,
                "frame_padding_base": (round(1 - self.base_frames / self.base_padded_frames, 6)
                                       if self.base_padded_frames else 0.0),
                "clamped_share": ratio(self.clamped, self.utterances),
                "fallback_share": ratio(self.fallback_batches, self.batches),
                "off_rate_share": ratio(self.off_rate_frames, self.real_frames),
                **{k: getattr(self, k) for k in self.__dataclass_fields__}}


def resolution_totals(duration: npt.ArrayLike, offsets: npt.ArrayLike, res: Resolution,
                      config: DynResConfig = DynResConfig(), group: npt.ArrayLike | None = None,
                      num_groups: int = 1) -> list[ResolutionTotals]:
    """:class:`ResolutionTotals` of the batches of ``res`` (made by :func:`resolve` from the
    same ``duration`` / ``offsets``), one per group: ``group[b]`` in ``[0, num_groups)`` per
    batch (e.g. its bucket; default: one group)."""
    d = np.asarray(duration, dtype=np.float64)
    off = np.asarray(offsets, dtype=np.int64)
    nb = off.shape[0] - 1
    g = np.zeros(nb, dtype=np.int64) if group is None else np.asarray(group, dtype=np.int64)
    gu = g[_batch_of(off)]
    sizes = np.diff(off)
    base = frames_at_rate(d, config.frames_per_second)
    off_rate = np.abs(res.rate / config.frames_per_second - 1) > OFF_RATE_TOLERANCE

    def per(values: npt.ArrayLike, by: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        return np.bincount(by, weights=np.asarray(values, dtype=np.float64), minlength=num_groups).round().astype(np.int64)

    cols = {
        "real_frames": per(res.frames, gu),
        "padded_frames": per(sizes * res.length, g),
        "base_frames": per(base, gu),
        "base_padded_frames": per(sizes * res.target, g),
        "off_rate_frames": per(np.where(off_rate, res.frames, 0), gu),
        "utterances": per(np.ones_like(d), gu),
        "clamped": per(res.clamped, gu),
        "batches": per(np.ones(nb), g),
        "fallback_batches": per(res.fallback, g),
    }
    return [ResolutionTotals(**{k: int(v[i]) for k, v in cols.items()}) for i in range(num_groups)]


def time_mask_widths(width: int, rate: npt.ArrayLike, frames_per_second: float = 100.0) -> npt.NDArray[np.int64]:
    """SpecAugment time-mask width (frames) per utterance: ``width`` frames at the base rate
    cover ``width / frames_per_second`` seconds; at ``rate`` Hz the same seconds take
    ``round(width * rate / frames_per_second)`` frames."""
    if width < 0:
        raise ValueError(f"time-mask width must be >= 0 frames, got {width}")
    return np.rint(width * np.asarray(rate, dtype=np.float64) / frames_per_second).astype(np.int64)
