"""The reports drawn from the analysis: the HTML report of a manifest, its rejects, buckets
and plan (``aggregates``: the small tables, the buckets and plan sections in
``buckets_section`` and ``plan_section``, fed block by block by ``stream_sections``; ``page``:
the self-contained page) and the PNG plots (``plots``)."""

__all__ = ["aggregates", "buckets_section", "page", "plan_section", "plots", "stream_sections"]
