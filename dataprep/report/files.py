"""The report stage's library entries, one per command, manifest in and files out:
:func:`filter_manifest` (``dataprep filter``) and :func:`stats_report` (``dataprep stats``).
The pure parts are :mod:`~dataprep.report.filters` and :mod:`~dataprep.report.stats`."""

from __future__ import annotations

import os
from pathlib import Path

from dataprep.report.filters import FilterResult, Thresholds, apply_filters
from dataprep.report.stats import ManifestStats, compute_stats
from manifests.errors import DataprepError
from manifests.io import (default_rejects_path, manifest_hash, read_manifest, read_metadata, write_json,
                          write_manifest, write_rejects)
from manifests.outputs import publish_together, refuse_same_paths

#: the columns ``stats`` reads
STATS_COLUMNS = ["duration", "num_tokens", "tps", "lang"]


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
                 plots: str | os.PathLike[str] | None = None) -> tuple[ManifestStats, list[Path]]:
    """The figures of ``manifest`` (:func:`compute_stats`); with ``json_path`` also written as
    JSON with the manifest's name and content hash, with ``plots`` the PNGs written into that
    folder (needs matplotlib). Returns the figures and the files written."""
    manifest = Path(manifest)
    refuse_same_paths({"MANIFEST": manifest}, {"--json": json_path})
    df = read_manifest(manifest, columns=STATS_COLUMNS)
    stats = compute_stats(df)
    written: list[Path] = []
    if json_path is not None:
        doc = stats.to_json()
        doc["manifest"] = {"path": manifest.name, "content_hash": manifest_hash(manifest)}
        write_json(doc, json_path)
        written.append(Path(json_path))
    if plots is not None:
        from dataprep.report.plots import write_plots  # lazy: matplotlib is an extra

        written += [Path(p) for p in write_plots(df, plots)]
    return stats, written
