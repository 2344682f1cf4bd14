"""Dynamic-resolution batching, the pure math: per-utterance frame rates (Hz) that bring every
utterance of a batch to the batch's target frames ``F``, with clamps and a per-batch fallback.

- ``F`` constant (:attr:`DynResConfig.target_frames`, e.g. 800-1600) or ``"longest"``:
  ``1 + floor(T * base + 1e-6)`` frames for the batch's longest ``T`` s at the base rate
  (``frames_per_second``, 100 Hz = a 10 ms hop). :func:`bucket_frames` is the shape
  oomptimize sizes a bucket at.
- Utterance ``i`` of ``d_i`` s needs ``r_i = (F - 1) / d_i`` Hz (a fractional hop of
  ``sample_rate / r_i`` samples) for exactly ``F`` frames; rates are clamped to
  ``[min_rate, max_rate]``, where the utterance has ``1 + floor(d_i * rate + 1e-6)`` frames.
- A batch where some utterance needs less than ``floor_rate`` falls back to the base rate.

Vectorized over all utterances of all batches (CSR: ``offsets``), no torch; feature
extraction lives in :mod:`dataprep.training.dynres`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from manifests.errors import OptionError
from manifests.options import check_int, check_number, check_sample_rate

#: a rate differing from the base by more than this share counts as "off the base rate"
OFF_RATE_TOLERANCE = 0.10
#: ``target_frames`` of the policy that takes each batch's longest utterance at the base rate
LONGEST = "longest"
_EPS = 1e-6
#: the constant targets accepted: the described policy's range (frames per batch)
TARGET_FRAMES_RANGE = (800, 1600)


@dataclass(frozen=True)
class DynResConfig:
    """Rates in frames per second (Hz); ``sample_rate`` in samples per second (at most
    :data:`~manifests.options.MAX_SAMPLE_RATE`);
    ``target_frames``: frames per batch, a constant int in :data:`TARGET_FRAMES_RANGE` or
    :data:`LONGEST`. Checked here (:class:`~manifests.errors.OptionError` naming the field):
    finite rates with ``0 < floor_rate <= min_rate <= max_rate <= sample_rate`` and
    ``0 < frames_per_second <= sample_rate``."""

    frames_per_second: float = 100.0
    min_rate: float = 70.0
    max_rate: float = 130.0
    floor_rate: float = 50.0
    sample_rate: int = 16000
    target_frames: int | str = LONGEST

    def __post_init__(self) -> None:
        check_sample_rate("sample_rate", self.sample_rate)
        # a rate above the sample rate would ask for a hop below one sample
        check_number("frames_per_second", self.frames_per_second, gt=0, le=self.sample_rate)
        check_number("floor_rate", self.floor_rate, gt=0, le=self.sample_rate)
        check_number("min_rate", self.min_rate, ge=self.floor_rate, le=self.sample_rate)
        check_number("max_rate", self.max_rate, ge=self.min_rate, le=self.sample_rate)
        if self.target_frames != LONGEST:
            t = self.target_frames
            if isinstance(t, bool) or not isinstance(t, int):
                raise OptionError("target_frames", f"must be an integer ({TARGET_FRAMES_RANGE[0]}.."
                                  f"{TARGET_FRAMES_RANGE[1]}) or {LONGEST!r}, got {t!r}")
            check_int("target_frames", t, ge=TARGET_FRAMES_RANGE[0], le=TARGET_FRAMES_RANGE[1])

    @property
    def base_hop(self) -> float:
        """Samples per frame at the base rate (160 for 100 Hz at 16 kHz)."""
        return self.sample_rate / self.frames_per_second

    @property
    def constant(self) -> bool:
        """True for a constant target (every batch the same length)."""
        return self.target_frames != LONGEST

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def shape_policy(self) -> dict[str, Any]:
        """What decides a batch's frames, as recorded with batch sizes (``buckets.json``) and
        compared by the plan: the longest at the base rate depends on that rate only; a
        constant target on every rate too (the clamps and the floor change the length)."""
        if not self.constant:
            return {"target_frames": LONGEST, "frames_per_second": self.frames_per_second}
        return {k: v for k, v in self.to_json().items() if k != "sample_rate"}

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


def batch_targets(max_duration: npt.ArrayLike, config: DynResConfig) -> npt.NDArray[np.int64]:
    """Target frames per batch (``max_duration``: each batch's longest, seconds) under the
    config's policy: the constant, or :func:`target_frames`."""
    t = np.asarray(max_duration, dtype=np.float64)
    if config.constant:
        return np.full(t.shape, int(config.target_frames), dtype=np.int64)
    return target_frames(t, config.frames_per_second)


def bucket_frames(max_duration: npt.ArrayLike, config: DynResConfig | None = None) -> npt.NDArray[np.int64]:
    """Frames of the longest batch tensor a bucket of utterances up to ``max_duration`` seconds
    can make (the shape to size its batch at). None or :data:`LONGEST`: the longest at the base
    rate (:func:`target_frames`, as :mod:`oom.step` computes it). A constant ``F``: ``F`` while
    the longest utterance's rate ``(F - 1) / T`` lies in ``[min_rate, max_rate]``; otherwise its
    frames at the clamped rate (fewer than ``F`` for short buckets, more for long ones), or at the
    base rate below ``floor_rate`` (fallback). The length of
    a batch grows with its longest utterance, so the bucket's bound is the worst case."""
    T = np.maximum(np.asarray(max_duration, dtype=np.float64), 1e-9)
    if config is None or not config.constant:
        return target_frames(T, 100.0 if config is None else config.frames_per_second)
    F = int(config.target_frames)
    need = (F - 1) / T
    rate = np.where(need < config.floor_rate, config.frames_per_second,
                    np.clip(need, config.min_rate, config.max_rate))
    return np.where((need >= config.min_rate) & (need <= config.max_rate), F, frames_at_rate(T, rate))


@dataclass(frozen=True)
class Resolution:
    """Per utterance (rows order): ``rate`` (Hz), ``frames``, ``clamped``; per batch:
    ``target`` frames, ``length`` (frames of the batch tensor: its longest utterance's, i.e.
    the target unless that utterance is clamped or the batch fell back), ``fallback`` (every utterance at the base rate)."""

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
    is batch ``b``); ``target``: frames per batch (default: :func:`batch_targets` of each
    batch's longest under ``config``). See the module docstring for the rules.
    """
    d = np.maximum(np.asarray(duration, dtype=np.float64), 1e-9)
    off = np.asarray(offsets, dtype=np.int64)
    if off.ndim != 1 or off.shape[0] < 1 or off[0] != 0 or off[-1] != d.shape[0] or (np.diff(off) < 0).any():
        raise ValueError("offsets must rise from 0 to the number of utterances")
    if target is None:
        target = batch_targets(_segment_reduce(np.maximum, d, off, 0.0), config)
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
    length = np.where(np.diff(off) > 0, _segment_reduce(np.maximum, frames, off, 0), F)  # empty: the target
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

    def __sub__(self, other: ResolutionTotals) -> ResolutionTotals:
        return ResolutionTotals(**{k: getattr(self, k) - getattr(other, k) for k in self.__dataclass_fields__})

    def to_json(self) -> dict[str, Any]:
        """``frame_padding`` (dynamic resolution), ``frame_padding_base`` (ordinary padding
        at the base rate), ``clamped_share`` (of utterances), ``fallback_share`` (of batches),
        ``off_rate_share`` (of real frames), ``mean_batch`` (utterances per batch), plus the
        counts (``padded_frames``: the encoder's input frames, a compute proxy)."""
        def ratio(a: int, b: int) -> float:
            return round(a / b, 6) if b else 0.0

        return {"frame_padding": round(1 - self.real_frames / self.padded_frames, 6) if self.padded_frames else 0.0,
                "frame_padding_base": (round(1 - self.base_frames / self.base_padded_frames, 6)
                                       if self.base_padded_frames else 0.0),
                "clamped_share": ratio(self.clamped, self.utterances),
                "fallback_share": ratio(self.fallback_batches, self.batches),
                "off_rate_share": ratio(self.off_rate_frames, self.real_frames),
                "mean_batch": ratio(self.utterances, self.batches),
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


#: the constant targets the reports compare with 2D bucketing (the described range)
COMPARED_TARGETS: tuple[int, ...] = (800, 1000, 1200, 1600)


def policy_totals(duration: npt.ArrayLike, offsets: npt.ArrayLike, config: DynResConfig = DynResConfig(),
                  targets: tuple[int, ...] = COMPARED_TARGETS) -> dict[str, ResolutionTotals]:
    """The same batches (CSR, as :func:`resolve`) under :data:`LONGEST` and each constant of
    ``targets`` (the config's rates otherwise): :class:`ResolutionTotals` keyed ``"longest"``,
    ``"800"``, ... (2D bucketing's figures are the ``base_*`` ones of any of them)."""
    out = {}
    for t in (LONGEST, *targets):
        cfg = replace(config, target_frames=t)
        out[str(t)] = resolution_totals(duration, offsets, resolve(duration, offsets, None, cfg), cfg)[0]
    return out


def comparison_rows(totals: dict[str, ResolutionTotals]) -> list[dict[str, Any]]:
    """One row per policy, 2D bucketing first: ``policy``, ``encoder_frames`` (batch size x
    batch length, summed: the compute proxy), ``vs_2d`` (their ratio to 2D's), ``frame_padding``,
    ``mean_batch``, ``off_rate_share`` (frames > 10% off the base rate), ``clamped_share``,
    ``fallback_share``. Batch sizes are the same for all (sizes made for a policy change
    ``mean_batch``: see ``oomptimize --dynamic-resolution``)."""
    if not totals:
        return []
    any_t = next(iter(totals.values())).to_json()
    base = any_t["base_padded_frames"]
    rows = [{"policy": "2d", "encoder_frames": base, "vs_2d": 1.0, "frame_padding": any_t["frame_padding_base"],
             "mean_batch": any_t["mean_batch"], "off_rate_share": 0.0, "clamped_share": 0.0, "fallback_share": 0.0}]
    for name, t in totals.items():
        j = t.to_json()
        rows.append({"policy": name if name == LONGEST else f"F={name}", "encoder_frames": j["padded_frames"],
                     "vs_2d": round(j["padded_frames"] / base, 6) if base else 0.0,
                     **{k: j[k] for k in ("frame_padding", "mean_batch", "off_rate_share", "clamped_share",
                                          "fallback_share")}})
    return rows
