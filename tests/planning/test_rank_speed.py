"""Ranks of different speeds (``--rank-speed``): every row still exactly once per epoch, equal
steps on every rank, no batch above its bucket's batch size; a slower rank's batches are
cheaper, so the predicted straggler (speeds applied) drops against the plan that ignores them;
held in memory or spilled, the same bytes; equal speeds are the ordinary plan byte for byte;
replan keeps the speeds; plan.json records them, simulate applies them; bad speeds are
one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bucketing.speeds import RankSpeeds, speed_batches, speed_steps
from dataprep.planning.build import build_plan
from dataprep.planning.options import PlanOptions, parse_rank_speed
from dataprep.planning.replan import replan
from dataprep.planning.simulate import plan_steps_report
from dataprep.testing import write_plan_inputs
from manifests.errors import DataprepError, OptionError
from manifests.plan_files import PlanShard
from manifests.plan_meta import read_plan_meta
from tests.training._consumer import run_cli

W, EPOCHS = 4, 2
SPEEDS = (1.0, 0.5, 1.0, 0.7)


class Inputs:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.manifest, self.buckets = write_plan_inputs(root, 1500, seed=5, num_buckets=5)
        self.plain = root / "plain"
        build_plan(self.manifest, self.buckets, self.plain, PlanOptions(world_size=W, epochs=EPOCHS))
        self.fast = root / "speeds"
        self.meta = build_plan(self.manifest, self.buckets, self.fast,
                               PlanOptions(world_size=W, epochs=EPOCHS, rank_speed=SPEEDS, row_group_steps=4))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Inputs:
    return Inputs(tmp_path_factory.mktemp("rank_speed"))


def _batches(plan: Path) -> dict[int, list]:
    meta = read_plan_meta(plan)
    return {r: list(PlanShard(plan, r)) for r in range(meta.world_size)}


def _check_coverage(plan: Path, num_rows: int, epochs: range) -> None:
    meta = read_plan_meta(plan)
    by_rank = _batches(plan)
    assert len({len(b) for b in by_rank.values()}) == 1  # equal steps
    for e in epochs:
        rows = np.concatenate([b.rows for bs in by_rank.values() for b in bs if b.epoch == e])
        assert np.array_equal(np.sort(rows), np.arange(num_rows))  # every row once
    caps = meta.batch_sizes
    assert all(len(b.rows) <= caps[b.bucket] and len(b.rows) > 0 for bs in by_rank.values() for b in bs)


def test_every_row_once_per_epoch_equal_steps_and_batches_within_their_cap(inputs: Inputs) -> None:
    _check_coverage(inputs.fast, 1500, range(EPOCHS))
    assert inputs.meta.extra["rank_speed"] == list(SPEEDS)


def test_slower_ranks_get_cheaper_batches_and_the_straggler_drops(inputs: Inputs) -> None:
    by_rank = _batches(inputs.fast)
    mean = {r: np.mean([len(b.rows) for b in bs]) for r, bs in by_rank.items()}
    assert mean[1] < mean[3] < min(mean[0], mean[2])  # 0.5 < 0.7 < 1
    aware = plan_steps_report(inputs.fast)  # the plan's own speeds
    unaware = plan_steps_report(inputs.plain, speed=SPEEDS)
    assert aware.straggler < 0.5 * unaware.straggler, (aware, unaware)
    # and the speeds are what the report applies: alike, the speed-aware plan looks unbalanced
    assert plan_steps_report(inputs.fast, speed=[1.0] * W).straggler > aware.straggler


def test_spilled_gives_the_same_bytes(inputs: Inputs, tmp_path: Path) -> None:
    meta = build_plan(inputs.manifest, inputs.buckets, tmp_path / "spilled",
                      PlanOptions(world_size=W, epochs=EPOCHS, rank_speed=SPEEDS, row_group_steps=4,
                                  memory_limit=1 << 16))
    assert meta.plan_hash == inputs.meta.plan_hash


def test_equal_speeds_are_the_ordinary_plan(inputs: Inputs, tmp_path: Path) -> None:
    plain = read_plan_meta(inputs.plain)
    same = build_plan(inputs.manifest, inputs.buckets, tmp_path / "same",
                      PlanOptions(world_size=W, epochs=EPOCHS, rank_speed=(0.8,) * W))
    assert same.plan_hash == plain.plan_hash and "rank_speed" not in same.extra


@pytest.mark.parametrize(("world_size", "speeds"), [(None, None), (2, (1.0, 0.6)), (None, (1.0, 1.0, 1.0, 0.5))])
def test_replan_keeps_or_takes_speeds_and_every_row_once(inputs: Inputs, tmp_path: Path, world_size: int | None,
                                                         speeds: tuple[float, ...] | None) -> None:
    at = inputs.meta.steps_per_epoch[0] + 3  # inside epoch 1
    out = tmp_path / "re"
    W2 = world_size or W
    meta = replan(inputs.fast, inputs.manifest, out, PlanOptions(world_size=W2, rank_speed=speeds), at_step=at)
    assert meta.extra["rank_speed"] == list(speeds or SPEEDS)
    by_rank = _batches(out)
    assert len({len(b) for b in by_rank.values()}) == 1
    seen = np.concatenate([b.rows for r, bs in _batches(inputs.fast).items() for b in bs
                           if b.epoch == 1 and b.step < at])
    rest = np.concatenate([b.rows for bs in by_rank.values() for b in bs if b.epoch == 1])
    assert np.array_equal(np.sort(np.concatenate([seen, rest])), np.arange(1500))


def test_speed_batches_property() -> None:
    rng = np.random.default_rng(0)
    laid = 0
    for _ in range(40):
        Wr = int(rng.integers(2, 9))
        speeds = RankSpeeds.of(rng.choice([1.0, 0.8, 0.5, 0.3], Wr).tolist() + [1.0, 0.5])
        if speeds is None:
            continue
        K = int(rng.integers(1, 7))
        counts = rng.integers(0, 400, K)
        bs = rng.integers(1, 40, K)
        got = speed_batches(counts, bs, speeds)
        if got is None:  # the rows cannot fill whole steps (e.g. batch size 1, rows not a multiple of W)
            continue
        laid += 1
        nb, sizes, klass = got
        bb = np.repeat(np.arange(K), nb)
        assert np.array_equal(np.bincount(bb, weights=sizes, minlength=K).astype(np.int64), counts)
        assert (sizes >= 1).all() and (sizes <= bs[bb]).all()
        steps, S = speed_steps(klass, sizes.astype(np.float64), speeds)
        assert np.array_equal(np.bincount(klass, minlength=speeds.ranks.shape[0]), speeds.ranks * S)
        assert np.array_equal(np.bincount(steps, minlength=S), np.full(S, speeds.world_size))
    assert laid >= 25


def test_rank_speed_sources_and_errors(tmp_path: Path) -> None:
    assert parse_rank_speed("1,1,0.5") == (1.0, 1.0, 0.5)
    (tmp_path / "s.txt").write_text("1\n0.5, 0.25  # slow node\n", encoding="utf-8")
    assert parse_rank_speed(str(tmp_path / "s.txt")) == (1.0, 0.5, 0.25)
    (tmp_path / "cm.json").write_text(json.dumps({"rank_speed": [1.0, 2.0, None]}), encoding="utf-8")
    assert parse_rank_speed(str(tmp_path / "cm.json")) == (1.0, 0.5, 1.0)  # time factors inverted
    (tmp_path / "bad.txt").write_text("1\nfast\n", encoding="utf-8")
    with pytest.raises(DataprepError, match=r"bad.txt:2: not a speed"):
        parse_rank_speed(str(tmp_path / "bad.txt"))
    with pytest.raises(DataprepError, match="neither speeds"):
        parse_rank_speed(str(tmp_path / "absent"))
    with pytest.raises(OptionError, match="one speed per rank"):
        PlanOptions(world_size=3, rank_speed=(1.0, 0.5))
    with pytest.raises(OptionError, match="> 0"):
        PlanOptions(world_size=2, rank_speed=(1.0, 0.0))
    with pytest.raises(OptionError, match="balanced steps"):
        PlanOptions(world_size=2, rank_speed=(1.0, 0.5), balance=0)


def test_cli_plan_simulate_and_bad_speeds(inputs: Inputs, tmp_path: Path) -> None:
    cli = run_cli

    res = cli("plan-batches", str(inputs.manifest), "-b", str(inputs.buckets), "-w", str(W), "-e", str(EPOCHS),
              "--rank-speed", ",".join(map(str, SPEEDS)), "--row-group-steps", "4", "-o", str(tmp_path / "p"))
    assert res.returncode == 0, res.stderr
    assert read_plan_meta(tmp_path / "p").plan_hash == inputs.meta.plan_hash
    res = cli("simulate", str(inputs.plain), "--world-sizes", "2", "--rank-speed", ",".join(map(str, SPEEDS)))
    assert res.returncode == 0 and "predicted straggler" in res.stdout, res.stderr
    res = cli("replan", str(tmp_path / "p"), "--at-step", "3", "-o", str(tmp_path / "r"), "-w", "2", "-m",
              str(inputs.manifest))
    assert res.returncode == 0, res.stderr
    assert "rank_speed" not in read_plan_meta(tmp_path / "r").extra  # another world size: speeds not carried
    for bad, message in (("1,0.5", "--rank-speed: must give one speed per rank"),
                         ("1,1,1,-1", "--rank-speed: must be > 0")):
        res = cli("plan-batches", str(inputs.manifest), "-b", str(inputs.buckets), "-w", str(W),
                  "--rank-speed", bad, "-o", str(tmp_path / "bad"))
        assert res.returncode != 0 and message in res.stderr and "Traceback" not in res.stderr, res.stderr
