"""What a compiled manifest holds and what to drop from it: statistics (``stats``), named
filters with a count per filter (``filters``), the plots of both reports (``plots``), bucket
fitting (``buckets``: manifest -> buckets.json), the padding report (``padding``) and the HTML
report of a manifest, its rejects, buckets and plan (``aggregates``: the small tables; ``page``:
the self-contained page); the entries of their commands in ``files`` and ``buckets``."""

from dataprep.report.buckets import FitOptions, FitResult, fit_buckets_file
from dataprep.report.files import filter_manifest, stats_report
from dataprep.report.filters import FilterResult, FilterSummary, Thresholds, apply_filters
from dataprep.report.padding import manifest_padding_report
from dataprep.report.stats import ManifestStats, compute_stats

__all__ = [
    "FilterResult",
    "FilterSummary",
    "FitOptions",
    "FitResult",
    "ManifestStats",
    "Thresholds",
    "apply_filters",
    "compute_stats",
    "filter_manifest",
    "fit_buckets_file",
    "manifest_padding_report",
    "stats_report",
]
