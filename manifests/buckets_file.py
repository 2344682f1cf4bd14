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

import os
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from manifests.atomic_files import write_json
from manifests.errors import ManifestError
from manifests.nemo_buckets import is_nemo_buckets_path, read_nemo_options
from manifests.validation import Validator, load_json_file

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
    source: str = field(default="buckets.json", compare=False)  # the file it was read from, for errors

    def batch_sizes(self) -> npt.NDArray[np.int64]:
        """Utterances per batch of each bucket (int64, each in 1..:data:`MAX_BATCH_SIZE`, as
        :func:`parse_buckets` checked); a one-line :class:`ManifestError` naming the file and the
        first bucket without one (a spec whose batch sizes are not yet assigned)."""
        missing = [b.index for b in self.buckets if b.batch_size is None]
        if missing:
            raise ManifestError(
                f"{self.source}: bucket {missing[0]} has no batch_size ({len(missing)} buckets lack one); "
                "run `dataprep fit-buckets` with a budget or `dataprep oomptimize`"
            )
        return np.asarray([b.batch_size for b in self.buckets], dtype=np.int64)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "buckets": [b.to_json() for b in self.buckets],
            "batch_size_source": self.batch_size_source,
            "fit": self.fit,
        }


_KNOWN = {"index", "max_duration", "max_tokens", "batch_size", "num_utterances", "hours",
          "min_duration", "duration_bin", "token_bin"}


#: the largest batch (utterances) a buckets.json may ask for: beyond it a typo (``1e9``) would
#: allocate tens of GiB before anything else fails
MAX_BATCH_SIZE = 1 << 20
#: the largest token bound (a plan shard stores it as int32)
MAX_TOKENS = (1 << 31) - 1


def _optional(v: Validator, raw: dict[str, Any], key: str, name: str, check: Any) -> Any:
    return None if raw.get(key) is None else check(raw[key], f"{name}.{key}")


def parse_buckets(obj: Any, where: str = "buckets.json") -> BucketSpec:
    """Validate a decoded ``buckets.json`` object field by field, without coercion; raise
    :class:`ManifestError` as ``FILE: field: problem``."""
    v = Validator(where)
    obj = v.obj(obj, "(file)")
    version = v.int_(obj.get("version", BUCKETS_VERSION), "version")
    if version != BUCKETS_VERSION:
        raise v.fail("version", f"unsupported version {version} (this tool reads {BUCKETS_VERSION})")
    raw_buckets = v.list_(v.key(obj, "buckets"), "buckets")
    if not raw_buckets:
        raise v.fail("buckets", "empty; expected at least one bucket")
    buckets = []
    for i, raw in enumerate(raw_buckets):
        name = f"buckets[{i}]"
        raw = v.obj(raw, name)
        index = v.int_(raw.get("index", i), f"{name}.index")
        if index != i:
            raise v.fail(f"{name}.index", f"is {index}; bucket indices must be 0..{len(raw_buckets) - 1} in order")
        buckets.append(
            Bucket(
                index=index,
                max_duration=v.number(v.key(raw, "max_duration", f"{name}."), f"{name}.max_duration", positive=True),
                max_tokens=_optional(v, raw, "max_tokens", name, lambda x, n: v.int_(x, n, lo=1, hi=MAX_TOKENS)),
                batch_size=_optional(v, raw, "batch_size", name, lambda x, n: v.int_(x, n, lo=1, hi=MAX_BATCH_SIZE)),
                num_utterances=_optional(v, raw, "num_utterances", name, lambda x, n: v.int_(x, n, lo=0)),
                hours=_optional(v, raw, "hours", name, lambda x, n: v.number(x, n, lo=0)),
                min_duration=_optional(v, raw, "min_duration", name, lambda x, n: v.number(x, n, lo=0)),
                duration_bin=_optional(v, raw, "duration_bin", name, lambda x, n: v.int_(x, n, lo=0)),
                token_bin=_optional(v, raw, "token_bin", name, lambda x, n: v.int_(x, n, lo=0)),
                extra={k: val for k, val in raw.items() if k not in _KNOWN},
            )
        )
    for b in buckets:
        if b.min_duration is not None and b.min_duration >= b.max_duration:
            raise v.fail(f"buckets[{b.index}].min_duration",
                         f"{b.min_duration!r} is not below max_duration {b.max_duration!r}")
    return BucketSpec(
        buckets=tuple(buckets),
        batch_size_source=dict(v.obj(obj.get("batch_size_source", {}), "batch_size_source")),
        fit=dict(v.obj(obj.get("fit", {}), "fit")),
        version=version,
        source=where,
    )


def read_buckets(path: str | os.PathLike[str]) -> BucketSpec:
    """Read and validate a ``buckets.json`` file (strict JSON: no NaN / Infinity), or NeMo's
    bucketing YAML (``.yaml`` / ``.yml``: :mod:`manifests.nemo_buckets`)."""
    if is_nemo_buckets_path(path):
        return parse_buckets(read_nemo_options(path), str(path))
    return parse_buckets(load_json_file(path), str(path))


def write_buckets(spec: BucketSpec, path: str | os.PathLike[str]) -> None:
    """Write ``buckets.json`` atomically (a ``.yaml`` name refused: readers take it for NeMo's YAML)."""
    if is_nemo_buckets_path(path):
        raise ManifestError(f"{path}: a buckets.json named .yaml / .yml would be read as NeMo's bucketing YAML "
                            "(by its suffix); name it .json")
    write_json(spec.to_json(), path)
