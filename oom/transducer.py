"""Reference transducer models (Parakeet RNN-T / TDT) and their loss, batched or sample-wise.

After NeMo's FastConformer transducer configs (XL / XXL sizes of the Parakeet cards): the
encoder of :mod:`oom.encoder`, an LSTM prediction network (``pred_dim`` 640, 2 layers) and a
joint (``enc -> 640``, ``pred -> 640``, ReLU, ``640 -> V + 1`` (+ D durations for TDT)); 1024
BPE tokens, blank id 1024. The joint output is B x T' x (U + 1) x (V + 1 [+ D]).

``loss_mode``: ``batched`` materializes the whole joint; ``sample-wise`` computes joint, loss
and gradient per chunk of ``SAMPLE_CHUNK`` samples inside the forward and keeps only the
gradients w.r.t. the projected encoder / predictor outputs and the joint's parameters, which
the outer backward injects: same gradients, the joint's memory that of one chunk. On fake
tensors only the first two chunks run (every later chunk allocates as the second).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from oom.encoder import ConformerBlock, ConvSubsampling, EncoderConfig, padding_mask, subsampled_length
from oom.lattice import TransducerNLL, is_fake
from oom.options import LOSS_MODES

#: Samples per chunk of the sample-wise loss.
SAMPLE_CHUNK = 1


@dataclass(frozen=True)
class TransducerConfig(EncoderConfig):
    """Sizes of a reference transducer: the encoder plus an LSTM predictor and a joint."""

    pred_dim: int = 640
    pred_layers: int = 2
    joint_dim: int = 640
    vocab_size: int = 1024  # BPE tokens, without blank
    durations: tuple[int, ...] = ()  # TDT: (0, 1, 2, 3, 4); empty: RNN-T

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "durations": list(self.durations), "kind": "tdt" if self.durations else "rnnt"}


TRANSDUCER_CONFIGS: dict[str, TransducerConfig] = {
    "parakeet-rnnt-0.6b": TransducerConfig("parakeet-rnnt-0.6b", n_mels=80, enc_layers=24),
    "parakeet-tdt-0.6b": TransducerConfig("parakeet-tdt-0.6b", n_mels=128, enc_layers=24, durations=(0, 1, 2, 3, 4)),
    "parakeet-tdt-1.1b": TransducerConfig("parakeet-tdt-1.1b", n_mels=80, enc_layers=42, durations=(0, 1, 2, 3, 4)),
    # Small models for tests and CPU dry runs.
    "tiny-rnnt": TransducerConfig(
        "tiny-rnnt", n_mels=16, enc_layers=2, enc_dim=64, enc_heads=2, subsampling_channels=16,
        pred_dim=32, pred_layers=1, joint_dim=32, vocab_size=64,
    ),
    "tiny-tdt": TransducerConfig(
        "tiny-tdt", n_mels=16, enc_layers=2, enc_dim=64, enc_heads=2, subsampling_channels=16,
        pred_dim=32, pred_layers=1, joint_dim=32, vocab_size=64, durations=(0, 1, 2),
    ),
}


class Joint(nn.Module):
    """``out(relu(enc_proj(f)[:, :, None] + pred_proj(g)[:, None]))``: (B, T', U + 1, V + 1 + D)."""

    def __init__(self, cfg: TransducerConfig) -> None:
        super().__init__()
        self.enc_proj = nn.Linear(cfg.enc_dim, cfg.joint_dim)
        self.pred_proj = nn.Linear(cfg.pred_dim, cfg.joint_dim)
        self.out = nn.Linear(cfg.joint_dim, cfg.vocab_size + 1 + len(cfg.durations))

    def forward(self, f: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """``f`` (B, T', J) and ``g`` (B, U + 1, J), both already projected."""
        return self.out(F.relu(f[:, :, None] + g[:, None]))


class Transducer(nn.Module):
    """FastConformer encoder + LSTM prediction network + joint."""

    def __init__(self, cfg: TransducerConfig) -> None:
        super().__init__()
        self.config = cfg
        self.pre = ConvSubsampling(cfg.n_mels, cfg.subsampling_channels, cfg.enc_dim)
        self.encoder = nn.ModuleList(ConformerBlock(cfg) for _ in range(cfg.enc_layers))
        self.embed = nn.Embedding(cfg.vocab_size + 1, cfg.pred_dim)
        self.lstm = nn.LSTM(cfg.pred_dim, cfg.pred_dim, cfg.pred_layers, batch_first=True)
        self.joint = Joint(cfg)

    @property
    def blank(self) -> int:
        return self.config.vocab_size

    def encode(self, features: torch.Tensor, feature_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T', enc_dim) encoder output and (B,) lengths in encoder frames."""
        x = self.pre(features)
        lens = subsampled_length(feature_lens)
        mask = padding_mask(lens, x.shape[1])
        for block in self.encoder:
            x = block(x, mask)
        return x, lens

    def predict(self, targets: torch.Tensor) -> torch.Tensor:
        """(B, U + 1, pred_dim): the prediction network over blank + ``targets`` (B, U)."""
        start = torch.full_like(targets[:, :1], self.blank)
        emb = self.embed(torch.cat([start, targets], dim=1))
        if emb.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
            # oneDNN has no bf16 LSTM on CPUs without bf16 support: fp32 there (CPU dry runs
            # and the fake-tensor estimate; B x (U+1) x 640 states, tiny next to the joint)
            with torch.autocast("cpu", enabled=False):
                y, _ = self.lstm(emb.float())
            return y
        y, _ = self.lstm(emb)
        return y


def joint_nll(
    model: Transducer,
    f: torch.Tensor,
    g: torch.Tensor,
    targets: torch.Tensor,
    frame_lens: torch.Tensor,
    target_lens: torch.Tensor,
) -> torch.Tensor:
    """Per-sample NLL (B,) from projected encoder ``f`` (B, T', J) and predictor ``g``
    (B, U + 1, J) outputs: joint, log-softmax (fp32), gather, lattice."""
    cfg = model.config
    v1 = cfg.vocab_size + 1
    logits = model.joint(f, g)
    lp = torch.log_softmax(logits[..., :v1].float(), dim=-1)
    b, t, u1, _ = lp.shape
    blank = lp[..., model.blank]
    label = lp[:, :, :-1].gather(-1, targets[:, None, :, None].expand(b, t, u1 - 1, 1)).squeeze(-1)
    duration = torch.log_softmax(logits[..., v1:].float(), dim=-1) if cfg.durations else None
    return TransducerNLL.apply(blank, label, duration, cfg.durations, frame_lens, target_lens)  # type: ignore[no-any-return]


class _InjectGrads(torch.autograd.Function):
    """Returns ``value``; its backward hands precomputed gradients to ``f`` and ``g``."""

    @staticmethod
    def forward(ctx: Any, value: torch.Tensor, f: torch.Tensor, g: torch.Tensor,  # type: ignore[override]
                grad_f: torch.Tensor, grad_g: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(grad_f, grad_g)
        return value.clone()

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        grad_f, grad_g = ctx.saved_tensors
        return None, grad_f * grad_out, grad_g * grad_out, None, None


def _sample_wise(
    model: Transducer, f: torch.Tensor, g: torch.Tensor, targets: torch.Tensor,
    frame_lens: torch.Tensor, target_lens: torch.Tensor,
) -> torch.Tensor:
    """Mean NLL with joint + loss + backward per chunk; joint parameter gradients are
    accumulated here, encoder / predictor ones flow through the returned value."""
    b = f.shape[0]
    grad_f = torch.zeros_like(f)
    grad_g = torch.zeros_like(g)
    total = torch.zeros((), dtype=torch.float32, device=f.device)
    starts = range(0, b, SAMPLE_CHUNK)
    if is_fake(f):
        starts = starts[:2]
    params = [p for p in model.joint.out.parameters() if p.requires_grad]
    fd, gd = f.detach(), g.detach()
    for s in starts:
        e = s + SAMPLE_CHUNK
        fc = fd[s:e].requires_grad_(True)
        gc = gd[s:e].requires_grad_(True)
        nll = joint_nll(model, fc, gc, targets[s:e], frame_lens[s:e], target_lens[s:e])
        part = nll.sum() / b
        torch.autograd.backward(part, inputs=[fc, gc, *params])
        grad_f[s:e] = fc.grad
        grad_g[s:e] = gc.grad
        total = total + part.detach()
    return _InjectGrads.apply(total, f, g, grad_f, grad_g)  # type: ignore[no-any-return]


def transducer_loss(
    model: Transducer,
    features: torch.Tensor,
    feature_lens: torch.Tensor,
    tokens: torch.Tensor,
    token_lens: torch.Tensor,
    loss_mode: str = "batched",
) -> torch.Tensor:
    """Mean per-sample transducer NLL. ``tokens`` (B, U + 1): the first token (prompt /
    BOS of the synthetic batch) is dropped, the U others are the targets."""
    if loss_mode not in LOSS_MODES:
        raise ValueError(f"loss_mode {loss_mode!r}: expected one of {LOSS_MODES}")
    targets, target_lens = tokens[:, 1:], token_lens - 1
    enc, frame_lens = model.encode(features, feature_lens)
    f = model.joint.enc_proj(enc)
    g = model.joint.pred_proj(model.predict(targets))
    if loss_mode == "batched":
        return joint_nll(model, f, g, targets, frame_lens, target_lens).mean()
    return _sample_wise(model, f, g, targets, frame_lens, target_lens)
