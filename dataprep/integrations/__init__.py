"""Consumers of a plan outside our own loop: exports of buckets and manifests for NeMo and
Lhotse (``export``). Modules here may import torch, Lhotse or NeMo lazily; nothing below
``dataprep`` imports them."""
