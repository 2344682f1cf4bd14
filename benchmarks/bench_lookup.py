"""``dataprep lookup`` of one rank's step, by part, and its projection to a plan of 10^9 utterances.

    python benchmarks/bench_lookup.py [--rows 100000 1000000] [--world-size 8] [--work DIR]

For each size, builds (once, kept in ``--work/N``) the manifest and plan of
``benchmarks/bench_loader.py``, the row cache and the shards' step indexes, then times
``lookup_step`` at random steps (best of a few calls each: pages warm, as a user tracing steps one
after another) and its parts. The parts that read bytes growing with the plan are the shard's footer hashed against
``plan.json`` (SHA-256, about 640 bytes a row group), the step index (one entry and one row
group's metadata read, from a file of 32 bytes a group) and the manifest's footer hash (a row
group per 2^20 rows): the projection to 10^9 utterances MEASURES them on synthetic files with the
row groups a 10^9 plan's shard (steps per rank scaled from the largest size run) and manifest
have, and adds the parts that do not grow (:data:`CONSTANT`) as measured. CPU and wall time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_loader import build  # noqa: E402
from dataprep.integrations.lookup import lookup_step  # noqa: E402
from dataprep.integrations.rows import ManifestRows  # noqa: E402
from manifests.hash_cache import file_facts, manifest_hash  # noqa: E402
from manifests.manifest_write import ROW_GROUP_ROWS  # noqa: E402
from manifests.plan_files import META_KIND, META_PLAN, SHARD_SCHEMA, PlanShard, shard_name, shard_table  # noqa: E402
from manifests.plan_meta import read_plan_meta  # noqa: E402
from manifests.step_index import build_step_index, step_footer  # noqa: E402

PARTS = ("plan.json", "manifest hash", "row cache open", "shard footer hash", "step footer (index)",
         "row group read", "rows read", "lookup_step")
#: parts whose bytes grow with the plan: measured on synthetic files of a 10^9 plan's footers
GROWING = ("manifest hash", "shard footer hash", "step footer (index)")
#: parts whose work does not grow with the plan (plan.json: world size and epochs; the row cache's
#: open: its footer, last batch and index header; a row group: --row-group-steps batches; rows
#: read: one batch): taken as their median over the sizes run
CONSTANT = ("plan.json", "row cache open", "row group read", "rows read")


def _best(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Best wall and CPU seconds of ``repeats`` calls."""
    wall, cpu = [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return min(wall), min(cpu)


def _shard_parts(path: Path, step: int, cache: Path, repeats: int) -> dict[str, tuple[float, float]]:
    """The shard's parts of a lookup of ``step``: footer hash, the one group's footer from the
    index, that group read."""
    facts = file_facts(path)
    md = step_footer(path, facts, step, cache)
    f = pq.ParquetFile(path, metadata=md, page_checksum_verification=True)
    return {"shard footer hash": _best(lambda: file_facts(path), repeats),
            "step footer (index)": _best(lambda: step_footer(path, facts, step, cache), repeats),
            "row group read": _best(lambda: f.read_row_group(0, columns=["epoch", "step", "step_in_epoch", "bucket",
                                                                         "ids", "rows"]), repeats)}


def measure(work: Path, n: int, world_size: int, steps: int, repeats: int) -> tuple[dict[str, tuple[float, float]], int]:
    """Median over random steps of each part's best time (wall, CPU), seconds; and steps per rank."""
    work.mkdir(parents=True, exist_ok=True)
    manifest, plan, _ = build(work, n, world_size)
    cache = work / "cache"
    t = time.perf_counter()
    ManifestRows.open(manifest, cache)
    meta = read_plan_meta(plan)
    for r in range(world_size):
        PlanShard(plan, r, meta, at_step=meta.first_step, cache_dir=cache)
    print(f"{n:,} utterances: row cache and step indexes ready in {time.perf_counter() - t:.1f} s", flush=True)
    rng = np.random.default_rng(0)
    out: dict[str, list[tuple[float, float]]] = {p: [] for p in PARTS}
    for step in rng.integers(meta.first_step, meta.num_steps, steps).tolist():
        rank = step % world_size
        batch = next(PlanShard(plan, rank, meta, at_step=step, cache_dir=cache).iter_batches(start_step=step))
        rows = ManifestRows.open(manifest, cache)
        out["plan.json"].append(_best(lambda: read_plan_meta(plan), repeats))
        out["manifest hash"].append(_best(lambda: manifest_hash(manifest), repeats))
        out["row cache open"].append(_best(lambda: ManifestRows.open(manifest, cache), repeats))
        for p, v in _shard_parts(plan / shard_name(rank), step, cache, repeats).items():
            out[p].append(v)
        out["rows read"].append(_best(lambda: rows.records(batch.rows), repeats))  # noqa: B023
        out["lookup_step"].append(_best(lambda: lookup_step(plan, step, [rank], manifest, cache), repeats))  # noqa: B023
    got = {p: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for p, v in out.items()}
    return got, meta.num_steps - meta.first_step


def _whole_footer(path: Path) -> None:
    """What opening a shard without the index costs: the whole footer parsed and every group's
    step statistics read (as :class:`PlanShard` does)."""
    md = pq.ParquetFile(path).metadata
    col = md.schema.to_arrow_schema().get_field_index("step")
    for i in range(md.num_row_groups):
        st = md.row_group(i).column(col).statistics
        st.min, st.max  # noqa: B018


def synthetic_shard(path: Path, groups: int, row_group_steps: int, batch: int = 1) -> None:
    """A shard of ``groups`` row groups of ``row_group_steps`` steps: the footer a plan of that many
    groups has (the same columns and statistics; their size does not depend on the batches'),
    batches of ``batch`` rows."""
    if path.exists():
        return
    meta = {META_KIND: b"plan-shard", META_PLAN: json.dumps({"version": 1, "rank": 0, "world_size": 1}).encode()}
    tmp = path.with_name(path.name + ".tmp")
    with pq.ParquetWriter(tmp, SHARD_SCHEMA.with_metadata(meta), compression="zstd", compression_level=1,
                          use_dictionary=["epoch", "bucket"], write_statistics=["epoch", "step", "bucket"],
                          write_page_checksum=True) as w:
        k = row_group_steps
        offsets = np.arange(0, k * batch + 1, batch)
        ids = pa.array([f"{i:09d}" for i in range(k * batch)])
        for g in range(groups):
            rows = np.arange(k * batch, dtype=np.int64) + g * k * batch
            w.write_table(shard_table(epoch=0, first_step=g * k, step_in_epoch=g * k, bucket=np.arange(k) % 60,
                                      offsets=offsets, rows=rows, ids=ids, max_duration=np.full(k, 20.0),
                                      max_tokens=np.full(k, 60)), row_group_size=k)
    tmp.rename(path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", "--utterances", dest="rows", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench_lookup"))
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--row-group-steps", type=int, default=128, help="the planner's default (PlanOptions)")
    ap.add_argument("--target", type=float, default=1e9, help="utterances of the plan projected to")
    args = ap.parse_args()
    target = int(args.target)
    sizes = sorted(set(args.rows))
    got, steps_per_rank = {}, {}
    for n in sizes:
        got[n], steps_per_rank[n] = measure(args.work / str(n), n, args.world_size, args.steps, args.repeats)
    for n in sizes:
        print(f"\n{n:,} utterances, world size {args.world_size} (median over {args.steps} random steps, "
              "best of a few calls each): wall ms / CPU ms")
        for p in PARTS:
            w, c = got[n][p]
            print(f"  {p:<20} {w * 1e3:8.2f} / {c * 1e3:8.2f}")

    big = sizes[-1]
    groups = max(1, -(-steps_per_rank[big] * target // (big * args.row_group_steps)))
    shard = args.work / f"synthetic-{groups}.parquet"
    synthetic_shard(shard, groups, args.row_group_steps)
    footer = pq.read_metadata(shard).serialized_size
    manifest = args.work / f"synthetic-manifest-{-(-target // ROW_GROUP_ROWS)}.parquet"
    synthetic_manifest_footer(args.work / str(big) / "m.parquet", manifest, -(-target // ROW_GROUP_ROWS))
    t = time.perf_counter()
    build_step_index(shard, None)
    built = time.perf_counter() - t
    whole = _best(lambda: _whole_footer(shard), args.repeats)
    rng = np.random.default_rng(1)
    synth: dict[str, list[tuple[float, float]]] = {p: [] for p in GROWING}
    for step in rng.integers(0, groups * args.row_group_steps, args.steps).tolist():
        parts = _shard_parts(shard, step, args.work / "cache", args.repeats)
        for p in GROWING[1:]:
            synth[p].append(parts[p])
        synth["manifest hash"].append(_best(lambda: file_facts(manifest), args.repeats))
    sgot = {p: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for p, v in synth.items()}
    print(f"\nMEASURED on synthetic files of a {target:.0e}-utterance plan: a shard of {groups:,} row groups of "
          f"{args.row_group_steps} steps ({steps_per_rank[big]:,} steps a rank at {big:,} utterances, scaled), "
          f"footer {footer / 2**20:.1f} MiB ({footer / groups:.0f} bytes a group); a manifest footer of "
          f"{-(-target // ROW_GROUP_ROWS)} row groups ({pq.read_metadata(manifest).serialized_size / 2**20:.1f} MiB). "
          f"The step index built once in {built:.2f} s; the whole shard footer parsed with every group's step "
          f"statistics (what a lookup did without the index): {whole[0] * 1e3:.1f} ms wall / {whole[1] * 1e3:.1f} ms CPU")
    for p in GROWING:
        print(f"  {p:<20} {sgot[p][0] * 1e3:8.2f} / {sgot[p][1] * 1e3:8.2f}")
    total = [sum(sgot[p][k] for p in GROWING) for k in (0, 1)]
    print(f"\nlookup of one rank's step at {target:.0e} utterances, PROJECTED: the parts above (measured at that "
          f"size) plus those that do not grow with the plan, median over {', '.join(f'{n:,}' for n in sizes)}:")
    for p in CONSTANT:
        v = [statistics.median(got[n][p][k] for n in sizes) for k in (0, 1)]
        total = [total[0] + v[0], total[1] + v[1]]
        print(f"  {p:<20} {v[0] * 1e3:8.2f} / {v[1] * 1e3:8.2f}")
    rest = [statistics.median(got[n]["lookup_step"][k] - sum(got[n][p][k] for p in PARTS[:-1]) for n in sizes)
            for k in (0, 1)]
    print(f"  {'the rest of lookup_step (its checks; lookup_step minus its parts)':<20} {rest[0] * 1e3:8.2f} / "
          f"{rest[1] * 1e3:8.2f}")
    print(f"sum: wall {(total[0] + rest[0]) * 1e3:.1f} ms, CPU {(total[1] + rest[1]) * 1e3:.1f} ms (goal <= 50 ms)")


def synthetic_manifest_footer(source: Path, out: Path, groups: int) -> None:
    """A Parquet file of ``groups`` one-row groups of ``source``'s first row, written as
    ``write_manifest`` writes (zstd, statistics on every column, its metadata): the footer of a
    manifest of that many row groups."""
    if out.exists():
        return
    one = pq.read_table(source).slice(0, 1)
    tmp = out.with_name(out.name + ".tmp")
    with pq.ParquetWriter(tmp, one.schema, compression="zstd") as w:
        for _ in range(groups):
            w.write_table(one)
    tmp.rename(out)


if __name__ == "__main__":
    main()
