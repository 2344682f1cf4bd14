""":class:`OomOptions`: how ``oomptimize`` sizes the buckets, checked in ``__post_init__``
whatever the caller. Torch-free, so the CLI reads its defaults without torch."""

from __future__ import annotations

import os
from dataclasses import dataclass

from bucketing.dynres import DynResConfig
from manifests.errors import DataprepError, OptionError
from manifests.options import check_bool, check_choice, check_int, check_number, check_str
from manifests.units import parse_bytes

LOSS_MODES = ("batched", "sample-wise")
#: the built-in models (:data:`oom.models.CONFIGS` and :data:`oom.transducer.TRANSDUCER_CONFIGS`,
#: named here without torch for ``--help`` and the check); any other ``--model`` is ``pkg.module:factory``
MODEL_NAMES = ("canary-1b", "canary-1b-flash", "canary-180m-flash", "parakeet-rnnt-0.6b", "parakeet-tdt-0.6b",
               "parakeet-tdt-1.1b", "small", "tiny", "tiny-rnnt", "tiny-tdt")
#: Largest device memory accepted (bytes): 1 PiB
MAX_MEMORY = 2**50


@dataclass(frozen=True)
class OomOptions:
    """What to size for and how.

    ``model``: a built-in name or ``pkg.module:factory``. ``estimate``: estimate peak memory
    without a device (needs ``gpu_memory``). ``device``: where probes run (``cuda``,
    ``cuda:1``; ``cpu`` = dry run). ``gpu_memory``: device memory in bytes (caps a real GPU's;
    1..2**50). ``memory_fraction``: share of memory a step may use (0 < f <= 1). ``margin``:
    headroom below the fraction, a size (``2GiB``) or a share of memory (``5%``).
    ``tolerance``: stop bisecting when the gap is below this share of the batch (0..1).
    ``max_batch``: largest batch tried (1..2**20). ``max_tps``: tokens per second assumed
    for buckets without ``max_tokens`` (> 0). ``cache_dir``: probe cache (None: none read or
    written). ``retries``: re-runs of a failed isolated probe (>= 0). ``start_batch``: where
    the largest bucket's search starts (>= 1). ``loss_mode``: transducers' ``batched`` or
    ``sample-wise`` loss. ``exact_trace``: full traces per bucket instead of the fitted
    estimate. ``explain``: per bucket, the bytes by class at the peak. ``dynamic_resolution``:
    size each bucket at its dynamic-resolution shape (:func:`bucketing.dynres.bucket_frames`;
    None: the longest utterance at 100 Hz).
    """

    model: str
    estimate: bool = False
    device: str = "cuda"
    gpu_memory: int | None = None
    memory_fraction: float = 0.9
    margin: str = "5%"
    tolerance: float = 0.05
    max_batch: int = 4096
    max_tps: float = 20.0
    cache_dir: str | None = None
    retries: int = 2
    start_batch: int = 1
    loss_mode: str = "batched"
    exact_trace: bool = False
    explain: bool = False
    dynamic_resolution: DynResConfig | None = None

    def __post_init__(self) -> None:
        check_str("model", self.model)
        if ":" not in self.model and self.model not in MODEL_NAMES:
            raise OptionError("model", f"{self.model!r}: not a known model ({', '.join(MODEL_NAMES)}) "
                                       "nor 'package.module:function'")
        check_bool("estimate", self.estimate)
        check_str("device", self.device)
        check_int("gpu_memory", self.gpu_memory, ge=1, le=MAX_MEMORY, optional=True)
        check_number("memory_fraction", self.memory_fraction, gt=0, le=1)
        check_str("margin", self.margin)
        try:
            parse_bytes(self.margin, MAX_MEMORY)
        except DataprepError as exc:
            raise OptionError("margin", str(exc)) from None
        check_number("tolerance", self.tolerance, ge=0, le=1)
        check_int("max_batch", self.max_batch, ge=1)
        check_number("max_tps", self.max_tps, gt=0)
        if self.cache_dir is not None and not isinstance(self.cache_dir, (str, os.PathLike)):
            raise OptionError("cache_dir", f"must be a path, got {self.cache_dir!r}")
        check_int("retries", self.retries, ge=0, le=100)
        check_int("start_batch", self.start_batch, ge=1)
        check_choice("loss_mode", self.loss_mode, LOSS_MODES)
        check_bool("exact_trace", self.exact_trace)
        check_bool("explain", self.explain)
        if self.dynamic_resolution is not None and not isinstance(self.dynamic_resolution, DynResConfig):
            raise OptionError("dynamic_resolution",
                              f"must be a DynResConfig, got {type(self.dynamic_resolution).__name__}")
        if (self.estimate or not self.device.startswith("cuda")) and self.gpu_memory is None:
            raise OptionError("gpu_memory", "required with --estimate or a CPU device (e.g. --gpu-memory 80GiB)")
