"""The FastConformer encoder every reference model shares (:mod:`oom.models` encoder-decoders,
:mod:`oom.transducer` transducers): its sizes (:class:`EncoderConfig`), the 8x convolutional
subsampling, the conformer block and its parts, and the padding mask.

Units: ``features`` are (B, T_frames, n_mels) log-mel frames at a 10 ms hop; lengths are int64
counts of frames; :func:`subsampled_length` gives encoder frames (8x fewer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class EncoderConfig:
    """Sizes of the FastConformer encoder every reference model shares (mel bins, layers,
    width, heads, feed-forward multiple, conv kernel, subsampling channels, dropout)."""

    name: str
    n_mels: int = 128
    enc_layers: int = 24
    enc_dim: int = 1024
    enc_heads: int = 8
    enc_ff_mult: int = 4
    conv_kernel: int = 9
    subsampling_channels: int = 256
    dropout: float = 0.1


def subsampled_length(frames: torch.Tensor | int) -> Any:
    """Encoder frames after the 8x subsampling (three conv 3x3, stride 2, padding 1)."""
    n = frames
    for _ in range(3):
        n = (n - 1) // 2 + 1
    return n


def padding_mask(lens: torch.Tensor, length: int) -> torch.Tensor:
    """(B, length) bool, True where a position is real (not padding)."""
    return torch.arange(length, device=lens.device)[None, :] < lens[:, None]


class ConvSubsampling(nn.Module):
    """8x time (and frequency) reduction, NeMo ``dw_striding`` style."""

    def __init__(self, n_mels: int, channels: int, out_dim: int) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(1, channels, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, stride=2, padding=1, groups=channels),
            nn.Conv2d(channels, channels, 1),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, stride=2, padding=1, groups=channels),
            nn.Conv2d(channels, channels, 1),
            nn.ReLU(),
        )
        self.out = nn.Linear(channels * subsampled_length(n_mels), out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x.unsqueeze(1))  # (B, C, T/8, F/8)
        b, c, t, f = x.shape
        return self.out(x.transpose(1, 2).reshape(b, t, c * f))


class FeedForward(nn.Module):
    def __init__(self, dim: int, mult: int, dropout: float, act: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.lin1 = nn.Linear(dim, dim * mult)
        self.lin2 = nn.Linear(dim * mult, dim)
        self.drop = nn.Dropout(dropout)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.lin2(self.drop(self.act(self.lin1(self.norm(x))))))


class Attention(nn.Module):
    """Multi-head attention through ``scaled_dot_product_attention`` (self or cross)."""

    def __init__(self, dim: int, heads: int, dropout: float, kv_dim: int | None = None) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(kv_dim or dim, 2 * dim)
        self.o = nn.Linear(dim, dim)
        self.dropout = dropout

    def forward(
        self, x: torch.Tensor, mem: torch.Tensor, key_mask: torch.Tensor | None, causal: bool = False
    ) -> torch.Tensor:
        b, t, d = x.shape
        h = self.heads
        q = self.q(x).view(b, t, h, d // h).transpose(1, 2)
        k, v = self.kv(mem).view(b, mem.shape[1], 2, h, d // h).permute(2, 0, 3, 1, 4)
        mask = None
        if key_mask is not None:
            mask = key_mask[:, None, None, :]  # (B, 1, 1, S), True = attend
            if causal:
                mask = mask & torch.ones(t, mem.shape[1], dtype=torch.bool, device=x.device).tril()
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0,
            is_causal=causal and mask is None,
        )
        return self.o(y.transpose(1, 2).reshape(b, t, d))


class ConvModule(nn.Module):
    def __init__(self, dim: int, kernel: int, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.pw1 = nn.Conv1d(dim, 2 * dim, 1)
        self.dw = nn.Conv1d(dim, dim, kernel, padding=kernel // 2, groups=dim)
        self.bn = nn.BatchNorm1d(dim)
        self.pw2 = nn.Conv1d(dim, dim, 1)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        y = self.norm(x).masked_fill(~mask[..., None], 0.0).transpose(1, 2)
        y = F.glu(self.pw1(y), dim=1)
        y = self.pw2(F.silu(self.bn(self.dw(y))))
        return self.drop(y.transpose(1, 2))


class ConformerBlock(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        d = cfg.enc_dim
        self.ff1 = FeedForward(d, cfg.enc_ff_mult, cfg.dropout, F.silu)
        self.att_norm = nn.LayerNorm(d)
        self.att = Attention(d, cfg.enc_heads, cfg.dropout)
        self.conv = ConvModule(d, cfg.conv_kernel, cfg.dropout)
        self.ff2 = FeedForward(d, cfg.enc_ff_mult, cfg.dropout, F.silu)
        self.norm = nn.LayerNorm(d)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + 0.5 * self.ff1(x)
        y = self.att_norm(x)
        x = x + self.drop(self.att(y, y, mask))
        x = x + self.conv(x, mask)
        x = x + 0.5 * self.ff2(x)
        return self.norm(x)
