"""Step-time cost model: seconds one rank spends on one batch.

    time = overhead + B * (per_frame * F + per_frame2 * F**2 + per_token * T + per_token2 * T**2)

``B`` is the batch size (utterances), ``F`` the padded audio length in frames
(longest duration in the batch / ``frame_shift``), ``T`` the padded decoder length in tokens
(most tokens in the batch). The linear terms stand for convolutions / feed-forward layers,
the squared ones for self-attention over frames and tokens.

The defaults are rough figures for a ~100M-parameter encoder-decoder (FastConformer/Canary
scale, 8x subsampling, bf16) on one datacenter GPU: a batch of 32 utterances of 20 s with
100 tokens takes ~0.5 s. They only need the right *shape* for relative figures (idle
fraction, synchronized vs not); override them (``CostModel.from_overrides``) or fit them
from GPU timings (the OOM search records step times per bucket).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields, replace

import numpy as np
import numpy.typing as npt

from manifests.errors import OptionError
from manifests.options import check_number


#: (low, high) of each coefficient: ``overhead`` > 0 s (a step takes time, so ratios of step times
#: are defined), the others >= 0, a frame 0.1 ms to 1 s. Past these a value is a typo, and
#: within them a step time and sums of billions of them stay finite in float64.
BOUNDS = {"overhead": (0.0, 3600.0), "per_frame": (0.0, 1.0), "per_frame2": (0.0, 1.0), "per_token": (0.0, 1.0),
          "per_token2": (0.0, 1.0), "frame_shift": (1e-4, 1.0)}


@dataclass(frozen=True)
class CostModel:
    """Coefficients of the step-time model (seconds; see the module docstring)."""

    overhead: float = 0.02  # s per step (launches, optimizer, all-reduce latency)
    per_frame: float = 5e-6  # s per utterance-frame
    per_frame2: float = 6e-10  # s per utterance-frame^2
    per_token: float = 2e-5  # s per utterance-token
    per_token2: float = 5e-8  # s per utterance-token^2
    frame_shift: float = 0.01  # s per frame

    def __post_init__(self) -> None:
        for f in fields(self):  # finite and within BOUNDS: every step time finite and > 0
            lo, hi = BOUNDS[f.name]
            check_number(f.name, getattr(self, f.name), gt=0 if f.name == "overhead" else None,
                         ge=None if f.name == "overhead" else lo, le=hi)

    def step_time(
        self,
        batch_size: npt.NDArray[np.integer],
        max_duration: npt.NDArray[np.floating],
        max_tokens: npt.NDArray[np.integer],
    ) -> npt.NDArray[np.float64]:
        """Seconds per batch, elementwise over arrays of batches."""
        b = np.asarray(batch_size, dtype=np.float64)
        f = np.asarray(max_duration, dtype=np.float64) / self.frame_shift
        t = np.asarray(max_tokens, dtype=np.float64)
        return self.overhead + b * (self.per_frame * f + self.per_frame2 * f * f
                                    + self.per_token * t + self.per_token2 * t * t)

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def with_overrides(self, pairs: Iterable[str]) -> CostModel:
        """Apply ``name=value`` overrides (e.g. ``per_frame2=1e-9``); ValueError names a bad one."""
        changes: dict[str, float] = {}
        for pair in pairs:
            name, sep, value = pair.partition("=")
            name = name.strip()
            if not sep or name not in self.names():
                raise ValueError(f"cost coefficient {pair!r}: expected NAME=VALUE with NAME in {', '.join(self.names())}")
            try:
                changes[name] = float(value)
            except ValueError:
                raise ValueError(f"cost coefficient {pair!r}: {value!r} is not a number") from None
            try:
                replace(self, **{name: changes[name]})
            except OptionError as exc:
                raise ValueError(f"cost coefficient {pair!r}: {exc.problem}") from None
        return replace(self, **changes)
