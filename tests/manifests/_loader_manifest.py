"""For the loaders' caches' tests (column cache, row cache): a small random manifest (files
shared by a few rows, nulls in strings and numbers, non-ASCII text, rows in containers) and a
cache file rewritten with other recorded facts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from manifests.column_cache import write_ipc_file
from manifests.manifest_write import write_manifest


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


def rewrite_cache_facts(cache_file: Path, meta_key: str, *, stream: bool, **facts: object) -> None:
    """Rewrite a cache file whole (an IPC file, or ``stream``) with ``facts`` replacing those
    recorded under ``meta_key``, as another tool version would have written it."""
    with pa.memory_map(str(cache_file)) as src:
        if stream:
            reader = pa.ipc.open_stream(src)
            batches = list(reader)
        else:
            reader = pa.ipc.open_file(src)
            batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        schema = reader.schema
    meta = json.loads(schema.metadata[meta_key.encode()])
    meta.update(facts)
    write_ipc_file(cache_file, schema.with_metadata({meta_key: json.dumps(meta)}), batches, stream=stream)
