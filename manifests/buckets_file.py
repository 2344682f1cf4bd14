"""``buckets.json``: bucket bounds and per-bucket batch sizes, readable by humans.

Format (version 1)::

    {"version": 1,
     "buckets": [{"index": 0, "max_duration": 3.975, "max_tokens": 30, "batch_size": 352,
                  "num_utterances": 1200, "hours": 1.1}, ...],
     "batch_size_source": {"rule": "padded-budget", ...}}

Buckets are ordered by duration bin, then token sub-bin. ``max_duration`` is in seconds,
``max_tokens`` counts decoder tokens including the prompt; both are inclusive upper bounds.
A user may write the file by hand (e.g. from NeMo's ``bucket_duration_bins``); only
``max_duration`` is then required, and ``max_tokens`` / ``batch_size`` may be omitted
(unbounded / unknown).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from manifests.io import ManifestError, write_json

BUCKETS_VERSION = 1


@dataclass(frozen=True)
class Bucket:
    """One box of the grid: inclusive upper bounds and the batch size it trains with."""

    index: int
    max_duration: float  # seconds, inclusive
    max_tokens: int | None = None  # tokens incl. prompt, inclusive; None = unbounded
    batch_size: int | None = None  # utterances per batch; None = not yet assigned
    num_utterances: int | None = None
    hours: float | None = None
    min_duration: float | None = None  # seconds, exclusive lower bound of the duration bin
    duration_bin: int | None = None
    token_bin: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if v is not None and k != "extra"}
        out.update(self.extra)
        return out


@dataclass(frozen=True)
class BucketSpec:
    """The content of a ``buckets.json`` file."""

    buckets: tuple[Bucket, ...]
    batch_size_source: dict[str, Any] = field(default_factory=dict)
    fit: dict[str, Any] = field(default_factory=dict)  # how the bounds were fitted
    version: int = BUCKETS_VERSION

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "buckets": [b.to_json() for b in self.buckets],
            "batch_size_source": self.batch_size_source,
            "fit": self.fit,
        }


_KNOWN = {"index", "max_duration", "max_tokens", "batch_size", "num_utterances", "hours",
          "min_duration", "duration_bin", "token_bin"}


def parse_buckets(obj: Any, where: str = "buckets.json") -> BucketSpec:
    """Validate a decoded ``buckets.json`` object; raise :class:`ManifestError` naming the problem."""
    if not isinstance(obj, dict) or not isinstance(obj.get("buckets"), list) or not obj["buckets"]:
        raise ManifestError(f"{where}: expected an object with a non-empty 'buckets' list")
    version = obj.get("version", BUCKETS_VERSION)
    if version != BUCKETS_VERSION:
        raise ManifestError(f"{where}: unsupported version {version!r} (expected {BUCKETS_VERSION})")
    buckets = []
    for i, raw in enumerate(obj["buckets"]):
        if not isinstance(raw, dict) or "max_duration" not in raw:
            raise ManifestError(f"{where}: bucket {i} has no 'max_duration'")
        max_d = float(raw["max_duration"])
        if not math.isfinite(max_d) or max_d <= 0:
            raise ManifestError(f"{where}: bucket {i} has max_duration {raw['max_duration']!r}; expected > 0")
        bs = raw.get("batch_size")
        if bs is not None and (int(bs) != bs or int(bs) < 1):
            raise ManifestError(f"{where}: bucket {i} has batch_size {bs!r}; expected an integer >= 1")
        mt = raw.get("max_tokens")
        buckets.append(
            Bucket(
                index=int(raw.get("index", i)),
                max_duration=max_d,
                max_tokens=None if mt is None else int(mt),
                batch_size=None if bs is None else int(bs),
                num_utterances=raw.get("num_utterances"),
                hours=raw.get("hours"),
                min_duration=raw.get("min_duration"),
                duration_bin=raw.get("duration_bin"),
                token_bin=raw.get("token_bin"),
                extra={k: v for k, v in raw.items() if k not in _KNOWN},
            )
        )
    if [b.index for b in buckets] != list(range(len(buckets))):
        raise ManifestError(f"{where}: bucket indices must be 0..{len(buckets) - 1} in order")
    return BucketSpec(
        buckets=tuple(buckets),
        batch_size_source=dict(obj.get("batch_size_source", {})),
        fit=dict(obj.get("fit", {})),
        version=version,
    )


def read_buckets(path: str | os.PathLike[str]) -> BucketSpec:
    """Read and validate a ``buckets.json`` file."""
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ManifestError(f"{path}: no such file") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{path}: not valid JSON ({exc})") from None
    return parse_buckets(obj, str(path))


def write_buckets(spec: BucketSpec, path: str | os.PathLike[str]) -> None:
    """Write ``buckets.json`` atomically."""
    write_json(spec.to_json(), path)
