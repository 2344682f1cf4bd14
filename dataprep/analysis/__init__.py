"""The corpus analysis: what a compiled manifest holds and what to drop from it. Statistics
(``stats``, exact order statistics in ``exact``), named filters with a count per filter
(``filters``), their commands' entries, manifest in and files out (``stats_and_filter``), the
bucket fit (``buckets``: manifest -> buckets.json) and the padding report (``padding``)."""

from dataprep.analysis.buckets import FitOptions, FitResult, fit_buckets_file
from dataprep.analysis.filters import FilterResult, FilterSummary, Thresholds, apply_filters
from dataprep.analysis.padding import manifest_padding_report
from dataprep.analysis.stats import ManifestStats, compute_stats
from dataprep.analysis.stats_and_filter import filter_manifest, stats_report

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
