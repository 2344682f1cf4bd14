"""``dataprep lookup``: a step traced to its utterances equals the plan's batch and the manifest's
rows on every rank and step; it seeks (a corrupt row group elsewhere in the shard is never read);
a re-plan's earlier steps, steps past the end, other ranks and another manifest are refused in one
line; the CLI prints tables or JSON lines."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from dataprep.integrations.lookup import UTTERANCE_FIELDS, lookup_step
from dataprep.planning.build import build_plan
from dataprep.planning.options import PlanOptions
from dataprep.planning.replan import replan
from dataprep.testing import write_plan_inputs
from manifests.errors import DataprepError
from manifests.plan_files import PlanShard, shard_name
from tests.training._consumer import run_cli

W = 3


class Plans:
    def __init__(self, root: Path) -> None:
        self.manifest, buckets = write_plan_inputs(root, 500, seed=5, num_buckets=4, corpora=3)
        self.plan = root / "plan"
        self.cache = root / "cache"
        self.meta = build_plan(self.manifest, buckets, self.plan,
                               PlanOptions(world_size=W, epochs=2, row_group_steps=2))
        self.at = self.meta.steps_per_epoch[0] // 2
        self.replanned = root / "replanned"
        self.rmeta = replan(self.plan, self.manifest, self.replanned, PlanOptions(world_size=2, row_group_steps=2),
                            at_step=self.at)


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> Plans:
    return Plans(tmp_path_factory.mktemp("lookup"))


def test_every_step_on_every_rank_is_the_plans_batch_with_the_manifests_rows(plans: Plans) -> None:
    manifest = pl.read_parquet(plans.manifest).with_row_index("row")
    by_id = {r["id"]: r for r in manifest.iter_rows(named=True)}
    seen: list[str] = []
    for rank in range(W):
        for pb in PlanShard(plans.plan, rank):
            (got,) = lookup_step(plans.plan, pb.step, [rank], cache_dir=plans.cache)
            assert (got.rank, got.step, got.epoch, got.step_in_epoch, got.bucket) == \
                (rank, pb.step, pb.epoch, pb.step_in_epoch, pb.bucket)
            assert [u["id"] for u in got.utterances] == pb.ids
            for u in got.utterances:
                row = by_id[u["id"]]
                assert set(u) == set(UTTERANCE_FIELDS)
                assert (u["corpus"], u["duration"], u["num_tokens"]) == (row["corpus"], row["duration"],
                                                                          row["num_tokens"])
            if pb.epoch == 0:
                seen += pb.ids
    assert sorted(seen) == sorted(manifest["id"].to_list())  # an epoch traced covers the corpus once


def test_every_rank_by_default_in_rank_order(plans: Plans) -> None:
    batches = lookup_step(plans.plan, 1, cache_dir=plans.cache)
    assert [b.rank for b in batches] == list(range(W))
    assert [[u["id"] for u in b.utterances] for b in batches] == \
        [next(PlanShard(plans.plan, r).iter_batches(1)).ids for r in range(W)]


def test_it_seeks_a_corrupt_row_group_elsewhere_is_never_read(plans: Plans, tmp_path: Path) -> None:
    plan = tmp_path / "plan"
    shutil.copytree(plans.plan, plan)
    shard = plan / shard_name(0)
    md = pq.ParquetFile(shard).metadata
    assert md.num_row_groups >= 3
    last = md.num_row_groups - 1
    chunk = md.row_group(last).column(md.schema.to_arrow_schema().get_field_index("ids"))
    data = bytearray(shard.read_bytes())  # garble the middle of the last group's ids pages: size and footer stay
    mid = chunk.data_page_offset + chunk.total_compressed_size // 2
    data[mid:mid + 8] = bytes(8 - i for i in range(8))
    shard.write_bytes(bytes(data))
    first_step_of_last = int(md.row_group(last).column(1).statistics.min)
    (ok,) = lookup_step(plan, 0, [0], plans.manifest, plans.cache)
    assert [u["id"] for u in ok.utterances] == next(PlanShard(plans.plan, 0).iter_batches(0)).ids
    with pytest.raises(DataprepError, match="corrupt row group"):
        lookup_step(plan, first_step_of_last, [0], plans.manifest, plans.cache)


def test_refusals_are_one_line(plans: Plans, tmp_path: Path) -> None:
    with pytest.raises(DataprepError, match="past the plan's last step"):
        lookup_step(plans.plan, plans.meta.num_steps, cache_dir=plans.cache)
    with pytest.raises(DataprepError, match="not below the plan's world size 3"):
        lookup_step(plans.plan, 0, [3], cache_dir=plans.cache)
    with pytest.raises(DataprepError, match="step"):
        lookup_step(plans.plan, -1, cache_dir=plans.cache)
    with pytest.raises(DataprepError, match="step"):
        lookup_step(plans.plan, True, cache_dir=plans.cache)  # type: ignore[arg-type]  # a bool is no step
    with pytest.raises(DataprepError, match=f"precedes this re-plan's first step {plans.at}"):
        lookup_step(plans.replanned, plans.at - 1, manifest=plans.manifest, cache_dir=plans.cache)
    other, _ = write_plan_inputs(tmp_path, 50, seed=9, num_buckets=2)
    with pytest.raises(DataprepError, match="differs from the plan's manifest"):
        lookup_step(plans.plan, 0, manifest=other, cache_dir=plans.cache)


def test_a_replanned_plan_is_traced_from_its_first_step(plans: Plans) -> None:
    batches = lookup_step(plans.replanned, plans.at, manifest=plans.manifest, cache_dir=plans.cache)
    assert [b.rank for b in batches] == [0, 1]
    assert [[u["id"] for u in b.utterances] for b in batches] == \
        [next(PlanShard(plans.replanned, r).iter_batches(plans.at)).ids for r in range(2)]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_cli("lookup", *args, cwd=cwd)


def test_cli_prints_a_table_or_json_lines_and_refuses_in_one_line(plans: Plans) -> None:
    root = plans.plan.parent
    res = _cli("plan", "--step", "2", "--json", cwd=root)
    assert res.returncode == 0, res.stderr
    lines = [json.loads(x) for x in res.stdout.splitlines()]
    assert [x["rank"] for x in lines] == list(range(W)) and all(x["step"] == 2 for x in lines)
    assert [u["id"] for u in lines[1]["utterances"]] == next(PlanShard(plans.plan, 1).iter_batches(2)).ids
    res = _cli("plan", "-s", "2", "-r", "1", cwd=root)
    assert res.returncode == 0, res.stderr
    assert "step 2, rank 1" in res.stdout and lines[1]["utterances"][0]["id"] in res.stdout
    assert "corpus" in res.stdout
    res = _cli("plan", "--step", str(plans.meta.num_steps), cwd=root)
    assert res.returncode == 2 and res.stderr.strip().startswith("error:") and len(res.stderr.splitlines()) == 1
    res = _cli("plan", "--step", "0", "--rank", "-1", cwd=root)
    assert res.returncode == 2 and "--rank" in res.stderr and len(res.stderr.splitlines()) == 1
