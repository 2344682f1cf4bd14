"""``dataprep lookup`` of one rank's step, by part, and its projection to a plan of 10^9 utterances.

    python benchmarks/bench_lookup.py [--utterances 1000000 10000000] [--world-size 8] [--work DIR]

For each size, builds (once, kept in ``--work/N``) the manifest and plan of
``benchmarks/bench_loader.py`` and the row cache, then times ``lookup_step`` at random steps
(best of a few calls each: the pages warm, as a user tracing steps one after another) and its
parts: ``plan.json`` read, the manifest's verified hash, the row cache opened, the shard opened
and seeked, the rows read. Each part is fitted as ``a + b * N`` over the sizes given and the sum
projected to 10^9 utterances (a projection, printed as one: the shard's and the manifest's
Parquet footers grow with N, the row cache's open does not). Wall and CPU time both (the CPU
figure is what a quiet machine gives when the host is shared).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_loader import build  # noqa: E402
from dataprep.integrations.lookup import lookup_step  # noqa: E402
from dataprep.integrations.rows import ManifestRows  # noqa: E402
from manifests.hash_cache import manifest_hash  # noqa: E402
from manifests.plan_files import PlanShard  # noqa: E402
from manifests.plan_meta import read_plan_meta  # noqa: E402

PARTS = ("plan.json", "manifest hash", "row cache open", "shard open + seek", "rows read", "lookup_step")


def _best(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Best wall and CPU seconds of ``repeats`` calls."""
    wall, cpu = [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return min(wall), min(cpu)


def measure(work: Path, n: int, world_size: int, steps: int, repeats: int) -> dict[str, tuple[float, float]]:
    """Median over random steps of each part's best time (wall, CPU), seconds."""
    work.mkdir(parents=True, exist_ok=True)
    manifest, plan, _ = build(work, n, world_size)
    cache = work / "cache"
    t = time.perf_counter()
    ManifestRows.open(manifest, cache)
    print(f"{n:,} utterances: row cache ready in {time.perf_counter() - t:.1f} s", flush=True)
    meta = read_plan_meta(plan)
    rng = np.random.default_rng(0)
    out: dict[str, list[tuple[float, float]]] = {p: [] for p in PARTS}
    for step in rng.integers(meta.first_step, meta.num_steps, steps).tolist():
        rank = step % world_size
        batch = next(PlanShard(plan, rank, meta).iter_batches(start_step=step))
        rows = ManifestRows.open(manifest, cache)
        out["plan.json"].append(_best(lambda: read_plan_meta(plan), repeats))
        out["manifest hash"].append(_best(lambda: manifest_hash(manifest), repeats))
        out["row cache open"].append(_best(lambda: ManifestRows.open(manifest, cache), repeats))
        out["shard open + seek"].append(_best(
            lambda: next(PlanShard(plan, rank, meta).iter_batches(start_step=step)), repeats))  # noqa: B023
        out["rows read"].append(_best(lambda: rows.records(batch.rows), repeats))  # noqa: B023
        out["lookup_step"].append(_best(lambda: lookup_step(plan, step, [rank], manifest, cache), repeats))  # noqa: B023
    return {p: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for p, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--utterances", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench_lookup"))
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    sizes = sorted(set(args.utterances))
    got = {n: measure(args.work / str(n), n, args.world_size, args.steps, args.repeats) for n in sizes}
    for n in sizes:
        print(f"\n{n:,} utterances, world size {args.world_size} (median over {args.steps} random steps, "
              "best of a few calls each): wall ms / CPU ms")
        for p in PARTS:
            w, c = got[n][p]
            print(f"  {p:<18} {w * 1e3:8.2f} / {c * 1e3:8.2f}")
    if len(sizes) > 1:
        x = np.asarray(sizes, dtype=np.float64)
        target = 1e9
        print(f"\nprojected to {target:.0e} utterances (a + b*N fitted per part over {', '.join(f'{n:,}' for n in sizes)}; "
              "PROJECTED, not measured):")
        total = {"wall": 0.0, "cpu": 0.0}
        for p in PARTS[:-1]:
            for k, which in (("wall", 0), ("cpu", 1)):
                y = np.asarray([got[n][p][which] for n in sizes])
                b, a = np.polyfit(x, y, 1)
                total[k] += max(a + b * target, float(y.min()))
            print(f"  {p:<18} slope {np.polyfit(x, [got[n][p][1] for n in sizes], 1)[0] * 1e9 * 1e3:8.2f} CPU ms "
                  "per 10^9 utterances")
        print(f"lookup of one rank's step at 10^9 utterances (projected sum of parts): wall {total['wall'] * 1e3:.1f} ms, "
              f"CPU {total['cpu'] * 1e3:.1f} ms (goal <= 50 ms)")


if __name__ == "__main__":
    main()
