"""``replan --exclude``: from the step on, the excluded rows are never seen again and every other
row exactly once per epoch (the rest of the step's epoch: exactly the unseen ones); steps before
it stay the parent's; a later re-plan keeps the exclusions; held in memory or spilled, the same
bytes; ``verify`` checks them; bad exclusion files are one-line errors."""

from __future__ import annotations

import collections
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from dataprep.planning.build import build_plan, spills_to_disk
from dataprep.planning.exclude import check_exclusions, read_excluded_ids
from dataprep.planning.options import PlanOptions
from dataprep.planning.replan import replan
from dataprep.testing import write_plan_inputs
from manifests.errors import DataprepError
from manifests.plan_files import PlanShard
from manifests.plan_meta import read_plan_meta

W, EPOCHS = 3, 3


class Parent:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.manifest, self.buckets = write_plan_inputs(root, 700, seed=11, num_buckets=4)
        self.plan = root / "plan"
        self.meta = build_plan(self.manifest, self.buckets, self.plan,
                               PlanOptions(world_size=W, epochs=EPOCHS, row_group_steps=3))
        self.ids = pl.read_parquet(self.manifest)["id"].to_list()


@pytest.fixture(scope="module")
def parent(tmp_path_factory: pytest.TempPathFactory) -> Parent:
    return Parent(tmp_path_factory.mktemp("exclude"))


def batches(plan: Path) -> list[tuple[int, int, list[int]]]:
    """(epoch, step, rows) of every batch of every rank."""
    meta = read_plan_meta(plan)
    return [(b.epoch, b.step, b.rows.tolist()) for r in range(meta.world_size) for b in PlanShard(plan, r)]


def write_ids(path: Path, ids: list[str]) -> Path:
    path.write_text("\n".join(ids) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(("at_frac", "world_size", "memory_limit"), [(0.5, 2, None), (0.2, 4, None),
                                                                      (0.5, 2, 1 << 16)])
def test_excluded_rows_are_never_seen_again_and_every_other_row_once_per_epoch(
        parent: Parent, tmp_path: Path, at_frac: float, world_size: int, memory_limit: int | None) -> None:
    rng = np.random.default_rng(int(at_frac * 100) + world_size)
    excluded_ids = sorted(rng.choice(parent.ids, 40, replace=False).tolist())
    excluded = {parent.ids.index(i) for i in excluded_ids}
    at = int(parent.meta.steps_per_epoch[0] * (1 + at_frac))  # inside epoch 1
    out = tmp_path / "re"
    meta = replan(parent.plan, parent.manifest, out,
                  PlanOptions(world_size=world_size, row_group_steps=3, memory_limit=memory_limit), at_step=at,
                  exclude=write_ids(tmp_path / "bad.txt", [*excluded_ids, "not-an-id"]))
    assert meta.extra["excluded"]["rows"] == sorted(excluded) and meta.extra["excluded"]["unknown_ids"] == 1
    before = [(e, s, rows) for e, s, rows in batches(parent.plan) if s < at]
    after = batches(out)
    assert min(s for _, s, _ in after) == at
    assert not excluded & {r for _, _, rows in after for r in rows}
    every = set(range(len(parent.ids)))
    for epoch in range(1, EPOCHS):
        seen = collections.Counter(r for e, _, rows in before + after if e == epoch for r in rows)
        assert max(seen.values()) == 1, "a row twice in one epoch"
        if epoch == 1:  # rows seen before the step stay seen; the unseen rest without the excluded
            seen_before = {r for e, _, rows in before if e == 1 for r in rows}
            assert set(seen) == every - (excluded - seen_before)
        else:
            assert set(seen) == every - excluded
    assert check_exclusions(out, meta) == (len(excluded), at)
    if memory_limit is not None:  # spilled to disk: the same plan as held in memory
        assert spills_to_disk(parent.manifest, PlanOptions(world_size=world_size, memory_limit=memory_limit))
        held = tmp_path / "held"
        replan(parent.plan, parent.manifest, held, PlanOptions(world_size=world_size, row_group_steps=3),
               at_step=at, exclude=tmp_path / "bad.txt")
        assert all((held / f.name).read_bytes() == f.read_bytes() for f in out.iterdir())


def test_a_later_replan_keeps_the_exclusions_and_adds_more(parent: Parent, tmp_path: Path) -> None:
    first_ids, more_ids = parent.ids[:5], parent.ids[5:8]
    at1 = parent.meta.steps_per_epoch[0] // 2
    one = tmp_path / "one"
    replan(parent.plan, parent.manifest, one, PlanOptions(world_size=2, row_group_steps=3), at_step=at1,
           exclude=write_ids(tmp_path / "a.txt", first_ids))
    at2 = read_plan_meta(one).num_steps - read_plan_meta(one).steps_per_epoch[-1]  # the last epoch's first step
    two, three = tmp_path / "two", tmp_path / "three"
    kept = replan(one, parent.manifest, two, PlanOptions(world_size=W, row_group_steps=3), at_step=at2)
    assert kept.extra["excluded"]["rows"] == list(range(5))
    both = replan(one, parent.manifest, three, PlanOptions(world_size=W, row_group_steps=3), at_step=at2,
                  exclude=write_ids(tmp_path / "b.txt", more_ids))
    assert both.extra["excluded"]["rows"] == list(range(8)) and both.extra["excluded"]["files"] == ["a.txt", "b.txt"]
    for plan, gone in ((two, set(range(5))), (three, set(range(8)))):
        rows = collections.Counter(r for _, _, rs in batches(plan) for r in rs)
        assert not gone & set(rows) and set(rows) == set(range(len(parent.ids))) - gone and max(rows.values()) == 1


def test_a_parquet_rejects_file_names_the_ids(parent: Parent, tmp_path: Path) -> None:
    path = tmp_path / "rejects.parquet"
    pl.DataFrame({"id": parent.ids[10:13], "reason": ["bad_audio"] * 3}).write_parquet(path)
    assert sorted(read_excluded_ids(path).to_list()) == parent.ids[10:13]
    meta = replan(parent.plan, parent.manifest, tmp_path / "re", PlanOptions(world_size=2), at_step=1, exclude=path)
    assert meta.extra["excluded"]["rows"] == [10, 11, 12]


def test_bad_exclusion_files_and_weighted_plans_are_refused_in_one_line(parent: Parent, tmp_path: Path) -> None:
    (tmp_path / "latin1.txt").write_bytes(b"u00001\ncaf\xe9\n")
    pl.DataFrame({"name": ["x"]}).write_parquet(tmp_path / "noid.parquet")
    write_ids(tmp_path / "none.txt", ["zzz", "yyy"])
    (tmp_path / "empty.txt").write_text("\n\n")
    for name, match in (("latin1.txt", r"latin1.txt:2: not UTF-8"), ("noid.parquet", "without an `id` column"),
                        ("none.txt", "none of its 2 ids"), ("empty.txt", "lists no ids"), ("missing.txt", "no such")):
        with pytest.raises(DataprepError, match=match):
            replan(parent.plan, parent.manifest, tmp_path / "re", PlanOptions(world_size=2), at_step=1,
                   exclude=tmp_path / name)
    manifest, buckets = write_plan_inputs(tmp_path / "w", 300, seed=2, num_buckets=3, corpora=2)
    plan = tmp_path / "wplan"
    build_plan(manifest, buckets, plan, PlanOptions(world_size=2, epochs=2, weights={"c0": 1.0, "c1": 2.0}))
    ids = pl.read_parquet(manifest)["id"].to_list()[:3]
    with pytest.raises(DataprepError, match="weighted plan is not supported"):
        replan(plan, manifest, tmp_path / "wre", PlanOptions(world_size=2), at_step=1,
               exclude=write_ids(tmp_path / "w.txt", ids))


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dataprep.cli", *args], capture_output=True, text=True, cwd=cwd)


def test_cli_replan_exclude_then_verify(parent: Parent, tmp_path: Path) -> None:
    ids = write_ids(tmp_path / "spike.txt", parent.ids[20:24])
    res = _cli("replan", str(parent.plan), "--at-step", "4", "--exclude", str(ids), "-o", str(tmp_path / "re"),
               cwd=parent.root)
    assert res.returncode == 0, res.stderr
    assert "excluded from step 4 on: 4 utterances" in res.stdout
    assert read_plan_meta(tmp_path / "re").world_size == W  # the plan's world size by default
    res = _cli("verify", str(tmp_path / "re"), cwd=parent.root)
    assert res.returncode == 0 and "no batch from step 4 on holds one of its 4 excluded utterances" in res.stdout, res.stderr
    res = _cli("replan", str(parent.plan), "--at-step", "4", "--exclude", str(ids), "-o", str(ids), cwd=parent.root)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
