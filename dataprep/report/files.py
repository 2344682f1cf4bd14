"""The report stage's library entries, one per command, manifest in and files out:
:func:`filter_manifest` (``dataprep filter``) and :func:`stats_report` (``dataprep stats``).
The pure parts are :mod:`~dataprep.report.filters` and :mod:`~dataprep.report.stats`."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from dataprep.report.exact import SELECT_BUDGET
from dataprep.report.filters import FilterResult, Thresholds, apply_filters
from dataprep.report.stats import ManifestStats, stream_stats
from manifests.errors import DataprepError
from manifests.io import (check_manifest_file, default_rejects_path, iter_manifest, manifest_hash, read_manifest,
                          read_metadata, write_json, write_manifest, write_rejects)
from manifests.options import check_int
from manifests.outputs import publish_together, refuse_same_paths

#: the columns ``stats`` reads (the optional ones when the manifest has them)
STATS_COLUMNS = ["duration", "num_tokens", "tps", "lang"]
OPTIONAL_STATS_COLUMNS = ["lang", "corpus"]
#: rows per block ``stats`` reads: about 40 MB of its columns
STATS_BLOCK_ROWS = 1 << 20


def filter_manifest(manifest: str | os.PathLike[str], output: str | os.PathLike[str], thresholds: Thresholds,
                    rejects: str | os.PathLike[str] | None = None) -> FilterResult:
    """Write the rows of ``manifest`` that pass ``thresholds`` to ``output`` (a compiled
    manifest, input order kept) and every other row to ``rejects`` (default
    ``<output stem>.rejects.parquet``) with the first filter it fails as ``reason``; both
    published together or not at all. Rows in = kept + rejected."""
    if not isinstance(thresholds, Thresholds):
        raise DataprepError(f"filter_manifest: thresholds must be Thresholds, got {type(thresholds).__name__}")
    manifest, output = Path(manifest), Path(output)
    rejects = Path(rejects) if rejects is not None else default_rejects_path(output)
    refuse_same_paths({"MANIFEST": manifest}, {"-o": output, "--rejects": rejects})
    input_hash = manifest_hash(manifest)
    df = read_manifest(manifest)
    recorded = read_metadata(manifest)["provenance"]
    result = apply_filters(df, thresholds)
    provenance = {
        "command": "filter",
        "input": manifest.name,
        "input_hash": input_hash,
        **({"tokenizers": recorded["tokenizers"]} if "tokenizers" in recorded else {}),  # what counted num_tokens
        "thresholds": thresholds.to_json(),
        "rows_in": result.rows_in,
        "kept": result.kept.height,
        "rejected": result.rejected.height,
    }
    with publish_together(output, rejects) as (tmp_out, tmp_rejects):  # visible together or not at all
        write_manifest(result.kept, tmp_out, provenance=provenance)
        write_rejects(result.rejected, tmp_rejects, provenance=provenance)
    return result


def stats_report(manifest: str | os.PathLike[str], json_path: str | os.PathLike[str] | None = None,
                 plots: str | os.PathLike[str] | None = None, *, block_rows: int = STATS_BLOCK_ROWS,
                 budget: int = SELECT_BUDGET) -> tuple[ManifestStats, list[Path]]:
    """The figures of ``manifest`` (:func:`~dataprep.report.stats.stream_stats`, read in
    blocks of ``block_rows`` rows: memory bounded by a block, the groups and ``budget``
    selected values, not by the manifest); with ``json_path`` also written as JSON with the
    manifest's name and content hash, with ``plots`` the PNGs written into that folder (needs
    matplotlib). Returns the figures and the files written."""
    manifest = Path(manifest)
    refuse_same_paths({"MANIFEST": manifest}, {"--json": json_path})
    check_int("block_rows", block_rows, ge=1, le=None)
    check_int("budget", budget, ge=1, le=None)
    check_manifest_file(manifest)
    names = pq.read_schema(manifest).names
    columns = [c for c in STATS_COLUMNS if c in names or c not in OPTIONAL_STATS_COLUMNS]
    columns += [c for c in OPTIONAL_STATS_COLUMNS if c in names and c not in columns]
    agg = None
    if plots is not None:
        from dataprep.report.plots import PlotAggregates  # lazy: matplotlib is an extra

        agg = PlotAggregates(budget=budget)
    stats = stream_stats(lambda: (pl.from_arrow(t) for t in iter_manifest(manifest, columns, block_rows)),
                         budget=budget, consumers=[agg] if agg is not None else [])
    written: list[Path] = []
    if json_path is not None:
        doc = stats.to_json()
        doc["manifest"] = {"path": manifest.name, "content_hash": manifest_hash(manifest)}
        blend = read_metadata(manifest)["provenance"].get("blend")
        if isinstance(blend, dict):  # many corpora: the weights and temperatures they were blended with
            doc["blend"] = blend.get("tree")
        write_json(doc, json_path)
        written.append(Path(json_path))
    if plots is not None:
        from dataprep.report.plots import write_plots  # lazy: matplotlib is an extra

        written += [Path(p) for p in write_plots(agg, plots)]
    return stats, written
