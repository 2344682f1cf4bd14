"""`dataprep plan-batches` and `dataprep simulate` as a user runs them: shards checked across
ranks (coverage, equal steps, capacity, bucket bounds; balanced steps by default, one bucket per
step with ``--balance 0``), byte-identical determinism across thread counts, resumption through
the reader, one-line user errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from bucketing.costmodel import CostModel
from dataprep.cli import app
from dataprep.testing import write_plan_inputs
from manifests.buckets_file import read_buckets
from manifests.hash_cache import manifest_hash
from manifests.plan_files import open_shard, read_plan_json

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()
W = 4


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, Path]:
    n = 3000
    return write_plan_inputs(tmp_path_factory.mktemp("plan-in"), n, seed=11, num_buckets=6,
                             ids=[f"spk{i % 37}-utt{i:05d}" for i in range(n)])


def _plan(inputs, out: Path, *extra: str):
    manifest, buckets = inputs
    return runner.invoke(app, ["plan-batches", str(manifest), "--buckets", str(buckets), "--world-size", str(W),
                               "--seed", "0", "--epochs", "3", "-o", str(out), "--row-group-steps", "4", *extra])


@pytest.fixture(scope="module")
def plan(inputs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plan-out") / "plan"
    res = _plan(inputs, out)
    assert res.exit_code == 0, res.output
    for text in ("steps per epoch", "predicted padding", "fallbacks", "plan hash"):
        assert text in res.stdout
    assert read_plan_json(out)["plan_hash"] in res.stdout
    return out


@pytest.fixture(scope="module")
def plan0(inputs, tmp_path_factory) -> Path:
    """The same plan with one bucket per step (``--balance 0``)."""
    out = tmp_path_factory.mktemp("plan-out") / "plan0"
    res = _plan(inputs, out, "--balance", "0")
    assert res.exit_code == 0, res.output
    return out


@pytest.mark.parametrize("which", ["plan", "plan0"])
def test_shards_hold_every_property_across_ranks(which, inputs, request) -> None:
    plan = request.getfixturevalue(which)
    manifest, buckets = inputs
    meta = read_plan_json(plan)
    df = pl.read_parquet(manifest, columns=["id", "duration"])
    ids = df["id"].to_list()
    n = len(ids)
    spec = read_buckets(buckets).buckets
    bs = np.array([b.batch_size for b in spec])
    max_d = np.array([b.max_duration for b in spec])
    tables = [pq.read_table(plan / f"rank-{r:05d}.parquet") for r in range(W)]
    assert meta["inputs"]["manifest"]["content_hash"] == manifest_hash(manifest)
    assert len({t.num_rows for t in tables}) == 1 and tables[0].num_rows == meta["num_steps"]  # equal steps
    for t in tables:
        assert t.column("step").to_pylist() == list(range(meta["num_steps"]))
        assert t.schema.field("epoch").type == "int32" and t.schema.field("bucket").type == "int32"
    buckets_by_rank = np.stack([t.column("bucket").to_numpy() for t in tables])
    same = (buckets_by_rank == buckets_by_rank[0]).all(0)
    if which == "plan0":
        assert same.all() and "balance" not in meta  # --balance 0: one bucket per step on every rank
    else:  # the default: balanced steps, counted exceptions, reported same-bucket share
        bal = meta["balance"]
        assert bal["tolerance"] == 0.05
        t = CostModel().step_time(*(np.stack([tb.column(c).to_numpy() for tb in tables])
                                    for c in ("size", "max_duration", "max_tokens")))
        assert int((t.max(0) > 1.05 * t.mean(0)).sum()) == bal["unbalanced_steps"]
        assert bal["same_bucket"] == pytest.approx(same.mean())
        assert 0 < same.mean() < 1  # this corpus allows some one-bucket steps at W = 4, not all
        assert meta["num_steps"] < read_plan_json(request.getfixturevalue("plan0"))["num_steps"]  # fuller batches
    assert meta["fallbacks"]["broken_sync_steps"] == 0
    for e in range(3):
        seen = []
        for t in tables:
            sel = t.filter(t.column("epoch").to_numpy() == e)
            rows = sel.column("rows").to_pylist()
            sizes = np.array([len(r) for r in rows])
            b = sel.column("bucket").to_numpy()
            assert (sizes >= 1).all() and (sizes <= bs[b]).all()  # capacity
            assert (df["duration"].to_numpy()[np.concatenate(rows)] <= np.repeat(max_d[b], sizes)).all()  # bounds
            assert sel.column("ids").to_pylist() == [[ids[i] for i in r] for r in rows]
            seen += [i for r in rows for i in r]
        assert sorted(seen) == list(range(n))  # coverage: exactly once per epoch, across ranks
    orders = [[i for r in tables[0].filter(tables[0].column("epoch").to_numpy() == e).column("rows").to_pylist()
               for i in r] for e in range(3)]
    assert orders[0] != orders[1] != orders[2]  # a different order every epoch
    assert meta["steps_per_epoch"] and sum(meta["steps_per_epoch"]) == meta["num_steps"]
    assert 0 < meta["padding"]["audio"] < 0.5 and 0 <= meta["padding"]["tokens"] < 0.9


def test_dynamic_resolution_adds_target_frames_to_the_same_batches(plan, inputs, tmp_path) -> None:
    out = tmp_path / "plan-dynres"
    res = _plan(inputs, out, "--dynamic-resolution", "--max-rate", "120")
    assert res.exit_code == 0, res.output
    assert "dynamic resolution (100 Hz base, 70-120 Hz" in res.stdout and "fell back" in res.stdout
    meta, plain = read_plan_json(out), read_plan_json(plan)
    dr = meta["dynamic_resolution"]
    assert "dynamic_resolution" not in plain and dr["config"]["max_rate"] == 120.0
    assert dr["frame_padding"] < dr["frame_padding_base"] and dr["fallback_share"] == 0.0
    assert len(dr["per_bucket"]) == len(plain["buckets"])
    assert sum(b["utterances"] for b in dr["per_bucket"]) == dr["utterances"]
    for r in range(W):
        t = pq.read_table(out / f"rank-{r:05d}.parquet")
        old = pq.read_table(plan / f"rank-{r:05d}.parquet")
        assert "target_frames" not in old.column_names and t.schema.field("target_frames").type == "int32"
        assert t.drop(["target_frames"]).equals(old)  # the same batches, one more column
        want = 1 + np.floor(t.column("max_duration").to_numpy() * 100 + 1e-6).astype(np.int64)
        assert t.column("target_frames").to_numpy().tolist() == want.tolist()
    assert [b.target_frames for b in open_shard(out, 0).iter_batches(3)] == \
        pq.read_table(out / "rank-00000.parquet").column("target_frames").to_pylist()[3:]
    bad = _plan(inputs, tmp_path / "bad", "--dynamic-resolution", "--floor-rate", "80")
    assert bad.exit_code == 2 and bad.output.startswith("error: --min-rate: must be >= 80")


def test_resumption_through_the_reader(plan) -> None:
    meta = read_plan_json(plan)
    for rank in (0, W - 1):
        shard = open_shard(plan, rank)
        full = [(b.step, b.bucket, b.ids, b.rows.tolist()) for b in shard]
        for k in (0, 1, 5, meta["steps_per_epoch"][0], meta["num_steps"] - 1, meta["num_steps"]):
            assert [(b.step, b.bucket, b.ids, b.rows.tolist()) for b in shard.iter_batches(k)] == full[k:]


def test_byte_identical_across_runs_and_thread_counts(plan, inputs, tmp_path) -> None:
    manifest, buckets = inputs
    code = ("import sys; from dataprep.cli import app; sys.argv=['dataprep','plan-batches',*sys.argv[1:]]; app()")
    outs = []
    for i, threads in enumerate(("1", "2")):
        out = tmp_path / f"plan{i}"
        env = dict(os.environ, POLARS_MAX_THREADS=threads, OMP_NUM_THREADS=threads, ARROW_NUM_THREADS=threads,
                   PYTHONPATH=str(REPO))
        subprocess.run([sys.executable, "-c", code, str(manifest), "--buckets", str(buckets), "--world-size",
                        str(W), "--seed", "0", "--epochs", "3", "-o", str(out), "--row-group-steps", "4"],
                       check=True, env=env, capture_output=True)
        outs.append(out)
    names = sorted(p.name for p in plan.iterdir())
    assert names == ["plan.json"] + [f"rank-{r:05d}.parquet" for r in range(W)]
    for name in names:
        ref = (plan / name).read_bytes()
        assert all((o / name).read_bytes() == ref for o in outs), name


def test_seed_changes_the_plan(inputs, tmp_path, plan) -> None:
    res = _plan(inputs, tmp_path / "p", "--seed", "1")
    assert res.exit_code == 0
    assert read_plan_json(tmp_path / "p")["plan_hash"] != read_plan_json(plan)["plan_hash"]


def test_buckets_without_batch_size_is_a_one_line_error(inputs, tmp_path) -> None:
    manifest, buckets = inputs
    obj = json.loads(buckets.read_text())
    del obj["buckets"][2]["batch_size"]
    (tmp_path / "b.json").write_text(json.dumps(obj))
    res = runner.invoke(app, ["plan-batches", str(manifest), "--buckets", str(tmp_path / "b.json"),
                              "--world-size", "2", "-o", str(tmp_path / "p")])
    assert res.exit_code == 2
    assert "error:" in res.stderr and "bucket 2 has no batch_size" in res.stderr and "fit-buckets" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "p").exists()


def test_more_ranks_than_utterances_is_a_user_error(inputs, tmp_path) -> None:
    manifest, buckets = inputs
    res = runner.invoke(app, ["plan-batches", str(manifest), "--buckets", str(buckets), "--world-size", "5000",
                              "-o", str(tmp_path / "p")])
    assert res.exit_code == 2 and "--world-size: must be <= the number of rows" in res.stderr  # refused before any shard is opened
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "p").exists()


def test_simulate_command(plan, inputs) -> None:
    manifest, _ = inputs
    res = runner.invoke(app, ["simulate", str(plan), "--manifest", str(manifest), "--world-sizes", "2,16"])
    assert res.exit_code == 0, res.output
    assert "idle_sync" in res.stdout and "speedup" in res.stdout
    lines = [ln.split() for ln in res.stdout.splitlines() if ln.split() and ln.split()[0].isdigit()]
    assert [int(c[0]) for c in lines] == [W, 2, 16]
    idle_sync, idle_unsync = (float(x.rstrip("%")) for x in lines[0][3:5])
    assert idle_sync < idle_unsync  # at the plan's own layout, synchronization helps
    res = runner.invoke(app, ["simulate", str(plan), "--coef", "bogus=1"])
    assert res.exit_code == 2 and "bogus=1" in res.stderr
