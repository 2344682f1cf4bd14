"""Plan shards: writer publishes atomically; the torch-free reader seeks to any step
without reading earlier row groups and resumes exactly."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from manifests.errors import ManifestError
from manifests.plan_files import (
    SHARD_SCHEMA,
    SHARD_SCHEMA_TARGET_FRAMES,
    PlanShard,
    PlanWriter,
    open_shard,
    read_plan_json,
    shard_name,
    shard_table,
)
from manifests.plan_meta import FileRef, ManifestRef, PlanMeta, plan_hash_of

W = 3


def plan_meta(epochs: int, steps: int, world_size: int = W) -> PlanMeta:
    """Metadata for a hand-written plan: only the shapes are real (4 buckets, batches of 1..5)."""
    return PlanMeta(manifest=ManifestRef("m.parquet", "0" * 64, 10_000), buckets_file=FileRef("b.json", "1" * 64),
                    buckets=[{"index": i, "max_duration": 10.0 * (i + 1), "batch_size": 5} for i in range(4)],
                    world_size=world_size, seed=0, epochs=epochs, interleave="random", allocation={},
                    num_steps=epochs * steps, steps_per_epoch=[steps] * epochs, per_epoch=[], per_bucket=[],
                    padding={}, fallbacks={})


def _write_plan(path, epochs: int = 2, steps: int = 40, row_group_steps: int = 8) -> dict:
    """A plan of ``epochs`` x ``steps`` steps over W ranks; batch sizes 1..5, rows distinct."""
    rng = np.random.default_rng(0)
    ids = pa.array([f"utt-{i:05d}" for i in range(10_000)])
    expected: dict = {}
    with PlanWriter(path, W, row_group_steps=row_group_steps) as w:
        nxt = 0
        for e in range(epochs):
            bucket = rng.integers(0, 4, steps)
            for r in range(W):
                sizes = rng.integers(1, 6, steps)
                offsets = np.r_[0, np.cumsum(sizes)]
                rows = np.arange(nxt, nxt + offsets[-1], dtype=np.int64)
                nxt += int(offsets[-1])
                t = shard_table(epoch=e, first_step=e * steps, bucket=bucket, offsets=offsets, rows=rows,
                                ids=ids.take(pa.array(rows)), max_duration=sizes * 1.5, max_tokens=sizes * 2)
                w.write(r, t)
                for i in range(steps):
                    expected.setdefault(r, []).append((e, e * steps + i, int(bucket[i]),
                                                       rows[offsets[i]:offsets[i + 1]].tolist()))
        w.finish(plan_meta(epochs, steps))
    return expected


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    path = tmp_path_factory.mktemp("p") / "plan"
    return path, _write_plan(path)


def test_layout_schema_and_plain_pyarrow_read(plan) -> None:
    path, expected = plan
    meta = read_plan_json(path)
    assert meta["world_size"] == W and len(meta["shards"]) == W and len(meta["plan_hash"]) == 64
    for r in range(W):
        f = pq.ParquetFile(path / f"rank-{r:05d}.parquet")
        assert f.schema_arrow.remove_metadata() == SHARD_SCHEMA.remove_metadata()
        t = f.read(columns=["step", "bucket", "ids", "rows"])
        assert t.column("step").to_pylist() == list(range(80))
        assert t.column("rows").to_pylist() == [x[3] for x in expected[r]]
        assert t.column("ids").to_pylist() == [[f"utt-{i:05d}" for i in x[3]] for x in expected[r]]
        # row groups hold a fixed number of steps and never span epochs
        assert [f.metadata.row_group(i).num_rows for i in range(f.num_row_groups)] == [8] * 10


@settings(max_examples=25, deadline=None)
@given(rank=st.integers(0, W - 1), k=st.integers(0, 85))
def test_resuming_at_any_step_equals_uninterrupted(plan, rank, k) -> None:
    path, expected = plan
    shard = open_shard(path, rank)
    full = [(b.epoch, b.step, b.bucket, b.rows.tolist()) for b in shard]
    assert full == expected[rank]
    resumed = [(b.epoch, b.step, b.bucket, b.rows.tolist()) for b in shard.iter_batches(start_step=k)]
    assert resumed == full[k:]
    assert shard.read(start_step=k).column("step").to_pylist() == list(range(k, 80))
    assert shard.read(start_step=k, columns=["rows"]).column_names == ["rows"]
    ids = [b.ids for b in shard.iter_batches(start_step=k)]
    assert ids == [[f"utt-{i:05d}" for i in x[3]] for x in expected[rank][k:]]
    parts = list(shard.iter_tables(start_step=k, columns=["epoch", "rows"]))  # one row group each
    assert all(t.num_rows <= 8 and t.column_names == ["epoch", "rows"] for t in parts)
    assert pa.concat_tables(parts).equals(shard.read(start_step=k, columns=["epoch", "rows"])) if parts else k >= 80


def test_seek_reads_no_earlier_row_group(tmp_path) -> None:
    """Overwrite the first row groups' bytes with garbage: reading from a later step still works."""
    path = tmp_path / "plan"
    expected = _write_plan(path, epochs=1, steps=40, row_group_steps=8)
    shard_path = path / "rank-00001.parquet"
    md = pq.ParquetFile(shard_path).metadata
    end_of_group_2 = max(md.row_group(2).column(c).file_offset + md.row_group(2).column(c).total_compressed_size
                         for c in range(md.num_columns))
    data = bytearray(shard_path.read_bytes())
    data[4:end_of_group_2] = b"\xff" * (end_of_group_2 - 4)
    shard_path.write_bytes(bytes(data))
    shard = PlanShard(path, 1)
    assert shard.row_groups_from(24) == [3, 4]
    got = [(b.epoch, b.step, b.bucket, b.rows.tolist()) for b in shard.iter_batches(start_step=27)]
    assert got == expected[1][27:]
    with pytest.raises(Exception):
        list(shard.iter_batches(start_step=0))  # the corrupted groups really are unreadable


def test_rewrite_replaces_plan_but_never_a_foreign_folder(tmp_path) -> None:
    path = tmp_path / "plan"
    _write_plan(path, epochs=1, steps=10)
    first = (path / "plan.json").read_bytes()
    _write_plan(path, epochs=1, steps=10)
    assert (path / "plan.json").read_bytes() == first  # deterministic, replaced in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan"]  # no temp folders left
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    with pytest.raises(ManifestError, match="not a plan directory"):
        PlanWriter(foreign, 2)
    assert (foreign / "notes.txt").read_text() == "keep"


def test_failed_write_publishes_nothing(tmp_path) -> None:
    path = tmp_path / "plan"
    with pytest.raises(RuntimeError):
        with PlanWriter(path, 2) as w:
            w.write(0, SHARD_SCHEMA.empty_table())
            raise RuntimeError("crash mid-plan")
    assert not path.exists() and list(tmp_path.iterdir()) == []


def test_reader_errors_are_one_line(tmp_path) -> None:
    with pytest.raises(ManifestError, match="not a plan directory"):
        read_plan_json(tmp_path)
    (tmp_path / "plan.json").write_text(json.dumps({"version": 99}))
    with pytest.raises(ManifestError, match="unsupported plan version"):
        read_plan_json(tmp_path)
    with pytest.raises(ManifestError, match="unsupported plan version"):  # a shard is opened through its plan.json
        open_shard(tmp_path, 0)


def test_reading_a_shard_does_not_import_pandas(plan) -> None:
    plan = plan[0]
    """Trainers start in well under a second: the shard reader must not pull in pandas."""
    import subprocess
    import sys

    code = ("import sys; from manifests.plan_files import open_shard; "
            f"b = next(open_shard({str(plan)!r}, 0).iter_batches(1)); "
            "assert b.rows.dtype.name == 'int64' and b.step == 1; print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_target_frames_shards_are_version_2_and_old_shards_still_read(plan, tmp_path) -> None:
    old_path, expected = plan
    path = tmp_path / "plan2"
    ids = pa.array([f"utt-{i}" for i in range(8)])
    with PlanWriter(path, 1, row_group_steps=2, target_frames=True) as w:
        t = shard_table(epoch=0, first_step=0, bucket=np.array([0, 1, 1]), offsets=np.array([0, 2, 5, 8]),
                        rows=np.arange(8), ids=ids, max_duration=np.array([1.0, 2.0, 2.5]),
                        max_tokens=np.array([3, 4, 5]), target_frames=np.array([101, 201, 251]))
        w.write(0, t)
        w.finish(plan_meta(1, 3, world_size=1))
    f = pq.ParquetFile(path / "rank-00000.parquet")
    assert f.schema_arrow.remove_metadata() == SHARD_SCHEMA_TARGET_FRAMES.remove_metadata()
    assert json.loads(f.schema_arrow.metadata[b"speech_dataprep.plan"])["version"] == 2
    shard = open_shard(path, 0)
    assert shard.version == 2 and [b.target_frames for b in shard] == [101, 201, 251]
    assert [b.target_frames for b in shard.iter_batches(1)] == [201, 251]
    assert shard.read(2, columns=["target_frames"]).column("target_frames").to_pylist() == [251]
    old = open_shard(old_path, 0)  # version 1: no column, target None, read as before
    assert old.version == 1 and {b.target_frames for b in old} == {None}
    assert [(b.epoch, b.step, b.bucket, b.rows.tolist()) for b in old] == expected[0]


@pytest.mark.parametrize("plan_meta_json,version", [(b'{"version": 9, "rank": 0}', "9"), (b'{"rank": 0}', "None")])
def test_an_unknown_shard_version_is_refused_in_one_line(tmp_path, plan_meta_json: bytes, version: str) -> None:
    """A newer version, or none (every shard written records one), is refused in one line."""
    from manifests.content_hash import file_sha256
    from manifests.hash_cache import file_facts

    _write_plan(tmp_path, epochs=1, steps=4)
    t = SHARD_SCHEMA.empty_table().replace_schema_metadata(
        {b"speech_dataprep.kind": b"plan-shard", b"speech_dataprep.plan": plan_meta_json})
    shard = tmp_path / "rank-00000.parquet"
    pq.write_table(t, shard)
    obj = json.loads((tmp_path / "plan.json").read_text())  # recorded as if a newer planner wrote it
    obj["shards"][0].update(sha256=file_sha256(shard), size=file_facts(shard)["size"],
                            footer_sha256=file_facts(shard)["footer_sha256"])
    obj["plan_hash"] = plan_hash_of(obj)
    (tmp_path / "plan.json").write_text(json.dumps(obj))
    with pytest.raises(ManifestError, match=rf"unsupported shard version {version} \(this tool reads 1, 2, 3\)") as exc:
        open_shard(tmp_path, 0)
    assert "\n" not in str(exc.value)


def test_write_ranks_bytes_do_not_depend_on_threads(tmp_path) -> None:
    """Shards written several ranks at a time (``write_threads``), each in parts, all ranks at
    once or group after group, are the bytes one thread writes, closed as soon as written or by
    ``finish``; ticks come in rank order."""
    ids = pa.array([f"utt-{i:05d}" for i in range(4000)])
    rng = np.random.default_rng(1)
    sizes = rng.integers(1, 6, (W, 3, 10))

    def tables(r: int):
        for c in range(3):
            offsets = np.r_[0, np.cumsum(sizes[r, c])]
            rows = np.arange(offsets[-1], dtype=np.int64) + 100 * (3 * r + c)
            yield shard_table(epoch=0, first_step=10 * c, bucket=sizes[r, c] % 3, offsets=offsets, rows=rows,
                              ids=ids.take(pa.array(rows)), max_duration=sizes[r, c] * 1.5,
                              max_tokens=sizes[r, c] * 2, step_in_epoch=10 * c)

    shards = []
    for threads, close, groups in ((1, False, 1), (3, False, 1), (3, True, 1), (2, True, 2)):
        ticks: list[int] = []
        with PlanWriter(tmp_path / f"p{threads}{close}", W, row_group_steps=4, write_threads=threads) as w:
            for ranks in (range(W),) if groups == 1 else (range(0, 1), range(1, W)):  # all at once, or in groups
                w.write_ranks(tables, ticks.append, close=close, ranks=ranks)
            if close:  # each shard finished as written: no more batches for it
                with pytest.raises(ValueError, match="rank 0 is already closed"):
                    w.write(0, next(tables(0)))
            w.finish(plan_meta(1, 30))
        assert ticks == list(range(W))
        shards.append([(tmp_path / f"p{threads}{close}" / shard_name(r)).read_bytes() for r in range(W)])
    assert shards[0] == shards[1] == shards[2] == shards[3]
