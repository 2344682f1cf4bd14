"""The ``dataprep`` CLI and pipelines: probing, tokenization, compile, stats, filters,
reports, the loader and the thin training loop."""

__version__ = "0.1.0"

__all__ = ["__version__"]
