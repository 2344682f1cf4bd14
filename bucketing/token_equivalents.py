"""Token-equivalents: one currency for audio and text rows (speech-LLM batches).

A row's size is ``te = ceil(duration_s x audio_token_rate) + num_tokens``: its audio as the
tokens the encoder hands the LLM (``audio_token_rate`` in tokens per second of audio; NeMo's
``token_equivalent_duration`` is ``1 / rate`` seconds per token, and the ceiling is computed
as NeMo's ``ceil(duration / token_equivalent_duration)``), plus its prompt (context) and answer
tokens (``num_tokens``). A text-only row (duration 0) costs its tokens. :func:`token_cost` is
what a row weighs in a batch budget, as lhotse's ``TokenConstraint`` measures it:
``te + te**2 / quadratic_factor`` (``te`` without one); a batch of ``n`` rows of largest cost
``c`` fits ``batch_tokens`` when ``n x c <= batch_tokens`` (:func:`token_batch_sizes`).
Pure and vectorized; options checked by :class:`TokenEquivalentOptions`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from manifests.options import check_int, check_number

__all__ = ["TokenEquivalentOptions", "token_batch_sizes", "token_cost", "token_equivalents"]


#: Default audio tokens per second of audio: one token per 80 ms encoder frame (FastConformer's 8x
#: subsampling of 10 ms frames), as a speech-LLM's adapter hands them to the LLM.
DEFAULT_AUDIO_TOKEN_RATE = 12.5

@dataclass(frozen=True)
class TokenEquivalentOptions:
    """``audio_token_rate``: tokens per second of audio (> 0; 12.5 for an encoder with an 80 ms
    output frame). ``batch_tokens``: a batch's budget in token-equivalents (>= 1; None: not sized
    by it). ``quadratic_factor``: the quadratic penalty's scale (> 0; None: linear)."""

    audio_token_rate: float
    batch_tokens: int | None = None
    quadratic_factor: float | None = None

    def __post_init__(self) -> None:
        check_number("audio_token_rate", self.audio_token_rate, gt=0)
        check_int("batch_tokens", self.batch_tokens, ge=1, le=None, optional=True)
        check_number("quadratic_factor", self.quadratic_factor, gt=0, optional=True)

    @classmethod
    def from_nemo(cls, token_equivalent_duration: float, batch_tokens: int | None = None,
                  quadratic_factor: float | None = None) -> TokenEquivalentOptions:
        """The options of NeMo's ``token_equivalent_duration`` (s per token, > 0) and friends."""
        check_number("token_equivalent_duration", token_equivalent_duration, gt=0)
        return cls(1.0 / token_equivalent_duration, batch_tokens, quadratic_factor)


def token_equivalents(duration_s: npt.ArrayLike, num_tokens: npt.ArrayLike,
                      audio_token_rate: float) -> npt.NDArray[np.int64]:
    """``ceil(duration_s x audio_token_rate) + num_tokens`` per row (module docstring), int64."""
    check_number("audio_token_rate", audio_token_rate, gt=0)
    d = np.asarray(duration_s, dtype=np.float64)
    audio = np.ceil(d / (1.0 / audio_token_rate))  # NeMo's ceil(duration / token_equivalent_duration)
    return audio.astype(np.int64) + np.asarray(num_tokens, dtype=np.int64)


def token_cost(te: npt.ArrayLike, quadratic_factor: float | None = None) -> npt.NDArray[np.float64]:
    """A row's weight in a token budget: ``te + te**2 / quadratic_factor`` (``te`` without one)."""
    t = np.asarray(te, dtype=np.float64)
    return t if quadratic_factor is None else t + t * t / quadratic_factor


def token_batch_sizes(te_max: npt.ArrayLike, batch_tokens: int,
                      quadratic_factor: float | None = None) -> npt.NDArray[np.int64]:
    """The most rows of largest token-equivalents ``te_max`` a batch of ``batch_tokens`` holds:
    ``floor(batch_tokens / token_cost(te_max))`` (lhotse: ``n x longest <= max_tokens``); 0 where
    one row alone exceeds the budget."""
    check_int("batch_tokens", batch_tokens, ge=1, le=None)
    cost = token_cost(te_max, quadratic_factor)
    n = np.floor(batch_tokens / np.maximum(cost, 1e-300))
    n = np.where((n + 1) * cost <= batch_tokens, n + 1, n)  # the float quotient's rounding, both ways
    n = np.where((n * cost > batch_tokens) & (n > 0), n - 1, n)
    return n.astype(np.int64)
