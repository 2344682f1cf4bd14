"""The OOMptimizer: batch size per bucket of a ``buckets.json``, measured or estimated.

Budget (bytes of allocated memory a step may peak at) =
``memory_fraction * device memory - margin``. The fraction (default 0.9) leaves room for
the CUDA context, cuDNN/cuBLAS workspaces and allocator fragmentation; the margin (default
5 % of device memory) guards against the memory creep users report hours into training,
when the caching allocator has fragmented over many batch shapes
(NVIDIA-NeMo/Speech#15847, where users needed ``--memory-fraction 0.5``). Both are written to
``batch_size_source``. Setting ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` in
training reduces the creep.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from collections.abc import Callable
from typing import Any

import torch

from bucketing.dynres import LONGEST, bucket_frames
from manifests.buckets_file import Bucket, BucketSpec
from manifests.errors import DataprepError, OptionError
from manifests.units import parse_bytes
from manifests.hash_cache import keep_value, kept_value
from oom.cache import ProbeCache, budget_probe
from oom.estimate import shape_estimator
from oom.fit import FitError, fitted_model
from oom.isolate import device_info, run_isolated
from oom.models import FRAMES_PER_SECOND, is_transducer, model_config
from oom.options import OomOptions
from oom.search import ProbeResult, SearchResult, search_buckets
from oom.step import Shape

def _model_context(model: str) -> dict[str, Any]:
    cfg = model_config(model)
    return {"name": model, **cfg.to_json()} if cfg is not None else {"factory": model}


def _peak_function(model: str, loss_mode: str, exact_trace: bool) -> tuple[Callable[[Shape, int], int], str]:
    """``(shape, batch) -> estimated peak bytes`` and the method's name: the fitted laws of
    :mod:`oom.fit` (one trace per model), or full traces per shape (``exact_trace``, or
    when the model's sizes are not shape monomials)."""
    if not exact_trace:
        try:
            fm = fitted_model(model, loss_mode)
            return (lambda shape, b: fm.peak(b, shape)), "fitted"
        except FitError:
            pass
    return (lambda shape, b: shape_estimator(model, shape, loss_mode).peak(b)), "exact-trace"


class _Estimate:
    """The estimate's ``(shape, batch) -> peak bytes``, traced at the first probe the cache cannot
    answer (the fit traces a step once per model: seconds for a 1B model on CPU). Which method a
    model gets (:func:`_peak_function`) names the cached probes, so it is kept in the cache too: a
    search the cache answers traces nothing."""

    def __init__(self, model: str, loss_mode: str, exact_trace: bool, cache_dir: str | None) -> None:
        self.model, self.loss_mode = model, loss_mode
        self.context = {"estimator_of": _model_context(model), "torch": torch.__version__, "loss_mode": loss_mode}
        self._peak: Callable[[Shape, int], int] | None = None
        kept = None if exact_trace else kept_value(cache_dir, self.context)
        if exact_trace or kept in ("fitted", "exact-trace"):
            self.method = "exact-trace" if exact_trace else str(kept)
        else:
            self._peak, self.method = _peak_function(model, loss_mode, exact_trace=False)
            keep_value(cache_dir, self.context, self.method)

    def peak(self, shape: Shape, batch_size: int) -> int:
        if self._peak is None:
            self._peak, method = _peak_function(self.model, self.loss_mode, exact_trace=self.method == "exact-trace")
            if method != self.method:
                raise DataprepError(f"{self.model}: the cached estimator ({self.method}) no longer applies; "
                                    f"run again with --no-cache")
        return self._peak(shape, batch_size)


def explain_bucket(model: str, shape: Shape, batch_size: int, loss_mode: str = "batched") -> dict[str, Any]:
    """Estimated live bytes by class (parameters, gradients, optimizer, activations,
    attention, joint) at the peak of the step, for one bucket shape and batch size."""
    return fitted_model(model, loss_mode).explain(batch_size, shape).to_json()


def oomptimize(
    spec: BucketSpec,
    options: OomOptions,
    *,
    on_done: Callable[[int, SearchResult], None] | None = None,
) -> BucketSpec:
    """Return ``spec`` with every bucket's ``batch_size`` set to the largest batch whose
    training step fits the budget, with provenance in ``batch_size_source`` and per-bucket
    ``oom_peak_bytes`` / ``oom_step_seconds`` / ``oom_probes`` ([batch, peak bytes, step
    seconds] of every probe that fit: data for a step-time cost model).

    ``options`` (:class:`OomOptions`, checked there): ``estimate=True`` needs ``gpu_memory``
    (bytes) and no device. Otherwise the probes run ``device`` (``cuda``, ``cuda:1``, or
    ``cpu`` for dry runs, which needs ``gpu_memory``). ``start_batch`` is where the largest
    bucket's search starts (e.g. from an estimate).

    ``loss_mode`` (``batched`` | ``sample-wise``) applies to transducers (measured and
    estimated); it is recorded in ``batch_size_source``. The estimate is the fitted one of
    :mod:`oom.fit` unless ``exact_trace`` (two full traces per bucket shape). ``explain``
    adds ``oom_breakdown`` (bytes by class at the peak, from the fitted laws) to each bucket.

    ``dynamic_resolution`` (a :class:`~bucketing.dynres.DynResConfig`): each bucket is sized at
    the frames of its largest dynamic-resolution batch tensor (:func:`~bucketing.dynres.bucket_frames`;
    None: its longest utterance at 100 Hz); the config's ``shape_policy()`` is written to
    ``batch_size_source.shape_policy`` (plans refuse sizes made for another) and each bucket
    records the shape it was sized at in ``oom_shape``.
    ``on_done(bucket index, result)`` is called as each bucket is sized.
    """
    if not isinstance(options, OomOptions):
        raise DataprepError(f"oomptimize: options must be OomOptions, got {type(options).__name__}")
    o = options
    model, estimate, device, gpu_memory, memory_fraction = o.model, o.estimate, o.device, o.gpu_memory, o.memory_fraction
    margin, tolerance, max_batch, max_tps, cache_dir = o.margin, o.tolerance, o.max_batch, o.max_tps, o.cache_dir
    retries, start_batch, loss_mode, exact_trace, explain = o.retries, o.start_batch, o.loss_mode, o.exact_trace, o.explain
    if loss_mode != "batched" and not is_transducer(model):
        raise OptionError("loss_mode", f"only transducer models have a sample-wise loss ({model} has none)")
    gpu = _device(estimate, device, gpu_memory)
    total = int(gpu["total_memory"])
    margin_bytes = parse_bytes(margin, total)
    budget = int(memory_fraction * total) - margin_bytes
    if budget <= 0:
        raise DataprepError(f"memory budget {budget} bytes: fraction {memory_fraction} of {total} minus margin {margin_bytes}")

    shapes = [Shape.of_bucket(b.max_duration, b.max_tokens, max_tps) for b in spec.buckets]
    policy: dict[str, Any] = {"target_frames": LONGEST, "frames_per_second": FRAMES_PER_SECOND}
    if o.dynamic_resolution is not None:
        frames = bucket_frames([b.max_duration for b in spec.buckets], o.dynamic_resolution).tolist()
        shapes = [dataclasses.replace(s, frames=int(f)) for s, f in zip(shapes, frames)]
        policy = o.dynamic_resolution.shape_policy()
    base_ctx = {
        "model": _model_context(model),
        "gpu": gpu["name"],
        "gpu_memory": total,
        "torch": torch.__version__,
        "mode": "estimate" if estimate else f"measured:{device.split(':')[0]}",
        "memory_fraction": None if estimate else memory_fraction,
        **({"loss_mode": loss_mode} if loss_mode != "batched" else {}),
    }
    estimator = _Estimate(model, loss_mode, exact_trace, cache_dir) if estimate else None
    method = estimator.method if estimator is not None else None

    def probe_for(i: int) -> Callable[[int], ProbeResult]:
        shape = shapes[i]
        cache = ProbeCache(cache_dir, {**base_ctx, "frames": shape.frames, "tokens": shape.tokens})
        if estimator is not None:
            # the fitted and exact estimates agree to the byte on the models we ship; the
            # cache key still tells them apart so that one never answers for the other
            cache = ProbeCache(cache_dir, {**cache.context, "estimator": method})

            def measure(b: int) -> ProbeResult:
                return ProbeResult(fits=True, peak_bytes=estimator.peak(shape, b))
        else:

            def measure(b: int) -> ProbeResult:
                kwargs = {"model": model, "frames": shape.frames, "tokens": shape.tokens, "batch_size": b,
                          "device": device, "memory_fraction": memory_fraction, "loss_mode": loss_mode}
                return run_isolated("oom.isolate:step_probe", kwargs, retries=retries)[0]

        return budget_probe(measure, budget, cache)

    keys = [(s.frames, s.tokens) for s in shapes]
    sizes, results = search_buckets(
        keys, probe_for, tolerance=tolerance, max_batch=max_batch, start=start_batch, on_done=on_done
    )
    buckets = [_sized_bucket(b, shape, int(size), res, budget, model, loss_mode if explain else None)
               for b, shape, size, res in zip(spec.buckets, shapes, sizes, results)]
    source = _provenance(model, estimate, device, gpu, memory_fraction, margin, margin_bytes, budget, tolerance,
                         max_tps, loss_mode, method, policy)
    return dataclasses.replace(spec, buckets=tuple(buckets), batch_size_source=source)


def _device(estimate: bool, device: str, gpu_memory: int | None) -> dict[str, Any]:
    """Name and total memory (bytes) of what the batches are sized for."""
    if estimate or not device.startswith("cuda"):  # OomOptions requires gpu_memory here
        assert gpu_memory is not None
        return {"name": f"estimate:{gpu_memory}" if estimate else "cpu", "total_memory": int(gpu_memory)}
    gpu = device_info(device)
    if gpu_memory is not None:
        gpu["total_memory"] = min(int(gpu_memory), gpu["total_memory"])
    return gpu


def _sized_bucket(b: Bucket, shape: Shape, size: int, res: SearchResult, budget: int, model: str,
                  explain_mode: str | None) -> Bucket:
    """``b`` with its batch size and the probes that fit (``oom_breakdown`` too when
    ``explain_mode`` is the loss mode to explain)."""
    if size < 1:
        raise DataprepError(
            f"bucket {b.index} ({b.max_duration:g} s, {shape.tokens} tokens): even a batch of 1 "
            f"exceeds the budget of {budget} bytes for {model}"
        )
    fitting = sorted((pb, r.peak_bytes, r.step_seconds) for pb, r in res.probes if r.fits)
    at = [f for f in fitting if f[0] <= size]
    chosen = at[-1] if at else (size, None, None)
    extra = {**b.extra, "oom_shape": {"frames": shape.frames, "tokens": shape.tokens},
             "oom_peak_bytes": chosen[1], "oom_step_seconds": chosen[2],
             "oom_probes": [list(f) for f in fitting]}
    if explain_mode is not None:
        extra["oom_breakdown"] = explain_bucket(model, shape, size, explain_mode)
    return dataclasses.replace(b, batch_size=size, extra=extra)

def _provenance(model: str, estimate: bool, device: str, gpu: dict[str, Any], memory_fraction: float, margin: str,
                margin_bytes: int, budget: int, tolerance: float, max_tps: float, loss_mode: str,
                method: str | None, shape_policy: dict[str, Any]) -> dict[str, Any]:
    """``batch_size_source``: how the sizes were found (model, device, budget in bytes, ...)."""
    total = int(gpu["total_memory"])
    return {
        "rule": "oom-estimate" if estimate else "oom-measured",
        "model": model,
        "model_config": _model_context(model),
        "gpu": gpu["name"],
        "gpu_memory_bytes": total,
        "device": None if estimate else device,
        "torch": torch.__version__,
        "memory_fraction": memory_fraction,
        "margin_bytes": margin_bytes,
        "margin": margin,
        "budget_bytes": budget,
        "tolerance": tolerance,
        "max_tps": max_tps,
        "frames_per_second": FRAMES_PER_SECOND,
        # the batch shape each size is for: plan-batches --dynamic-resolution refuses another one
        "dynamic_resolution": ("sized by target frames (the longest utterance at frames_per_second)"
                               if shape_policy.get("target_frames") == LONGEST
                               else f"sized by target frames ({shape_policy.get('target_frames')} per batch, or "
                                    "what the clamp or the floor gives: oom_shape)"),
        "shape_policy": shape_policy,
        "precision": "bf16-autocast",
        "loss_mode": loss_mode if is_transducer(model) else None,
        "estimator": method,
        "optimizer": "AdamW",
        "date": _dt.datetime.now(_dt.timezone.utc).date().isoformat(),
    }
