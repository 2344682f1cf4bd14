"""Reading a packed corpus from an object store: plan-order reads with prefetch against Lhotse's Shar reader.

    python benchmarks/bench_object_store.py [--utterances 2000] [--latency-ms 20] [--prefetch-steps 8] [--runs 3]

Corpus (built once in --work): 16 kHz FLAC clips of ../shared/data/audio cut to LibriSpeech
dev-clean's durations, packed as Shar (``pack --layout shar --buckets``), compiled, uploaded to
moto's S3 on loopback behind a proxy adding --latency-ms a request and answering reads at a
store's cost (``python -m dataprep.testing_store --store-like``, another core; moto copies the
whole object for each ranged GET: ``--moto-ranges``), containers as ``s3://`` URLs, planned for one rank
(``--container-block``). On one pinned core: ours is ``PlanSampler(prefetch_steps=K)`` +
``PlanDataLoader``; Lhotse's is ``CutSet.from_shar`` on the same URLs (``manifests.storage``, one
GET per object). Reads alone run --runs times, alternating (the run of median ratio shown), then
decoded once. Goals: ours >= 2x Lhotse's reads, first batch <= 1 s, fetched / used <= 1.05.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHARED = Path(os.environ.get("SPEECH_DATAPREP_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
BUCKET = "bench-object-store"


def build(work: Path, n: int) -> dict[str, Path]:
    """Write, compile, fit and pack the corpus (skipped where already there)."""
    import soundfile
    from typer.testing import CliRunner

    from benchmarks.bench_containers import _shared_recordings
    from dataprep.cli import app
    from dataprep.testing import WORDS, write_nemo_manifest, write_tone
    from dataprep.tokenize import train_model

    def dp(*args: str) -> None:
        r = CliRunner().invoke(app, list(args))
        if r.exit_code != 0:
            raise SystemExit(f"dataprep {' '.join(args)} failed:\n{r.output}")

    p = {k: work / v for k, v in {"source": "source.jsonl", "spm": "spm.model", "loose": "loose.parquet",
                                  "buckets": "buckets.json", "shar": "shar", "packed": "packed.parquet"}.items()}
    if not p["source"].exists():
        with open(SHARED / "librispeech.dev-clean.csv", encoding="utf-8") as fh:
            meta = [r for _, r in zip(range(n), csv.DictReader(fh))]
        recs = _shared_recordings()
        rng = np.random.default_rng(0)
        rows = []
        for i in range(n):
            m = meta[i % len(meta)]
            seconds = float(m["duration"])
            path = work / "audio" / f"u{i:05d}.flac"
            if recs:
                rec = recs[i % len(recs)]
                want = int(seconds * 16000)
                start = int(rng.integers(0, rec.shape[0]))
                clip = np.tile(rec, want // rec.shape[0] + 2)[start:start + want]
                path.parent.mkdir(parents=True, exist_ok=True)
                soundfile.write(path, clip, 16000, subtype="PCM_16")
            else:
                write_tone(path, seconds, sample_rate=16000, seed=i)
            rows.append({"audio_filepath": str(path), "duration": soundfile.info(str(path)).duration,
                         "text": m["text"].lower(), "lang": "en"})
        write_nemo_manifest(p["source"], rows)
    if not p["spm"].exists():
        train_model([" ".join(WORDS[i:i + 12]) for i in range(0, len(WORDS), 3)], p["spm"], vocab_size=200, threads=1)
    if not p["loose"].exists():
        dp("compile", str(p["source"]), "--tokenizer", str(p["spm"]), "-o", str(p["loose"]))
        dp("fit-buckets", str(p["loose"]), "--num-buckets", "8", "--num-subbuckets", "2",
           "--max-duration-budget", "200", "-o", str(p["buckets"]))
    if not p["packed"].exists():
        dp("pack", str(p["loose"]), "-o", str(p["shar"]), "--layout", "shar", "--container-size", "16MB",
           "--buckets", str(p["buckets"]))
        dp("compile", str(p["shar"]), "--tokenizer", str(p["spm"]), "-o", str(p["packed"]))
    return p


def start_store(latency_ms: float, core: int, extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """The loopback S3 (moto behind the latency proxy) in a child pinned to ``core``, and its env;
    ``extra``: more of ``python -m dataprep.testing_store``'s options (``--store-like``)."""
    from dataprep.testing_store import DUMMY_ENV

    proc = subprocess.Popen([sys.executable, "-m", "dataprep.testing_store", "--latency-ms", str(latency_ms),
                             *extra],
                            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1],
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    line = proc.stdout.readline().strip()  # type: ignore[union-attr]
    if not line.startswith("AWS_ENDPOINT_URL="):
        proc.kill()
        raise SystemExit(f"the loopback store did not start: {line!r}")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(proc.pid, {core})
    return proc, {**DUMMY_ENV, "AWS_ENDPOINT_URL": line.partition("=")[2]}


def upload(p: dict[str, Path], work: Path, env: dict[str, str], block: int) -> tuple[Path, Path, list[str], list[str]]:
    """Upload the Shar folder; the packed manifest with its containers as URLs; a one-rank plan.
    Returns (URL manifest, plan, cuts URLs, recording URLs)."""
    import boto3
    import polars as pl
    from typer.testing import CliRunner

    from dataprep.cli import app
    from manifests.manifest_read import read_manifest
    from manifests.manifest_write import write_manifest

    s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    s3.create_bucket(Bucket=BUCKET)
    files = sorted(f for f in p["shar"].iterdir() if f.is_file())
    for f in files:
        s3.upload_file(str(f), BUCKET, f"shar/{f.name}")
    url = f"s3://{BUCKET}/shar/"
    m = read_manifest(p["packed"])
    m = m.with_columns(pl.col("container").str.replace(str(p["shar"]) + "/", url, literal=True))
    manifest, plan = work / "packed-s3.parquet", work / "plan-s3"
    write_manifest(m, manifest)
    blocks = ["--container-block", str(block)] if block else []
    r = CliRunner().invoke(app, ["plan-batches", str(manifest), "--buckets", str(p["buckets"]), "--world-size", "1",
                                 "--seed", "0", "-o", str(plan), *blocks])
    if r.exit_code != 0:
        raise SystemExit(r.output)
    cuts = [url + f.name for f in files if f.name.startswith("cuts.")]
    recs = [url + f.name for f in files if f.name.startswith("recording.")]
    return manifest, plan, cuts, recs


class _LoadAudio:
    """A dataset of a plan's cut sets: each cut's samples (what a NeMo dataset does first), or
    the cuts themselves, their audio bytes in memory (``decode=False``: the reads alone)."""

    def __init__(self, decode: bool) -> None:
        self.decode = decode

    def __getitem__(self, cuts: Any) -> Any:
        return [c.load_audio() for c in cuts] if self.decode else list(cuts)


def ours(manifest: Path, plan: Path, steps: int, decode: bool) -> dict[str, float]:
    """Plan-order reads: PlanSampler (prefetch on) + PlanDataLoader, every cut decoded or not."""
    from dataprep.integrations.lhotse import PlanDataLoader, PlanSampler
    from manifests.column_cache import ColumnCache
    from manifests.plan_files import PlanShard

    t0 = time.perf_counter()
    sampler = PlanSampler(plan, manifest, rank=0, world_size=1, prefetch_steps=steps)
    loader = PlanDataLoader(_LoadAudio(decode), sampler)
    n, first = 0, 0.0
    for batch in loader:
        if n == 0:
            first = time.perf_counter() - t0
        n += len(batch)
    dt = time.perf_counter() - t0
    ahead = sampler._prefetcher
    cols = ColumnCache.open(manifest)
    used = sum(int(cols.gather(pb.rows, pb.ids).member_sizes.sum()) for pb in PlanShard(plan, 0).iter_batches())
    return {"utt": n, "s": dt, "first": first, "fetched": ahead.fetched_bytes if ahead else 0,
            "requests": ahead.requests if ahead else 0, "used": used}


class _StoreIO:
    """A Lhotse IO backend opening ``s3://`` with the client ours uses: one GET per object."""

    def __new__(cls) -> Any:
        from lhotse.serialization import IOBackend

        class StoreIOBackend(IOBackend):
            def open(self, identifier: Any, mode: str) -> Any:
                from manifests import storage

                data = io.BytesIO(storage.read_bytes(str(identifier)))
                raw: Any = gzip.GzipFile(fileobj=data) if str(identifier).endswith(".gz") else data
                return io.TextIOWrapper(raw, encoding="utf-8") if "b" not in mode else raw

            def is_applicable(self, identifier: Any) -> bool:
                return str(identifier).startswith("s3://")

        return StoreIOBackend()


def lhotse_shar(cuts: list[str], recs: list[str], decode: bool) -> dict[str, float]:
    """Lhotse's Shar reader over the URLs, in order, every cut decoded or not (its audio bytes
    in memory: the reads alone)."""
    from lhotse import CutSet
    from lhotse.serialization import (
        CompositeIOBackend,
        get_default_io_backend,
        set_current_io_backend,
    )

    default = get_default_io_backend()
    set_current_io_backend(CompositeIOBackend([_StoreIO(), *default.backends]))
    t0 = time.perf_counter()
    n, first = 0, 0.0
    for cut in CutSet.from_shar(fields={"cuts": cuts, "recording": recs}):
        if decode:
            cut.load_audio()
        if n == 0:
            first = time.perf_counter() - t0
        n += 1
    return {"utt": n, "s": time.perf_counter() - t0, "first": first}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--utterances", type=int, default=2000)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--prefetch-steps", type=int, default=8)
    ap.add_argument("--container-block", type=int, default=1, help="plan-batches --container-block (0: off)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench_object_store"))
    ap.add_argument("--core", type=int, default=0, help="the core the readers run on (the store gets another)")
    ap.add_argument("--moto-ranges", action="store_true",
                    help="let moto answer every request (it copies the whole object for each ranged GET: a cost "
                         "per request that grows with the object, which a store does not have)")
    ap.add_argument("--runs", type=int, default=3, help="read passes of each reader, alternating (the median is shown)")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    paths = build(args.work, args.utterances)
    print(f"# corpus ready in {args.work} ({time.perf_counter() - t:.1f} s)", flush=True)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    store_core = next((c for c in cores if c != args.core), args.core)
    proc, env = start_store(args.latency_ms, store_core, extra=() if args.moto_ranges else ("--store-like",))
    try:
        os.environ.update(env)
        manifest, plan, cuts, recs = upload(paths, args.work, env, args.container_block)
        from dataprep.integrations.rows import ManifestRows
        from manifests.column_cache import ColumnCache

        ManifestRows.open(manifest), ColumnCache.open(manifest)  # a trainer's caches, built once per manifest
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {args.core})
        from manifests import storage
        storage.stat(cuts[0])  # the store's client made and connected before either reader is timed
        runs = []  # ours and Lhotse's reads alternate: a load that drifts (a shared machine) hits both
        for r in range(args.runs):
            runs.append((ours(manifest, plan, args.prefetch_steps, decode=False), lhotse_shar(cuts, recs, decode=False)))
            print(f"# run {r + 1}: ours {runs[-1][0]['utt'] / runs[-1][0]['s']:,.0f} utt/s, Lhotse "
                  f"{runs[-1][1]['utt'] / runs[-1][1]['s']:,.0f} utt/s, ratio "
                  f"{(runs[-1][0]['utt'] / runs[-1][0]['s']) / (runs[-1][1]['utt'] / runs[-1][1]['s']):.2f}", flush=True)
        ad = ours(manifest, plan, args.prefetch_steps, decode=True)
        bd = lhotse_shar(cuts, recs, decode=True)
    finally:
        proc.kill()
    ratios = [(x["utt"] / x["s"]) / (y["utt"] / y["s"]) for x, y in runs]
    mid = sorted(range(len(runs)), key=lambda i: ratios[i])[len(runs) // 2]
    a, b = runs[mid]  # the run of median ratio
    mb = sum(f.stat().st_size for f in paths["shar"].glob("recording.*")) / 1e6
    print(f"\n{a['utt']:.0f} utterances, {mb:.0f} MB of FLAC in {len(recs)} Shar tars in S3 on loopback, "
          f"+{args.latency_ms:g} ms per request; plan --container-block {args.container_block}, prefetch "
          f"{args.prefetch_steps} steps; readers on one core, store on another"
          f"{'; moto answers ranged GETs' if args.moto_ranges else '; store-like proxy'}\n")
    print("| measure | plan-order reads + prefetch (ours) | Lhotse Shar reader | ours / Lhotse | goal |")
    print("|---|---|---|---|---|")
    for name, x, y, goal in (("utterances/s read (cuts with their audio bytes)", a, b, ">= 2"),
                             ("utterances/s read and decoded", ad, bd, "")):
        rx, ry = x["utt"] / x["s"], y["utt"] / y["s"]
        print(f"| {name} | {rx:,.0f} | {ry:,.0f} | {rx / ry:.2f} | {goal} |")
    print(f"| ours / Lhotse, each of {len(runs)} runs (median above) | {', '.join(f'{x:.2f}' for x in ratios)} | | | |")
    print(f"| time to first batch, read (s) | {a['first']:.2f} | {b['first']:.2f} | | ours <= 1 |")
    print(f"| bytes fetched / bytes used | {a['fetched'] / max(1, a['used']):.3f} | 1 (whole tars, in order) | | <= 1.05 |")
    print(f"| requests | {a['requests']:,.0f} | {len(cuts) + len(recs)} | | |")


if __name__ == "__main__":
    main()
