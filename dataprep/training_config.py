""":class:`TrainConfig`: what ``dataprep train`` (:func:`dataprep.training.train`) does,
checked in ``__post_init__`` whatever the caller.

Torch-free and outside :mod:`dataprep.training` (whose import loads torch) so that the CLI
reads its defaults and checks its ranges without torch; :mod:`dataprep.training` exports it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from dataprep.planning.step_reads import DEFAULT_PREFETCH_BYTES, PrefetchOptions
from manifests.errors import OptionError
from manifests.options import check_bool, check_choice, check_int, check_number, check_str

DEVICES = ("auto", "cpu", "cuda")
#: the log-mel front ends of our loop (:meth:`dataprep.training.features.FeatureConfig.named`)
FEATURE_SETS = ("ours", "nemo", "canary-1b")
#: how the loop resamples audio to 16 kHz (:func:`dataprep.training.audio.load_audio`)
RESAMPLERS = ("soxr", "lhotse")
#: torch.manual_seed's range
SEED_RANGE = (-(2**63), 2**64 - 1)
#: most DataLoader worker processes per rank and batches prepared ahead (each held in memory)
MAX_WORKERS, MAX_PREFETCH = 1024, 256


def _path(name: str, value: Any, optional: bool = False) -> str | None:
    """A path field as ``str`` (a ``str`` or ``os.PathLike``, not empty)."""
    if value is None and optional:
        return None
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise OptionError(name, f"must be a path, got {value!r}")
    return str(os.fspath(value))


@dataclass
class TrainConfig:
    """What ``dataprep train`` does.

    ``steps``: train up to (not including) this global plan step (None = the whole plan;
    >= 0). ``lr``: AdamW learning rate (> 0, finite). ``seed``: model init and dropout.
    ``workers``: DataLoader worker processes per rank (>= 0; 0 = one prefetch thread).
    ``prefetch``: batches prepared ahead (>= 0). ``prefetch_steps`` / ``prefetch_bytes``: read
    the audio bytes of that many next steps ahead, at most that many bytes held (0 steps: off;
    :class:`~dataprep.planning.step_reads.PrefetchOptions`). ``checkpoint_every``: steps between saves
    (>= 0; 0 = only at the end). ``device``: auto, cpu or cuda. ``timeout_s``: seconds before a
    hung collective / rank is reported (> 0). ``cache_dir``: memory-mapped manifest columns
    (None: the tool's cache directory). ``features``: the log-mel front end, one of
    :data:`FEATURE_SETS` (``nemo``: NeMo's preprocessor defaults, ``canary-1b``: Canary-1B's
    config), with the model's mel count. ``resampler``: ``soxr`` (HQ) or ``lhotse`` (the samples
    NeMo's Lhotse dataloader gives, :func:`dataprep.training.audio.load_audio`).
    """

    plan_dir: str
    manifest: str
    tokenizer: list[str]
    checkpoint_dir: str
    model: str = "tiny"
    steps: int | None = None
    resume: bool = False
    lr: float = 1e-3
    seed: int = 0
    workers: int = 0
    prefetch: int = 2
    prefetch_steps: int = 0  # plan steps whose audio bytes are read ahead (0: off)
    prefetch_bytes: int = DEFAULT_PREFETCH_BYTES  # bytes held ahead at most
    skip_bad_audio: bool = False
    checkpoint_every: int = 0  # steps; 0 = only at the end
    trace: bool = False
    device: str = "auto"  # auto | cpu | cuda
    timeout_s: float = 600.0
    cache_dir: str | None = None
    quiet: bool = False
    dynamic_resolution: bool = True  # use the plan's dynamic resolution when it has one
    features: str = "ours"  # ours | nemo | canary-1b (FeatureConfig.named, the model's mel count)
    resampler: str = "soxr"  # soxr | lhotse (NeMo's Lhotse dataloader's samples)
    overwrite: bool = False  # replace a run already in checkpoint_dir
    allow_other_tokenizer: bool = False  # train with a tokenizer other than the manifest's
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.plan_dir = _path("plan_dir", self.plan_dir)  # type: ignore[assignment]
        self.manifest = _path("manifest", self.manifest)  # type: ignore[assignment]
        self.checkpoint_dir = _path("checkpoint_dir", self.checkpoint_dir)  # type: ignore[assignment]
        self.cache_dir = _path("cache_dir", self.cache_dir, optional=True)
        if not isinstance(self.tokenizer, list) or not self.tokenizer:
            raise OptionError("tokenizer", f"must be a non-empty list of models, got {self.tokenizer!r}")
        for t in self.tokenizer:
            check_str("tokenizer", t)
        check_str("model", self.model)
        check_int("steps", self.steps, ge=0, le=None, optional=True)
        check_number("lr", self.lr, gt=0)
        check_int("seed", self.seed, ge=SEED_RANGE[0], le=SEED_RANGE[1])
        check_int("workers", self.workers, ge=0, le=MAX_WORKERS)
        check_int("prefetch", self.prefetch, ge=0, le=MAX_PREFETCH)
        PrefetchOptions(self.prefetch_steps, self.prefetch_bytes)  # checks both
        check_int("checkpoint_every", self.checkpoint_every, ge=0, le=None)
        check_choice("device", self.device, DEVICES)
        check_choice("features", self.features, FEATURE_SETS)
        check_choice("resampler", self.resampler, RESAMPLERS)
        check_number("timeout_s", self.timeout_s, gt=0)
        for name in ("resume", "skip_bad_audio", "trace", "quiet", "dynamic_resolution", "overwrite",
                     "allow_other_tokenizer"):
            check_bool(name, getattr(self, name))
        if not isinstance(self.extra, dict):
            raise OptionError("extra", f"must be a dict, got {type(self.extra).__name__}")
