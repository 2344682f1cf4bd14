"""Memory of packed speech-LLM batches, by shape: S sequences of N token-equivalents per step.

:class:`SpeechLLMShape` is a speech-LLM's shape (audio encoder, adapter, LLM, LoRA rank or full
fine-tuning); :func:`packed_memory` its training step's bytes for S sequences of N tokens:
weights (trainable fp32, frozen bf16), gradients (fp32) and AdamW states (two fp32) for the
trainable parameters only, and activations (bf16) linear in N x S: per LLM token and layer
``7h + 2 kv + 4 ffn`` values, the logits (6 bytes per vocabulary entry: bf16 logits, fp32
softmax), and per encoder token (``N x`` the bucket's audio share) and conformer layer ``35 d``
values plus the subsampling's. Attention is varlen (flash-attention style): its memory is linear
in N, no N^2 term. Torch-free; :func:`size_packed_buckets` gives each bucket of a ``buckets.json``
the most sequences a step holds within the budget.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from manifests.buckets_file import BucketSpec
from manifests.errors import DataprepError, OptionError
from manifests.options import check_int, check_number, check_str
from manifests.units import parse_bytes

#: bytes: activations bf16, trainable weights / gradients fp32, frozen weights bf16, AdamW 2 x fp32
ACT, TRAIN_W, FROZEN_W, GRAD, ADAM = 2, 4, 2, 4, 8
#: saved values per conformer-layer token (two macaron FFs 18d, attention 6d, conv module 6d, norms 5d)
CONFORMER_ACT = 35
#: bytes per logit: bf16 logits and their fp32 softmax, kept for the backward pass
LOGIT_BYTES = 6
#: feature frames per second (10 ms hop)
FRAME_RATE = 100.0


@dataclass(frozen=True)
class SpeechLLMShape:
    """A speech-LLM's shape. Encoder: ``subsampling`` x frames of ``n_mels`` -> one audio token,
    ``enc_layers`` conformer layers of width ``enc_dim`` (0: the convolution + linear of
    :mod:`oom.speech_llm`), dw-striding subsampling with ``sub_channels`` (0: one strided
    convolution). Adapter: linear ``enc_dim`` -> ``llm_hidden``. LLM: ``llm_layers`` blocks,
    ``llm_heads`` x ``head_dim`` queries, ``llm_kv_heads`` key/value heads, SwiGLU ``llm_ffn``,
    ``vocab_size``, tied embeddings or not. ``lora_rank`` > 0: LoRA on q, k, v, o and the LLM
    frozen; 0: full fine-tuning. ``train_encoder``: the encoder and adapter train."""

    name: str
    n_mels: int = 16
    subsampling: int = 8
    enc_layers: int = 0
    enc_dim: int = 32
    sub_channels: int = 0
    llm_layers: int = 2
    llm_hidden: int = 64
    llm_heads: int = 4
    llm_kv_heads: int = 4
    head_dim: int = 16
    llm_ffn: int = 128
    vocab_size: int = 128
    tie_embeddings: bool = False
    lora_rank: int = 0
    train_encoder: bool = True

    def __post_init__(self) -> None:
        check_str("name", self.name)
        for f in ("n_mels", "subsampling", "enc_dim", "llm_layers", "llm_hidden", "llm_heads", "llm_kv_heads",
                  "head_dim", "llm_ffn", "vocab_size"):
            check_int(f, getattr(self, f), ge=1)
        for f in ("enc_layers", "sub_channels", "lora_rank"):
            check_int(f, getattr(self, f), ge=0)

    @property
    def audio_token_rate(self) -> float:
        """Audio tokens per second of audio."""
        return FRAME_RATE / self.subsampling

    def param_counts(self) -> dict[str, int]:
        """Parameters by part: ``encoder`` (subsampling, layers, adapter), ``llm``, ``lora``."""
        d, c, m = self.enc_dim, self.sub_channels, self.n_mels
        if c:  # NeMo's dw_striding: conv 1->c, then 2 x (depthwise 3x3 + pointwise), then a linear
            sub = 10 * c + 2 * (10 * c + c * c + c) + c * math.ceil(m / 8) * d + d
        else:
            sub = m * d * self.subsampling + d + 2 * d + d * d + d
        layer = 2 * (8 * d * d + 5 * d) + (4 * d * d + 4 * d) + (3 * d * d + 15 * d) + 10 * d
        encoder = sub + self.enc_layers * layer + d * self.llm_hidden + self.llm_hidden
        h, q, kv = self.llm_hidden, self.llm_heads * self.head_dim, self.llm_kv_heads * self.head_dim
        block = 2 * h + h * q + 2 * h * kv + q * h + 3 * h * self.llm_ffn
        llm = self.llm_layers * block + h + self.vocab_size * h * (1 if self.tie_embeddings else 2)
        r = self.lora_rank
        lora = self.llm_layers * r * ((h + q) + 2 * (h + kv) + (q + h))
        return {"encoder": encoder, "llm": llm, "lora": lora}

    def trainable(self) -> int:
        p = self.param_counts()
        return (p["encoder"] if self.train_encoder else 0) + (p["lora"] if self.lora_rank else p["llm"])

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


SPEECH_LLMS: dict[str, SpeechLLMShape] = {
    # the CPU test model (oom.speech_llm): conv + linear encoder, 2-layer LLM
    "tiny-speech-llm": SpeechLLMShape("tiny-speech-llm"),
    # Canary-Qwen-2.5B's shape: canary-1b-flash's FastConformer encoder, Qwen3-1.7B, LoRA on attention
    "canary-qwen-2.5b": SpeechLLMShape(
        "canary-qwen-2.5b", n_mels=128, subsampling=8, enc_layers=32, enc_dim=1024, sub_channels=256,
        llm_layers=28, llm_hidden=2048, llm_heads=16, llm_kv_heads=8, head_dim=128, llm_ffn=6144,
        vocab_size=151936, tie_embeddings=True, lora_rank=128),
}


def speech_llm_shape(name: str, lora_rank: int | None = None) -> SpeechLLMShape:
    """The preset ``name`` (:data:`SPEECH_LLMS`), with ``lora_rank`` overriding its own (0: full)."""
    if name not in SPEECH_LLMS:
        raise OptionError("model", f"{name!r}: not a speech-LLM ({', '.join(SPEECH_LLMS)})")
    shape = SPEECH_LLMS[name]
    return shape if lora_rank is None else replace(shape, lora_rank=lora_rank)


def static_bytes(s: SpeechLLMShape) -> dict[str, int]:
    """Bytes that do not grow with the batch: ``parameters``, ``gradients``, ``optimizer``."""
    p, t = s.param_counts(), s.trainable()
    total = p["encoder"] + p["llm"] + p["lora"]
    return {"parameters": t * TRAIN_W + (total - t) * FROZEN_W, "gradients": t * GRAD, "optimizer": t * ADAM}


def sequence_bytes(s: SpeechLLMShape, pack: int, audio_share: float) -> dict[str, int]:
    """Activation bytes of one sequence of ``pack`` tokens of which ``audio_share`` are audio."""
    kv = s.llm_kv_heads * s.head_dim
    llm = pack * (s.llm_layers * (7 * s.llm_hidden + 2 * kv + 4 * s.llm_ffn) + 2 * s.llm_hidden) * ACT
    logits = pack * s.vocab_size * LOGIT_BYTES
    enc_tokens = pack * audio_share
    frames = enc_tokens * s.subsampling
    sub = frames * (s.sub_channels * s.n_mels // 4 if s.sub_channels else s.n_mels) * ACT
    layers = enc_tokens * (s.enc_layers * CONFORMER_ACT + 4) * s.enc_dim * ACT
    encoder = int(sub + layers) if s.train_encoder else 0
    return {"activations": llm + encoder, "logits": logits}


def packed_memory(s: SpeechLLMShape, pack: int, sequences: int, audio_share: float) -> dict[str, int]:
    """Bytes of a training step on ``sequences`` x ``pack`` tokens, by class, and ``peak``."""
    out = static_bytes(s)
    out.update({k: v * sequences for k, v in sequence_bytes(s, pack, audio_share).items()})
    out["peak"] = sum(out.values())
    return out


@dataclass(frozen=True)
class PackedOomOptions:
    """What ``oomptimize --pack`` sizes: ``model`` (:data:`SPEECH_LLMS`), ``pack`` (N, tokens a
    sequence), ``gpu_memory`` (bytes), ``memory_fraction`` (0 < f <= 1), ``margin`` (a size or a
    share of memory), ``max_batch`` (most sequences a step), ``max_tps`` (tokens per second for
    buckets without ``max_tokens``), ``lora_rank`` (None: the model's; 0: full fine-tuning),
    ``audio_token_rate`` (None: the model's, tokens/s; the plan's ``--audio-token-rate``)."""

    model: str
    pack: int
    gpu_memory: int
    memory_fraction: float = 0.9
    margin: str = "5%"
    max_batch: int = 4096
    max_tps: float = 20.0
    lora_rank: int | None = None
    audio_token_rate: float | None = None

    def __post_init__(self) -> None:
        speech_llm_shape(self.model)
        check_int("pack", self.pack, ge=1, le=2**31 - 1)
        check_int("gpu_memory", self.gpu_memory, ge=1, le=2**50)
        check_number("memory_fraction", self.memory_fraction, gt=0, le=1)
        check_str("margin", self.margin)
        try:
            parse_bytes(self.margin, 2**50)
        except DataprepError as exc:
            raise OptionError("margin", str(exc)) from None
        check_int("max_batch", self.max_batch, ge=1)
        check_number("max_tps", self.max_tps, gt=0)
        check_int("lora_rank", self.lora_rank, ge=0, optional=True)
        check_number("audio_token_rate", self.audio_token_rate, gt=0, optional=True)

    @property
    def budget(self) -> int:
        """Bytes a step may use: the fraction of the memory less the margin."""
        return int(self.gpu_memory * self.memory_fraction - parse_bytes(self.margin, self.gpu_memory))


def size_packed_buckets(spec: BucketSpec, options: PackedOomOptions) -> BucketSpec:
    """``spec`` sized for packed batches: in each bucket's ``extra``, ``oom_sequences`` = the most
    sequences of ``pack`` tokens whose step fits the budget (0 where none does) and the bytes;
    its ``batch_size`` = those sequences x the members a sequence of the bucket's largest rows
    holds (utterances, as ``plan-batches --pack`` reads a batch size: never more sequences)."""
    shape = speech_llm_shape(options.model, options.lora_rank)
    rate = options.audio_token_rate or shape.audio_token_rate
    static = sum(static_bytes(shape).values())
    budget = options.budget
    buckets = []
    for b in spec.buckets:
        audio = math.ceil(b.max_duration * rate)
        text = b.max_tokens if b.max_tokens is not None else math.ceil(b.max_duration * options.max_tps)
        share = audio / max(audio + text, 1)
        per = sum(sequence_bytes(shape, options.pack, share).values())
        n = max(0, min(options.max_batch, (budget - static) // per))
        mem = packed_memory(shape, options.pack, max(n, 1), share)
        members = max(1, options.pack // max(audio + text, 1))
        buckets.append(replace(b, batch_size=int(n) * members, extra={**b.extra, "oom_pack": options.pack,
                                                            "oom_sequences": int(n),
                                                            "oom_audio_share": round(share, 4),
                                                            "oom_peak_bytes": mem["peak"], "oom_breakdown": mem}))
    source = {"rule": "speech-llm packed estimate", "model": shape.name, "pack": options.pack,
              "lora_rank": shape.lora_rank, "audio_token_rate": rate, "budget_bytes": budget,
              "gpu": f"{options.gpu_memory / 2**30:.1f} GiB (estimate)"}
    return replace(spec, buckets=buckets, batch_size_source=source)
