"""What a compiled manifest holds and what to drop from it: statistics (``stats``), named
filters with a count per filter (``filters``), the plots of both reports (``plots``), the
padding report (``padding``), and the HTML report of a manifest, its rejects, buckets and plan
(``aggregates``: the small tables; ``page``: the self-contained page)."""

from dataprep.report.filters import FilterResult, Thresholds, apply_filters
from dataprep.report.stats import ManifestStats, compute_stats

__all__ = ["FilterResult", "ManifestStats", "Thresholds", "apply_filters", "compute_stats"]
