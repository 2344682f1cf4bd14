"""Reading audio from containers: our loader over loose files and over packed tar shards, next to
Lhotse reading the same data as Shar; and header probing of members inside tars.

    python benchmarks/bench_containers.py [--utterances 2000] [--repeats 3] [--work DIR] [--core 0]

Corpus (built once in --work): 1-8 s 16 kHz FLAC utterances, clips of ../shared/data/audio and
synthetic tones, compiled, bucketed, planned, then packed into WebDataset tars and Lhotse Shar.
Prints utterances/s read and decoded to float32 on one pinned core, medians of --repeats:
(a) our loader over the loose files, following the plan; (b) the same over the tar shards;
(c) Lhotse ``CutSet.from_shar`` with ``cut.load_audio()``; (d) ``PlanSampler`` over the tar
shards, audio loaded by Lhotse; (e) ``get_plan_dataloader`` over a NeMo-tarred copy. Goals:
(b), (d) >= 0.8 x (c). Then member header probing in tars (``probe_members``, one thread),
files/s (goal >= 2,000), next to loose-file probing (``probe_headers``).
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHARED = Path(os.environ.get("SPEECH_DATAPREP_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def _one_core(core: int) -> None:
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})


def _shared_recordings() -> list[np.ndarray]:
    """The shared recordings as mono 16 kHz float32 (empty when ../shared/data is absent)."""
    import soundfile
    import soxr

    listing = SHARED / "audio" / "manifest.csv"
    out = []
    if not listing.exists():
        return out
    with open(listing, encoding="utf-8") as fh:
        for rec in csv.DictReader(fh):
            path = SHARED / "audio" / rec["file"]
            try:
                data, sr = soundfile.read(str(path), dtype="float32", always_2d=True)
            except Exception:  # noqa: BLE001 (a format libsndfile lacks: skip it)
                continue
            mono = data.mean(axis=1)
            if sr != 16000:
                mono = soxr.resample(mono, sr, 16000).astype(np.float32)
            if mono.shape[0] >= 16000:
                out.append(mono)
    return out


def build(work: Path, n: int) -> dict[str, Path]:
    """Write, compile, plan and pack the corpus (skipped where already there)."""
    import soundfile
    from typer.testing import CliRunner

    from dataprep.cli import app
    from dataprep.testing import WORDS, write_nemo_manifest, write_tone
    from dataprep.tokenize import train_model

    runner = CliRunner()

    def dp(*args: str) -> None:
        r = runner.invoke(app, list(args))
        if r.exit_code != 0:
            raise SystemExit(f"dataprep {' '.join(args)} failed:\n{r.output}")

    paths = {k: work / v for k, v in {
        "source": "source.jsonl", "spm": "spm.model", "loose": "loose.parquet", "buckets": "buckets.json",
        "plan": "plan", "wds": "wds", "packed": "packed.parquet", "pbuckets": "packed-buckets.json",
        "pplan": "packed-plan", "shar": "shar", "nemo": "nemo-tarred", "nemo_m": "nemo-tarred.parquet",
        "nemo_plan": "nemo-tarred-plan"}.items()}
    if not paths["source"].exists():
        rng = np.random.default_rng(0)
        recs = _shared_recordings()
        rows = []
        for i in range(n):
            seconds = float(np.round(rng.uniform(1.0, 8.0), 2))
            path = work / "audio" / f"u{i:05d}.flac"
            if recs and i % 3:
                rec = recs[i % len(recs)]
                want = int(seconds * 16000)
                reps = int(np.ceil(want / rec.shape[0])) + 1
                start = int(rng.integers(0, rec.shape[0]))
                clip = np.tile(rec, reps)[start:start + want]
                path.parent.mkdir(parents=True, exist_ok=True)
                soundfile.write(path, clip, 16000, subtype="PCM_16")
            else:
                write_tone(path, seconds, sample_rate=16000, seed=i)
            text = " ".join(rng.choice(np.array(WORDS[:200]), size=max(1, int(seconds * 2.5))))
            rows.append({"audio_filepath": str(path), "duration": soundfile.info(str(path)).duration,
                         "text": text, "lang": "en"})
        write_nemo_manifest(paths["source"], rows)
    if not paths["spm"].exists():
        train_model([" ".join(WORDS[i:i + 12]) for i in range(0, len(WORDS), 3)], paths["spm"], vocab_size=200,
                    threads=1)
    if not paths["loose"].exists():
        dp("compile", str(paths["source"]), "--tokenizer", str(paths["spm"]), "--probe", "never", "-o", str(paths["loose"]))
        dp("fit-buckets", str(paths["loose"]), "--num-buckets", "8", "--num-subbuckets", "2",
           "--max-duration-budget", "120", "-o", str(paths["buckets"]))
        dp("plan-batches", str(paths["loose"]), "--buckets", str(paths["buckets"]), "--world-size", "1",
           "--seed", "0", "--epochs", "1", "-o", str(paths["plan"]))
    if not paths["packed"].exists():
        dp("pack", str(paths["loose"]), "-o", str(paths["wds"]), "--layout", "webdataset", "--container-size", "32MB",
           "--buckets", str(paths["buckets"]))
        dp("compile", *sorted(str(p) for p in paths["wds"].glob("shard-*.tar")), "--tokenizer", str(paths["spm"]),
           "-o", str(paths["packed"]))
        dp("fit-buckets", str(paths["packed"]), "--num-buckets", "8", "--num-subbuckets", "2",
           "--max-duration-budget", "120", "-o", str(paths["pbuckets"]))
        dp("plan-batches", str(paths["packed"]), "--buckets", str(paths["pbuckets"]), "--world-size", "1",
           "--seed", "0", "--epochs", "1", "-o", str(paths["pplan"]))
    if not (paths["shar"] / "cuts.000000.jsonl.gz").exists():
        dp("pack", str(paths["loose"]), "-o", str(paths["shar"]), "--layout", "shar", "--container-size", "32MB")
    if not paths["nemo_m"].exists():
        dp("pack", str(paths["loose"]), "-o", str(paths["nemo"]), "--layout", "nemo-tarred", "--container-size", "32MB",
           "--buckets", str(paths["buckets"]))
        k = len(list(paths["nemo"].glob("audio_*.tar"))) - 1
        dp("compile", f"{paths['nemo']}/manifest__OP_0..{k}_CL_.json", "--tarred-audio",
           f"{paths['nemo']}/audio__OP_0..{k}_CL_.tar", "--tokenizer", str(paths["spm"]), "-o", str(paths["nemo_m"]))
        dp("plan-batches", str(paths["nemo_m"]), "--buckets", str(paths["buckets"]), "--world-size", "1",
           "--seed", "0", "--epochs", "1", "-o", str(paths["nemo_plan"]))
    return paths


def ours(manifest: Path, plan: Path, cache: Path) -> tuple[int, float]:
    """(utterances, seconds) reading + decoding every batch of rank 0's plan, one thread."""
    from dataprep.training import BatchBuilder
    from manifests.plan_files import PlanShard

    builder = BatchBuilder(manifest, [], cache_dir=cache, io_threads=1)
    cols = builder.columns  # the column cache is built before timing (once per manifest)
    batches = list(PlanShard(plan, 0).iter_batches())
    t = time.perf_counter()
    n = 0
    for pb in batches:
        waves = builder.read_audio(cols.gather(pb.rows, pb.ids))
        n += len(waves)
    return n, time.perf_counter() - t


def lhotse_shar(folder: Path) -> tuple[int, float]:
    """(utterances, seconds) iterating Lhotse's Shar reader in order, decoding each cut."""
    from lhotse import CutSet

    t = time.perf_counter()
    n = 0
    for cut in CutSet.from_shar(in_dir=folder):
        cut.load_audio()
        n += 1
    return n, time.perf_counter() - t


def plan_sampler(manifest: Path, plan: Path, cache: Path) -> tuple[int, float]:
    """(utterances, seconds): ``PlanSampler``'s cut sets of rank 0's plan, every cut's audio loaded."""
    from dataprep.integrations.lhotse import PlanSampler

    sampler = PlanSampler(plan, manifest, rank=0, world_size=1, cache_dir=cache)
    t = time.perf_counter()
    n = 0
    for cuts in sampler:
        for cut in cuts:
            cut.load_audio()
            n += 1
    return n, time.perf_counter() - t


class _LoadAudio:
    """A dataset of a plan's cut sets: each cut's samples (what a NeMo dataset does first)."""

    def __getitem__(self, cuts: object) -> list[np.ndarray]:
        return [c.load_audio() for c in cuts]  # type: ignore[attr-defined]


def plan_dataloader(manifest: Path, plan: Path) -> tuple[int, float]:
    """(utterances, seconds): ``get_plan_dataloader`` over a plan, one process."""
    from dataprep.integrations.nemo import get_plan_dataloader

    config = {"plan_dir": str(plan), "manifest": str(manifest), "sample_rate": 16000, "num_workers": 0}
    loader = get_plan_dataloader(config, global_rank=0, world_size=1, dataset=_LoadAudio())  # type: ignore[arg-type]
    t = time.perf_counter()
    n = sum(len(b) for b in loader)
    return n, time.perf_counter() - t


def probe_tar_members(tars: list[Path]) -> tuple[int, float]:
    """(members, seconds) reading every audio member's header in place, one thread."""
    import polars as pl

    from dataprep.compile.probe import probe_members
    from manifests.containers import index_tar

    frames = []
    for tar in tars:
        idx = index_tar(tar)
        keep = [i for i, name in enumerate(idx.names) if name.endswith(".flac")]
        frames.append(pl.DataFrame({"audio_path": [f"{tar}:{idx.names[i]}" for i in keep],
                                    "container": [str(tar)] * len(keep),
                                    "member_offset": [idx.offsets[i] for i in keep],
                                    "member_size": [idx.sizes[i] for i in keep]}))
    rows = pl.concat(frames)
    t = time.perf_counter()
    info = probe_members(rows, threads=1)
    dt = time.perf_counter() - t
    assert info["probe_reason"].null_count() == info.height, "every member's header should read"
    return info.height, dt


def probe_loose(manifest: Path) -> tuple[int, float]:
    from dataprep.compile.probe import probe_headers
    from manifests.manifest_read import read_manifest

    paths = read_manifest(manifest, columns=["audio_path"])["audio_path"].to_list()
    t = time.perf_counter()
    probe_headers(paths, threads=1)
    return len(paths), time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--utterances", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench_containers"))
    ap.add_argument("--core", type=int, default=0)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    paths = build(args.work, args.utterances)
    print(f"# corpus ready in {args.work} ({time.perf_counter() - t:.1f} s)", flush=True)
    _one_core(args.core)
    cache = args.work / "cache"
    tars = sorted(paths["wds"].glob("shard-*.tar"))
    loose_bytes = sum(p.stat().st_size for p in (args.work / "audio").glob("*.flac"))
    cases = {
        "(a) ours, loose files, plan batches": lambda: ours(paths["loose"], paths["plan"], cache),
        "(b) ours, tar shards, plan batches": lambda: ours(paths["packed"], paths["pplan"], cache),
        "(c) Lhotse Shar, sequential": lambda: lhotse_shar(paths["shar"]),
        "(d) PlanSampler + Lhotse load_audio, tar shards": lambda: plan_sampler(paths["packed"], paths["pplan"], cache),
        "(e) get_plan_dataloader, NeMo-tarred copy": lambda: plan_dataloader(paths["nemo_m"], paths["nemo_plan"]),
        "member header probe (tar)": lambda: probe_tar_members(tars),
        "loose header probe": lambda: probe_loose(paths["loose"]),
    }
    for case in cases.values():  # warm the page cache and the column caches
        case()
    rates: dict[str, float] = {}
    for name, case in cases.items():
        runs = []
        for _ in range(args.repeats):
            n, dt = case()
            runs.append(n / dt)
        rates[name] = statistics.median(runs)
    print(f"\n{args.utterances} utterances, {loose_bytes / 1e6:.0f} MB of FLAC, {len(tars)} tar shards; "
          f"one core (pinned to {args.core}), median of {args.repeats}\n")
    print("| measure | per second (one core) |")
    print("|---|---|")
    for name, rate in rates.items():
        unit = "files" if "probe" in name else "utterances"
        print(f"| {name} | {rate:,.0f} {unit} |")
    ratio = rates["(b) ours, tar shards, plan batches"] / rates["(c) Lhotse Shar, sequential"]
    print(f"| (b) / (c) | {ratio:.2f} (goal >= 0.8) |")
    d_ratio = rates["(d) PlanSampler + Lhotse load_audio, tar shards"] / rates["(c) Lhotse Shar, sequential"]
    print(f"| (d) / (c) | {d_ratio:.2f} (goal >= 0.8) |")
    print(f"| (b) / (a) | {rates['(b) ours, tar shards, plan batches'] / rates['(a) ours, loose files, plan batches']:.2f} |")


if __name__ == "__main__":
    main()
