"""``replan --exclude``: from the step on, the excluded rows are never seen again and every other
row exactly once per epoch (the rest of the step's epoch: exactly the unseen ones); steps before
it stay the parent's; a later re-plan keeps the exclusions; held in memory or spilled, the same
bytes; ``verify`` checks them; bad exclusion files are one-line errors."""

from __future__ import annotations

import collections
import subprocess
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dataprep.planning.build import build_plan, spills_to_disk
from dataprep.planning.exclude import check_exclusions, read_excluded_ids
from dataprep.planning.options import PlanOptions
from dataprep.planning.replan import replan
from dataprep.testing import write_plan_inputs
from manifests.errors import DataprepError
from manifests.plan_files import PlanShard
from manifests.plan_meta import read_plan_meta
from tests.training._consumer import run_cli

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


def test_bad_exclusion_files_are_refused_in_one_line(parent: Parent, tmp_path: Path) -> None:
    (tmp_path / "latin1.txt").write_bytes(b"u00001\ncaf\xe9\n")
    pl.DataFrame({"name": ["x"]}).write_parquet(tmp_path / "noid.parquet")
    write_ids(tmp_path / "none.txt", ["zzz", "yyy"])
    (tmp_path / "empty.txt").write_text("\n\n")
    for name, match in (("latin1.txt", r"latin1.txt:2: not UTF-8"), ("noid.parquet", "without an `id` column"),
                        ("none.txt", "none of its 2 ids"), ("empty.txt", "lists no ids"), ("missing.txt", "no such")):
        with pytest.raises(DataprepError, match=match):
            replan(parent.plan, parent.manifest, tmp_path / "re", PlanOptions(world_size=2), at_step=1,
                   exclude=tmp_path / name)


@pytest.fixture(scope="module")
def weighted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    root = tmp_path_factory.mktemp("wexclude")
    manifest, buckets = write_plan_inputs(root, 400, seed=2, num_buckets=3, corpora=3)
    plan = root / "plan"
    build_plan(manifest, buckets, plan, PlanOptions(world_size=2, epochs=3, weights={"c0": 1.0, "c1": 2.0, "c2": 4.0}))
    return manifest, plan, read_plan_meta(plan).extra["weights"]


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at=st.floats(0.05, 0.95), share=st.floats(0.01, 0.3), seed=st.integers(0, 2**16))
@example(at=0.0, share=0.1, seed=1)  # from step 0: the first epoch drawn again
def test_a_weighted_replan_excludes_and_draws_each_quota_again(weighted: tuple[Path, Path, dict],
                                                                tmp_path_factory: pytest.TempPathFactory,
                                                                at: float, share: float, seed: int) -> None:
    """Steps before K unchanged; no excluded row at or after K; every later epoch gives each
    corpus exactly its quota from its remaining rows (all of them before any repeats, or each
    row floor(k) or ceil(k) times); the rest of K's epoch is its unseen rows less the excluded."""
    manifest, plan, recorded = weighted
    tmp = tmp_path_factory.mktemp("wre")
    m = pl.read_parquet(manifest, columns=["id", "corpus"])
    rng = np.random.default_rng(seed)
    gone = set(rng.choice(m.height, max(1, int(share * m.height)), replace=False).tolist())
    meta = read_plan_meta(plan)
    k = int(at * (meta.num_steps - 1))
    out = replan(plan, manifest, tmp / "re", PlanOptions(world_size=2), at_step=k,
                 exclude=write_ids(tmp / "x.txt", [m["id"][i] for i in sorted(gone)]))
    assert not [r for e, st_, rows in batches(tmp / "re") for r in rows if r in gone]
    assert [c["quota"] for c in out.extra["weights"]["corpora"]] == [c["quota"] for c in recorded["corpora"]]
    quota = {c["corpus"]: c["quota"] for c in recorded["corpora"]}
    corpus_of = m["corpus"].to_list()
    e0 = max(e for e, s0 in enumerate(meta.first_step_of_epoch) if s0 <= k)
    parent_rest = collections.Counter(r for e, st_, rows in batches(plan) if e == e0 and st_ >= k for r in rows)
    new = batches(tmp / "re")
    boundary = k == meta.first_step_of_epoch[e0]  # then K's epoch is drawn whole again
    if not boundary:
        assert collections.Counter(r for e, _, rows in new if e == e0 for r in rows) == collections.Counter(
            {r: n for r, n in parent_rest.items() if r not in gone})
    for e in range(e0 + (not boundary), meta.epochs):
        taken = collections.Counter(r for ep, _, rows in new if ep == e for r in rows)
        for name, q in quota.items():
            left = [i for i in range(m.height) if corpus_of[i] == name and i not in gone]
            times = [taken.get(i, 0) for i in left]
            assert sum(times) == q  # exactly the quota
            lo = q // len(left)
            assert set(times) <= {lo, lo + 1}  # every remaining row floor or ceil times: all before repeats
    res = run_cli("verify", str(tmp / "re"), "--manifest", str(manifest))
    assert res.returncode == 0, res.stderr


def test_a_weighted_corpus_excluded_whole_is_one_line(weighted: tuple[Path, Path, dict], tmp_path: Path) -> None:
    manifest, plan, _ = weighted
    m = pl.read_parquet(manifest, columns=["id", "corpus"])
    ids = m.filter(pl.col("corpus") == "c1")["id"].to_list()
    with pytest.raises(DataprepError, match="every row of corpus 'c1' is excluded; its quota of"):
        replan(plan, manifest, tmp_path / "re", PlanOptions(world_size=2), at_step=1,
               exclude=write_ids(tmp_path / "w.txt", ids))


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd)


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
