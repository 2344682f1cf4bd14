"""Compile from an object store against the same compile from local disk.

    python benchmarks/bench_store_compile.py [--rows 5000] [--tars 16] [--latency-ms 20]
        [--corpora loose,probed,tarred] [--work DIR]

``--rows`` short 8 kHz WAV clips in --work, as three corpora: **loose** (a NeMo manifest with
durations; clips one object each, checked to exist by listing their folder), **probed** (no
durations: each header read by a range request) and **tarred** (a NeMo tarred set in --tars tars,
indexed from the tar headers). The store is S3 on loopback in another process, --latency-ms added
a request, answering at a store's cost (``python -m dataprep.testing_store --store-like --load``:
moto alone lists a page in time growing with the bucket). Each corpus is compiled from local disk,
then from the store cold (empty store cache) and warm (cached by ETag). Prints seconds, requests
and store / local (goal: cold <= 2).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_object_store import start_store  # noqa: E402

BUCKET = "bench-store-compile"


def _wav(seconds: float, seed: int) -> bytes:
    import soundfile
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    soundfile.write(buf, (rng.standard_normal(int(seconds * 8000)) * 0.1).astype(np.float32), 8000,
                    format="WAV", subtype="PCM_16")
    return buf.getvalue()


def build(work: Path, rows: int, tars: int, corpora: set[str]) -> None:
    """The clips and manifests of ``corpora`` (loose and probed share the clips) and the
    tokenizer, each part skipped when there."""
    work.mkdir(parents=True, exist_ok=True)
    lengths = np.round(np.random.default_rng(0).uniform(0.2, 0.8, rows), 2)
    clips = {s: _wav(float(s), i) for i, s in enumerate(sorted(set(lengths.tolist())))}
    words = "the quick brown fox jumps over a lazy dog again".split()
    if corpora & {"loose", "probed"} and not (work / "done-loose").exists():
        shutil.rmtree(work / "audio", ignore_errors=True)
        (work / "audio").mkdir()
        with open(work / "loose.jsonl", "w") as fh, open(work / "probed.jsonl", "w") as fh2:
            for i, s in enumerate(lengths.tolist()):
                (work / "audio" / f"u{i:06d}.wav").write_bytes(clips[s])
                row = {"audio_filepath": f"audio/u{i:06d}.wav", "text": " ".join(words[: 3 + i % 7])}
                fh.write(json.dumps({**row, "duration": s}) + "\n")
                fh2.write(json.dumps(row) + "\n")
        (work / "done-loose").touch()
    if "tarred" in corpora and not (work / "done-tarred").exists():
        shutil.rmtree(work / "tarred", ignore_errors=True)
        (work / "tarred").mkdir()
        for t in range(tars):
            with tarfile.open(work / "tarred" / f"audio_{t}.tar", "w") as tf, \
                    open(work / "tarred" / f"manifest_{t}.json", "w") as fh:
                for i in range(t, rows, tars):
                    data = clips[float(lengths[i])]
                    info = tarfile.TarInfo(f"u{i:06d}.wav")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
                    fh.write(json.dumps({"audio_filepath": f"u{i:06d}.wav", "duration": float(lengths[i]),
                                         "text": " ".join(words[: 3 + i % 7]), "shard_id": t}) + "\n")
        (work / "done-tarred").touch()
    if not (work / "spm.model").exists():
        from dataprep.testing import WORDS
        from dataprep.tokenize import train_model
        train_model([" ".join(WORDS[i:i + 12]) for i in range(0, len(WORDS), 3)] + [" ".join(words)] * 4,
                    work / "spm.model", vocab_size=60, threads=1)


def loads(work: Path, corpora: set[str]) -> list[str]:
    """The store's ``--load`` options: what ``corpora`` read, put in moto in-process (a PUT a
    clip through moto would take minutes at 100,000 clips)."""
    out = [f"s3://{BUCKET}/audio={work / 'audio'}"] if corpora & {"loose", "probed"} else []
    out += [f"s3://{BUCKET}/{c}.jsonl={work / f'{c}.jsonl'}" for c in ("loose", "probed") if c in corpora]
    out += [f"s3://{BUCKET}/tarred={work / 'tarred'}"] if "tarred" in corpora else []
    return [a for spec in out for a in ("--load", spec)]


def _requests(env: dict[str, str]) -> int:
    import urllib.request
    with urllib.request.urlopen(env["AWS_ENDPOINT_URL"] + "/__proxy__/counts") as r:
        return sum(json.loads(r.read()).values())


def _zero(env: dict[str, str]) -> None:
    import urllib.request
    urllib.request.urlopen(urllib.request.Request(env["AWS_ENDPOINT_URL"] + "/__proxy__/counts", method="DELETE"))


def compile_once(args: list[str], env: dict[str, str], out: Path, spm: Path) -> dict[str, Any]:
    """``dataprep compile ARGS -o OUT`` in-process: seconds and store requests."""
    from typer.testing import CliRunner

    from dataprep.cli import app
    from manifests import storage

    storage.reset_clients()
    _zero(env)
    t = time.perf_counter()
    r = CliRunner().invoke(app, ["compile", *args, "--tokenizer", str(spm), "-o", str(out)])
    dt = time.perf_counter() - t
    if r.exit_code != 0:
        raise SystemExit(f"dataprep compile {' '.join(args)} failed:\n{r.output}")
    return {"s": dt, "requests": _requests(env)}


CORPORA = {"loose": "loose (manifest with durations)", "probed": "loose, no durations (each header probed)",
           "tarred": "tarred (NeMo, tar headers indexed)"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=5000)
    ap.add_argument("--tars", type=int, default=16)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--corpora", default=",".join(CORPORA), help="comma-separated, among " + ", ".join(CORPORA))
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench_store_compile"))
    args = ap.parse_args()
    corpora = {c.strip() for c in args.corpora.split(",") if c.strip()}
    if not corpora or not corpora <= set(CORPORA):
        ap.error(f"--corpora: among {', '.join(CORPORA)}, got {args.corpora!r}")
    work = args.work / f"{args.rows}-{args.tars}"
    t = time.perf_counter()
    build(work, args.rows, args.tars, corpora)
    built = time.perf_counter() - t
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    t = time.perf_counter()
    proc, env = start_store(args.latency_ms, core=cores[-1], extra=("--store-like", *loads(work, corpora)))
    loaded = time.perf_counter() - t
    out = args.work / "out"
    out.mkdir(parents=True, exist_ok=True)
    try:
        os.environ.update(env)
        os.environ["SPEECH_DATAPREP_CACHE"] = str(out / "cache")
        shutil.rmtree(out / "cache", ignore_errors=True)
        t_last = args.tars - 1
        cases = {
            "loose": ([str(work / "loose.jsonl")], [f"s3://{BUCKET}/loose.jsonl"]),
            "probed": ([str(work / "probed.jsonl")], [f"s3://{BUCKET}/probed.jsonl"]),
            "tarred": (
                [str(work / "tarred" / f"manifest__OP_0..{t_last}_CL_.json"),
                 "--tarred-audio", str(work / "tarred" / f"audio__OP_0..{t_last}_CL_.tar")],
                [f"s3://{BUCKET}/tarred/manifest__OP_0..{t_last}_CL_.json",
                 "--tarred-audio", f"s3://{BUCKET}/tarred/audio__OP_0..{t_last}_CL_.tar"]),
        }
        print(f"\n{args.rows:,} rows, S3 on loopback +{args.latency_ms:g} ms per request, store-like proxy "
              f"(corpora built in {built:.1f} s, put in the store in {loaded:.1f} s)\n")
        print("| corpus | local (s) | store, cold (s) | requests | store, warm (s) | requests | cold / local | goal |")
        print("|---|---|---|---|---|---|---|---|")
        for name, label in CORPORA.items():
            if name not in corpora:
                continue
            local, url = cases[name]
            loc = compile_once(local, env, out / "local.parquet", work / "spm.model")
            cold = compile_once(url, env, out / "cold.parquet", work / "spm.model")
            warm = compile_once(url, env, out / "warm.parquet", work / "spm.model")
            print(f"| {label} | {loc['s']:.2f} | {cold['s']:.2f} | {cold['requests']:,} | {warm['s']:.2f} | "
                  f"{warm['requests']:,} | {cold['s'] / loc['s']:.2f} | <= 2 |", flush=True)
        if corpora & {"loose", "probed"}:
            from manifests import storage
            storage.reset_clients()
            t = time.perf_counter()
            listed = storage.list_prefix(f"s3://{BUCKET}/audio/")
            print(f"\nthe store's listing of the loose clips alone ({len(listed):,} objects, "
                  f"{(len(listed) + 999) // 1000} requests): {time.perf_counter() - t:.2f} s", flush=True)
    finally:
        proc.kill()


if __name__ == "__main__":
    main()
