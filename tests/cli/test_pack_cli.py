"""`dataprep plan-batches --pack N` as a user runs it, and the properties of packed plans: every
row once per epoch (or left out with its reason), no sequence over N, ``cu_seqlens`` the
members' token-equivalents, equal steps on every rank, the same bytes whatever the number of
threads, resumption, re-plans on another world size, `verify` and `simulate`."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from bucketing.packing import token_equivalents
from dataprep.cli import app
from dataprep.planning import PlanOptions, build_plan
from dataprep.testing import write_plan_inputs
from manifests.errors import ManifestError
from manifests.manifest_write import write_manifest
from manifests.plan_files import check_packed, open_shard, shard_name
from manifests.plan_meta import read_plan_meta

runner = CliRunner()
N = 1024


@pytest.fixture(scope="module")
def blend(tmp_path_factory) -> tuple[Path, Path]:
    """1,200 speech rows, 400 text-only rows (duration 0) and one row over N."""
    folder = tmp_path_factory.mktemp("pack-in")
    kept, buckets = write_plan_inputs(folder, 1200, seed=5, num_buckets=5)
    speech = pl.read_parquet(kept)
    rng = np.random.default_rng(0)
    text = speech.head(400).with_columns(
        pl.format("text-{}", pl.col("id")).alias("id"), pl.lit(0.0).alias("duration"),
        pl.Series("num_tokens", rng.integers(5, 200, 400), dtype=pl.Int32), pl.lit(0.0).alias("tps"))
    long = speech.head(1).with_columns(pl.lit("too-long").alias("id"), pl.lit(N + 5, pl.Int32).alias("num_tokens"),
                                       pl.lit(0.0).alias("duration"))
    path = folder / "blend.parquet"
    write_manifest(pl.concat([speech, text, long], how="vertical_relaxed"), path)
    return path, buckets


def invoke(*args: str) -> str:
    res = runner.invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return res.output


def check_plan(plan: Path, manifest: Path) -> None:
    """Every property a packed plan promises, read from its files."""
    meta = read_plan_meta(plan)
    man = pl.read_parquet(manifest)
    pack = meta.extra["pack"]
    te = token_equivalents(man["duration"].to_numpy(), man["num_tokens"].to_numpy(), pack["audio_token_rate"])
    left = sorted(r for rows in meta.allocation["left_out"].values() for r in rows)
    assert all(te[r] > pack["max_tokens"] for r in meta.allocation["left_out"].get("exceeds_pack", []))
    seen: dict[int, list[int]] = {}
    steps = set()
    for r in range(meta.world_size):
        shard = open_shard(plan, r)
        assert shard.version == 3
        steps.add(shard.num_steps)
        for b in shard:
            seen.setdefault(b.epoch, []).extend(b.rows.tolist())
            assert (np.diff(b.sequence) >= 0).all() and b.sequence[0] == 0
            assert set(np.diff(b.sequence).tolist()) <= {0, 1}  # members of a sequence contiguous
            assert b.cu_seqlens[0] == 0 and b.cu_seqlens.shape[0] == b.sequence[-1] + 2
            sizes = np.bincount(b.sequence, weights=te[b.rows])
            assert (np.diff(b.cu_seqlens) == sizes).all() and (sizes <= pack["max_tokens"]).all()
            assert b.ids == man["id"].to_numpy()[b.rows].tolist()
    assert len(steps) == 1  # equal steps on every rank
    for e in range(meta.epochs):  # every row once per epoch, or left out with its reason
        assert sorted(seen[e] + left) == list(range(man.height))


def test_packed_plan_cli(blend, tmp_path: Path) -> None:
    out = tmp_path / "plan"
    text = invoke("plan-batches", str(blend[0]), "-b", str(blend[1]), "-w", "4", "-e", "2", "--pack", str(N),
                  "-o", str(out), "--row-group-steps", "4")
    assert "packed:" in text and "slot use" in text and "1 row left out" in text
    check_plan(out, blend[0])
    meta = read_plan_meta(out)
    assert meta.extra["pack"]["max_tokens"] == N and meta.extra["pack"]["audio_token_rate"] == 12.5
    assert meta.extra["pack"]["text_rows"] == 400
    assert meta.allocation["left_out"] == {"exceeds_pack": [1600]}
    assert "ok" in invoke("verify", str(out))
    sim = invoke("simulate", str(out), "--world-sizes", "2")
    assert "packed sequences of at most 1,024 token-equivalents" in sim
    # resumption: from step k, exactly the batches of an uninterrupted run
    shard = open_shard(out, 1)
    whole = list(shard)
    k = whole[len(whole) // 2].step
    assert [(b.step, b.rows.tolist(), b.cu_seqlens.tolist()) for b in shard.iter_batches(k)] == \
        [(b.step, b.rows.tolist(), b.cu_seqlens.tolist()) for b in whole if b.step >= k]
    # a re-plan on another world size: consumed parent batches plus the re-plan cover each epoch once
    re = tmp_path / "replan"
    invoke("replan", str(out), "--at-step", str(k), "-w", "3", "-o", str(re), "--manifest", str(blend[0]))
    meta2 = read_plan_meta(re)
    assert meta2.extra["pack"]["max_tokens"] == N
    assert "ok" in invoke("verify", str(re))
    left = [r for rows in meta.allocation["left_out"].values() for r in rows]
    for e in range(2):
        rows = [x for r in range(4) for b in open_shard(out, r) if b.epoch == e and b.step < k for x in b.rows]
        rows += [x for r in range(3) for b in open_shard(re, r) if b.epoch == e for x in b.rows]
        assert sorted(rows + left) == list(range(1601))
    for extra, flag in ((["--exclude", str(blend[0])], "--exclude"), (["--cost-equal"], "--cost-equal")):
        res = runner.invoke(app, ["replan", str(out), "--at-step", str(k), "-o", str(tmp_path / "r2"),
                                  "--manifest", str(blend[0]), *extra])
        assert res.exit_code == 2 and flag in res.output and "packed plan" in res.output, res.output


def _shard_bytes(plan: Path) -> list[str]:
    meta = read_plan_meta(plan)
    return [hashlib.sha256((plan / shard_name(r)).read_bytes()).hexdigest() for r in range(meta.world_size)] + \
        [hashlib.sha256((plan / "plan.json").read_bytes()).hexdigest()]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs two cores to write shards on two threads")
def test_packed_plans_are_the_same_bytes_whatever_the_threads(blend, tmp_path: Path) -> None:
    cores = os.sched_getaffinity(0)
    options = PlanOptions(world_size=4, pack=N, epochs=2, seed=7)
    build_plan(blend[0], blend[1], tmp_path / "many", options)
    try:
        os.sched_setaffinity(0, {min(cores)})  # one core: one writer thread
        build_plan(blend[0], blend[1], tmp_path / "one", options)
    finally:
        os.sched_setaffinity(0, cores)
    assert _shard_bytes(tmp_path / "many") == _shard_bytes(tmp_path / "one")


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(world=st.integers(1, 5), cap=st.sampled_from([400, 1024, 3000]), seed=st.integers(0, 3),
       per_batch=st.one_of(st.none(), st.integers(1, 3)), balance=st.sampled_from([0.0, 0.05]))
def test_packed_plan_properties(blend, tmp_path_factory, world: int, cap: int, seed: int,
                                per_batch: int | None, balance: float) -> None:
    out = tmp_path_factory.mktemp("prop") / "plan"
    build_plan(blend[0], blend[1], out, PlanOptions(world_size=world, pack=cap, seed=seed, balance=balance,
                                                   sequences_per_batch=per_batch))
    check_plan(out, blend[0])


def test_pack_options_are_checked(blend, tmp_path: Path) -> None:
    for extra, flag in ((["--sequences-per-batch", "2"], "--sequences-per-batch"),
                        (["--pack", "0"], "--pack"),
                        (["--pack", "64", "--audio-token-rate", "-1"], "--audio-token-rate"),
                        (["--pack", "64", "--dynamic-resolution"], "--dynamic-resolution")):
        res = runner.invoke(app, ["plan-batches", str(blend[0]), "-b", str(blend[1]), "-w", "2",
                                  "-o", str(tmp_path / "p"), *extra])
        assert res.exit_code == 2 and flag in res.output and "Traceback" not in res.output, res.output
        assert len(res.output.strip().splitlines()) == 1


def test_a_corrupt_packed_batch_is_refused_in_one_line(tmp_path: Path) -> None:
    def table(seq: list[list[int]], cu: list[list[int]]) -> pa.Table:
        return pa.table({"sequence": pa.array(seq, pa.list_(pa.int32())), "cu_seqlens": pa.array(cu, pa.list_(pa.int32()))})

    check_packed(table([[0, 0, 1], [0]], [[0, 5, 9], [0, 7]]), 10, tmp_path)
    for seq, cu in (([[0, 2]], [[0, 1, 2, 3]]), ([[1, 1]], [[0, 1, 2]]), ([[0, 1]], [[0, 4]]), ([[0]], [[0, 11]])):
        with pytest.raises(ManifestError, match="corrupt shard"):
            check_packed(table(seq, cu), 10, tmp_path)


def test_padding_compares_fixed_2d_and_packed_in_each_currency(blend, tmp_path: Path) -> None:
    kept = blend[0].parent / "kept.parquet"
    report = tmp_path / "padding.json"
    text = invoke("padding", str(kept), "-b", str(blend[1]), "--pack", str(N), "--json", str(report))
    assert "fixed vs 2D vs packed" in text and "token-equivalents" in text
    import json

    cur = json.loads(report.read_text())["currencies"]
    assert cur["max_tokens"] == N and set(cur["schemes"]) == {"fixed-30s", "fixed-40s", "2d", "packed"}
    packed = cur["schemes"]["packed"]
    assert packed["te_padding"] == packed["token_padding"] and 0 <= packed["te_padding"] < 0.2
    assert packed["num_rows"] + packed["excluded"] == 1200
    assert all(0 <= s["te_padding"] < 1 for s in cur["schemes"].values())
    res = runner.invoke(app, ["padding", str(kept), "-b", str(blend[1]), "--audio-token-rate", "25"])
    assert res.exit_code == 2 and "--audio-token-rate" in res.output and "--pack" in res.output
