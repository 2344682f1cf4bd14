"""Exports for NeMo and Lhotse users: train with the same buckets and batch sizes elsewhere.

Input: a plan directory (buckets from ``plan.json``, each utterance's bucket from epoch 0
of the shards) or a ``buckets.json`` (each utterance's bucket by flexible allocation, as
``plan-batches`` does). Either way with the compiled manifest.

NeMo (``export_nemo``), files in ``out/``:
    bucketing.yaml    ``use_bucketing``, ``num_buckets``, ``bucket_duration_bins`` (2D
                      ``[[max_duration, max_tokens], ...]``, or 1D ``[max_duration, ...]`` when
                      the buckets have no token bounds), ``bucket_batch_size``, ``max_tps``,
                      ``bucketing_2d_strict_mode``; JSON syntax (valid YAML), merge it into the
                      ``train_ds`` section
    manifest.jsonl    every utterance, NeMo JSONL (audio_filepath, offset, duration, text, lang, ...)
    bucket-000.jsonl  the utterances of bucket 0, ... (one file per bucket)

Lhotse (``export_lhotse``):
    cuts.jsonl.gz     a CutSet: one MonoCut per utterance (Recording + SupervisionSegment),
                      ``custom`` holds ``bucket`` and ``num_tokens``
    bins.json         ``duration_bins`` (max_duration per bucket, or ``[d, t]`` pairs),
                      ``bucket_batch_size``, ``max_tps``; use with
                      :func:`lhotse_constraint` + ``DynamicBucketingSampler``

Outputs are byte-identical for equal inputs (sorted keys, gzip mtime 0).
"""

from __future__ import annotations

import gzip
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow.parquet as pq

from bucketing.allocate import allocate
from bucketing.fit import grid_from_spec
from manifests.buckets_file import BucketSpec, parse_buckets, read_buckets
from manifests.errors import DataprepError, ManifestError
from manifests.io import atomic_path, read_manifest, require_manifest_hash, write_json
from manifests.plan_files import shard_name
from manifests.plan_meta import PLAN_JSON, read_plan_meta

NEMO_OPTIONAL = ("lang", "source_lang", "target_lang", "task")


@dataclass(frozen=True)
class ExportInputs:
    """Buckets and the manifest with a ``bucket`` column (-1 = in no bucket, not exported)."""

    spec: BucketSpec
    manifest: pl.DataFrame
    origin: str  # "plan" or "buckets"

    @property
    def bucket(self) -> npt.NDArray[np.int64]:
        return self.manifest["bucket"].to_numpy()


def _plan_buckets(plan_dir: Path, world_size: int, num_rows: int) -> npt.NDArray[np.int64]:
    """Bucket of each manifest row in epoch 0 of a plan (-1 where the plan has none)."""
    bucket = np.full(num_rows, -1, dtype=np.int64)
    for r in range(world_size):
        t = pq.read_table(plan_dir / shard_name(r), columns=["bucket", "rows"], filters=[("epoch", "=", 0)])
        rows = t.column("rows").combine_chunks()
        sizes = np.diff(rows.offsets.to_numpy())
        bucket[rows.values.to_numpy()] = np.repeat(t.column("bucket").to_numpy(), sizes)
    return bucket


def load_inputs(plan_or_buckets: str | os.PathLike[str], manifest: str | os.PathLike[str]) -> ExportInputs:
    """Read a plan directory or buckets.json plus the manifest; assign each row its bucket."""
    src = Path(plan_or_buckets)
    df = read_manifest(manifest)
    if src.is_dir() or src.name == PLAN_JSON:
        plan_dir = src if src.is_dir() else src.parent
        meta = read_plan_meta(plan_dir)
        if meta.replan is not None:  # its shards start mid-plan: epoch 0 may be absent or partial
            raise DataprepError(f"{plan_dir}: a re-planned plan (from step {meta.replan.at_step}); export its "
                                "parent plan or the buckets.json")
        require_manifest_hash(manifest, meta.manifest.content_hash, "the plan's manifest")
        spec = parse_buckets({"version": 1, "buckets": meta.buckets}, str(plan_dir / PLAN_JSON))
        bucket = _plan_buckets(plan_dir, meta.world_size, df.height)
        origin = "plan"
    else:
        spec = read_buckets(src)
        alloc = allocate(df["duration"].to_numpy(), df["num_tokens"].fill_null(0).to_numpy(), grid_from_spec(spec))
        bucket = alloc.bucket.astype(np.int64)
        origin = "buckets"
    if any(b.batch_size is None for b in spec.buckets):
        raise ManifestError(f"{src}: every bucket needs a batch_size to export (run fit-buckets with a budget)")
    return ExportInputs(spec, df.with_columns(pl.Series("bucket", bucket)), origin)


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


def _bucket_max_tokens(inputs: ExportInputs) -> npt.NDArray[np.int64]:
    """Most tokens of an utterance per bucket (a flexible allocation may raise the last bound)."""
    b = inputs.bucket
    ok = b >= 0
    out = np.zeros(len(inputs.spec.buckets), dtype=np.int64)
    np.maximum.at(out, b[ok], inputs.manifest["num_tokens"].fill_null(0).to_numpy()[ok].astype(np.int64))
    return out


def _max_tps(df: pl.DataFrame) -> float:
    """Largest TPS in the exported rows, rounded up (so NeMo's ``max_tps`` filter keeps all)."""
    tps = df["tps"].drop_nulls()
    return math.ceil(float(tps.max()) * 1000 + 1e-9) / 1000 if tps.len() else float("inf")


def bucketing_config(inputs: ExportInputs) -> dict[str, Any]:
    """The NeMo ``train_ds`` bucketing options for these buckets."""
    kept = inputs.manifest.filter(pl.col("bucket") >= 0)
    return {
        "use_lhotse": True,
        "use_bucketing": True,
        "num_buckets": len(inputs.spec.buckets),
        "bucket_duration_bins": duration_bins(inputs.spec, _bucket_max_tokens(inputs)),
        "bucket_batch_size": [int(b.batch_size) for b in inputs.spec.buckets],  # type: ignore[arg-type]
        "max_tps": _max_tps(kept),
        "bucketing_2d_strict_mode": False,
        "batch_duration": None,
        "batch_size": None,
    }


def _nemo_frame(df: pl.DataFrame) -> pl.DataFrame:
    cols = [pl.col("audio_path").alias("audio_filepath"), pl.col("offset").fill_null(0.0), pl.col("duration"),
            pl.col("text").fill_null("")]
    for c in NEMO_OPTIONAL:
        if df[c].null_count() < df.height:
            cols.append(pl.col(c).alias("taskname") if c == "task" else pl.col(c))
    return df.select(cols)


def _write_jsonl(df: pl.DataFrame, path: Path) -> None:
    with atomic_path(path) as tmp:
        df.write_ndjson(tmp)


def export_nemo(plan_or_buckets: str | os.PathLike[str], manifest: str | os.PathLike[str],
                out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Write NeMo bucketing options and manifests (see the module docstring); return the options."""
    inputs = load_inputs(plan_or_buckets, manifest)
    out = Path(out_dir)
    cfg = bucketing_config(inputs)
    with atomic_path(out / "bucketing.yaml") as tmp:
        tmp.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    kept = inputs.manifest.filter(pl.col("bucket") >= 0)
    _write_jsonl(_nemo_frame(kept), out / "manifest.jsonl")
    for b in range(len(inputs.spec.buckets)):
        _write_jsonl(_nemo_frame(kept.filter(pl.col("bucket") == b)), out / f"bucket-{b:03d}.jsonl")
    return cfg


def _recording_info(paths: list[str]) -> dict[str, tuple[int, int, int]]:
    """(sample_rate, num_samples, channels) per distinct audio file, from headers only."""
    from dataprep.compile.probe import probe_headers

    probed = probe_headers(paths, threads=8)
    out: dict[str, tuple[int, int, int]] = {}
    for path, dur, sr, ch, reason, detail in probed.iter_rows():
        if reason is not None:
            raise DataprepError(str(detail))
        out[path] = (int(sr), int(round(dur * sr)), int(ch))
    return out


def lhotse_cuts(inputs: ExportInputs) -> list[Any]:
    """One lhotse ``MonoCut`` per bucketed utterance (Recording from the file header)."""
    from lhotse import AudioSource, MonoCut, Recording, SupervisionSegment

    kept = inputs.manifest.filter(pl.col("bucket") >= 0)
    info = _recording_info(kept["audio_path"].unique(maintain_order=True).to_list())
    recordings: dict[str, Any] = {}
    cuts = []
    for row in kept.iter_rows(named=True):
        path = row["audio_path"]
        rec = recordings.get(path)
        if rec is None:
            sr, n, ch = info[path]
            rec = Recording(id=path, sources=[AudioSource(type="file", channels=list(range(ch)), source=path)],
                            sampling_rate=sr, num_samples=n, duration=n / sr, channel_ids=list(range(ch)))
            recordings[path] = rec
        offset = float(row["offset"] or 0.0)
        channel: Any = 0 if len(rec.channel_ids) == 1 else list(rec.channel_ids)
        lang = row["target_lang"] or row["lang"]
        sup = SupervisionSegment(id=row["id"], recording_id=rec.id, start=offset, duration=float(row["duration"]),
                                 channel=channel, text=row["text"], language=lang)
        cuts.append(MonoCut(id=row["id"], start=offset, duration=float(row["duration"]), channel=channel,
                            recording=rec, supervisions=[sup],
                            custom={"bucket": int(row["bucket"]), "num_tokens": int(row["num_tokens"] or 0)}))
    return cuts


def export_lhotse(plan_or_buckets: str | os.PathLike[str], manifest: str | os.PathLike[str],
                  out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Write ``cuts.jsonl.gz`` and ``bins.json`` (see the module docstring); return the bins."""
    inputs = load_inputs(plan_or_buckets, manifest)
    out = Path(out_dir)
    cuts = lhotse_cuts(inputs)
    with atomic_path(out / "cuts.jsonl.gz") as tmp:
        with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:
            for cut in cuts:
                gz.write((json.dumps(cut.to_dict(), sort_keys=True, ensure_ascii=False) + "\n").encode())
    bins = {
        "duration_bins": duration_bins(inputs.spec, _bucket_max_tokens(inputs)),
        "bucket_batch_size": [int(b.batch_size) for b in inputs.spec.buckets],  # type: ignore[arg-type]
        "max_tps": _max_tps(inputs.manifest.filter(pl.col("bucket") >= 0)),
        "num_cuts": len(cuts),
        "token_field": "custom.num_tokens",
    }
    write_json(bins, out / "bins.json")
    return bins


def lhotse_constraint(duration_bins: list[Any], batch_sizes: list[int]) -> Any:
    """A lhotse sampling constraint with a fixed batch size per (2D) bucket, for
    ``DynamicBucketingSampler(cuts, constraint=c, duration_bins=bins)``.

    1D bins: lhotse's own ``FixedBucketBatchSizeConstraint``. 2D ``[d, t]`` bins: the same
    with a 2D bucket choice, as NeMo's ``FixedBucketBatchSizeConstraint2D`` (non-strict): the
    first bucket (in order) whose ``max_duration >= duration`` and ``max_tokens >= tokens``,
    i.e. the smallest bucket that holds the cut; tokens come from ``cut.custom["num_tokens"]``.
    """
    from lhotse.dataset.sampling.dynamic_bucketing import FixedBucketBatchSizeConstraint

    if not duration_bins or not isinstance(duration_bins[0], (list, tuple)):
        return FixedBucketBatchSizeConstraint(max_seq_len_buckets=list(duration_bins), batch_sizes=list(batch_sizes))
    return _constraint_2d_class()(max_seq_len_buckets=[tuple(b) for b in duration_bins], batch_sizes=list(batch_sizes))


_CLS: Any = None


def _constraint_2d_class() -> Any:
    global _CLS
    if _CLS is not None:
        return _CLS
    from dataclasses import dataclass as _dc

    from lhotse.dataset.sampling.dynamic_bucketing import FixedBucketBatchSizeConstraint

    @_dc
    class BucketBatchSizeConstraint2D(FixedBucketBatchSizeConstraint):  # type: ignore[misc]
        def __post_init__(self) -> None:
            self.max_seq_len_buckets = [tuple(b) for b in self.max_seq_len_buckets]

        def measure_length(self, example: Any) -> tuple[float, int]:
            return float(example.duration), int(example.custom["num_tokens"])

        def select_bucket(self, buckets: Any, example: Any = None, example_len: Any = None) -> int:
            d, t = self.measure_length(example) if example_len is None else example_len
            for i, (bd, bt) in enumerate(self.max_seq_len_buckets):
                if bd >= d and bt >= t:
                    return i
            return len(self.max_seq_len_buckets)  # holds nothing: lhotse's add() reports it

    BucketBatchSizeConstraint2D.__module__ = __name__
    BucketBatchSizeConstraint2D.__qualname__ = "BucketBatchSizeConstraint2D"
    _CLS = BucketBatchSizeConstraint2D
    return _CLS
