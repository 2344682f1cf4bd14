"""The step index: a shard opened at a step reads that one row group's metadata and gives the
batch the whole footer gives, for every step of a shard of many irregular row groups (more than
a short Thrift list header holds); a cached index that is damaged, garbage, pointed at another
group or unwritable is one log line and the right batch, never other data."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from manifests.hash_cache import file_facts
from manifests.plan_files import PlanShard, PlanWriter, shard_name, shard_table
from manifests.plan_meta import FileRef, ManifestRef, PlanMeta
from manifests.step_index import build_step_index, index_file

W, EPOCHS, STEPS, PARTS = 2, 2, 40, (17, 23)


def _meta() -> PlanMeta:
    return PlanMeta(manifest=ManifestRef("m.parquet", "0" * 64, 10_000), buckets_file=FileRef("b.json", "1" * 64),
                    buckets=[{"index": i, "max_duration": 10.0 * (i + 1), "batch_size": 5} for i in range(4)],
                    world_size=W, seed=0, epochs=EPOCHS, interleave="random", allocation={},
                    num_steps=EPOCHS * STEPS, steps_per_epoch=[STEPS] * EPOCHS, per_epoch=[], per_bucket=[],
                    padding={}, fallbacks={})


@pytest.fixture(scope="module", params=[False, True], ids=["v1", "target_frames"])
def plan(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """Each epoch written in two parts (17 and 23 steps) in row groups of 3 steps: 28 groups a
    shard, of 3 or 2 steps."""
    path = tmp_path_factory.mktemp("stepindex") / "plan"
    rng = np.random.default_rng(1)
    ids = pa.array([f"utt-{i:05d}" for i in range(10_000)])
    nxt = 0
    with PlanWriter(path, W, row_group_steps=3, target_frames=request.param) as w:
        for e in range(EPOCHS):
            for r in range(W):
                done = 0
                for n in PARTS:
                    sizes = rng.integers(1, 6, n)
                    offsets = np.r_[0, np.cumsum(sizes)]
                    rows = np.arange(nxt, nxt + offsets[-1], dtype=np.int64)
                    nxt += int(offsets[-1])
                    w.write(r, shard_table(epoch=e, first_step=e * STEPS + done, step_in_epoch=done,
                                           bucket=rng.integers(0, 4, n), offsets=offsets, rows=rows,
                                           ids=ids.take(pa.array(rows)), max_duration=sizes * 1.5,
                                           max_tokens=sizes * 2,
                                           target_frames=sizes * 10 if request.param else None))
                    done += n
        w.finish(_meta())
    return path


def test_every_step_seeks_its_one_row_group_and_gives_the_batch_of_the_whole_footer(plan: Path,
                                                                                    tmp_path: Path) -> None:
    for r in range(W):
        whole = PlanShard(plan, r)
        assert whole._file.metadata.num_row_groups == 28
        for b in whole:
            shard = PlanShard(plan, r, at_step=b.step, cache_dir=tmp_path)
            assert shard._file.metadata.num_row_groups == 1
            got = next(shard.iter_batches(b.step))
            assert (got.epoch, got.step, got.step_in_epoch, got.bucket, got.ids, got.target_frames) == \
                (b.epoch, b.step, b.step_in_epoch, b.bucket, b.ids, b.target_frames)
            assert got.rows.tolist() == b.rows.tolist()
    assert len(list((tmp_path / "step-index").iterdir())) == W  # one index per shard, reused


def _index_of(plan: Path, cache: Path, rank: int = 0) -> Path:
    PlanShard(plan, rank, at_step=0, cache_dir=cache)
    return index_file(file_facts(plan / shard_name(rank)), cache)


def _damage(where: Path, how: str) -> None:
    if how == "garbage":
        where.write_bytes(b"\x93NUMPY not an index at all")
    elif how == "truncated":
        where.write_bytes(where.read_bytes()[:-16])
    elif how == "header":
        index = np.load(where)
        index[2] += 1  # a footer length the shard does not have
        np.save(where, index)
    else:  # "swapped": group 5's span pointing at group 6's metadata
        index = np.load(where)
        table = index[6:].reshape(-1, 4)
        table[5, 2:], table[6, 2:] = table[6, 2:].copy(), table[5, 2:].copy()
        np.save(where, index)


@pytest.mark.parametrize("how", ["garbage", "truncated", "header", "swapped"])
def test_a_damaged_index_is_one_log_line_and_rebuilt(plan: Path, tmp_path: Path, how: str,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    where = _index_of(plan, tmp_path)
    good = where.read_bytes()
    _damage(where, how)
    step = int(np.load(where)[6:].reshape(-1, 4)[5, 0]) if how == "swapped" else 13
    with caplog.at_level(logging.WARNING, logger="manifests.step_index"):
        got = next(PlanShard(plan, 0, at_step=step, cache_dir=tmp_path).iter_batches(step))
    assert got.ids == next(PlanShard(plan, 0).iter_batches(step)).ids
    (rec,) = caplog.records
    assert "step index" in rec.getMessage() and "rebuilt" in rec.getMessage() and "\n" not in rec.getMessage()
    assert where.read_bytes() == good


def test_an_unwritable_cache_still_seeks(plan: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache = tmp_path / "cache"
    cache.write_text("a file where the cache folder would be")
    with caplog.at_level(logging.WARNING, logger="manifests.step_index"):
        got = next(PlanShard(plan, 1, at_step=30, cache_dir=cache).iter_batches(30))
    assert got.ids == next(PlanShard(plan, 1).iter_batches(30)).ids
    assert len(caplog.records) == 1 and "not kept" in caplog.records[0].getMessage()


def test_a_step_outside_the_shard_is_refused_as_without_the_index(plan: Path, tmp_path: Path) -> None:
    from manifests.errors import ManifestError

    with pytest.raises(ManifestError, match="outside the plan's steps"):
        next(PlanShard(plan, 0, at_step=EPOCHS * STEPS + 1, cache_dir=tmp_path).iter_batches(EPOCHS * STEPS + 1))


def test_the_index_is_recomputed_from_the_shard_and_matches_the_footer(plan: Path, tmp_path: Path) -> None:
    copy = tmp_path / "plan"
    shutil.copytree(plan, copy)
    a = build_step_index(plan / shard_name(0))
    b = build_step_index(copy / shard_name(0))
    assert a.tolist() == b.tolist()  # a function of the shard's bytes only
    table = a[6:].reshape(-1, 4)
    assert table[0, 0] == 0 and (table[1:, 0] == table[:-1, 1] + 1).all() and table[-1, 1] == EPOCHS * STEPS - 1
