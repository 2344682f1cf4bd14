"""The entries of ``dataprep filter`` (:func:`filter_manifest`) and ``dataprep stats``
(:func:`stats_report`), manifest in and files out. The pure parts are
:mod:`~dataprep.analysis.filters` and :mod:`~dataprep.analysis.stats`."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from bucketing.token_equivalents import TokenEquivalentOptions
from dataprep.analysis.exact import SELECT_BUDGET
from dataprep.analysis.filters import FilterResult, FilterSummary, Thresholds, apply_filters
from dataprep.analysis.stats import ManifestStats, stream_stats
from manifests.atomic_files import write_json
from manifests.content_hash import ContentHasher
from manifests.errors import DataprepError
from manifests.hash_cache import manifest_hash, remember_verified
from manifests.manifest_read import check_manifest_file, iter_manifest
from manifests.manifest_write import RowGroupWriter, default_rejects_path, file_metadata, output_schemas
from manifests.options import check_int
from manifests.outputs import publish_together, refuse_same_paths
from manifests.schema import CORPUS_COLUMN, MODALITY_COLUMN, conform, has_containers, has_corpus, has_modality, schema_version

#: the columns ``stats`` reads (the optional ones when the manifest has them)
STATS_COLUMNS = ["duration", "num_tokens", "tps", "lang"]
OPTIONAL_STATS_COLUMNS = ["lang", "corpus", "modality"]
#: rows per block ``stats`` reads (about 10 MB of its columns; its keys, bins and masks a few
#: times that): 1M-row blocks cost 0.13 GiB more for the same time (synthetic 10M rows)
STATS_BLOCK_ROWS = 1 << 18
#: rows per block ``filter`` reads (every column: tens of MB)
FILTER_BLOCK_ROWS = 1 << 18


def _filtered(manifest: Path, block: pl.DataFrame, thresholds: Thresholds) -> FilterResult:
    """:func:`apply_filters` of a block of ``manifest``, its refusal naming the file."""
    try:
        return apply_filters(block, thresholds)
    except DataprepError as exc:
        raise DataprepError(f"{manifest}: {exc}") from None


def filter_manifest(manifest: str | os.PathLike[str], output: str | os.PathLike[str], thresholds: Thresholds,
                    rejects: str | os.PathLike[str] | None = None, *,
                    block_rows: int = FILTER_BLOCK_ROWS) -> FilterSummary:
    """Write the rows of ``manifest`` that pass ``thresholds`` to ``output`` (a compiled
    manifest, input order kept) and every other row to ``rejects`` (default
    ``<output stem>.rejects.parquet``) with the first filter it fails as ``reason``; both
    published together or not at all. Rows in = kept + rejected.

    Streams the manifest in blocks of ``block_rows`` rows (memory: a block and one row group
    per output, not the manifest): a pass to hash both outputs (the hash goes into their
    metadata), a pass to write them, and first a pass over the filter, ``container`` and
    ``corpus`` columns only when the manifest has those optional columns (each output keeps
    them only when one of its rows has a value, as :func:`manifests.manifest_write.write_manifest` does). The files
    equal, byte for byte, those written from the whole frame."""
    if not isinstance(thresholds, Thresholds):
        raise DataprepError(f"filter_manifest: thresholds must be Thresholds, got {type(thresholds).__name__}")
    check_int("block_rows", block_rows, ge=1, le=None)
    manifest, output = Path(manifest), Path(output)
    rejects = Path(rejects) if rejects is not None else default_rejects_path(output)
    refuse_same_paths({"MANIFEST": manifest}, {"-o": output, "--rejects": rejects})
    input_hash = manifest_hash(manifest)
    recorded = check_manifest_file(manifest)["provenance"]
    schema = pq.read_schema(manifest)
    names = schema.names

    def split(columns: list[str] | None) -> Iterator[FilterResult]:
        seen = False
        for t in iter_manifest(manifest, columns, block_rows):
            seen = True
            yield _filtered(manifest, pl.from_arrow(t), thresholds)  # type: ignore[arg-type]
        if not seen:  # no rows: still one (empty) block, so missing columns are refused
            empty = schema.empty_table()
            yield _filtered(manifest, pl.from_arrow(empty.select(columns) if columns else empty), thresholds)  # type: ignore[arg-type]

    optional = [c for c in ("container", CORPUS_COLUMN, MODALITY_COLUMN) if c in names]
    flags = {"kept": [False] * 3, "rejected": [False] * 3}  # (containers, corpus, modality) of each output
    if optional:
        needed = {c for _, c, _, _ in thresholds.active()} | set(optional)
        for r in split([c for c in names if c in needed] + sorted(needed - set(names))):  # lacking: derived or refused
            for key, part in (("kept", r.kept), ("rejected", r.rejected)):
                has = (has_containers(part), has_corpus(part), has_modality(part))
                flags[key] = [a or b for a, b in zip(flags[key], has)]
    kept_pl, kept_pa = output_schemas("manifest", *flags["kept"])
    rej_pl, rej_pa = output_schemas("rejects", *flags["rejected"])

    def tables() -> Iterator[tuple[FilterSummary, pa.Table, pa.Table]]:
        for r in split(None):
            yield (r.summary(), conform(r.kept, kept_pl).to_arrow().cast(kept_pa),
                   conform(r.rejected, rej_pl).to_arrow().cast(rej_pa))

    hashers = (ContentHasher(kept_pa), ContentHasher(rej_pa))
    summary: FilterSummary | None = None
    for part, kept, rejected in tables():
        summary = part if summary is None else summary + part
        hashers[0].update(kept)
        hashers[1].update(rejected)
    assert summary is not None
    hashes = (hashers[0].hexdigest(), hashers[1].hexdigest())
    provenance = {
        "command": "filter",
        "input": manifest.name,
        "input_hash": input_hash,
        **({"tokenizers": recorded["tokenizers"]} if "tokenizers" in recorded else {}),  # what counted num_tokens
        "thresholds": thresholds.to_json(),
        "rows_in": summary.rows_in,
        "kept": summary.kept,
        "rejected": summary.rejected,
    }
    with publish_together(output, rejects) as (tmp_out, tmp_rejects):  # visible together or not at all
        full = [schema.with_metadata(file_metadata(h, kind, provenance, schema_version(schema)))
                for schema, h, kind in ((kept_pa, hashes[0], "manifest"), (rej_pa, hashes[1], "rejects"))]
        with RowGroupWriter(tmp_out, full[0]) as w_kept, RowGroupWriter(tmp_rejects, full[1]) as w_rejected:
            for _, kept, rejected in tables():
                w_kept.write(kept)
                w_rejected.write(rejected)
        if (w_kept.rows, w_rejected.rows) != (hashers[0].rows, hashers[1].rows):
            raise AssertionError(f"{manifest}: the writing pass gave other rows than the hashing pass")
        remember_verified(tmp_out, hashes[0])
        remember_verified(tmp_rejects, hashes[1])
    return summary


def stats_report(manifest: str | os.PathLike[str], json_path: str | os.PathLike[str] | None = None, *,
                 consumers: Sequence[Any] = (), block_rows: int = STATS_BLOCK_ROWS,
                 budget: int = SELECT_BUDGET,
                 token_options: TokenEquivalentOptions | None = None) -> tuple[ManifestStats, list[Path]]:
    """The figures of ``manifest`` (:func:`~dataprep.analysis.stats.stream_stats`, read in
    blocks of ``block_rows`` rows: memory bounded by a block, the groups and ``budget``
    selected values, not by the manifest); with ``json_path`` also written as JSON with the
    manifest's name and content hash. ``consumers`` see every pass's blocks too (what
    :func:`~dataprep.analysis.stats.stream_stats` takes: the PNG plots' aggregates). Returns
    the figures and the files written. ``token_options``: token-equivalents at its audio token
    rate reported too (:mod:`bucketing.token_equivalents`)."""
    manifest = Path(manifest)
    refuse_same_paths({"MANIFEST": manifest}, {"--json": json_path})
    check_int("block_rows", block_rows, ge=1, le=None)
    check_int("budget", budget, ge=1, le=None)
    meta = check_manifest_file(manifest)
    names = pq.read_schema(manifest).names
    columns = [c for c in STATS_COLUMNS if c in names or c not in OPTIONAL_STATS_COLUMNS]
    columns += [c for c in OPTIONAL_STATS_COLUMNS if c in names and c not in columns]
    strings = [c for c in OPTIONAL_STATS_COLUMNS if c in columns]
    stats = stream_stats(lambda: iter_manifest(manifest, columns, block_rows, dictionary=strings),
                         budget=budget, consumers=list(consumers),
                         audio_token_rate=None if token_options is None else token_options.audio_token_rate)
    written: list[Path] = []
    if json_path is not None:
        doc = stats.to_json()
        doc["manifest"] = {"path": manifest.name, "content_hash": manifest_hash(manifest)}
        blend = meta["provenance"].get("blend")
        if isinstance(blend, dict):  # many corpora: the weights and temperatures they were blended with
            doc["blend"] = blend.get("tree")
        write_json(doc, json_path)
        written.append(Path(json_path))
    return stats, written
