"""Plans that know the store (issue 40, item 4): ``container_block`` orders each bucket in shuffled
blocks of containers. Every row is still planned once per epoch (the rows of each epoch are
the default plan's, none twice: a property over random corpora), a rank-step touches at most
two blocks' containers where blocks hold a batch, and the price in randomness is recorded."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataprep.planning import PlanOptions, build_plan
from manifests.errors import OptionError
from manifests.manifest_write import write_manifest
from manifests.plan_files import PlanShard


def corpus(folder: Path, n: int, containers: int, seed: int, budget: float = 60.0) -> tuple[Path, Path]:
    """A manifest of ``n`` rows whose audio lies in ``containers`` files, and its buckets."""
    from bucketing.budget import budget_source, padded_budget_batch_sizes
    from bucketing.fit import grid_to_buckets
    from bucketing.fit_passes import fit_buckets
    from manifests.buckets_file import BucketSpec, write_buckets

    rng = np.random.default_rng(seed)
    d = rng.lognormal(1.6, 0.6, n)
    tok = (d * rng.uniform(2, 4, n)).astype(np.int64) + 9
    where = rng.integers(0, containers, n)
    write_manifest(pl.DataFrame({"id": [f"u{i:05d}" for i in range(n)], "audio_path": [f"c{w}.flac" for w in where],
                                 "duration": d, "num_tokens": tok}), folder / "m.parquet")
    fit = fit_buckets(d, tok, 2, 1)
    bs = padded_budget_batch_sizes(fit.grid.max_duration, max_duration_budget=budget)
    write_buckets(BucketSpec(grid_to_buckets(fit.grid, bs), budget_source(max_duration_budget=budget)),
                  folder / "b.json")
    return folder / "m.parquet", folder / "b.json"


def epoch_rows(plan: Path, world_size: int, epoch: int) -> list[int]:
    rows: list[int] = []
    for r in range(world_size):
        t = PlanShard(plan, r).read_epoch(epoch, ["rows"])
        rows += t.column("rows").combine_chunks().values.to_numpy().tolist()
    return rows


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(60, 400), containers=st.integers(1, 40), block=st.integers(1, 6), world_size=st.integers(1, 3),
       seed=st.integers(0, 2**16))
def test_every_row_once_per_epoch_with_blocks(tmp_path_factory: pytest.TempPathFactory, n: int, containers: int,
                                              block: int, world_size: int, seed: int) -> None:
    folder = tmp_path_factory.mktemp("blocks")
    manifest, buckets = corpus(folder, n, containers, seed)
    plain = build_plan(manifest, buckets, folder / "plain", PlanOptions(world_size, seed=seed, epochs=2))
    blocked = build_plan(manifest, buckets, folder / "blocked",
                         PlanOptions(world_size, seed=seed, epochs=2, container_block=block))
    for e in range(2):
        got = epoch_rows(folder / "blocked", world_size, e)
        assert max(Counter(got).values()) == 1  # no row twice in an epoch
        assert sorted(got) == sorted(epoch_rows(folder / "plain", world_size, e))  # the same rows as the default plan
    entry = blocked.extra["container_blocks"]
    assert entry["containers"] == block and 0 < entry["mates_rows"] <= entry["bucket_rows"]
    assert "container_blocks" not in plain.extra


def test_blocks_bound_the_containers_a_step_reads(tmp_path: Path) -> None:
    manifest, buckets = corpus(tmp_path, 3000, 60, seed=3)
    paths = pl.read_parquet(manifest)["audio_path"].to_numpy()

    def containers_per_batch(plan: Path) -> np.ndarray:
        t = PlanShard(plan, 0).read_epoch(0, ["rows"]).column("rows").combine_chunks()
        rows, off = t.values.to_numpy(), t.offsets.to_numpy()
        return np.array([len(set(paths[rows[a:b]])) for a, b in zip(off[:-1], off[1:]) if b > a])

    build_plan(manifest, buckets, tmp_path / "plain", PlanOptions(1, seed=0))
    build_plan(manifest, buckets, tmp_path / "blocked", PlanOptions(1, seed=0, container_block=2))
    plain, blocked = containers_per_batch(tmp_path / "plain"), containers_per_batch(tmp_path / "blocked")
    # 60 containers, ~25 rows of a bucket each, batches of ~10-20 rows: a block holds a batch
    assert blocked.max() <= 2 * 2 < plain.mean()


def test_container_block_is_checked() -> None:
    with pytest.raises(OptionError, match="container_block"):
        PlanOptions(2, container_block=0)
    with pytest.raises(OptionError, match="container_block"):
        PlanOptions(2, container_block=True)  # type: ignore[arg-type]


def test_replan_lays_the_rest_out_in_container_blocks(tmp_path: Path) -> None:
    """``replan --container-block``: the re-plan verifies, holds every unseen row of the epoch once,
    and each re-planned rank-step touches at most two blocks' containers."""
    from dataprep.cli import app
    from tests.training._consumer import invoke, runner

    manifest, buckets = corpus(tmp_path, 3000, 60, seed=3)
    paths = pl.read_parquet(manifest)["audio_path"].to_numpy()
    build_plan(manifest, buckets, tmp_path / "plain", PlanOptions(2, seed=0))
    k = 5
    res = invoke("replan", str(tmp_path / "plain"), "--at-step", str(k), "--world-size", "1", "--manifest",
                 str(manifest), "--container-block", "2", "-o", str(tmp_path / "re"))
    assert "container blocks of 2" in res
    invoke("verify", str(tmp_path / "re"), "--manifest", str(manifest))
    invoke("replan", str(tmp_path / "plain"), "--at-step", str(k), "--world-size", "1", "--manifest",
           str(manifest), "-o", str(tmp_path / "re-plain"))

    def per_step(plan: Path) -> tuple[np.ndarray, np.ndarray]:
        t = PlanShard(plan, 0).read_epoch(0, ["rows"]).column("rows").combine_chunks()
        rows, off = t.values.to_numpy(), t.offsets.to_numpy()
        return rows, np.array([len(set(paths[rows[a:b]])) for a, b in zip(off[:-1], off[1:]) if b > a])

    rows, blocked = per_step(tmp_path / "re")
    assert blocked.max() <= 2 * 2 < per_step(tmp_path / "re-plain")[1].mean()
    seen = [r for rk in range(2) for pb in PlanShard(tmp_path / "plain", rk).iter_batches(0) if pb.step < k
            for r in pb.rows.tolist()]
    assert sorted(rows.tolist() + seen) == list(range(3000))  # every row of epoch 0 exactly once
    plain = runner.invoke(app, ["replan", str(tmp_path / "plain"), "--at-step", str(k), "--manifest", str(manifest),
                                "--container-block", "0", "-o", str(tmp_path / "bad")])
    assert plain.exit_code != 0 and "--container-block" in plain.output and "Traceback" not in plain.output


def test_replan_keeps_the_parents_container_blocks(tmp_path: Path) -> None:
    from dataprep.planning import replan

    manifest, buckets = corpus(tmp_path, 400, 20, seed=5)
    build_plan(manifest, buckets, tmp_path / "p", PlanOptions(2, seed=0, container_block=3))
    kept = replan(tmp_path / "p", manifest, tmp_path / "r", PlanOptions(1), at_step=1)
    assert kept.extra["container_blocks"]["containers"] == 3
    plain = build_plan(manifest, buckets, tmp_path / "q", PlanOptions(2, seed=0))
    assert "container_blocks" not in replan(tmp_path / "q", manifest, tmp_path / "s", PlanOptions(1), at_step=1).extra
    assert "container_blocks" not in plain.extra
