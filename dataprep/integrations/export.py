"""Exports for NeMo and Lhotse users: train with the same buckets and batch sizes elsewhere.

Input: a plan directory (each utterance's bucket from epoch 0) or a ``buckets.json``, with the
compiled manifest. ``export_nemo`` writes ``bucketing.yaml`` (JSON syntax, a whole
``train_ds``: bins, batch sizes, ``max_tps``, ``manifest_filepath``), ``manifest.jsonl``
(:func:`manifests.records.nemo_line`) and ``bucket-NNN.jsonl``; NeMo-named tars as NeMo reads
them (``manifest_<k>.json`` per tar); a blend (loose and tarred corpora may mix) as an
``input_cfg`` (:mod:`dataprep.integrations.export_blend`); other containers are refused naming
``dataprep pack``. ``export_lhotse`` writes ``cuts.jsonl.gz``, or a Lhotse Shar set in ``shar/``
for rows held in containers, and ``bins.json`` (:func:`lhotse_constraint`). ``max_tps`` is the
largest TPS NeMo measures on an exported row; rows in no bucket are a one-line error, or go to
``rejects=``. Streamed in :data:`~dataprep.integrations.export_io.BATCH_ROWS`-row batches; the folder is swapped in whole.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bucketing.allocate import allocate
from bucketing.fit import grid_from_spec
from dataprep.compile.audio_checks import require_audio
from dataprep.integrations.cuts import cut_dict_for_row
from dataprep.integrations.export_io import (
    Stats,
    bucketing_config,
    duration_bins,
    export_dir,
    iter_manifest,
    nemo_duration,
    pack_hint,
    row_channels,
    row_tokens,
    tar_pattern,
    write_config,
)
from manifests.atomic_files import write_json
from manifests.buckets_file import BucketSpec, parse_buckets, read_buckets
from manifests.errors import DataprepError, ManifestError
from manifests.hash_cache import require_manifest_hash
from manifests.manifest_read import check_manifest_file
from manifests.manifest_write import write_rejects
from manifests.optional import require
from manifests.plan_files import PlanShard
from manifests.plan_meta import PLAN_JSON, PlanMeta, read_plan_meta
from manifests.records import nemo_line

#: cuts per Shar shard of a Lhotse export of container rows
SHAR_SHARD_CUTS = 1000
@dataclass(frozen=True)
class ExportInputs:
    """Buckets, the manifest's path and each manifest row's bucket (-1 = in no bucket)."""

    spec: BucketSpec
    manifest_path: Path
    bucket: npt.NDArray[np.int32]
    origin: str  # "plan" or "buckets"

    @property
    def manifest(self) -> pl.DataFrame:
        """The whole manifest with a ``bucket`` column (reads it all: for tests and small corpora)."""
        return pl.read_parquet(self.manifest_path).with_columns(pl.Series("bucket", self.bucket.astype(np.int64)))


def _plan_buckets(plan_dir: Path, meta: PlanMeta, num_rows: int) -> npt.NDArray[np.int32]:
    """Bucket of each manifest row in epoch 0 of a plan (-1 where the plan has none)."""
    bucket = np.full(num_rows, -1, dtype=np.int32)
    for r in range(meta.world_size):
        t = PlanShard(plan_dir, r, meta).read_epoch(0, ["bucket", "rows"])
        rows = t.column("rows").combine_chunks()
        sizes = np.diff(rows.offsets.to_numpy())
        bucket[rows.values.to_numpy()] = np.repeat(t.column("bucket").to_numpy(), sizes)
    return bucket


def load_inputs(plan_or_buckets: str | os.PathLike[str], manifest: str | os.PathLike[str]) -> ExportInputs:
    """Read a plan directory or buckets.json; assign each manifest row its bucket (reads only
    the manifest's ``duration`` and ``num_tokens`` columns, for a buckets.json)."""
    src = Path(plan_or_buckets)
    manifest = Path(manifest)
    if not manifest.is_file():
        raise DataprepError(f"{manifest}: no such manifest")
    check_manifest_file(manifest)  # a rejects file (or any other Parquet) is not a manifest to export
    num_rows = pq.ParquetFile(manifest).metadata.num_rows
    if src.is_dir() or src.name == PLAN_JSON:
        plan_dir = src if src.is_dir() else src.parent
        meta = read_plan_meta(plan_dir)
        if meta.replan is not None:  # its shards start mid-plan: epoch 0 may be absent or partial
            raise DataprepError(f"{plan_dir}: a re-planned plan (from step {meta.replan.at_step}); export its "
                                "parent plan or the buckets.json")
        require_manifest_hash(manifest, meta.manifest.content_hash, "the plan's manifest")
        spec = parse_buckets({"version": 1, "buckets": meta.buckets}, str(plan_dir / PLAN_JSON))
        bucket = _plan_buckets(plan_dir, meta, num_rows)
        origin = "plan"
    else:
        spec = read_buckets(src)
        t = pq.read_table(manifest, columns=["duration", "num_tokens"])
        tokens = t.column("num_tokens").to_numpy(zero_copy_only=False)
        alloc = allocate(t.column("duration").to_numpy(), np.nan_to_num(tokens.astype(np.float64)).astype(np.int64),
                         grid_from_spec(spec))
        bucket = alloc.bucket.astype(np.int32)
        origin = "buckets"
    if any(b.batch_size is None for b in spec.buckets):
        raise ManifestError(f"{src}: every bucket needs a batch_size to export (run fit-buckets with a budget)")
    return ExportInputs(spec, manifest, bucket, origin)


def check_covered(inputs: ExportInputs, rejects: str | os.PathLike[str] | None) -> int:
    """Rows in no bucket: a one-line error, or (``rejects`` given) written there; returns their count."""
    missing = np.flatnonzero(inputs.bucket < 0)
    if not missing.size:
        return 0
    if rejects is None:
        first = pq.ParquetFile(inputs.manifest_path).read(columns=["id"]).column("id")[int(missing[0])].as_py()
        raise DataprepError(f"{inputs.manifest_path}: {missing.size} row(s) are in no bucket (first: {first!r}); "
                            "refit the buckets or pass --rejects FILE to export without them")
    parts = [t.filter(pa.array(b < 0)) for t, b in iter_manifest(inputs.manifest_path, inputs.bucket) if (b < 0).any()]
    rows = pl.from_arrow(pa.concat_tables(parts))  # only the uncovered rows are held
    assert isinstance(rows, pl.DataFrame)
    detail = pl.format("{}: {} s, {} tokens: in no bucket", pl.col("id"), pl.col("duration"), pl.col("num_tokens"))
    write_rejects(rows.with_columns(pl.lit("exceeds_bucket").alias("reason"), detail.alias("detail")), rejects)
    return int(missing.size)


def nemo_tar_shards(manifest: Path) -> tuple[dict[str, int], str] | None:
    """For a manifest held in NeMo-named tars: each tar's shard id and NeMo's brace pattern of
    them (``audio__OP_0..3_CL_.tar``); ``None`` for loose files. One line naming ``dataprep pack``
    for rows NeMo cannot read as one tarred dataset (a blend's corpora may mix kinds:
    :func:`dataprep.integrations.export_blend.export_nemo_blend`)."""
    names = pq.ParquetFile(manifest).schema_arrow.names
    if "container" not in names:
        return None
    t = pq.read_table(manifest, columns=["container", "member_offset"])
    held = pc.is_valid(t.column("container"))
    n_held = pc.sum(held).as_py() or 0
    if n_held == 0:
        return None
    if n_held < t.num_rows:
        raise DataprepError(f"{manifest}: {t.num_rows - n_held} loose file(s) and {n_held} row(s) inside containers: "
                            f"NeMo reads one kind per dataset; compile them as a blend (input_cfg) or run: "
                            f"{pack_hint(manifest)}")
    if t.column("member_offset").null_count:
        raise DataprepError(f"{manifest}: rows held in Parquet files: NeMo reads tarred audio only; "
                            f"run: {pack_hint(manifest)}")
    return tar_pattern(manifest, sorted(set(t.column("container").drop_null().to_pylist())))


def export_nemo(plan_or_buckets: str | os.PathLike[str], manifest: str | os.PathLike[str],
                out_dir: str | os.PathLike[str], *, channel: int | None = None,
                rejects: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Write NeMo bucketing options and manifests (see the module docstring); return the options.
    ``channel``: NeMo's ``channel_selector`` for multi-channel audio (default 0 when there is any)."""
    inputs = load_inputs(plan_or_buckets, manifest)
    require_audio(inputs.manifest_path, "export nemo")
    from dataprep.integrations.export_blend import blend_tree, export_nemo_blend

    tree = blend_tree(inputs.manifest_path)
    if tree is not None:
        check_covered(inputs, rejects)
        return export_nemo_blend(inputs, out_dir, tree, channel)
    tarred = nemo_tar_shards(inputs.manifest_path)
    check_covered(inputs, rejects)
    if tarred is not None:
        return _export_nemo_tarred(inputs, out_dir, tarred, channel)
    stats = Stats(len(inputs.spec.buckets))
    multi = False
    with export_dir(out_dir) as tmp, contextlib.ExitStack() as stack:
        main = stack.enter_context(open(tmp / "manifest.jsonl", "w", encoding="utf-8"))
        per: list[IO[str]] = [stack.enter_context(open(tmp / f"bucket-{b:03d}.jsonl", "w", encoding="utf-8"))
                              for b in range(len(inputs.spec.buckets))]
        for table, bucket in iter_manifest(inputs.manifest_path, inputs.bucket):
            keep = bucket >= 0
            rows = table.filter(pa.array(keep)).to_pylist()
            kept_bucket = bucket[keep]
            tps = 0.0
            for row, b in zip(rows, kept_bucket.tolist()):
                rec, writes_rate = nemo_line(row)
                line = json.dumps(rec, ensure_ascii=False) + "\n"
                main.write(line)
                per[b].write(line)
                if row["num_tokens"] is not None:
                    tps = max(tps, int(row["num_tokens"]) / nemo_duration(row, writes_rate))
                multi = multi or (not writes_rate and row_channels(row) > 1)
            stats.add(kept_bucket, row_tokens(table)[keep], tps)
        cfg = bucketing_config(inputs.spec, stats, channel if channel is not None else (0 if multi else None))
        cfg["manifest_filepath"] = str(Path(out_dir).resolve() / "manifest.jsonl")
        cfg["written"] = ["manifest.jsonl", "bucket-*.jsonl"]
        write_config(tmp, cfg)
    return cfg


def _export_nemo_tarred(inputs: ExportInputs, out_dir: str | os.PathLike[str], tarred: tuple[dict[str, int], str],
                        channel: int | None) -> dict[str, Any]:
    """:func:`export_nemo` of rows held in NeMo-named tars (the module docstring)."""
    ids, tar_pattern = tarred
    stats = Stats(len(inputs.spec.buckets))
    multi = False
    with export_dir(out_dir) as tmp, contextlib.ExitStack() as stack:
        files: dict[int, IO[str]] = {}
        for table, bucket in iter_manifest(inputs.manifest_path, inputs.bucket):
            keep = bucket >= 0
            tps = 0.0
            for row in table.filter(pa.array(keep)).to_pylist():
                shard = ids[row["container"]]
                member = row["audio_path"][len(row["container"]) + 1:]  # audio_path = <container>:<member>
                rec, writes_rate = nemo_line({**row, "audio_path": member})
                rec["shard_id"] = shard
                if shard not in files:
                    files[shard] = stack.enter_context(open(tmp / f"manifest_{shard}.json", "w", encoding="utf-8"))
                files[shard].write(json.dumps(rec, ensure_ascii=False) + "\n")
                if row["num_tokens"] is not None:
                    tps = max(tps, int(row["num_tokens"]) / nemo_duration(row, writes_rate))
                multi = multi or (not writes_rate and row_channels(row) > 1)
            stats.add(bucket[keep], row_tokens(table)[keep], tps)
        for shard in sorted(set(ids.values()) - set(files)):  # NeMo wants a manifest per tar, even empty
            (tmp / f"manifest_{shard}.json").write_text("", encoding="utf-8")
        cfg = bucketing_config(inputs.spec, stats, channel if channel is not None else (0 if multi else None))
        body = tar_pattern[tar_pattern.index("_OP_"):tar_pattern.index("_CL_") + 4]
        cfg.update(is_tarred=True, shard_manifests=True, skip_missing_manifest_entries=True,
                   tarred_audio_filepaths=tar_pattern,
                   manifest_filepath=str(Path(out_dir).resolve() / f"manifest_{body}.json"),
                   written=[f"manifest_{body}.json"])
        write_config(tmp, cfg)
    return cfg


def export_lhotse(plan_or_buckets: str | os.PathLike[str], manifest: str | os.PathLike[str],
                  out_dir: str | os.PathLike[str], *, channel: int | None = None,
                  rejects: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Write ``cuts.jsonl.gz`` and ``bins.json`` (see the module docstring); return the bins."""
    require("lhotse", "export lhotse")
    inputs = load_inputs(plan_or_buckets, manifest)
    require_audio(inputs.manifest_path, "export lhotse")
    check_covered(inputs, rejects)
    stats = Stats(len(inputs.spec.buckets))
    shar = held_in_containers(inputs.manifest_path)
    with export_dir(out_dir) as tmp:
        if shar:  # a folder of its own: Lhotse's from_shar takes every NAME.json beside it for a field
            (tmp / "shar").mkdir()
            _write_shar(inputs, tmp / "shar", channel, stats)
        else:
            with open(tmp / "cuts.jsonl.gz", "wb") as raw, \
                    gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:
                def write(row: dict[str, Any], b: int) -> float:
                    cut = cut_dict_for_row(row, channel, {"bucket": b})
                    gz.write((json.dumps(cut, sort_keys=True, ensure_ascii=False) + "\n").encode())
                    return float(cut["duration"])

                _export_covered(inputs, stats, write)
        bins = {
            "duration_bins": duration_bins(inputs.spec, stats.max_tokens),
            "bucket_batch_size": [int(b.batch_size) for b in inputs.spec.buckets],  # type: ignore[arg-type]
            "max_tps": stats.exported_max_tps,
            "num_cuts": stats.rows,
            "token_field": "custom.num_tokens",
        }
        write_json(bins, tmp / "bins.json")
    return {**bins, "written": ["shar/cuts.*.jsonl.gz", "shar/recording.*.tar"] if shar else ["cuts.jsonl.gz"]}


def held_in_containers(manifest: Path) -> bool:
    """Whether any row of ``manifest`` is held in a container (a tar member or a Parquet row):
    the ``container`` column read a block at a time, stopping at the first held row."""
    pf = pq.ParquetFile(manifest)
    if "container" not in pf.schema_arrow.names:
        return False
    return any(b.column(0).null_count < b.num_rows for b in pf.iter_batches(columns=["container"]))


def _write_shar(inputs: ExportInputs, folder: Path, channel: int | None, stats: Stats) -> None:
    """The covered rows as a Lhotse Shar set (``cuts.NNNNNN.jsonl.gz`` + ``recording.NNNNNN.tar``,
    audio as FLAC through Lhotse's own ``SharWriter``): what Lhotse's ``CutSet.from_shar`` and our
    ``compile`` both read, where a tar member has no plain Lhotse source."""
    from lhotse.shar import SharWriter

    from dataprep.integrations.cuts import cut_for_row

    with SharWriter(str(folder), fields={"recording": "flac"}, shard_size=SHAR_SHARD_CUTS) as writer:
        def write(row: dict[str, Any], b: int) -> float:
            cut = cut_for_row(row, channel, {"bucket": b})
            writer.write(cut)
            return float(cut.duration)

        _export_covered(inputs, stats, write)


def _export_covered(inputs: ExportInputs, stats: Stats, write: Callable[[dict[str, Any], int], float]) -> None:
    """Each row the plan covers (bucket >= 0), block by block, passed to ``write(row, bucket)``,
    which writes its cut and returns its duration (seconds); ``stats`` gathers the buckets, tokens
    and highest tokens per second."""
    for table, bucket in iter_manifest(inputs.manifest_path, inputs.bucket):
        keep = bucket >= 0
        kept_bucket = bucket[keep]
        tps = 0.0
        for row, b in zip(table.filter(pa.array(keep)).to_pylist(), kept_bucket.tolist()):
            duration = write(row, b)
            if row["num_tokens"] is not None:
                tps = max(tps, int(row["num_tokens"]) / duration)
        stats.add(kept_bucket, row_tokens(table)[keep], tps)


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
