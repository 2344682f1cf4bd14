"""One full training step on a synthetic batch of a bucket's worst shape.

The same function runs on CUDA (the measured probe), on real CPU tensors (tests) and on
fake tensors (the estimate), so what is measured and what is estimated is one program:
``zero_grad`` -> forward + loss under bf16 autocast -> ``backward`` -> AdamW ``step``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from oom.models import FRAMES_PER_SECOND, loss


@dataclass(frozen=True)
class Shape:
    """A bucket's worst-case batch element: ``frames`` feature frames (10 ms each) and
    ``tokens`` decoder tokens including the prompt (the decoder reads ``tokens`` and
    predicts ``tokens``: the target adds an EOS)."""

    frames: int
    tokens: int

    @classmethod
    def of_bucket(cls, max_duration: float, max_tokens: int | None, max_tps: float = 20.0) -> Shape:
        """Frames for ``max_duration`` seconds (floor(d * 100) + 1, as an STFT with a 10 ms
        hop gives); tokens = ``max_tokens``, or ``ceil(max_duration * max_tps)`` when the
        bucket has no token bound."""
        frames = int(math.floor(max_duration * FRAMES_PER_SECOND + 1e-6)) + 1
        tokens = int(max_tokens) if max_tokens is not None else int(math.ceil(max_duration * max_tps))
        return cls(frames=frames, tokens=max(tokens, 1))


@dataclass
class Batch:
    features: torch.Tensor  # (B, frames, n_mels) float32
    feature_lens: torch.Tensor  # (B,) int64 frames
    tokens: torch.Tensor  # (B, tokens + 1) int64 ids
    token_lens: torch.Tensor  # (B,) int64, = tokens + 1


def synthetic_batch(
    batch_size: int, shape: Shape, n_mels: int, vocab_size: int, device: torch.device | str = "cpu", seed: int = 0
) -> Batch:
    """A full batch of ``batch_size`` copies of the worst shape (no padding inside)."""
    gen = torch.Generator().manual_seed(seed)
    feats = torch.randn(batch_size, shape.frames, n_mels, generator=gen)
    toks = torch.randint(1, vocab_size, (batch_size, shape.tokens + 1), generator=gen)
    return Batch(
        features=feats.to(device),
        feature_lens=torch.full((batch_size,), shape.frames, dtype=torch.int64).to(device),
        tokens=toks.to(device),
        token_lens=torch.full((batch_size,), shape.tokens + 1, dtype=torch.int64).to(device),
    )


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    """AdamW with the multi-tensor (foreach) implementation: the CUDA default, made explicit
    so CPU and fake runs allocate the same temporaries."""
    return torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-3, foreach=True)


def training_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    device_type: str,
    autocast_dtype: torch.dtype | None = torch.bfloat16,
    loss_mode: str = "batched",
) -> torch.Tensor:
    """zero_grad, forward + loss (autocast ``autocast_dtype`` on ``device_type``, None = off;
    ``loss_mode`` for transducers), backward, optimizer step. Returns the detached loss."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
        value = loss(model, batch.features, batch.feature_lens, batch.tokens, batch.token_lens, loss_mode)
    value.backward()
    optimizer.step()
    return value.detach()
