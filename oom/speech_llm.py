"""A small speech-LLM in plain torch: audio encoder + adapter + causal LM over packed sequences.

Encoder: a convolution whose kernel and stride are the subsampling (8 feature frames -> one
audio token, 12.5 tokens/s at a 10 ms hop), LayerNorm, GELU, a linear layer: every audio token
depends on its own frames only, so members never mix in the encoder. Adapter: a linear layer
into the LLM's width. LLM: pre-RMSNorm decoder blocks (multi-head attention with rotary
positions from ``position_ids``, SwiGLU MLP), tied to no weights; LoRA adapters on the
attention projections when ``lora_rank`` > 0 (then only the encoder, adapter and LoRA train).
Attention is causal and block-diagonal over ``member_cu_seqlens`` (a boolean mask through
``scaled_dot_product_attention``): a packed batch's loss is the sum of its members' losses alone.
Shapes: :class:`oom.packed_estimate.SpeechLLMShape`, the one the memory estimate sizes.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from manifests.errors import DataprepError
from oom.packed_estimate import SpeechLLMShape


class LoRALinear(nn.Linear):
    """A linear layer plus ``B @ A`` of rank ``rank`` (B starts at zero); with a rank, the base
    weight is frozen."""

    def __init__(self, d_in: int, d_out: int, rank: int) -> None:
        super().__init__(d_in, d_out, bias=False)
        self.rank = rank
        if rank:
            self.weight.requires_grad_(False)
            self.lora_a = nn.Parameter(torch.randn(rank, d_in) / d_in**0.5)
            self.lora_b = nn.Parameter(torch.zeros(d_out, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        return y + F.linear(F.linear(x, self.lora_a), self.lora_b) if self.rank else y


def rotary(x: torch.Tensor, position_ids: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary embedding of ``x`` (1, heads, T, d) at ``position_ids`` (1, T)."""
    d = x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, dtype=x.dtype, device=x.device) / d)
    ang = position_ids[0, :, None].to(x.dtype) * inv  # (T, d/2)
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


def varlen_causal_mask(member_cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """(T, T) bool: position i sees j when j <= i and both are in the same member."""
    pos = torch.arange(total, device=member_cu_seqlens.device)
    member = torch.searchsorted(member_cu_seqlens[1:].to(torch.int64), pos, right=True)
    return (member[:, None] == member[None, :]) & (pos[None, :] <= pos[:, None])


class Block(nn.Module):
    def __init__(self, s: SpeechLLMShape) -> None:
        super().__init__()
        h, r = s.llm_hidden, s.lora_rank
        self.heads = s.llm_heads
        self.norm1, self.norm2 = nn.RMSNorm(h), nn.RMSNorm(h)
        self.q, self.k, self.v, self.o = (LoRALinear(h, h, r) for _ in range(4))
        self.gate, self.up = nn.Linear(h, s.llm_ffn, bias=False), nn.Linear(h, s.llm_ffn, bias=False)
        self.down = nn.Linear(s.llm_ffn, h, bias=False)
        if r:
            for m in (self.norm1, self.norm2, self.gate, self.up, self.down):
                m.requires_grad_(False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        t, h = x.shape[1], x.shape[2]
        y = self.norm1(x)
        q, k, v = (p(y).view(1, t, self.heads, h // self.heads).transpose(1, 2) for p in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(rotary(q, position_ids), rotary(k, position_ids), v, attn_mask=mask)
        x = x + self.o(a.transpose(1, 2).reshape(1, t, h))
        y = self.norm2(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


class SpeechLLM(nn.Module):
    """The model of the module docstring; ``config`` is its :class:`SpeechLLMShape`."""

    def __init__(self, shape: SpeechLLMShape) -> None:
        super().__init__()
        if (shape.enc_layers or shape.sub_channels or shape.tie_embeddings or shape.llm_kv_heads != shape.llm_heads
                or shape.llm_heads * shape.head_dim != shape.llm_hidden):
            raise DataprepError(f"model {shape.name!r}: this reference builds a convolution + linear encoder and "
                                f"full multi-head attention only (a shape for the estimate, not to train here)")
        self.config = shape
        self.n_mels, self.vocab_size, self.subsampling = shape.n_mels, shape.vocab_size, shape.subsampling
        self.subsample = nn.Conv1d(shape.n_mels, shape.enc_dim, shape.subsampling, stride=shape.subsampling)
        self.enc_norm = nn.LayerNorm(shape.enc_dim)
        self.enc_out = nn.Linear(shape.enc_dim, shape.enc_dim)
        self.adapter = nn.Linear(shape.enc_dim, shape.llm_hidden)
        self.embed = nn.Embedding(shape.vocab_size, shape.llm_hidden)
        self.blocks = nn.ModuleList(Block(shape) for _ in range(shape.llm_layers))
        self.norm = nn.RMSNorm(shape.llm_hidden)
        self.head = nn.Linear(shape.llm_hidden, shape.vocab_size, bias=False)
        if shape.lora_rank:
            for m in (self.embed, self.norm, self.head):
                m.requires_grad_(False)

    def encode(self, features: torch.Tensor, feature_lens: torch.Tensor) -> torch.Tensor:
        """Audio tokens of every member, concatenated in member order: (sum ceil(F_m / s), hidden)."""
        s = self.subsampling
        if features.shape[1] == 0:  # text-only members alone: no audio token
            return features.new_zeros(0, self.config.llm_hidden)
        pad = -features.shape[1] % s
        x = F.pad(features, (0, 0, 0, pad)).transpose(1, 2)  # (M, n_mels, F) padded to a multiple of s
        x = self.subsample(x).transpose(1, 2)
        x = self.adapter(self.enc_out(F.gelu(self.enc_norm(x))))
        keep = torch.arange(x.shape[1], device=x.device)[None, :] < (-(-feature_lens // s))[:, None]
        return x[keep]

    def forward(self, batch: Any) -> torch.Tensor:
        """Logits (1, T, vocab) of a :class:`~dataprep.training.packed.PackedBatch` (on this device)."""
        x = self.embed(batch.input_ids)
        x = x.masked_scatter(batch.audio_mask[..., None], self.encode(batch.features, batch.feature_lens).to(x.dtype))
        mask = varlen_causal_mask(batch.member_cu_seqlens, x.shape[1])
        for block in self.blocks:
            x = block(x, batch.position_ids, mask)
        return self.head(self.norm(x))


def packed_loss(model: nn.Module, batch: Any) -> tuple[torch.Tensor, int]:
    """(sum of the token cross-entropies, number of target tokens) of a packed batch."""
    logits = model(batch)
    loss = F.cross_entropy(logits.flatten(0, 1).float() if logits.dtype != torch.float64 else logits.flatten(0, 1),
                           batch.labels.flatten(), ignore_index=-100, reduction="sum")
    return loss, int((batch.labels != -100).sum())


def build_speech_llm(shape: SpeechLLMShape) -> SpeechLLM:
    return SpeechLLM(shape)
