"""Commands: train-tokenizer, compile (filled in by the foundation work)."""

from __future__ import annotations

from dataprep.cli_app import app  # noqa: F401
