"""The reports drawn from the analysis: the HTML report of a manifest, its rejects, buckets
and plan (``aggregates``: the small tables, ``stream_sections``: the buckets and plan sections
fed block by block; ``page``: the self-contained page) and the PNG plots (``plots``)."""

__all__ = ["aggregates", "page", "plots", "stream_sections"]
