"""The parts every export shares: streaming the manifest with its buckets, the output folder
swapped in whole (:func:`export_dir`), per-bucket token and TPS statistics (:class:`Stats`), NeMo's
``bucketing.yaml`` options and the brace pattern of NeMo-named tars (:func:`tar_pattern`)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from dataprep.integrations.cuts import row_header
from manifests.atomic_files import current_umask, sweep_stale_temps, temp_prefix
from manifests.buckets_file import BucketSpec
from manifests.errors import DataprepError


#: manifest column -> NeMo JSONL key, written where not null
def is_2d(spec: BucketSpec) -> bool:
    return any(b.max_tokens is not None for b in spec.buckets)


def duration_bins(spec: BucketSpec, max_tokens: npt.NDArray[np.int64] | None = None) -> list[Any]:
    """NeMo ``bucket_duration_bins``: ``[[max_duration, max_tokens], ...]`` (2D) or ``[max_duration, ...]``."""
    if not is_2d(spec):
        return [float(b.max_duration) for b in spec.buckets]
    big = np.iinfo(np.int32).max
    mt = [big if b.max_tokens is None else int(b.max_tokens) for b in spec.buckets]
    if max_tokens is not None:
        mt = [max(a, int(c)) for a, c in zip(mt, max_tokens)]
    return [[float(b.max_duration), int(t)] for b, t in zip(spec.buckets, mt)]


#: rows per streamed manifest batch
BATCH_ROWS = 65_536
#: files that mark a folder as an export (the only non-empty folders an export replaces)
EXPORT_MARKERS = ("bucketing.yaml", "bins.json")


def iter_manifest(path: Path, bucket: npt.NDArray[np.int32]) -> Iterator[tuple[pa.Table, npt.NDArray[np.int32]]]:
    """The manifest in batches of :data:`BATCH_ROWS` rows with their buckets (bounded memory)."""
    start = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS):
        yield pa.Table.from_batches([batch]), bucket[start:start + batch.num_rows]
        start += batch.num_rows


@contextlib.contextmanager
def export_dir(out_dir: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary sibling folder that replaces ``out_dir`` whole when the block succeeds
    (and is removed when it fails). Refuses to replace a non-empty folder that is not an export."""
    out = Path(out_dir)
    is_export = out.is_dir() and (not any(out.iterdir()) or any((out / m).exists() for m in EXPORT_MARKERS))
    if out.exists() and not is_export:
        raise DataprepError(f"{out}: exists and is not an export folder; refusing to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_temps(out)  # a killed export's folders (named with its pid)
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(out), suffix=".tmp", dir=out.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~current_umask())
        old = None
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=temp_prefix(out), suffix=".old", dir=out.parent))
            os.replace(out, old / "export")
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class Stats:
    """Per-bucket most tokens and the largest TPS NeMo will measure, accumulated over batches."""

    def __init__(self, num_buckets: int) -> None:
        self.max_tokens = np.zeros(num_buckets, dtype=np.int64)
        self.max_tps = 0.0
        self.rows = 0

    def add(self, bucket: npt.NDArray[np.int32], tokens: npt.NDArray[np.int64], tps: float) -> None:
        np.maximum.at(self.max_tokens, bucket, tokens)
        self.max_tps = max(self.max_tps, tps)
        self.rows += len(bucket)

    @property
    def exported_max_tps(self) -> float:
        """``max_tps`` for NeMo: the largest TPS, nudged up so float noise never drops that row."""
        return float(np.nextafter(self.max_tps * (1 + 1e-12), math.inf)) if self.rows else float("inf")


def nemo_duration(row: dict[str, Any], writes_rate: bool) -> float:
    """The cut duration NeMo's manifest reader will give ``row``: its duration when
    ``sampling_rate`` is written, else cut short by the audio header's length (as Lhotse's
    ``truncate`` does)."""
    duration = float(row["duration"])
    if writes_rate or row["audio_path"] is None:
        return duration
    sr, frames, _ = row_header(row)
    return min(duration, frames / sr - float(row["offset"] or 0.0))


def bucketing_config(spec: BucketSpec, stats: Stats, channel_selector: int | None) -> dict[str, Any]:
    """The NeMo ``train_ds`` bucketing options for these buckets."""
    cfg: dict[str, Any] = {
        "use_lhotse": True,
        "use_bucketing": True,
        "num_buckets": len(spec.buckets),
        "bucket_duration_bins": duration_bins(spec, stats.max_tokens),
        "bucket_batch_size": [int(b.batch_size) for b in spec.buckets],  # type: ignore[arg-type]
        "max_tps": stats.exported_max_tps,
        "bucketing_2d_strict_mode": False,
        "batch_duration": None,
        "batch_size": None,
    }
    if channel_selector is not None:
        cfg["channel_selector"] = channel_selector
    return cfg


def row_tokens(table: pa.Table) -> npt.NDArray[np.int64]:
    """``num_tokens`` of a manifest batch (null as 0)."""
    return np.nan_to_num(table.column("num_tokens").to_numpy(zero_copy_only=False).astype(np.float64)).astype(np.int64)


def row_channels(row: dict[str, Any]) -> int:
    if row["channels"] is not None and float(row["offset"] or 0.0) == 0.0:
        return int(row["channels"])
    return row_header(row)[2] if row["audio_path"] is not None else 1


#: the tar names NeMo's tarred reader takes a shard id from (its own pattern)
NEMO_TAR = re.compile(r"^(.*/audio[^/]*_)(\d+)([^/]*\.tar)$")


def pack_hint(manifest: Path) -> str:
    return f"dataprep pack {manifest} -o DIR --layout nemo-tarred, compile DIR and export that"


def tar_pattern(manifest: Path, tars: list[str]) -> tuple[dict[str, int], str]:
    """Each of ``tars``' shard id and NeMo's brace pattern of them; one line naming ``dataprep
    pack`` where NeMo cannot read them as one tarred dataset."""
    parts = [NEMO_TAR.match(x) for x in tars]
    bad = next((x for x, m in zip(tars, parts) if m is None), None)
    if bad is not None:
        raise DataprepError(f"{bad}: NeMo takes a shard id only from tars named audio..._<k>...tar; "
                            f"run: {pack_hint(manifest)}")
    shapes = {(m.group(1), m.group(3), len(m.group(2)) if m.group(2).startswith("0") and len(m.group(2)) > 1 else 0)
              for m in parts if m is not None}
    if len(shapes) != 1:
        raise DataprepError(f"{manifest}: its tars follow {len(shapes)} naming patterns ({tars[0]}, ...), NeMo "
                            f"needs one; run: {pack_hint(manifest)}")
    head, tail, width = shapes.pop()
    ids = {x: int(m.group(2)) for x, m in zip(tars, parts) if m is not None}
    if len(set(ids.values())) != len(ids):
        raise DataprepError(f"{manifest}: two tars give the same shard id; run: {pack_hint(manifest)}")
    k = sorted(ids.values())
    body = (f"{k[0]:0{width}d}..{k[-1]:0{width}d}" if k == list(range(k[0], k[-1] + 1))
            else ",".join(f"{v:0{width}d}" for v in k))
    return ids, f"{head}_OP_{body}_CL_{tail}"


def write_config(folder: Path, cfg: dict[str, Any]) -> None:
    """``bucketing.yaml`` (JSON syntax: YAML reads it) of ``cfg`` less ``written`` (what the
    export wrote besides it, for the message)."""
    text = json.dumps({k: v for k, v in cfg.items() if k != "written"}, indent=2, sort_keys=True)
    (folder / "bucketing.yaml").write_text(text + "\n", encoding="utf-8")


