"""Reference attention encoder-decoder models, close enough to NVIDIA Canary that memory and
step time behave alike.

Encoder: FastConformer-like. 8x convolutional subsampling with depthwise-separable convs (as
NeMo's ``dw_striding``: conv 3x3/s2, then two [depthwise 3x3/s2, pointwise 1x1] stages, 256
channels), then conformer blocks: FF/2, multi-head self-attention, convolution module
(pointwise + GLU, depthwise conv kernel 9, batch norm, SiLU, pointwise), FF/2, LayerNorm.
The self-attention is *plain* MHSA through ``scaled_dot_product_attention`` (NeMo uses
relative positional attention; plain SDPA keeps the model small, lets torch choose the
flash / memory-efficient kernel and changes parameter count by < 1 %: the relative position
projections and biases are omitted).

Decoder: pre-LN transformer with causal self-attention, cross-attention to the encoder and a
ReLU feed-forward, sinusoidal positions (no parameters), a linear head over the vocabulary.

Configurations follow NeMo's ``examples/asr/conf/speech_multitask/fast-conformer_aed.yaml``
(encoder d_model 1024, 8 heads, FF x4, conv kernel 9; decoder hidden 1024, inner 4096,
8 heads) and the Canary model cards. The vocabulary is 16384 for all of them (the flash
models' aggregate tokenizer is about that size).

Units: ``features`` are (B, T_frames, n_mels) log-mel frames at a 10 ms hop; token tensors
are (B, U) integer ids; lengths are int64 counts of frames / tokens.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from manifests.errors import DataprepError

#: Feature frames per second of audio (10 ms hop).
FRAMES_PER_SECOND = 100
#: Target id ignored by the loss (padding).
PAD_ID = 0


@dataclass(frozen=True)
class EncoderConfig:
    """Sizes of the FastConformer encoder every reference model shares (mel bins, layers,
    width, heads, feed-forward multiple, conv kernel, subsampling channels)."""

    name: str
    n_mels: int = 128
    enc_layers: int = 24
    enc_dim: int = 1024
    enc_heads: int = 8
    enc_ff_mult: int = 4
    conv_kernel: int = 9
    subsampling_channels: int = 256


@dataclass(frozen=True)
class ModelConfig(EncoderConfig):
    """Sizes of a reference encoder-decoder model: the encoder plus a transformer decoder."""

    dec_layers: int = 24
    dec_dim: int = 1024
    dec_heads: int = 8
    dec_ff_mult: int = 4
    vocab_size: int = 16384
    dropout: float = 0.1

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


CONFIGS: dict[str, ModelConfig] = {
    "canary-1b": ModelConfig("canary-1b", enc_layers=24, dec_layers=24),
    "canary-1b-flash": ModelConfig("canary-1b-flash", enc_layers=32, dec_layers=4),
    "canary-180m-flash": ModelConfig(
        "canary-180m-flash", enc_layers=17, enc_dim=512, dec_layers=4, dec_dim=1024
    ),
    # Small models for tests and CPU dry runs.
    "small": ModelConfig(
        "small", n_mels=80, enc_layers=4, enc_dim=256, enc_heads=4, subsampling_channels=64,
        dec_layers=2, dec_dim=256, dec_heads=4, vocab_size=1024,
    ),
    "tiny": ModelConfig(
        "tiny", n_mels=16, enc_layers=2, enc_dim=64, enc_heads=2, subsampling_channels=16,
        dec_layers=1, dec_dim=64, dec_heads=2, vocab_size=128,
    ),
}


def subsampled_length(frames: torch.Tensor | int) -> Any:
    """Encoder frames after the 8x subsampling (three conv 3x3, stride 2, padding 1)."""
    n = frames
    for _ in range(3):
        n = (n - 1) // 2 + 1
    return n


def _padding_mask(lens: torch.Tensor, length: int) -> torch.Tensor:
    """(B, length) bool, True where a position is real (not padding)."""
    return torch.arange(length, device=lens.device)[None, :] < lens[:, None]


def _sinusoid(length: int, dim: int, device: torch.device) -> torch.Tensor:
    pos = torch.arange(length, device=device, dtype=torch.float32)[:, None]
    inv = torch.exp(torch.arange(0, dim, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / dim))
    pe = torch.zeros(length, dim, device=device)
    pe[:, 0::2] = torch.sin(pos * inv)
    pe[:, 1::2] = torch.cos(pos * inv)
    return pe


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
    def __init__(self, cfg: ModelConfig) -> None:
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


class DecoderBlock(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d = cfg.dec_dim
        self.self_norm = nn.LayerNorm(d)
        self.self_att = Attention(d, cfg.dec_heads, cfg.dropout)
        self.cross_norm = nn.LayerNorm(d)
        self.cross_att = Attention(d, cfg.dec_heads, cfg.dropout)
        self.ff = FeedForward(d, cfg.dec_ff_mult, cfg.dropout, F.relu)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(
        self, x: torch.Tensor, x_mask: torch.Tensor, mem: torch.Tensor, mem_mask: torch.Tensor
    ) -> torch.Tensor:
        y = self.self_norm(x)
        x = x + self.drop(self.self_att(y, y, x_mask, causal=True))
        x = x + self.drop(self.cross_att(self.cross_norm(x), mem, mem_mask))
        return x + self.ff(x)


class EncDec(nn.Module):
    """Attention encoder-decoder: ``forward(features, feature_lens, tokens_in, token_lens) -> logits``.

    ``features`` (B, T_frames, n_mels) float; ``feature_lens`` (B,) frames; ``tokens_in``
    (B, U) ids (decoder input, prompt included); ``token_lens`` (B,) tokens.
    Returns logits (B, U, vocab_size).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.pre = ConvSubsampling(cfg.n_mels, cfg.subsampling_channels, cfg.enc_dim)
        self.encoder = nn.ModuleList(ConformerBlock(cfg) for _ in range(cfg.enc_layers))
        self.bridge = nn.Linear(cfg.enc_dim, cfg.dec_dim) if cfg.enc_dim != cfg.dec_dim else nn.Identity()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dec_dim)
        self.decoder = nn.ModuleList(DecoderBlock(cfg) for _ in range(cfg.dec_layers))
        self.dec_norm = nn.LayerNorm(cfg.dec_dim)
        self.head = nn.Linear(cfg.dec_dim, cfg.vocab_size)

    def forward(
        self,
        features: torch.Tensor,
        feature_lens: torch.Tensor,
        tokens_in: torch.Tensor,
        token_lens: torch.Tensor,
    ) -> torch.Tensor:
        x = self.pre(features)
        enc_mask = _padding_mask(subsampled_length(feature_lens), x.shape[1])
        for block in self.encoder:
            x = block(x, enc_mask)
        mem = self.bridge(x)
        u = tokens_in.shape[1]
        y = self.embed(tokens_in) * math.sqrt(self.config.dec_dim) + _sinusoid(u, self.config.dec_dim, tokens_in.device)
        dec_mask = _padding_mask(token_lens, u)
        for block in self.decoder:
            y = block(y, dec_mask, mem, enc_mask)
        return self.head(self.dec_norm(y))


def sequence_loss(logits: torch.Tensor, targets: torch.Tensor, target_lens: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy over real (non-padding) target positions.

    ``logits`` (B, U, V); ``targets`` (B, U) ids; ``target_lens`` (B,) tokens.
    """
    mask = _padding_mask(target_lens, targets.shape[1])
    targets = targets.masked_fill(~mask, -100)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)


def loss(
    model: nn.Module,
    features: torch.Tensor,
    feature_lens: torch.Tensor,
    tokens: torch.Tensor,
    token_lens: torch.Tensor,
    loss_mode: str = "batched",
) -> torch.Tensor:
    """Training loss. Encoder-decoders: teacher-forced cross-entropy; ``tokens`` (B, U + 1)
    hold prompt + text + EOS, ``token_lens`` (B,) count them, the decoder reads
    ``tokens[:, :-1]`` and predicts ``tokens[:, 1:]``. Transducers (``oom.transducer``):
    the transducer loss in ``loss_mode`` (``batched`` or ``sample-wise``); ``loss_mode`` is
    ignored by encoder-decoders, whose loss has no joint."""
    from oom.transducer import Transducer, transducer_loss

    if isinstance(model, Transducer):
        return transducer_loss(model, features, feature_lens, tokens, token_lens, loss_mode)
    logits = model(features, feature_lens, tokens[:, :-1], token_lens - 1)
    return sequence_loss(logits, tokens[:, 1:], token_lens - 1)


def model_config(name: str) -> Any:
    """The built-in configuration called ``name`` (``ModelConfig`` or ``TransducerConfig``),
    or None for a user factory."""
    from oom.transducer import TRANSDUCER_CONFIGS

    return CONFIGS.get(name) or TRANSDUCER_CONFIGS.get(name)


def is_transducer(name: str) -> bool:
    """True for the built-in transducers (their loss has a ``loss_mode``)."""
    from oom.transducer import TRANSDUCER_CONFIGS

    return name in TRANSDUCER_CONFIGS


def known_models() -> list[str]:
    """Names of the built-in models."""
    from oom.transducer import TRANSDUCER_CONFIGS

    return sorted([*CONFIGS, *TRANSDUCER_CONFIGS])


def load_factory(spec: str) -> Callable[[], nn.Module]:
    """``"pkg.module:function"`` -> the function (a zero-argument model factory)."""
    mod_name, _, fn_name = spec.partition(":")
    if not mod_name or not fn_name:
        raise DataprepError(
            f"--model {spec!r}: not a known model ({', '.join(known_models())}) nor 'package.module:function'"
        )
    try:
        fn = getattr(importlib.import_module(mod_name), fn_name)
    except (ImportError, AttributeError) as exc:
        raise DataprepError(f"--model {spec!r}: cannot load the factory ({exc})") from None
    if not callable(fn):
        raise DataprepError(f"--model {spec!r}: {fn_name} is not callable")
    return fn  # type: ignore[no-any-return]


def build_model(name: str) -> nn.Module:
    """A fresh model: a built-in name (``canary-1b-flash``, ``tiny``, ...) or a user factory
    ``"pkg.module:build"`` returning an ``nn.Module`` with the :class:`EncDec` forward
    signature. Parameters are created on the current default device (use
    ``with torch.device(...)``)."""
    cfg = CONFIGS.get(name)
    if cfg is not None:
        return EncDec(cfg)
    if is_transducer(name):
        from oom.transducer import TRANSDUCER_CONFIGS, Transducer

        return Transducer(TRANSDUCER_CONFIGS[name])
    model = load_factory(name)()
    if not isinstance(model, nn.Module):
        raise DataprepError(f"--model {name!r}: the factory returned {type(model).__name__}, not an nn.Module")
    return model


def model_input_spec(model: nn.Module) -> tuple[int, int]:
    """(n_mels, vocab_size) a synthetic batch for ``model`` needs. User models expose them
    as ``model.n_mels`` / ``model.vocab_size`` or a ``config`` with those fields."""
    cfg = getattr(model, "config", None)
    n_mels = getattr(model, "n_mels", None) or getattr(cfg, "n_mels", None)
    vocab = getattr(model, "vocab_size", None) or getattr(cfg, "vocab_size", None)
    if n_mels is None or vocab is None:
        raise DataprepError(
            f"model {type(model).__name__}: expose n_mels and vocab_size (attributes or a config) "
            "so a synthetic batch can be built"
        )
    return int(n_mels), int(vocab)
