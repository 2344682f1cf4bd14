"""Reference attention encoder-decoder models, close enough to NVIDIA Canary that memory and
step time behave alike.

Encoder: FastConformer-like, 8x depthwise-separable subsampling (NeMo's ``dw_striding``, 256
channels), then conformer blocks (FF/2, plain multi-head self-attention through
``scaled_dot_product_attention``, convolution module with kernel 9, FF/2, LayerNorm).
Decoder: pre-LN transformer with causal self-attention, cross-attention, ReLU feed-forward,
sinusoidal positions and a linear head. Sizes follow NeMo's ``fast-conformer_aed.yaml`` and
the Canary model cards; the vocabulary is 16384. Plain attention instead of NeMo's relative
positional attention changes the parameter count by < 1 %.

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
from oom.encoder import (
    Attention,
    ConformerBlock,
    ConvSubsampling,
    EncoderConfig,
    FeedForward,
    padding_mask,
    subsampled_length,
)
from oom.transducer import TRANSDUCER_CONFIGS, Transducer, transducer_loss

#: Feature frames per second of audio (10 ms hop).
FRAMES_PER_SECOND = 100
#: Target id ignored by the loss (padding).
PAD_ID = 0


@dataclass(frozen=True)
class ModelConfig(EncoderConfig):
    """Sizes of a reference encoder-decoder model: the encoder plus a transformer decoder."""

    dec_layers: int = 24
    dec_dim: int = 1024
    dec_heads: int = 8
    dec_ff_mult: int = 4
    vocab_size: int = 16384

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


def _sinusoid(length: int, dim: int, device: torch.device) -> torch.Tensor:
    pos = torch.arange(length, device=device, dtype=torch.float32)[:, None]
    inv = torch.exp(torch.arange(0, dim, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / dim))
    pe = torch.zeros(length, dim, device=device)
    pe[:, 0::2] = torch.sin(pos * inv)
    pe[:, 1::2] = torch.cos(pos * inv)
    return pe


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
        enc_mask = padding_mask(subsampled_length(feature_lens), x.shape[1])
        for block in self.encoder:
            x = block(x, enc_mask)
        mem = self.bridge(x)
        u = tokens_in.shape[1]
        y = self.embed(tokens_in) * math.sqrt(self.config.dec_dim) + _sinusoid(u, self.config.dec_dim, tokens_in.device)
        dec_mask = padding_mask(token_lens, u)
        for block in self.decoder:
            y = block(y, dec_mask, mem, enc_mask)
        return self.head(self.dec_norm(y))


def sequence_loss(logits: torch.Tensor, targets: torch.Tensor, target_lens: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy over real (non-padding) target positions.

    ``logits`` (B, U, V); ``targets`` (B, U) ids; ``target_lens`` (B,) tokens.
    """
    mask = padding_mask(target_lens, targets.shape[1])
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
    if isinstance(model, Transducer):
        return transducer_loss(model, features, feature_lens, tokens, token_lens, loss_mode)
    logits = model(features, feature_lens, tokens[:, :-1], token_lens - 1)
    return sequence_loss(logits, tokens[:, 1:], token_lens - 1)


def model_config(name: str) -> Any:
    """The built-in configuration called ``name`` (``ModelConfig`` or ``TransducerConfig``),
    or None for a user factory."""
    return CONFIGS.get(name) or TRANSDUCER_CONFIGS.get(name)


def is_transducer(name: str) -> bool:
    """True for the built-in transducers (their loss has a ``loss_mode``)."""
    return name in TRANSDUCER_CONFIGS


def known_models() -> list[str]:
    """Names of the built-in models."""
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
