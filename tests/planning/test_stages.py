"""Staged blends (``--stage EPOCHS:weights.yaml``): each epoch holds exactly its stage's quotas
(every row at most once per epoch where a corpus is under-sampled: an exact multiset draw);
``verify`` checks each stage's quotas; a re-plan at a stage (or epoch) boundary for the same
world size gives the original's remaining plan batch for batch, inside an epoch every later
epoch is the original's and the rest of that epoch is exactly what no rank has seen; held in
memory or spilled, the same bytes; bad stages are one-line errors."""

from __future__ import annotations

import collections
from pathlib import Path

import polars as pl
import pytest

from dataprep.planning.build import build_plan
from dataprep.planning.options import PlanOptions
from dataprep.planning.replan import replan
from dataprep.planning.stages import parse_stage
from dataprep.planning.weights import check_quotas
from dataprep.testing import write_plan_inputs
from manifests.errors import DataprepError, OptionError
from manifests.plan_files import PlanShard
from manifests.plan_meta import read_plan_meta
from tests.training._consumer import run_cli

W = 3
STAGES = ((2, {"c0": 1.0, "c1": 1.0, "c2": 1.0}), (1, {"c0": 5.0, "c1": 1.0, "c2": 0.5}))


class Inputs:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.manifest, self.buckets = write_plan_inputs(root, 1200, seed=4, num_buckets=5, corpora=3)
        self.plan = root / "plan"
        self.meta = build_plan(self.manifest, self.buckets, self.plan,
                               PlanOptions(world_size=W, epochs=3, stages=STAGES, row_group_steps=4))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Inputs:
    return Inputs(tmp_path_factory.mktemp("stages"))


def batches(plan: Path, start: int = 0) -> list[tuple[int, int, int, list[int]]]:
    meta = read_plan_meta(plan)
    return [(r, b.epoch, b.step, b.rows.tolist()) for r in range(meta.world_size) for b in PlanShard(plan, r)
            if b.step >= start]


def test_each_epoch_holds_its_stages_quotas(inputs: Inputs) -> None:
    stages = inputs.meta.extra["stages"]
    assert [s["epochs"] for s in stages] == [[0, 1], [2, 2]]
    assert stages[1]["first_step"] == inputs.meta.first_step_of_epoch[2]
    q0 = [c["quota"] for c in stages[0]["weights"]["corpora"]]
    q1 = [c["quota"] for c in stages[1]["weights"]["corpora"]]
    assert q0 != q1 and q1[0] > q0[0]
    assert check_quotas(inputs.plan, inputs.manifest) == 3  # every epoch, its own stage's quotas
    corpus = pl.read_parquet(inputs.manifest, columns=["corpus"])["corpus"].to_list()
    for e, stage in ((0, 0), (1, 0), (2, 1)):  # each row floor(k) or ceil(k) times, k = quota / rows
        taken = collections.Counter(x for _, ep, _, rs in batches(inputs.plan) if ep == e for x in rs)
        for c in stages[stage]["weights"]["corpora"]:
            own = [r for r in range(1200) if corpus[r] == c["corpus"]]
            f, rest = divmod(c["quota"], len(own))
            assert {taken[r] for r in own} <= {f, f + (rest > 0)}
            assert sum(taken[r] for r in own) == c["quota"]


def test_spilled_gives_the_same_bytes(inputs: Inputs, tmp_path: Path) -> None:
    meta = build_plan(inputs.manifest, inputs.buckets, tmp_path / "spilled",
                      PlanOptions(world_size=W, epochs=3, stages=STAGES, row_group_steps=4, memory_limit=1 << 16))
    assert meta.plan_hash == inputs.meta.plan_hash


@pytest.mark.parametrize("where", ["stage", "epoch", "inside"])
def test_replan_gives_the_remaining_plan(inputs: Inputs, tmp_path: Path, where: str) -> None:
    first = inputs.meta.first_step_of_epoch
    at = {"stage": first[2], "epoch": first[1], "inside": first[1] + 5}[where]
    out = tmp_path / "re"
    meta = replan(inputs.plan, inputs.manifest, out, PlanOptions(world_size=W), at_step=at)
    def shape(stages: list[dict]) -> list[tuple]:
        return [(s["epochs"], s["first_step"], [c["quota"] for c in s["weights"]["corpora"]]) for s in stages]

    assert shape(meta.extra["stages"]) == shape(inputs.meta.extra["stages"])
    old, new = batches(inputs.plan, at), batches(out, at)
    if where != "inside":
        assert new == old  # the original's remaining plan, batch for batch
    else:
        e0 = 1
        assert [b for b in new if b[1] > e0] == [b for b in old if b[1] > e0]
        rest = collections.Counter(x for b in new if b[1] == e0 for x in b[3])
        assert rest == collections.Counter(x for b in old if b[1] == e0 for x in b[3])
    check_quotas(out, inputs.manifest)


def test_bad_stages_are_one_line_errors(inputs: Inputs, tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("c0: 1\nc1: 2\nc2: 1\n", encoding="utf-8")
    (tmp_path / "b.yaml").write_text("c0: 1\nc1: -2\n", encoding="utf-8")
    assert parse_stage(f"2:{tmp_path / 'a.yaml'}") == (2, {"c0": 1.0, "c1": 2.0, "c2": 1.0})
    with pytest.raises(DataprepError, match="b.yaml: c1: expected a weight > 0"):
        parse_stage(f"1:{tmp_path / 'b.yaml'}")
    with pytest.raises(OptionError, match="EPOCHS:weights.yaml"):
        parse_stage("two:a.yaml")
    with pytest.raises(OptionError, match="must be the plan's epochs"):
        PlanOptions(world_size=W, epochs=2, stages=STAGES)
    with pytest.raises(OptionError, match="same corpora"):
        PlanOptions(world_size=W, epochs=2, stages=((1, {"c0": 1.0}), (1, {"c1": 1.0})))
    with pytest.raises(OptionError, match="not both"):
        PlanOptions(world_size=W, epochs=3, stages=STAGES, weights={"c0": 1.0})
    res = run_cli("plan-batches", str(inputs.manifest), "-b", str(inputs.buckets), "-w", str(W), "--stage",
                  f"2:{tmp_path / 'a.yaml'}", "--stage", f"1:{tmp_path / 'a.yaml'}", "-o", str(tmp_path / "cli"))
    assert res.returncode == 0 and "stage: epochs 2-2" in res.stdout, res.stderr
    res = run_cli("plan-batches", str(inputs.manifest), "-b", str(inputs.buckets), "-w", str(W), "--stage",
                  f"1:{tmp_path / 'b.yaml'}", "-o", str(tmp_path / "bad"))
    assert res.returncode != 0 and "b.yaml" in res.stderr and "Traceback" not in res.stderr
