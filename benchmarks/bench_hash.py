"""Cost of verifying a manifest's content hash (``manifests.hash_cache.manifest_hash``) on a large manifest.

    python benchmarks/bench_hash.py [--rows 10000000] [--work DIR] [--repeats 3]

Writes (once, kept in --work) a compiled manifest of N synthetic rows with every column filled
(ids, audio paths, 60-120 character transcripts, languages, origins), streamed in chunks of
1M rows through ``write_parquet_stream`` (the writer compile uses). Then prints medians of:

- reading the recorded hash (footer only; what the tool trusted before);
- the cheap file facts (size, mtime, footer SHA-256) that key the verification cache;
- ``manifest_hash`` with a warm verification cache (what every check costs while the file is
  unchanged; writers record their files, so the first check after compile/filter is warm too);
- the full recomputation from the rows (``recompute_hash``: a file changed or copied since written);
- for scale: planning the same manifest reads only (id, duration, num_tokens).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_report import timed  # noqa: E402  (median of repeats)
from dataprep.testing import WORDS  # noqa: E402
from manifests.content_hash import recompute_hash  # noqa: E402
from manifests.hash_cache import file_facts, manifest_hash  # noqa: E402
from manifests.manifest_read import recorded_hash  # noqa: E402
from manifests.manifest_write import write_parquet_stream  # noqa: E402
from manifests.schema import MANIFEST_SCHEMA  # noqa: E402

CHUNK = 1_000_000


def _chunk(start: int, n: int) -> pa.Table:
    rng = np.random.default_rng(start)
    idx = np.arange(start, start + n)
    words = np.asarray(WORDS, dtype=object)
    nwords = rng.integers(12, 24, n)
    picks = rng.integers(0, len(words), (n, 24))
    texts = [" ".join(words[picks[i, :nwords[i]]]) for i in range(n)]
    dur = np.clip(rng.lognormal(np.log(6.0), 0.6, n), 0.5, 35.0).round(2)
    tok = np.maximum(1, np.round(dur * 3)).astype(np.int32)
    ids = [f"spk{i // 200:06d}/utt{i:09d}" for i in idx]
    cols = {
        "id": pa.array(ids), "audio_path": pa.array([f"/data/corpus/audio/{s}.flac" for s in ids]),
        "offset": pa.array(np.zeros(n)), "duration": pa.array(dur),
        "sample_rate": pa.array(np.full(n, 16000, np.int32)), "channels": pa.array(np.ones(n, np.int16)),
        "text": pa.array(texts), "lang": pa.array(np.where(idx % 3 == 0, "de", "en").tolist()),
        "source_lang": pa.nulls(n, pa.string()), "target_lang": pa.nulls(n, pa.string()),
        "task": pa.nulls(n, pa.string()), "num_tokens": pa.array(tok), "tps": pa.array(tok / dur),
        "origin": pa.array([f"train.jsonl:{i + 1}" for i in idx]), "extra": pa.nulls(n, pa.string()),
    }
    return pa.table([cols[f.name] for f in MANIFEST_SCHEMA], schema=MANIFEST_SCHEMA)


def build(path: Path, rows: int) -> None:
    if path.exists() and pq.ParquetFile(path).metadata.num_rows == rows:
        return
    t = time.perf_counter()
    write_parquet_stream(lambda: (_chunk(s, min(CHUNK, rows - s)) for s in range(0, rows, CHUNK)),
                         path, MANIFEST_SCHEMA, "manifest")
    print(f"wrote {rows:,} rows, {path.stat().st_size / 2**30:.2f} GiB, in {time.perf_counter() - t:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "bench_hash")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    path = args.work / f"manifest-{args.rows}.parquet"
    build(path, args.rows)
    cache = args.work / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    r = args.repeats
    t_recorded = timed(lambda: recorded_hash(path), r)
    t_facts = timed(lambda: file_facts(path), r)
    t_full = timed(lambda: recompute_hash(path), r)
    manifest_hash(path, cache)  # the first check: recompute + remember
    import manifests.hash_cache as mio
    def warm() -> None:
        mio._VERIFIED.clear()  # a fresh process: only the on-disk cache is warm
        manifest_hash(path, cache)
    t_warm = timed(warm, r)
    t_plan_read = timed(lambda: pq.read_table(path, columns=["id", "duration", "num_tokens"]), r)
    print(f"rows {args.rows:,}  file {path.stat().st_size / 2**30:.2f} GiB  (medians of {r})")
    print(f"recorded hash (footer only)          {t_recorded * 1e3:10.2f} ms")
    print(f"file facts (size, mtime, footer)     {t_facts * 1e3:10.2f} ms")
    print(f"manifest_hash, warm cache            {t_warm * 1e3:10.2f} ms")
    print(f"full recompute from the rows         {t_full * 1e3:10.2f} ms")
    print(f"planner's column read, for scale     {t_plan_read * 1e3:10.2f} ms")


if __name__ == "__main__":
    main()
