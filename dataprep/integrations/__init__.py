"""Consumers of a plan outside our own loop: exports of buckets and manifests for NeMo and
Lhotse (``export``). Modules here may import torch, Lhotse or NeMo lazily; nothing below
``dataprep`` imports them."""

# the public modules (imported on use: each may need torch, Lhotse or NeMo)
__all__ = [
    "cuts",
    "export",
    "lhotse",
    "lhotse_source",
    "lightning",
    "nemo",
    "pack",
    "prefetch",
    "rows",
    "torch",
]
