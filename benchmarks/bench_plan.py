"""Planner benchmark: a synthetic plan at W=128 (wall time, µs an utterance, peak RSS, plan
and disk bytes an utterance), Lhotse's sampler side by side, the tail-worker simulator.

    python benchmarks/bench_plan.py --rows 10000000 --runs 3 --balance 0.05 --skip-lhotse --skip-simulator
    python benchmarks/bench_plan.py --rows 100000000 --runs 1 --balance 0.05 --memory-limit 2GiB \
        --skip-lhotse --skip-simulator          # past the limit: spill files next to the plan
    python benchmarks/bench_plan.py --corpora 50 ...   # weighted vs the same rows unweighted (ratio)
    python benchmarks/bench_plan.py --replan ...       # and replan at the middle step onto W/2
    python benchmarks/bench_plan.py --page-cache-limit 1500MiB ...  # in a memory cgroup (root)

Rows resample real (duration, characters per second) pairs of ../shared/data with 5% jitter
(tokens = chars / 3.5 + 9), written in blocks of 5M; buckets fitted on the first block. The
plan runs in a fresh subprocess (2 threads): its wall time and VmHWM are its own. Medians.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SPEECH_DATAPREP_SHARED_DATA", REPO.parent / "shared" / "data"))
sys.path.insert(0, str(REPO))

from bucketing.budget import budget_source, padded_budget_batch_sizes  # noqa: E402
from bucketing.fit import grid_to_buckets  # noqa: E402
from bucketing.fit_passes import fit_buckets  # noqa: E402
from manifests.buckets_file import BucketSpec, write_buckets  # noqa: E402
from manifests.manifest_read import iter_manifest  # noqa: E402
from manifests.manifest_write import write_manifest, write_parquet_stream  # noqa: E402
from manifests.schema import POLARS_SCHEMA, conform, manifest_schema  # noqa: E402
from manifests.units import parse_bytes  # noqa: E402

CORPORA = ("librispeech.train-clean-100.csv", "commonvoice.id_ps.csv")
PROMPT = 9
CHARS_PER_TOKEN = 3.5


def real_pairs() -> tuple[np.ndarray, np.ndarray] | None:
    """(duration s, chars per second) of the shared corpora, or None when absent."""
    frames = [pl.read_csv(SHARED / n, columns=["duration", "text"]) for n in CORPORA if (SHARED / n).exists()]
    if not frames:
        return None
    df = pl.concat(frames).drop_nulls()
    d = df["duration"].to_numpy().astype(np.float64)
    return d, df["text"].str.len_chars().to_numpy() / d


def synthetic(n: int, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    pairs = real_pairs()
    if pairs is None:  # lognormal fits of the same corpora (log-seconds mean/std, chars/s)
        d = rng.lognormal(2.1, 0.55, n)
        cps = rng.normal(14.0, 2.5, n).clip(3, 30)
    else:
        pick = rng.integers(0, pairs[0].shape[0], n)
        d = pairs[0][pick] * rng.lognormal(0, 0.05, n)
        cps = pairs[1][pick] * rng.lognormal(0, 0.05, n)
    tokens = (np.round(d * cps / CHARS_PER_TOKEN) + PROMPT).astype(np.int32)
    return pl.DataFrame({"duration": d, "num_tokens": tokens}).with_columns(
        pl.format("utt-{}", pl.int_range(n, dtype=pl.Int64)).alias("id"))


def write_with_corpora(manifest: Path, out: Path, corpora: int, temperature: float, seed: int = 0) -> None:
    """``manifest`` rewritten to ``out`` with a ``corpus`` column (Zipf-like corpus sizes, rows
    shuffled across corpora) and the provenance of a blend weighted by each corpus's hours at
    ``temperature``; block by block (memory: a block, whatever the manifest's size)."""
    share = 1.0 / np.arange(1, corpora + 1) ** 1.1
    names = np.asarray([f"corpus{c:03d}" for c in range(corpora)], dtype=object)

    def blocks():  # block i's corpora drawn with seed (seed, i): the same in every pass
        for i, t in enumerate(iter_manifest(manifest, None, GEN_BLOCK)):
            yield t, np.random.default_rng([seed, i]).choice(corpora, size=t.num_rows, p=share / share.sum())

    hours = np.zeros(corpora)
    for t, code in blocks():
        hours += np.bincount(code, weights=t.column("duration").to_numpy(), minlength=corpora) / 3600
    tree = {"temperature": temperature,
            "children": [{"weight": float(max(h, 1e-3)), "corpus": n} for n, h in zip(names, hours)]}
    schema = manifest_schema(False, corpus=True)
    write_parquet_stream(lambda: (t.append_column("corpus", pa.array(names[code], pa.string())).cast(schema)
                                  for t, code in blocks()),
                         out, schema, "manifest", {"blend": {"path": "input_cfg.yaml", "tree": tree, "corpora": []}})


GEN_BLOCK = 5_000_000


def synthetic_blocks(n: int, seed: int = 0):
    """:func:`synthetic` rows in blocks of :data:`GEN_BLOCK` (block ``i`` drawn with seed ``(seed, i)``)."""
    for i, a in enumerate(range(0, n, GEN_BLOCK)):
        df = synthetic(min(GEN_BLOCK, n - a), seed=seed * 100003 + i)
        yield df.with_columns(pl.format("utt-{}", pl.int_range(a, a + df.height, dtype=pl.Int64)).alias("id"))


def write_synthetic(n: int, path: Path, buckets: Path, budget_s: float) -> float:
    """Stream ``n`` synthetic rows into a manifest, fit buckets on the first block; hours."""
    hours = [0.0]

    def tables():
        hours[0] = 0.0
        for df in synthetic_blocks(n):
            hours[0] += float(df["duration"].sum()) / 3600
            yield conform(df, POLARS_SCHEMA).to_arrow()

    write_parquet_stream(tables, path, manifest_schema(False), "manifest")
    buckets_for(next(synthetic_blocks(min(n, GEN_BLOCK))), buckets, budget_s)
    return hours[0]


def buckets_for(df: pl.DataFrame, path: Path, budget_s: float) -> None:
    fit = fit_buckets(df["duration"].to_numpy(), df["num_tokens"].to_numpy(), 30, 2)
    bs = padded_budget_batch_sizes(fit.grid.max_duration, max_duration_budget=budget_s)
    write_buckets(BucketSpec(grid_to_buckets(fit.grid, bs), budget_source(max_duration_budget=budget_s),
                             fit.report()), path)


CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from dataprep.planning import PlanOptions, build_plan
from bucketing import batching, plan
t1 = time.perf_counter()
fb = {"s": 0.0}
_form = batching.form_batches
def timed(*a, **k):
    t = time.perf_counter(); r = _form(*a, **k); fb["s"] += time.perf_counter() - t; return r
plan.form_batches = timed
timings = {"import": t1 - t0}
limit = int(sys.argv[6]) if len(sys.argv) > 6 and sys.argv[6] != "0" else None
from bucketing.dynres import DynResConfig
dynres = DynResConfig() if len(sys.argv) > 7 and sys.argv[7] == "1" else None
meta = build_plan(sys.argv[1], sys.argv[2], sys.argv[3],
                  PlanOptions(world_size=int(sys.argv[4]), seed=0, epochs=1, balance=float(sys.argv[5]),
                              memory_limit=limit, dynamic_resolution=dynres),
                  timings=timings)
timings["plan"] -= fb["s"]
timings["form_batches"] = fb["s"]
wall = time.perf_counter() - t0
try:  # this process's own peak: ru_maxrss keeps the parent's size from before the exec
    hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) / 2**20
except (OSError, StopIteration):
    hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
ru = resource.getrusage(resource.RUSAGE_SELF)  # all threads: less sensitive to other load than wall
print(json.dumps({"wall": wall, "cpu": ru.ru_utime + ru.ru_stime, "timings": timings, "rss_gib": hwm,
                  "steps": meta.num_steps, "padding": meta.padding, "moved": meta.fallbacks["moved_rows"],
                  "dropped": meta.fallbacks["dropped_rows"]}))
"""


REPLAN_CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from dataprep.planning import PlanOptions, replan
from manifests.plan_meta import read_plan_meta
parent = read_plan_meta(sys.argv[1])
limit = int(sys.argv[5]) if sys.argv[5] != "0" else None
at = parent.num_steps // 2
meta = replan(sys.argv[1], sys.argv[2], sys.argv[3], PlanOptions(world_size=int(sys.argv[4]), memory_limit=limit),
              at_step=at)
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) / 2**20
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall": time.perf_counter() - t0, "cpu": ru.ru_utime + ru.ru_stime, "rss_gib": hwm,
                  "at": at, "steps": meta.num_steps - at}))
"""


def run_replan(plan: Path, manifest: Path, out: Path, world: int, memory_limit: int = 0) -> dict:
    """``replan`` of ``plan`` at its middle step onto ``world`` ranks, in a fresh subprocess."""
    env = dict(os.environ, POLARS_MAX_THREADS="2", OMP_NUM_THREADS="2", PYTHONPATH=str(REPO))
    res = subprocess.run(["taskset", "-c", "0,1", sys.executable, "-c", REPLAN_CHILD, str(plan), str(manifest),
                          str(out), str(world), str(memory_limit)], capture_output=True, text=True, env=env)
    if res.returncode:
        sys.exit(f"replan failed: {res.stderr.strip().splitlines()[-1] if res.stderr.strip() else res.returncode}")
    got = json.loads(res.stdout.strip().splitlines()[-1])
    print(f"replan at step {got['at']} onto W={world}: wall {got['wall']:.2f} s, cpu {got['cpu']:.2f} s, "
          f"peak RSS {got['rss_gib']:.2f} GiB, {got['steps']} steps re-planned", flush=True)
    return got


def allocated_bytes(where: Path) -> int:
    """Bytes of disk the file ``where``, or the files under it, take (allocated blocks)."""
    if where.is_file():
        return where.stat().st_blocks * 512
    total = 0
    for root, _, files in os.walk(where):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:  # removed while walking
                pass
    return total


class DiskPeak:
    """Most disk the files under ``where`` took while the ``with`` block ran, sampled every
    ``every`` seconds in a thread (a walk of a few hundred files: no load to speak of)."""

    def __init__(self, where: Path, every: float = 0.25):
        self.where, self.every, self.peak = where, every, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, allocated_bytes(self.where))
            if self._stop.wait(self.every):
                return

    def __enter__(self) -> DiskPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, allocated_bytes(self.where))


@contextlib.contextmanager
def memory_cgroup(limit: int):
    """A fresh memory cgroup capped at ``limit`` bytes (the process's memory and the page cache
    it fills, together): yields its ``cgroup.procs`` file, or None for no cap (limit 0).
    Needs a writable cgroup file system (v2 ``memory.max`` or v1 ``memory.limit_in_bytes``,
    usually as root); removed afterwards."""
    if not limit:
        yield None
        return
    for root, knob in ((Path("/sys/fs/cgroup"), "memory.max"), (Path("/sys/fs/cgroup/unified"), "memory.max"),
                       (Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes")):
        if (root / "cgroup.procs").exists() and (knob == "memory.limit_in_bytes" or
                                                 "memory" in (root / "cgroup.controllers").read_text().split()):
            group = root / f"bench_plan-{os.getpid()}"
            try:
                group.mkdir()
                (group / knob).write_text(str(limit))
            except OSError as exc:
                sys.exit(f"--page-cache-limit: cannot make a memory cgroup under {root} ({exc.strerror})")
            try:
                yield group / "cgroup.procs"
            finally:
                group.rmdir()
            return
    sys.exit("--page-cache-limit: no memory cgroup controller to use here")


def run_plan(manifest: Path, buckets: Path, out: Path, world: int, balance: float = 0.0, memory_limit: int = 0,
             dynamic_resolution: bool = False, cache_limit: int = 0) -> dict:
    """``plan-batches`` in a fresh subprocess: its figures, and ``disk_gb``, the most disk the
    manifest's folder took meanwhile (manifest, spill files, plan). ``cache_limit``: the
    subprocess runs in a memory cgroup of that many bytes (:func:`memory_cgroup`), so a corpus
    whose spill files outgrow the page cache can be planned small."""
    env = dict(os.environ, POLARS_MAX_THREADS="2", OMP_NUM_THREADS="2", PYTHONPATH=str(REPO))
    argv = [str(manifest), str(buckets), str(out), str(world), str(balance), str(memory_limit),
            "1" if dynamic_resolution else "0"]
    with DiskPeak(manifest.parent) as disk, memory_cgroup(cache_limit) as procs:
        cmd = ["taskset", "-c", "0,1", sys.executable, "-c", CHILD, *argv]
        if procs is not None:  # the shell joins the cgroup, then becomes the child: all it reads is charged
            cmd = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(procs), *cmd]
        res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode:
        sys.exit(f"plan failed: {res.stderr.strip().splitlines()[-1] if res.stderr.strip() else res.returncode}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    out["disk_gb"] = disk.peak / 1e9
    print(f"  run: wall {out['wall']:.2f} s, cpu {out['cpu']:.2f} s, peak RSS {out['rss_gib']:.2f} GiB, "
          f"peak disk {out['disk_gb']:.1f} GB", flush=True)
    return out


def lhotse_cuts_per_s(durations: np.ndarray, world: int = 8, budget_s: float = 600.0) -> float:
    """Cuts per second rank 0 of Lhotse's DynamicBucketingSampler yields (2D: duration only)."""
    from lhotse import CutSet
    from lhotse.dataset.sampling import DynamicBucketingSampler
    from lhotse.testing.dummies import dummy_cut

    cuts = CutSet.from_cuts(dummy_cut(i, duration=float(d)) for i, d in enumerate(durations))
    sampler = DynamicBucketingSampler(cuts, max_duration=budget_s, num_buckets=30, shuffle=True, seed=0,
                                      world_size=world, rank=0, sync_buckets=True)
    t0 = time.perf_counter()
    n = sum(len(b) for b in sampler)
    return n / (time.perf_counter() - t0)


def shared_manifest(tmp: Path) -> Path | None:
    """LibriSpeech train-clean-100 + Common Voice id/ps with sentencepiece token counts."""
    import io

    import sentencepiece as spm

    if not all((SHARED / n).exists() for n in CORPORA):
        return None
    df = pl.concat([pl.read_csv(SHARED / n, columns=["id", "duration", "text"]) for n in CORPORA]).drop_nulls()
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(df["text"].to_list()), model_writer=buf, vocab_size=1024,
                                   input_sentence_size=20000, shuffle_input_sentence=True, num_threads=2,
                                   minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    tok = np.array([len(p) for p in sp.encode(df["text"].to_list())]) + PROMPT
    path = tmp / "shared.parquet"
    write_manifest(df.with_columns(pl.Series("num_tokens", tok, pl.Int32)), path)
    return path


def simulator_trend(tmp: Path, budget_s: float, seeds: int) -> None:
    from dataprep.planning import PlanOptions, build_plan, simulate_plan

    path = shared_manifest(tmp)
    if path is None:
        print(f"simulator: skipped ({SHARED} absent)")
        return
    df = pl.read_parquet(path, columns=["duration", "num_tokens"])
    buckets_for(df, tmp / "shared-buckets.json", budget_s)
    build_plan(path, tmp / "shared-buckets.json", tmp / "shared-plan",
               PlanOptions(world_size=16, seed=0, epochs=1, balance=0.0))  # the README's one-bucket simulator figures
    rows: dict[int, list] = {}
    for s in range(seeds):
        for r in simulate_plan(tmp / "shared-plan", (2, 16, 128), seed=s):
            rows.setdefault(r.world_size, []).append(r)
    print(f"simulator on {len(df)} shared utterances (LibriSpeech 100 h + CV id/ps), 30x2 buckets, "
          f"{budget_s:.0f} s budget, plan W=16, median of {seeds} deals; paper: 7% / 13% / 20% at 2 / 16 / 128")
    print(f"{'W':>5} {'idle sync':>10} {'idle unsync':>12} {'speedup':>8}")
    for w in (2, 16, 128):
        rs = rows[w]
        print(f"{w:>5} {statistics.median(r.idle_sync for r in rs):>10.1%} "
              f"{statistics.median(r.idle_unsync for r in rs):>12.1%} {statistics.median(r.speedup for r in rs):>8.1%}")


def weighted_vs_unweighted(tmp: Path, args: argparse.Namespace, wall: float, rss: float, limit: int) -> None:
    """Plan the same rows as ``--corpora`` weighted corpora (under the same ``--memory-limit``);
    print time and memory ratios."""
    write_with_corpora(tmp / "m.parquet", tmp / "weighted.parquet", args.corpora, args.temperature)
    results = [run_plan(tmp / "weighted.parquet", tmp / "buckets.json", tmp / "wplan", args.world_size, args.balance,
                        limit) for _ in range(args.runs)]
    wwall = statistics.median(r["wall"] for r in results)
    wrss = statistics.median(r["rss_gib"] for r in results)
    meta = json.loads((tmp / "wplan" / "plan.json").read_text())["weights"]
    under = sum(1 for c in meta["corpora"] if c["quota"] < c["rows"])
    print(f"weighted ({args.corpora} corpora, temperature {args.temperature:g}, {meta['epoch_quota']} utterances, "
          f"{under} corpora under-sampled): median wall {wwall:.2f} s, peak RSS {wrss:.2f} GiB; "
          f"weighted / unweighted: time {wwall / wall:.2f}x, memory {wrss / rss:.2f}x (goal <= 1.2x)")
    phases = {k: statistics.median(r["timings"][k] for r in results) for k in results[0]["timings"]}
    print("  weighted phases (median s): " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()))


#: Disk a run takes per utterance in --dir at its most (manifest, spill and position files,
#: plan): 56.4 B measured at 10M rows, 57.7 B at 40M (each run prints its own); the rest is
#: headroom for longer ids.
DISK_BYTES_PER_ROW = 70


def parse_rows(text: str) -> list[int]:
    """``--rows``: one size or several, comma-separated (``10000000,40000000``, ``1e8`` too)."""
    try:
        sizes = [int(float(x)) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--rows takes sizes separated by commas, not {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--rows takes positive sizes, not {text!r}")
    return sizes


def check_disk(where: Path, rows: int) -> None:
    """Exit with a one-line message unless ``where`` has the disk a ``rows``-row run takes."""
    import shutil

    need = rows * DISK_BYTES_PER_ROW
    free = shutil.disk_usage(where).free
    if free < need:
        sys.exit(f"--rows {rows}: needs about {need / 1e9:.0f} GB of disk in {where} (manifest, spill files, plan), "
                 f"only {free / 1e9:.0f} GB free; pass --dir on a larger disk")


def bench_size(rows: int, args: argparse.Namespace, limit: int) -> dict:
    """Plan ``rows`` synthetic utterances; print the figures; return the table's entry."""
    with tempfile.TemporaryDirectory(dir=args.dir) as td:
        tmp = Path(td)
        check_disk(tmp, rows)
        t0 = time.perf_counter()
        hours = write_synthetic(rows, tmp / "m.parquet", tmp / "buckets.json", args.budget)
        print(f"synthetic manifest: {rows} rows, {hours:.0f} h "
              f"(source: {'shared corpora' if real_pairs() else 'lognormal fits'}), built in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
        results = [run_plan(tmp / "m.parquet", tmp / "buckets.json", tmp / "plan", args.world_size, args.balance,
                            limit, args.dynamic_resolution, parse_bytes(args.page_cache_limit))
                   for _ in range(args.runs)]
        wall = statistics.median(r["wall"] for r in results)
        rss = statistics.median(r["rss_gib"] for r in results)
        size = sum(p.stat().st_size for p in (tmp / "plan").iterdir())
        manifest_b = allocated_bytes(tmp / "m.parquet")
        disk = statistics.median(r["disk_gb"] for r in results) * 1e9
        r0 = results[0]
        print(f"plan-batches W={args.world_size} --balance {args.balance:g}, 1 epoch, 2 cores: median wall {wall:.2f} s "
              f"(runs: {', '.join(format(r['wall'], '.2f') for r in results)}), peak RSS {rss:.2f} GiB, "
              f"output {size / 2**20:.0f} MiB ({size / rows:.1f} B/utt), {r0['steps']} steps, "
              f"padding audio {r0['padding']['audio']:.2%} tokens {r0['padding']['tokens']:.2%}, "
              f"moved {r0['moved']} dropped {r0['dropped']}")
        print(f"  disk in --dir at its most: {disk / 1e9:.1f} GB ({disk / rows:.1f} B/utt), of which the manifest "
              f"{manifest_b / rows:.1f} B/utt; the planner's own (spill files, plan): {(disk - manifest_b) / rows:.1f} B/utt")
        phases = {k: statistics.median(r["timings"][k] for r in results) for k in r0["timings"]}
        print("  phases (median s): " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items())
              + "  [form_batches = bucketing.batching, allocate = bucketing.allocate]")
        ours = rows / wall
        print(f"ours: {ours:,.0f} cuts/s planned (all {args.world_size} ranks, end to end), "
              f"{wall / rows * 1e6:.2f} us/utterance")
        entry = {"rows": rows, "wall": wall, "us": wall / rows * 1e6, "rss": rss, "bytes": size / rows,
                 "disk": disk / rows, "load": os.getloadavg()[0]}
        print(f"TABLE rows={rows} memory_limit={args.memory_limit} wall_s={wall:.1f} "
              f"us_per_utt={entry['us']:.2f} peak_rss_gib={rss:.2f} out_bytes_per_utt={size / rows:.1f} "
              f"disk_bytes_per_utt={entry['disk']:.1f} "
              f"load1={entry['load']:.1f}", flush=True)
        if args.replan:
            run_replan(tmp / "plan", tmp / "m.parquet", tmp / "replan", max(1, args.world_size // 2), limit)
        if args.corpora:
            weighted_vs_unweighted(tmp, args, wall, rss, limit)
    return entry


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=parse_rows, default=[10_000_000],
                    help="utterances; several sizes separated by commas print a table")
    ap.add_argument("--world-size", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--budget", type=float, default=600.0, help="padded seconds per batch")
    ap.add_argument("--lhotse-rows", type=int, default=200_000)
    ap.add_argument("--skip-lhotse", action="store_true")
    ap.add_argument("--balance", type=float, default=0.0, help="plan-batches --balance (0: one bucket per step)")
    ap.add_argument("--skip-simulator", action="store_true")
    ap.add_argument("--corpora", type=int, default=0, help="also plan C weighted corpora; report the ratio")
    ap.add_argument("--temperature", type=float, default=0.3, help="re-weighting temperature with --corpora")
    ap.add_argument("--memory-limit", default="0", help="plan-batches --memory-limit (e.g. 2GiB; 0: the default)")
    ap.add_argument("--dynamic-resolution", action="store_true",
                    help="plan with dynamic resolution (target frames per batch and the predicted figures)")
    ap.add_argument("--replan", action="store_true",
                    help="also re-plan the plan at its middle step onto half the ranks (under --memory-limit)")
    ap.add_argument("--dir", default=None, help="work directory (manifest, spill files, plan); default a temp dir")
    ap.add_argument("--page-cache-limit", default="0",
                    help="run each plan in a memory cgroup of this size (e.g. 1500MiB: the planner and the page "
                         "cache it fills together; needs a writable cgroup file system): a corpus whose spill "
                         "files outgrow the page cache, at a tenth of the size; 0: no cap")
    args = ap.parse_args()
    limit = parse_bytes(args.memory_limit)
    check_disk(Path(args.dir or tempfile.gettempdir()), max(args.rows))
    table = [bench_size(rows, args, limit) for rows in args.rows]
    if len(table) > 1:
        print(f"\nplan-batches W={args.world_size} --balance {args.balance:g} --memory-limit {args.memory_limit}, "
              f"1 epoch, 2 cores (median of {args.runs})")
        print(f"{'rows':>13} {'time s':>8} {'us/utt':>7} {'peak RSS GiB':>13} {'out B/utt':>10} {'disk B/utt':>11} "
              f"{'load':>5}")
        for e in table:
            print(f"{e['rows']:>13,} {e['wall']:>8.1f} {e['us']:>7.2f} {e['rss']:>13.2f} {e['bytes']:>10.1f} "
                  f"{e['disk']:>11.1f} {e['load']:>5.1f}")
    with tempfile.TemporaryDirectory(dir=args.dir) as td:
        tmp = Path(td)
        if not args.skip_lhotse:
            d = synthetic(args.lhotse_rows, seed=1)["duration"].to_numpy()
            theirs = lhotse_cuts_per_s(d, 8, args.budget)
            ours = table[-1]["rows"] / table[-1]["wall"]
            print(f"lhotse DynamicBucketingSampler (W=8, rank 0, sync_buckets, {args.lhotse_rows} cuts): "
                  f"{theirs:,.0f} cuts/s per rank; ours / theirs = {ours / theirs:,.0f}x "
                  f"(per-rank equivalent: {ours / args.world_size / theirs:.1f}x)")
        if not args.skip_simulator:
            simulator_trend(tmp, 200.0, 5)


if __name__ == "__main__":
    main()
