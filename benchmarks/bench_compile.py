"""``dataprep compile`` throughput: rows/s end to end, header probing files/s, tokenizer overhead.

    python benchmarks/bench_compile.py                          # 1M-line NeMo JSONL, medians of 3
    python benchmarks/bench_compile.py --rows 10000000 --repeats 1 --skip-probe --skip-cli
    python benchmarks/bench_compile.py --rows 200000 --probe-files 1000   # a quick look

Prints, each figure the median of ``--repeats`` runs:

1. ``compile_to_files`` rows/s on a generated NeMo JSONL (durations present), split into read,
   tokenize, other checks and spooling, and write; wall and CPU seconds and the peak RSS
   (``ru_maxrss``) of a fresh process per run; then the ``dataprep compile`` CLI once.
2. ``probe_headers`` files/s on generated WAV and FLAC files, with 1 and 8 threads.
3. ``Tokenizers.count`` throughput as a ratio of raw sentencepiece ``encode(texts, num_threads=...)``
   on the same texts (goal >= 0.9).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TRAIN_TEXTS = 50_000  # transcripts the tokenizer is trained on (the word list saturates long before)


def generate(path: Path, rows: int, seed: int = 0, pool: int = 100_000, block: int = 1_000_000) -> None:
    """``rows`` NeMo lines, unique audio paths; (duration, transcript) pairs drawn from
    ``sample_corpus(pool)`` and cycled (that generator costs ~0.1 ms a row; the
    tokenizer's work per row is the same either way)."""
    import polars as pl

    from dataprep.testing import sample_corpus

    dur, texts, _ = sample_corpus(min(rows, pool), seed=seed)
    corpus = pl.DataFrame({"duration": dur, "text": texts})
    with open(path, "wb") as fh:
        for start in range(0, rows, block):
            n = min(block, rows - start)
            ids = pl.int_range(start, start + n, eager=True)
            part = corpus[(ids % corpus.height).to_numpy()]
            pl.DataFrame({
                "audio_filepath": ("audio/" + ids.cast(pl.String).str.zfill(9) + ".flac"),
                "duration": part["duration"], "text": part["text"],
                "lang": pl.repeat("en", n, eager=True), "pnc": pl.repeat("yes", n, eager=True),
            }).write_ndjson(fh)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def compile_once(src: Path, model: Path, out: Path) -> dict[str, float]:
    """One streaming compile (``compile_to_files``: manifest + rejects written) in this process,
    timed by phase (wraps the reader and the tokenizer); "write" is the time after the last chunk
    (duplicate-id pass, hashing and writing the manifest from the spool)."""
    import dataprep.compile as comp
    import dataprep.compile.validate as validate  # where the reader is called
    from dataprep.tokenize import Tokenizers

    phases = {"read": 0.0, "tokenize": 0.0, "last_chunk": 0.0}
    real_iter, real_count = validate.iter_source, Tokenizers.count

    def timed_iter(*a, **kw):  # type: ignore[no-untyped-def]
        it = real_iter(*a, **kw)
        while True:
            t0 = time.perf_counter()
            try:
                frame = next(it)
            except StopIteration:
                phases["read"] += time.perf_counter() - t0
                return
            phases["read"] += time.perf_counter() - t0
            yield frame

    def timed_count(self, *a, **kw):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        try:
            return real_count(self, *a, **kw)
        finally:
            phases["tokenize"] += time.perf_counter() - t0

    validate.iter_source = timed_iter  # type: ignore[assignment]
    Tokenizers.count = timed_count  # type: ignore[method-assign]
    toks = Tokenizers.from_specs([str(model)])
    t0, c0 = time.perf_counter(), time.process_time()

    def on_chunk(_: int) -> None:
        phases["last_chunk"] = time.perf_counter()

    result = comp.compile_to_files([src], toks, comp.CompileOptions(prompt_tokens=9), out,
                                   out.with_suffix(".rejects.parquet"), on_chunk=on_chunk)
    t2, c2 = time.perf_counter(), time.process_time()
    t1 = phases["last_chunk"] or t0
    return {"rows": result.rows_in, "kept": result.rows_kept, "total": t2 - t0, "cpu": c2 - c0,
            "read": phases["read"], "tokenize": phases["tokenize"],
            "other": (t1 - t0) - phases["read"] - phases["tokenize"], "write": t2 - t1,
            "peak_rss_mib": peak_rss_mib()}


def bench_compile(src: Path, model: Path, rows: int, repeats: int, tmp: Path) -> None:
    runs = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, __file__, "--child", str(src), "--model", str(model),
                              "--output", str(tmp / "manifest.parquet")], check=True, capture_output=True, text=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        assert runs[-1]["rows"] == rows, runs[-1]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"compile_to_files (streaming; manifest + rejects), {rows:,} NeMo rows (durations present), "
          f"median of {repeats}:")
    print(f"  {rows / med['total']:,.0f} rows/s  ({med['total']:.2f} s wall, {med['cpu']:.2f} s CPU "
          f"= {rows / med['cpu']:,.0f} rows per CPU-second; {med['kept']:,.0f} kept)")
    for k in ("read", "tokenize", "other", "write"):
        print(f"  {k:9s} {med[k]:6.2f} s  ({rows / med[k]:>12,.0f} rows/s)" if med[k] > 0 else f"  {k:9s} 0 s")
    print(f"  peak RSS {med['peak_rss_mib']:,.0f} MiB (median; max {max(r['peak_rss_mib'] for r in runs):,.0f} MiB)")


def bench_cli(src: Path, model: Path, rows: int, tmp: Path) -> None:
    out = tmp / "cli.parquet"
    t0 = time.perf_counter()
    subprocess.run(["dataprep", "compile", str(src), "--tokenizer", str(model), "--prompt-tokens", "9",
                    "-o", str(out)], check=True, capture_output=True, text=True)
    secs = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"dataprep compile CLI once: {secs:.2f} s = {rows / secs:,.0f} rows/s "
          f"(incl. start-up and rejects file; peak RSS of the largest child so far {rss:,.0f} MiB)")


def bench_probe(tmp: Path, files: int, repeats: int) -> None:
    from dataprep.compile.probe import probe_headers
    from dataprep.testing import write_tone

    for ext in ("wav", "flac"):
        folder = tmp / ext
        paths = [str(write_tone(folder / f"{i:06d}.{ext}", 0.05 + (i % 7) * 0.01, seed=i)) for i in range(files)]
        for threads in (1, 8):
            secs = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                info = probe_headers(paths, threads=threads)
                secs.append(time.perf_counter() - t0)
                assert info["probe_reason"].null_count() == files
            print(f"probe_headers {ext:4s} threads={threads}: {files / statistics.median(secs):,.0f} files/s "
                  f"({files:,} files, median of {repeats})")


def bench_tokenize(texts: list[str], model: Path, repeats: int) -> None:
    import sentencepiece as spm

    from dataprep.tokenize import Tokenizers

    sp = spm.SentencePieceProcessor(model_file=str(model))
    toks = Tokenizers.from_specs([str(model)])
    langs = ["en"] * len(texts)
    for threads in (1, os.cpu_count() or 1):
        raw, ours = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            ids = sp.encode(texts, num_threads=threads)
            expected = [len(x) for x in ids]
            del ids  # both sides free the id lists inside the timing
            raw.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            counts = toks.count(texts, langs, threads)
            ours.append(time.perf_counter() - t0)
            assert counts.tolist() == expected
        r, o = statistics.median(raw), statistics.median(ours)
        print(f"tokenize threads={threads}: raw sp.encode {len(texts) / r:,.0f} texts/s, Tokenizers.count "
              f"{len(texts) / o:,.0f} texts/s, ratio {r / o:.2f} (goal >= 0.9; {len(texts):,} texts, median of {repeats})")


def train_tokenizer(texts: list[str], model: Path, vocab_size: int = 1024) -> int:
    """Train the model; the word list of ``sample_corpus`` may not yield 1024 pieces, in which
    case sentencepiece names the largest vocabulary it can reach and we use that."""
    import re

    from dataprep.tokenize import train_model
    from manifests.errors import DataprepError

    try:
        train_model(texts, model, vocab_size=vocab_size)
    except DataprepError as exc:
        m = re.search(r"<= (\d+)", str(exc))
        if not m:
            raise
        vocab_size = int(m.group(1))
        train_model(texts, model, vocab_size=vocab_size)
    return vocab_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--probe-files", type=int, default=5000)
    ap.add_argument("--tokenize-texts", type=int, default=200_000)
    ap.add_argument("--skip-probe", action="store_true")
    ap.add_argument("--skip-cli", action="store_true")
    ap.add_argument("--skip-compile", action="store_true")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--output", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:  # one compile in a fresh process: its peak RSS is the compile's alone
        print(json.dumps(compile_once(args.child, args.model, args.output)))
        return
    from dataprep.testing import sample_corpus

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        _, texts, _ = sample_corpus(max(TRAIN_TEXTS, args.tokenize_texts), seed=12345)
        model = tmp / "spm.model"
        t0 = time.perf_counter()
        vocab = train_tokenizer(texts[:TRAIN_TEXTS], model)
        print(f"trained a {vocab}-piece unigram model on {TRAIN_TEXTS:,} transcripts in {time.perf_counter() - t0:.1f} s")
        bench_tokenize(texts[: args.tokenize_texts], model, args.repeats)
        del texts
        if not args.skip_probe:
            bench_probe(tmp, args.probe_files, args.repeats)
        if not args.skip_compile:
            src = tmp / "train.jsonl"
            t0 = time.perf_counter()
            generate(src, args.rows)
            size = src.stat().st_size / 2**20
            print(f"generated {args.rows:,} NeMo lines ({size:,.0f} MiB) in {time.perf_counter() - t0:.1f} s")
            bench_compile(src, model, args.rows, args.repeats, tmp)
            if not args.skip_cli:
                bench_cli(src, model, args.rows, tmp)
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (figures are wall time unless noted)")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
