"""Probe results cached on disk: a re-run of the same search is free.

Key: (model config, GPU or estimate target, torch version, memory fraction, bucket shape in
frames and tokens). Value: per batch size, the raw outcome (oom, peak bytes, step
seconds). Whether a probe *fits* is decided from the outcome and the budget at lookup
time, so a different ``--margin`` reuses the same measurements. One JSON file per key under the
directory the caller passes (the CLI: ``<cache>/oom`` of :func:`manifests.hash_cache.default_cache_dir`,
or ``--cache-dir``), written atomically. Beside them :func:`keep_value` keeps small facts by
context (the estimator a model gets, :mod:`oom.optimize`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from manifests.atomic_files import write_json
from oom.search import Probe, ProbeResult

Measure = Callable[[int], ProbeResult]  # raw outcome: ``fits`` = not OOM


def cache_key(context: dict[str, Any]) -> str:
    """SHA-256 (hex, 24 chars) of the canonical JSON of ``context``."""
    return hashlib.sha256(json.dumps(context, sort_keys=True).encode()).hexdigest()[:24]


class ProbeCache:
    """Outcomes of one (model, GPU, torch, fraction, shape) context, by batch size."""

    def __init__(self, cache_dir: str | os.PathLike[str] | None, context: dict[str, Any]) -> None:
        self.context = context
        self.path = None if cache_dir is None else Path(cache_dir) / f"{cache_key(context)}.json"
        self.entries: dict[str, dict[str, Any]] = {}
        if self.path is not None and self.path.exists():
            try:
                data = json.loads(self.path.read_text(encoding="utf-8"))
                if data.get("context") == context:
                    self.entries = dict(data.get("probes", {}))
            except (OSError, ValueError):
                self.entries = {}  # a corrupt cache is a miss, never an error

    def get(self, batch_size: int) -> ProbeResult | None:
        e = self.entries.get(str(batch_size))
        if e is None:
            return None
        return ProbeResult(fits=not e["oom"], peak_bytes=e.get("peak_bytes"), step_seconds=e.get("step_seconds"), oom=e["oom"])

    def put(self, batch_size: int, r: ProbeResult) -> None:
        self.entries[str(batch_size)] = {"oom": r.oom or not r.fits, "peak_bytes": r.peak_bytes, "step_seconds": r.step_seconds}
        if self.path is not None:
            write_json({"context": self.context, "probes": self.entries}, self.path)


def kept_value(cache_dir: str | os.PathLike[str] | None, context: dict[str, Any]) -> Any:
    """The value :func:`keep_value` kept for ``context``, or None (no cache, none kept, another
    context under the same key, a corrupt file: a miss, never an error)."""
    if cache_dir is None:
        return None
    try:
        data = json.loads((Path(cache_dir) / f"{cache_key(context)}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data.get("value") if isinstance(data, dict) and data.get("context") == context else None


def keep_value(cache_dir: str | os.PathLike[str] | None, context: dict[str, Any], value: Any) -> None:
    """Keep a JSON ``value`` for ``context`` (atomically; nothing without a cache)."""
    if cache_dir is not None:
        write_json({"context": context, "value": value}, Path(cache_dir) / f"{cache_key(context)}.json")


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
