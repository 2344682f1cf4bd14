"""What a compiled manifest holds and what to drop from it: statistics (``stats``), named
filters with a count per filter (``filters``), and the plots of both reports (``plots``)."""

from dataprep.report.filters import FilterResult, Thresholds, apply_filters
from dataprep.report.stats import ManifestStats, compute_stats

__all__ = ["FilterResult", "ManifestStats", "Thresholds", "apply_filters", "compute_stats"]
