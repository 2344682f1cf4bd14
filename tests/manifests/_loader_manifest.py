"""A small random manifest for the loaders' caches (column cache, row cache): files shared by a
few rows, nulls in strings and numbers, non-ASCII text, rows in containers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl

from manifests.io import write_manifest


def write_loader_manifest(path: Path, rows: int, seed: int, *, langs: tuple[str, ...] = ("en", "de"),
                          files: int = 20, all_columns: bool = False) -> Path:
    """Write ``rows`` random rows to ``path``; ``all_columns`` adds sample_rate, channels, task
    and extra (the columns the row cache carries beyond the loader's)."""
    rng = np.random.default_rng(seed)
    n = rows
    in_tar = rng.random(n) < 0.4
    cols: dict[str, object] = {
        "id": [f"u{i:03d}" for i in range(n)],
        "audio_path": [f"/a/{rng.integers(0, files)}.flac" for _ in range(n)],
        "offset": [None if rng.random() < 0.5 else float(rng.integers(0, 50)) for _ in range(n)],
        "duration": rng.uniform(0.5, 20, n).round(2),
        "text": [None if rng.random() < 0.1 else f"wörds {i} é" for i in range(n)],
        "lang": [None if rng.random() < 0.3 else langs[rng.integers(0, len(langs))] for _ in range(n)],
        "num_tokens": rng.integers(1, 90, n).astype(np.int32),
        "container": [f"/t/{rng.integers(0, 3)}.tar" if t else None for t in in_tar],
        "member_offset": [int(rng.integers(0, 1 << 40)) if t else None for t in in_tar],
        "member_size": [int(rng.integers(1, 1 << 20)) if t else None for t in in_tar],
    }
    if all_columns:
        cols["sample_rate"] = pl.Series([None if rng.random() < 0.2 else 16000 for _ in range(n)], dtype=pl.Int32)
        cols["channels"] = pl.Series([None if rng.random() < 0.2 else 1 for _ in range(n)], dtype=pl.Int16)
        cols["task"] = [None if rng.random() < 0.5 else "asr" for _ in range(n)]
        cols["extra"] = [None if rng.random() < 0.5 else json.dumps({"k": i}) for i in range(n)]
    df = pl.DataFrame(cols).with_columns((pl.col("num_tokens") / pl.col("duration")).alias("tps"))
    write_manifest(df, path)
    return path
