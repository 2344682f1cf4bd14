"""`dataprep plan-batches --balance` and `dataprep replan` as a user runs them: balanced shards
by default (exactly once, equal steps, plan.json's balance report), --balance 0 one bucket per
step with no balance entry, and re-plans
W -> W2 at several steps that, with the parent's consumed batches, cover every utterance of
every epoch exactly once."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from bucketing.dynres import target_frames
from dataprep.cli import app
from dataprep.testing import write_plan_inputs
from manifests.plan_files import shard_name
from manifests.plan_meta import read_plan_meta

runner = CliRunner()
EPOCHS = 2


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, Path]:
    return write_plan_inputs(tmp_path_factory.mktemp("replan-in"), 1500, seed=3, num_buckets=5)


def invoke(*args: str) -> str:
    res = runner.invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return res.output


def plan(inputs, out: Path, world: int, balance: str) -> Path:
    if not out.exists():
        invoke("plan-batches", str(inputs[0]), "--buckets", str(inputs[1]), "--world-size", str(world),
               "--epochs", str(EPOCHS), "--balance", balance, "-o", str(out), "--row-group-steps", "3")
    return out


def batches(plan_dir: Path) -> pl.DataFrame:
    """All batches of a plan: rank, epoch, step, bucket, rows."""
    meta = read_plan_meta(plan_dir)
    frames = [pl.from_arrow(pq.read_table(plan_dir / shard_name(r), columns=["epoch", "step", "bucket", "rows"]))
              .with_columns(pl.lit(r).alias("rank")) for r in range(meta.world_size)]
    return pl.concat(frames)


def test_balanced_plan_cli(inputs, tmp_path: Path) -> None:
    out = tmp_path / "plan"
    text = invoke("plan-batches", str(inputs[0]), "--buckets", str(inputs[1]), "--world-size", "8", "-o", str(out))
    assert "same-bucket steps" in text and "straggler" in text
    meta = read_plan_meta(out)  # balanced by default
    assert meta.balance is not None and meta.balance.tolerance == 0.05 and 0 < meta.balance.fill <= 1
    explicit = tmp_path / "explicit"
    invoke("plan-batches", str(inputs[0]), "--buckets", str(inputs[1]), "--world-size", "8", "--balance", "0.05",
           "-o", str(explicit))
    assert read_plan_meta(explicit).plan_hash == meta.plan_hash  # the default is --balance 0.05
    child = tmp_path / "child"
    invoke("replan", str(out), "--at-step", "2", "--world-size", "3", "--manifest", str(inputs[0]), "-o", str(child))
    cm = read_plan_meta(child)
    assert cm.balance is not None and cm.balance.tolerance == 0.05  # a re-plan keeps the parent's tolerance
    b = batches(out)
    steps = b.group_by("rank").agg(pl.col("step").sort())
    assert len({tuple(s) for s in steps["step"].to_list()}) == 1  # same steps on every rank
    rows = np.concatenate(b["rows"].to_list())
    assert np.array_equal(np.sort(rows), np.arange(1500))  # carry on, nothing left out: every row once
    zero = tmp_path / "zero"
    invoke("plan-batches", str(inputs[0]), "--buckets", str(inputs[1]), "--world-size", "8", "--balance", "0",
           "-o", str(zero))
    assert "balance" not in json.loads((zero / "plan.json").read_text())  # --balance 0: no balance entry
    z = batches(zero)
    assert (z.group_by("step").agg(pl.col("bucket").n_unique())["bucket"] == 1).all()  # one bucket per step
    assert read_plan_meta(zero).num_steps > meta.num_steps


def test_bad_balance_is_one_line(inputs, tmp_path: Path) -> None:
    res = runner.invoke(app, ["plan-batches", str(inputs[0]), "--buckets", str(inputs[1]), "--world-size", "2",
                              "--balance", "-1", "-o", str(tmp_path / "p")])
    assert res.exit_code == 2 and "--balance: must be >= 0" in res.output


@pytest.mark.parametrize("balance", ["0", "0.05"])
@pytest.mark.parametrize("w,w2", [(4, 2), (4, 3), (2, 5)])
def test_replan_covers_every_utterance_once_per_epoch(inputs, tmp_path_factory, w: int, w2: int, balance: str) -> None:
    parent = plan(inputs, tmp_path_factory.mktemp("parent") / f"p{w}-{balance}", w, balance)
    pm = read_plan_meta(parent)
    old = batches(parent)
    n = pm.steps_per_epoch[0]
    for k in sorted({1, n // 2, n - 2, n + 1, pm.num_steps - 3}):
        child = tmp_path_factory.mktemp("child") / f"k{k}"
        invoke("replan", str(parent), "--at-step", str(k), "--world-size", str(w2), "-o", str(child),
               "--manifest", str(inputs[0]))
        cm = read_plan_meta(child)
        assert cm.replan is not None and cm.replan.at_step == k and cm.replan.parent_plan_hash == pm.plan_hash
        assert cm.world_size == w2 and cm.first_step == k
        assert (cm.balance.tolerance if cm.balance is not None else 0.0) == float(balance)  # the parent's
        new = batches(child)
        steps = new.group_by("rank").agg(pl.col("step").sort())
        assert len(steps) == w2 and len({tuple(s) for s in steps["step"].to_list()}) == 1
        assert new["step"].min() == k and new["step"].max() == cm.num_steps - 1
        assert sorted(set(new["step"].to_list())) == list(range(k, cm.num_steps))
        for e in range(EPOCHS):
            consumed = old.filter((pl.col("epoch") == e) & (pl.col("step") < k))["rows"].to_list()
            later = new.filter(pl.col("epoch") == e)["rows"].to_list()
            seen = Counter(int(x) for part in consumed + later for x in part)
            assert set(seen.values()) == {1}, (k, e)
            assert set(seen) == set(range(1500)), (k, e)


def test_replan_errors_are_one_line(inputs, tmp_path: Path) -> None:
    parent = plan(inputs, tmp_path / "p", 2, "0")
    n = read_plan_meta(parent).num_steps
    for args, msg in ((["--at-step", str(n), "--manifest", str(inputs[0])], "holds steps"),
                      (["--at-step", "-1", "--manifest", str(inputs[0])], "holds steps"),
                      (["--at-step", "1"], "give --manifest"),
                      (["--at-step", "1", "--manifest", str(inputs[1])], "")):
        res = runner.invoke(app, ["replan", str(parent), "--world-size", "3", "-o", str(tmp_path / "c"), *args])
        assert res.exit_code == 2 and msg in res.output and len(res.output.strip().splitlines()) == 1, res.output


def test_simulate_and_padding_report_fill_and_balance(inputs, tmp_path: Path) -> None:
    p = plan(inputs, tmp_path / "p", 4, "0.05")
    text = invoke("simulate", str(p), "--world-sizes", "2")
    assert "same-bucket steps" in text and "straggler" in text
    out = tmp_path / "pad.json"
    invoke("padding", str(inputs[0]), "--buckets", str(inputs[1]), "--world-sizes", "1,4", "--json", str(out))
    rows = json.loads(out.read_text())["steps"]
    assert [(r["world_size"], r["balance"]) for r in rows] == [(1, 0.0), (1, 0.05), (4, 0.0), (4, 0.05)]
    bal4 = rows[3]
    assert bal4["fill"] == pytest.approx(bal4["bound"]) and bal4["dropped"] == 0
    assert rows[2]["steps"] >= bal4["steps"]
    meta = read_plan_meta(p)
    assert bal4["steps"] == meta.steps_per_epoch[0]  # padding predicts what plan-batches makes
    res = runner.invoke(app, ["padding", str(inputs[0]), "--buckets", str(inputs[1]), "--world-sizes", "0"])
    assert res.exit_code == 2 and "--world-sizes" in res.output


@pytest.mark.parametrize("G,balance", [(1, "0"), (2, "0"), (4, "0"), (2, "0.05"), (4, "0.05")])
def test_sync_groups_cover_each_utterance_once_and_simulate_strategies(inputs, tmp_path: Path, G: int,
                                                                      balance: str) -> None:
    out = tmp_path / "p"
    invoke("plan-batches", str(inputs[0]), "--buckets", str(inputs[1]), "--world-size", "4", "--sync-group", str(G),
           "--balance", balance, "-o", str(out))
    meta = read_plan_meta(out)
    assert (meta.balance is not None) == (balance != "0")
    assert meta.sync_group == (G if G < 4 else None)
    assert ("sync_group" in json.loads((out / "plan.json").read_text())) == (G < 4)
    b = batches(out)
    rows = np.concatenate(b["rows"].to_list())
    assert np.array_equal(np.sort(rows), np.arange(1500))
    per_step = b.with_columns((pl.col("rank") // G).alias("group")).group_by(["step", "group"]).agg(
        pl.col("bucket").n_unique().alias("n"))
    if balance == "0":
        assert (per_step["n"] == 1).all()  # one bucket per step inside each group
    else:  # each group draws the W-rank plan's balanced steps, in its own order
        assert meta.balance is not None and meta.balance.same_bucket < 1 and (per_step["n"] > 1).any()
    text = invoke("simulate", str(out), "--world-sizes", "2", "--strategy", "sync,adpsgd,hybrid", "--group-size", "2",
                  "--slow-rank", "1=1.5")
    for s in ("sync", "adpsgd", "hybrid", "staleness", "rank 1 x1.5"):
        assert s in text
    bad = runner.invoke(app, ["simulate", str(out), "--strategy", "sync", "--slow-rank", "x"])
    assert bad.exit_code == 2 and "RANK=FACTOR" in bad.output


def test_sync_group_must_divide_the_world_size(inputs, tmp_path: Path) -> None:
    res = runner.invoke(app, ["plan-batches", str(inputs[0]), "--buckets", str(inputs[1]), "--world-size", "4",
                              "--sync-group", "3", "-o", str(tmp_path / "p")])
    assert res.exit_code == 2 and "divide the world size" in res.output


def test_balanced_plan_with_dynamic_resolution(inputs, tmp_path: Path) -> None:
    out = tmp_path / "p"
    invoke("plan-batches", str(inputs[0]), "--buckets", str(inputs[1]), "--world-size", "4", "--balance", "0.05",
           "--dynamic-resolution", "-o", str(out))
    meta = json.loads((out / "plan.json").read_text())
    per_bucket = meta["dynamic_resolution"]["per_bucket"]
    b = batches(out)
    sizes = b.with_columns(pl.col("rows").list.len().alias("n")).group_by("bucket").agg(pl.col("n").sum())
    # per-bucket figures follow each batch's own bucket (buckets differ across ranks at a step)
    got = {r["bucket"]: r["utterances"] for r in per_bucket if r["utterances"]}
    assert got == dict(zip(sizes["bucket"].to_list(), sizes["n"].to_list()))
    assert "balance" in meta


def _covers_once(parent: Path, child: Path, k: int) -> None:
    """The parent's steps < k and the child's steps hold every row exactly once per epoch."""
    old, new = batches(parent), batches(child)
    for e in range(EPOCHS):
        consumed = old.filter((pl.col("epoch") == e) & (pl.col("step") < k))["rows"].to_list()
        later = new.filter(pl.col("epoch") == e)["rows"].to_list()
        seen = Counter(int(x) for part in consumed + later for x in part)
        assert set(seen.values()) == {1} and set(seen) == set(range(1500)), (k, e)


@pytest.mark.parametrize("balance", ["0", "0.05"])
@pytest.mark.parametrize("w2,g2,want", [(2, None, 2), (6, None, 2), (8, "4", 4), (3, "1", 1)])
def test_replan_keeps_sync_groups(inputs, tmp_path_factory, balance: str, w2: int, g2: str | None, want: int) -> None:
    parent = tmp_path_factory.mktemp("sg") / "p"
    invoke("plan-batches", str(inputs[0]), "--buckets", str(inputs[1]), "--world-size", "4", "--sync-group", "2",
           "--epochs", str(EPOCHS), "--balance", balance, "-o", str(parent))
    pm = read_plan_meta(parent)
    for k in sorted({1, pm.steps_per_epoch[0] - 1, pm.num_steps - 2}):
        child = tmp_path_factory.mktemp("sgc") / f"k{k}"
        invoke("replan", str(parent), "--at-step", str(k), "--world-size", str(w2), "-o", str(child),
               "--manifest", str(inputs[0]), *(["--sync-group", g2] if g2 else []))
        cm = read_plan_meta(child)
        assert cm.sync_group == (want if want < w2 else None)
        _covers_once(parent, child, k)
        b = batches(child)
        steps = b.group_by("rank").agg(pl.col("step").sort())
        assert len({tuple(s) for s in steps["step"].to_list()}) == 1  # equal steps on every rank
        if balance == "0":  # one bucket per step inside each group
            per = b.with_columns((pl.col("rank") // want).alias("g")).group_by(["step", "g"]).agg(
                pl.col("bucket").n_unique().alias("n"))
            assert (per["n"] == 1).all()
            if want < w2 and cm.num_steps - k >= 8:  # groups draw their steps in their own orders
                by_group = b.filter(pl.col("rank") % want == 0).sort("step").group_by("rank").agg(pl.col("bucket"))
                assert len({tuple(x) for x in by_group["bucket"].to_list()}) > 1


def test_replan_sync_group_must_divide_the_new_world_size(inputs, tmp_path: Path) -> None:
    parent = tmp_path / "p"
    invoke("plan-batches", str(inputs[0]), "--buckets", str(inputs[1]), "--world-size", "4", "--sync-group", "2",
           "-o", str(parent))
    res = runner.invoke(app, ["replan", str(parent), "--at-step", "1", "--world-size", "3", "--manifest",
                              str(inputs[0]), "-o", str(tmp_path / "c")])
    assert res.exit_code == 2 and "--sync-group" in res.output and len(res.output.strip().splitlines()) == 1


@pytest.mark.parametrize("balance", ["0", "0.05"])
def test_replan_keeps_dynamic_resolution(inputs, tmp_path_factory, balance: str) -> None:
    parent = tmp_path_factory.mktemp("dr") / "p"
    invoke("plan-batches", str(inputs[0]), "--buckets", str(inputs[1]), "--world-size", "4", "--balance", balance,
           "--epochs", str(EPOCHS), "--dynamic-resolution", "--max-rate", "120", "-o", str(parent))
    pm = read_plan_meta(parent)
    for k, w2 in ((1, 2), (pm.steps_per_epoch[0] + 1, 3)):
        child = tmp_path_factory.mktemp("drc") / f"k{k}"
        invoke("replan", str(parent), "--at-step", str(k), "--world-size", str(w2), "-o", str(child),
               "--manifest", str(inputs[0]))
        _covers_once(parent, child, k)
        dr = json.loads((child / "plan.json").read_text())["dynamic_resolution"]
        assert dr["config"] == pm.extra["dynamic_resolution"]["config"] and dr["config"]["max_rate"] == 120.0
        t = pl.concat([pl.from_arrow(pq.read_table(child / shard_name(r), columns=["max_duration", "target_frames"]))
                       for r in range(w2)])
        want = target_frames(t["max_duration"].to_numpy(), 100.0)
        assert np.array_equal(t["target_frames"].to_numpy(), want)  # every batch: its longest at the base rate
        assert sum(r["utterances"] for r in dr["per_bucket"]) == sum(
            len(x) for x in batches(child)["rows"].to_list())
