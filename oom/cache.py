"""Probe results cached on disk: a re-run of the same search is free.

Key: (model config, GPU or estimate target, torch version, memory fraction, bucket shape in
frames and tokens). Value: per batch size, the raw outcome (oom, peak bytes, step
seconds). Whether a probe *fits* is decided from the outcome and the budget at lookup
time, so a different ``--margin`` reuses the same measurements. One JSON file per key under the
directory the caller passes (the CLI: ``<cache>/oom`` of :func:`manifests.hash_cache.default_cache_dir`,
or ``--cache-dir``), written atomically (:func:`manifests.hash_cache.keep_value`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from manifests.hash_cache import keep_value, kept_value
from oom.search import Probe, ProbeResult

Measure = Callable[[int], ProbeResult]  # raw outcome: ``fits`` = not OOM


class ProbeCache:
    """Outcomes of one (model, GPU, torch, fraction, shape) context, by batch size."""

    def __init__(self, cache_dir: str | os.PathLike[str] | None, context: dict[str, Any]) -> None:
        self.context, self.cache_dir = context, cache_dir
        kept = kept_value(cache_dir, context, "probes")
        self.entries: dict[str, dict[str, Any]] = dict(kept) if isinstance(kept, dict) else {}

    def get(self, batch_size: int) -> ProbeResult | None:
        e = self.entries.get(str(batch_size))
        if e is None:
            return None
        return ProbeResult(fits=not e["oom"], peak_bytes=e.get("peak_bytes"), step_seconds=e.get("step_seconds"), oom=e["oom"])

    def put(self, batch_size: int, r: ProbeResult) -> None:
        self.entries[str(batch_size)] = {"oom": r.oom or not r.fits, "peak_bytes": r.peak_bytes, "step_seconds": r.step_seconds}
        keep_value(self.cache_dir, self.context, self.entries, "probes")


def budget_probe(measure: Measure, budget_bytes: int, cache: ProbeCache | None = None) -> Probe:
    """A probe that fits when the step did not run out of memory and its peak is within
    ``budget_bytes``; outcomes go through ``cache`` (measure is not called on a hit)."""

    def probe(batch_size: int) -> ProbeResult:
        raw = cache.get(batch_size) if cache is not None else None
        if raw is None:
            raw = measure(batch_size)
            if cache is not None:
                cache.put(batch_size, raw)
        ok = (not raw.oom) and raw.fits and (raw.peak_bytes is None or raw.peak_bytes <= budget_bytes)
        return ProbeResult(fits=ok, peak_bytes=raw.peak_bytes, step_seconds=raw.step_seconds, oom=raw.oom)

    return probe
