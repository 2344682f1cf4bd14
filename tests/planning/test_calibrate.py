"""``dataprep calibrate``: the cost model and each rank's speed recovered from synthetic step
timings of a known model; plan-batches / replan --cost-model plan with exactly that model and
cost-equal sizes by default; bad
step logs and cost-model files are one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from bucketing.costmodel import CostModel
from dataprep.planning.build import build_plan
from dataprep.planning.calibrate import calibrate, read_cost_model, write_calibration
from dataprep.planning.options import PlanOptions
from dataprep.planning.replan import replan
from dataprep.testing import write_plan_inputs
from manifests.errors import DataprepError
from manifests.plan_files import PlanShard
from tests.training._consumer import run_cli

W = 4
TRUE = CostModel(overhead=0.05, per_frame=3e-6, per_frame2=1e-9, per_token=4e-5, per_token2=1e-7)


class Run:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.manifest, self.buckets = write_plan_inputs(root, 3000, seed=1, num_buckets=6)
        self.plan = root / "plan"
        build_plan(self.manifest, self.buckets, self.plan, PlanOptions(world_size=W, epochs=2))

    def log(self, path: Path, speeds: list[float], noise: float, seed: int = 0) -> Path:
        """Step times of :data:`TRUE` times each rank's speed, with relative noise."""
        rng = np.random.default_rng(seed)
        frames = []
        for r in range(W):
            t = PlanShard(self.plan, r).read(columns=["step", "size", "max_duration", "max_tokens"])
            sec = TRUE.step_time(t["size"].to_numpy(), t["max_duration"].to_numpy(), t["max_tokens"].to_numpy())
            sec = sec * speeds[r] * (1 + rng.normal(0, noise, sec.shape[0]))
            frames.append(pl.DataFrame({"rank": np.full(sec.shape[0], r), "step": t["step"].to_numpy(),
                                        "forward_backward_s": sec * 0.9, "optimizer_s": sec * 0.1,
                                        "data_wait_s": np.full(sec.shape[0], 0.001)}))
        pl.concat(frames).write_parquet(path)
        return path


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return Run(tmp_path_factory.mktemp("calibrate"))


def _predictions(run: Run, cost: CostModel) -> np.ndarray:
    t = PlanShard(run.plan, 0).read(columns=["size", "max_duration", "max_tokens"])
    return cost.step_time(t["size"].to_numpy(), t["max_duration"].to_numpy(), t["max_tokens"].to_numpy())


def test_a_known_model_is_recovered_from_its_timings(run: Run, tmp_path: Path) -> None:
    cal = calibrate(run.plan, run.log(tmp_path / "log.parquet", [1.0] * W, noise=0.01))
    truth, got = _predictions(run, TRUE), _predictions(run, cal.cost)
    assert np.median(np.abs(got - truth) / truth) < 0.01
    assert cal.median_rel_error < 0.015 and cal.rows == W * PlanShard(run.plan, 0).num_steps
    assert cal.cost.overhead == pytest.approx(TRUE.overhead, rel=0.1)
    assert cal.cost.per_frame2 == pytest.approx(TRUE.per_frame2, rel=0.1)
    assert all(s == pytest.approx(1.0, abs=0.01) for s in cal.rank_speed)
    assert cal.data_wait_share == pytest.approx(0.001 / (0.001 + np.mean(truth)), rel=0.3)


def test_a_slow_rank_is_found_and_does_not_bend_the_model(run: Run, tmp_path: Path) -> None:
    cal = calibrate(run.plan, run.log(tmp_path / "log.parquet", [1.0, 1.0, 1.0, 1.5], noise=0.01))
    assert cal.rank_speed[3] == pytest.approx(1.5, rel=0.02)
    assert all(s == pytest.approx(1.0, abs=0.02) for s in cal.rank_speed[:3])
    truth, got = _predictions(run, TRUE), _predictions(run, cal.cost)
    assert np.median(np.abs(got - truth) / truth) < 0.02


def _same(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir())
    return names == sorted(p.name for p in b.iterdir()) and all((a / n).read_bytes() == (b / n).read_bytes()
                                                                 for n in names)


def test_plan_batches_and_replan_use_the_calibrated_model_with_cost_equal_sizes(run: Run, tmp_path: Path) -> None:
    slow = CostModel(overhead=0.5, per_frame=1e-7, per_frame2=5e-9, per_token=1e-3, per_token2=1e-6)
    logged = run.log(tmp_path / "log.parquet", [1.0] * W, noise=0.0)
    cal = calibrate(run.plan, logged)
    out = tmp_path / "costmodel.json"
    write_calibration(cal, run.plan, logged, out)
    assert read_cost_model(out) == cal.cost
    obj = json.loads(out.read_text())
    obj["cost_model"] = {**obj["cost_model"], **{k: getattr(slow, k) for k in obj["cost_model"]}}
    out.write_text(json.dumps(obj))
    plan = ["plan-batches", str(run.manifest), "-b", str(run.buckets), "--world-size", str(W), "--epochs", "2",
            "--cost-model", str(out)]
    assert (res := run_cli(*plan, "-o", str(tmp_path / "cli"))).returncode == 0, res.stderr
    assert (res := run_cli(*plan, "--no-cost-equal", "-o", str(tmp_path / "cli-sizes"))).returncode == 0, res.stderr
    build_plan(run.manifest, run.buckets, tmp_path / "lib", PlanOptions(world_size=W, epochs=2, cost=slow,
                                                                       cost_equal=True))
    build_plan(run.manifest, run.buckets, tmp_path / "lib-sizes", PlanOptions(world_size=W, epochs=2, cost=slow))
    build_plan(run.manifest, run.buckets, tmp_path / "default", PlanOptions(world_size=W, epochs=2))
    assert _same(tmp_path / "cli", tmp_path / "lib") and _same(tmp_path / "cli-sizes", tmp_path / "lib-sizes")
    assert not _same(tmp_path / "default", tmp_path / "lib-sizes") and not _same(tmp_path / "lib", tmp_path / "lib-sizes")
    # cost-equal: every bucket's full batch predicted the same time (within one utterance), never above its cap
    buckets = json.loads((tmp_path / "lib" / "plan.json").read_text())["buckets"]
    caps = [b["batch_size"] for b in json.loads(run.buckets.read_text())["buckets"]]
    assert [b["memory_batch_size"] for b in buckets] == caps and all(b["batch_size"] <= c for b, c in zip(buckets, caps))
    sizes = np.asarray([b["batch_size"] for b in buckets])
    md, mt = np.asarray([b["max_duration"] for b in buckets]), np.asarray([b["max_tokens"] for b in buckets])
    full, one_more = slow.step_time(sizes, md, mt), slow.step_time(sizes + 1, md, mt)
    assert one_more.min() > full.max() * 0.999 or (sizes == caps).any()
    assert run_cli("verify", str(tmp_path / "lib"), "--manifest", str(run.manifest)).returncode == 0
    replan_args = ["replan", str(run.plan), "--at-step", "5", "--manifest", str(run.manifest), "--cost-model", str(out)]
    assert (res := run_cli(*replan_args, "-o", str(tmp_path / "re-cli"))).returncode == 0, res.stderr
    replan(run.plan, run.manifest, tmp_path / "re-lib", PlanOptions(world_size=W, cost=slow, cost_equal=True), at_step=5)
    assert _same(tmp_path / "re-cli", tmp_path / "re-lib")
    assert json.loads((tmp_path / "re-lib" / "plan.json").read_text())["buckets"] == buckets
    assert (res := run_cli("verify", str(tmp_path / "re-lib"), "--manifest", str(run.manifest))).returncode == 0, res.stderr
    assert (res := run_cli(*replan_args, "--no-cost-equal", "-o", str(tmp_path / "re-cli-sizes"))).returncode == 0
    replan(run.plan, run.manifest, tmp_path / "re-lib-sizes", PlanOptions(world_size=W, cost=slow), at_step=5)
    assert _same(tmp_path / "re-cli-sizes", tmp_path / "re-lib-sizes")
    res = run_cli("calibrate", str(run.plan), str(logged), "-o", str(tmp_path / "again.json"))
    assert res.returncode == 0, res.stderr
    assert "median error" in res.stdout and "slowest rank" in res.stdout


def test_bad_logs_and_cost_models_are_one_line_errors(run: Run, tmp_path: Path) -> None:
    good = pl.read_parquet(run.log(tmp_path / "log.parquet", [1.0] * W, noise=0.0))
    cases = {
        "no-step.parquet": (good.drop("step"), "integer `step` column"),
        "no-seconds.parquet": (good.drop("optimizer_s"), "needs `step_s`"),
        "dup.parquet": (pl.concat([good, good.head(1)]), "logged 2 times"),
        "nan.parquet": (good.with_columns(pl.when(pl.col("step") == 3).then(float("nan"))
                                          .otherwise(pl.col("optimizer_s")).alias("optimizer_s")), "not finite"),
        "rank.parquet": (good.with_columns(pl.when(pl.col("rank") == 1).then(W).otherwise(pl.col("rank"))
                                           .alias("rank")), f"the plan {W} ranks"),
        "step.parquet": (good.with_columns(pl.col("step") + 10_000), "is not in the plan"),
        "few.parquet": (good.head(3), "at least"),
    }
    for name, (frame, match) in cases.items():
        frame.write_parquet(tmp_path / name)
        with pytest.raises(DataprepError, match=match):
            calibrate(run.plan, tmp_path / name)
    (tmp_path / "text.parquet").write_text("rank,step\n")
    with pytest.raises(DataprepError, match="not a readable Parquet"):
        calibrate(run.plan, tmp_path / "text.parquet")
    for text, match in (("{", "not a JSON"), ('{"kind": "x"}', "not a cost model"),
                        ('{"kind": "speech-dataprep cost model", "cost_model": {"overhead": 1}}', "expected the keys"),
                        (json.dumps({"kind": "speech-dataprep cost model", "cost_model": {
                            **{k: 0.0 for k in CostModel.names()}, "frame_shift": True}}), "expected a number")):
        (tmp_path / "cm.json").write_text(text)
        with pytest.raises(DataprepError, match=match):
            read_cost_model(tmp_path / "cm.json")


def test_times_without_a_visible_overhead_still_give_a_model_with_one(run: Run, tmp_path: Path) -> None:
    """A CPU run whose per-step overhead drowns in noise: the fit keeps an overhead > 0 (a cost
    model needs one) instead of refusing the log."""
    rng = np.random.default_rng(3)
    frames = []
    for r in range(W):
        t = PlanShard(run.plan, r).read(columns=["step", "size", "max_duration"])
        sec = t["size"].to_numpy() * t["max_duration"].to_numpy() * 1e-3 * (1 + rng.normal(0, 0.05, t.num_rows))
        frames.append(pl.DataFrame({"rank": np.full(t.num_rows, r), "step": t["step"].to_numpy(), "step_s": sec}))
    pl.concat(frames).write_parquet(tmp_path / "log.parquet")
    cal = calibrate(run.plan, tmp_path / "log.parquet")
    assert cal.cost.overhead > 0 and cal.median_rel_error < 0.1
