"""Planning by spill (dataprep.planning.spill, .layout, .shards, .disk): a corpus that fits --memory-limit keeps its
spill in memory and writes nothing to disk; under a smaller limit plan-batches and replan spill
by bucket to disk (observed: the spill folder holds files as the plan is published) and write
the same plan, shard for shard, byte for byte (hypothesis over random corpora, world sizes,
seeds, sync groups and options; the golden pipeline pins the bytes themselves); a limit no
bucket fits in, or a plan a spill on disk cannot make, is a one-line error."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from bucketing.dynres import DynResConfig
from dataprep.cli import app
from dataprep.planning import PlanOptions, build_plan, carry_spilled, disk, layout, rank_files, shards, spill
from dataprep.testing import write_plan_inputs
from manifests.buckets_file import read_buckets
from manifests.errors import DataprepError
from manifests.plan_files import PlanWriter, shard_name
from manifests.plan_meta import read_plan_meta
from manifests.spill import spill_dir
from tests.conftest import FEW_EXAMPLES

runner = CliRunner()


def _same_plan(a: Path, b: Path, world_size: int) -> None:
    assert (a / "plan.json").read_bytes() == (b / "plan.json").read_bytes()
    for r in range(world_size):
        assert (a / shard_name(r)).read_bytes() == (b / shard_name(r)).read_bytes()


def _no_spill_left(folder: Path) -> None:
    assert not [p for p in folder.iterdir() if p.name.endswith(".spill")]


@contextlib.contextmanager
def _spilled(folder: Path) -> Iterator[list[int]]:
    """Inside, each plan published next to others in ``folder`` appends the bytes of the spill
    folders there at that moment (:meth:`PlanWriter.finish`: the spill is not yet removed);
    0 when the plan spilled nothing to disk."""
    seen: list[int] = []
    finish = PlanWriter.finish

    def watched(self: PlanWriter, meta):  # type: ignore[no-untyped-def]
        seen.append(sum(f.stat().st_size for d in folder.iterdir() if d.name.endswith(".spill")
                        for f in d.rglob("*") if f.is_file()))
        return finish(self, meta)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(PlanWriter, "finish", watched)
        yield seen


@settings(max_examples=FEW_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(40, 900), buckets=st.integers(2, 6), W=st.integers(1, 9), seed=st.integers(0, 2**31),
       epochs=st.integers(1, 2), group=st.sampled_from([None, 1]), strict=st.booleans(), carry=st.booleans(),
       interleave=st.sampled_from(["random", "ascending"]), budget=st.sampled_from([20.0, 60.0, 200.0]),
       data=st.integers(0, 2**31), order_rows=st.sampled_from([None, 8, 64]),
       dynres=st.booleans(), balance=st.sampled_from([0.05, 0.05, 0.0]), id_chunk=st.sampled_from([None, 7, 40]),
       groups=st.sampled_from([None, (200, 16, 8), (2000, 100, 64)]))
def test_out_of_core_plan_equals_in_memory(tmp_path_factory, n, buckets, W, seed, epochs, group, strict, carry,
                                            interleave, budget, data, order_rows, dynres, balance, id_chunk,
                                            groups) -> None:
    """``order_rows``: buckets ordered in parts of that many rows (None: whole, at this size);
    ``id_chunk``: buckets of more ids gather them a chunk of that many at a time (None: held);
    ``groups``: shards written from rank groups of at most that many bytes (positions moved
    that many rows at a time, parts of that many rows; None: one group, one move, one part);
    ``dynres``: dynamic resolution (its target frames and predicted figures) too; ``balance``
    0: one bucket per step (tails pooled, carried, borrowed: their rows by position)."""
    tmp = tmp_path_factory.mktemp("ooc")
    m, b = write_plan_inputs(tmp, n, seed=data, num_buckets=buckets, budget=budget)
    opts = dict(world_size=W, seed=seed, epochs=epochs, strict=strict, carry=carry, interleave=interleave,
                row_group_steps=2, sync_group=group, balance=balance,
                dynamic_resolution=DynResConfig() if dynres else None)
    _compare(tmp, m, b, opts, n, order_rows, id_chunk, groups)


@settings(max_examples=FEW_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(40, 900), corpora=st.integers(1, 4), W=st.integers(1, 9), seed=st.integers(0, 2**31),
       epochs=st.integers(1, 3), carry=st.booleans(), data=st.integers(0, 2**31),
       size=st.sampled_from([None, 0.3, 1.0, 2.5]), weights=st.lists(st.floats(0.05, 20.0), min_size=4, max_size=4),
       order_rows=st.sampled_from([None, 8, 64]), balance=st.sampled_from([0.05, 0.0]),
       id_chunk=st.sampled_from([None, 7, 40]), groups=st.sampled_from([None, (300, 32, 16)]))
def test_weighted_out_of_core_plan_equals_in_memory(tmp_path_factory, n, corpora, W, seed, epochs, carry, data,
                                                     size, weights, order_rows, balance, id_chunk, groups) -> None:
    """A weighted blend (corpora over- and under-sampled; ``size``: the epoch's utterances per
    manifest row, None: one each) planned out of core: the same shards and plan.json (per-corpus
    figures included) as in memory."""
    tmp = tmp_path_factory.mktemp("ooc-weighted")
    m, b = write_plan_inputs(tmp, n, seed=data, num_buckets=4, budget=60.0, corpora=corpora)
    present = sorted(set(pl.read_parquet(m)["corpus"].to_list()))
    opts = dict(world_size=W, seed=seed, epochs=epochs, carry=carry, row_group_steps=2, balance=balance,
                weights={c: weights[i] for i, c in enumerate(present)},
                epoch_utterances=None if size is None else max(1, int(size * n)))
    _compare(tmp, m, b, opts, n, order_rows, id_chunk, groups)
    assert "weights" in (tmp / "ooc" / "plan.json").read_text()


def _compare(tmp: Path, m: Path, b: Path, opts: dict, n: int, order_rows: int | None,
             id_chunk: int | None = None, groups: tuple[int, int, int] | None = None) -> None:
    """Plan ``m`` in memory and out of core (parts of ``order_rows`` rows, ids gathered in
    chunks of ``id_chunk``, shards written from rank groups of ``groups`` = (most bytes, rows
    moved at once, rows of a part)); the same bytes."""
    try:
        with _spilled(tmp) as seen:
            build_plan(m, b, tmp / "mem", PlanOptions(**opts))
        assert seen == [0]  # the corpus fits: its spill is in memory
    except DataprepError:
        assume(False)  # e.g. fewer utterances than ranks: nothing to compare
    try:
        with pytest.MonkeyPatch.context() as mp, _spilled(tmp) as seen:
            if order_rows is not None:
                mp.setattr(layout, "ORDER_ROWS", order_rows)
            if id_chunk is not None:
                mp.setattr(spill, "ID_CHUNK_ROWS", id_chunk)
            if groups is not None:
                mp.setattr(rank_files, "MAX_GROUP_BYTES", groups[0])
                mp.setattr(rank_files, "MOVE_ROWS", groups[1])
                mp.setattr(shards, "PART_ROWS", groups[2])
            build_plan(m, b, tmp / "ooc", PlanOptions(**opts, memory_limit=n * 100 - 1))  # below the in-memory need
    except DataprepError as exc:
        # the plan in memory fell back to one-bucket steps in its last epoch, or (few buckets) one bucket needs more
        assert "cannot fill whole balanced steps" in str(exc) or "--memory-limit: bucket" in str(exc)
        assume(False)
    assert len(seen) == 1 and seen[0] > 0  # spilled to disk
    W = opts["world_size"]
    _same_plan(tmp / "mem", tmp / "ooc", W)
    _no_spill_left(tmp)


def test_cli_memory_limit_spills_and_equals(tmp_path: Path) -> None:
    m, b = write_plan_inputs(tmp_path, 20000, seed=4, num_buckets=8)
    common = ["plan-batches", str(m), "--buckets", str(b), "--world-size", "8", "--epochs", "2"]
    with _spilled(tmp_path) as seen:
        for out, extra in (("mem", []), ("ooc", ["--memory-limit", "1MiB"])):
            res = runner.invoke(app, [*common, "-o", str(tmp_path / out), *extra])
            assert res.exit_code == 0, res.output
    assert seen[0] == 0 and seen[1] > 0  # the default limit holds the corpus in memory; 1 MiB spills it
    _same_plan(tmp_path / "mem", tmp_path / "ooc", 8)
    _no_spill_left(tmp_path)
    step = str(read_plan_meta(tmp_path / "mem").num_steps // 3)  # inside epoch 0: its unseen rest re-planned
    with _spilled(tmp_path) as seen:
        for out, extra in (("re-mem", []), ("re-ooc", ["--memory-limit", "1MiB"])):
            res = runner.invoke(app, ["replan", str(tmp_path / "mem"), "--manifest", str(m), "--at-step", step,
                                      "--world-size", "6", "-o", str(tmp_path / out), *extra])
            assert res.exit_code == 0, res.output
    assert seen[0] == 0 and seen[1] > 0
    _same_plan(tmp_path / "re-mem", tmp_path / "re-ooc", 6)
    _no_spill_left(tmp_path)
    res = runner.invoke(app, ["replan", str(tmp_path / "mem"), "--manifest", str(m), "--at-step", step,
                              "--world-size", "6", "-o", str(tmp_path / "x"), "--memory-limit", "lots"])
    assert res.exit_code == 2 and "--memory-limit" in res.output and len(res.output.strip().splitlines()) == 1


def test_memory_limit_errors_are_one_line(tmp_path: Path) -> None:
    m, b = write_plan_inputs(tmp_path, 3000, seed=5, num_buckets=3)
    common = ["plan-batches", str(m), "--buckets", str(b), "--world-size", "4", "-o", str(tmp_path / "p")]
    for extra, msg in ((["--memory-limit", "10KiB"], "bucket"),  # no bucket fits
                       (["--memory-limit", "lots"], "--memory-limit")):
        res = runner.invoke(app, [*common, *extra])
        assert res.exit_code == 2 and msg in res.output and len(res.output.strip().splitlines()) == 1, res.output
        assert not (tmp_path / "p").exists()
    _no_spill_left(tmp_path)
    with pytest.raises(DataprepError, match="memory_limit"):
        PlanOptions(world_size=2, memory_limit=0)


@pytest.mark.parametrize("carry,weighted", [(True, False), (False, False), (True, True)])
def test_batches_cut_into_pieces_equal_in_memory(tmp_path: Path, carry: bool, weighted: bool) -> None:
    """One batch more than whole steps hold (the largest bucket's), so steps cut batches into
    pieces: their figures are looked up again out of core (the spill files, carried rows);
    ``weighted``: and the per-corpus padding of the pieces' rows; with dynamic resolution, the
    pieces' own targets and figures."""
    import numpy as np

    from bucketing import batching

    even = batching.even_batch_counts

    def one_more(counts, bs, W):  # type: ignore[no-untyped-def]
        nb = even(counts, bs, W).copy()
        k = int(np.argmax(counts))
        nb[k] = min(nb[k] + 1, counts[k])
        return nb

    m, b = write_plan_inputs(tmp_path, 700, seed=3, num_buckets=4, budget=60.0, corpora=3 if weighted else 0)
    opts = dict(world_size=7, seed=1, epochs=2, carry=carry, row_group_steps=2,
                weights={"c0": 1.0, "c1": 3.0, "c2": 0.5} if weighted else None,
                dynamic_resolution=DynResConfig() if carry else None)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(batching, "even_batch_counts", one_more)
        mp.setattr(layout, "even_batch_counts", one_more)
        mp.setattr(layout, "ORDER_ROWS", 64)
        mp.setattr(spill, "ID_CHUNK_ROWS", 30)
        with _spilled(tmp_path) as seen:
            meta = build_plan(m, b, tmp_path / "mem", PlanOptions(**opts))
            build_plan(m, b, tmp_path / "ooc", PlanOptions(**opts, memory_limit=700 * 100 - 1))
    assert seen[0] == 0 and seen[1] > 0
    assert "split_batches\": 0" not in (tmp_path / "mem" / "plan.json").read_text(), meta
    _same_plan(tmp_path / "mem", tmp_path / "ooc", 7)


def test_too_little_disk_is_refused_before_anything_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file system is asked first: with less free than the spill files and the plan take,
    plan-batches stops in one line, leaving no plan and no spill directory."""
    import shutil
    from collections import namedtuple

    m, b = write_plan_inputs(tmp_path, 3000, seed=6, num_buckets=3)
    need = disk.disk_bytes(m, 2).peak
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda where: usage(need * 4, need * 3 + 1, need - 1))
    res = runner.invoke(app, ["plan-batches", str(m), "--buckets", str(b), "--world-size", "4", "--epochs", "2",
                              "--memory-limit", "100KiB", "-o", str(tmp_path / "p")])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert "the spill files and the plan need about" in res.output and "GiB free" in res.output
    assert not (tmp_path / "p").exists()
    _no_spill_left(tmp_path)


def test_the_disk_is_checked_again_once_the_spill_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the spill (its largest bucket known) the free disk is asked again for the rest:
    a disk that filled meanwhile stops plan-batches in one line, no plan and no spill left."""
    import shutil
    from collections import namedtuple

    m, b = write_plan_inputs(tmp_path, 3000, seed=6, num_buckets=3)
    usage = namedtuple("usage", "total used free")
    asked: list[Path] = []

    def disk_usage(where: Path) -> tuple[int, int, int]:
        asked.append(Path(where))
        return usage(1 << 40, 0, 1 << 40) if len(asked) == 1 else usage(1 << 40, (1 << 40) - 1, 1)

    monkeypatch.setattr(shutil, "disk_usage", disk_usage)
    res = runner.invoke(app, ["plan-batches", str(m), "--buckets", str(b), "--world-size", "4",
                              "--memory-limit", "100KiB", "-o", str(tmp_path / "p")])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert "the position files and the plan (besides the spill files written) need about" in res.output
    assert len(asked) == 2 and asked[1].name.endswith(".spill")
    assert not (tmp_path / "p").exists()
    _no_spill_left(tmp_path)


@pytest.mark.parametrize("epochs", [1, 3])
def test_disk_estimate_covers_the_spill_and_the_plan(tmp_path: Path, epochs: int) -> None:
    """What :func:`disk.disk_bytes` reserves is at least what the spill files, an
    epoch's position files and the plan's shards take, and not twice that: the spill's ids
    removed by a plan's only (last) epoch, kept (beside the position files' copy) by one of
    several."""
    m, b = write_plan_inputs(tmp_path, 5000, seed=7, num_buckets=4, ids=[f"utt-{i:09d}-x" for i in range(5000)])
    spec = read_buckets(b)
    bs = np.asarray([k.batch_size for k in spec.buckets], dtype=np.int64)
    root = tmp_path / "spill"
    root.mkdir()
    from bucketing.costmodel import CostModel
    from bucketing.fit import grid_from_spec

    grid = grid_from_spec(spec)
    corpus = carry_spilled(spill.spill_manifest(m, grid, bs, root, strict=False, memory_limit=1 << 30),
                           grid, bs, m, 1 << 30)
    need = disk.disk_bytes(m, epochs, largest=int(corpus.counts.max()))
    assert need.spill >= sum(p.stat().st_size for p in root.iterdir())
    layout.balanced_or_none(corpus, bs, 4, 0, 0, interleave="random", tolerance=0.05, cost=CostModel(), group=4,
                                   final=epochs == 1)
    assert (root / "b0.ids.data").exists() == (epochs > 1)
    spilled = sum(p.stat().st_size for p in root.iterdir())
    build_plan(m, b, tmp_path / "p", PlanOptions(world_size=4, epochs=epochs, memory_limit=5000 * 100 - 1))
    plan = sum(p.stat().st_size for p in (tmp_path / "p").iterdir())
    assert spilled + plan <= need.peak < 2 * (spilled + plan)
    assert need.peak == disk.disk_bytes(m, epochs).peak  # no bucket gathers its ids through a scratch copy
    assert disk.disk_bytes(m, 1, ids_once=False).peak > disk.disk_bytes(m, 1).peak
    # a re-plan's unseen rest counts the times each row is drawn (int32); a weighted plan counts them already
    assert disk.disk_bytes(m, epochs, drawn=True).peak - disk.disk_bytes(m, epochs).peak == 4 * 5000
    assert disk.disk_bytes(m, epochs, True, drawn=True) == disk.disk_bytes(m, epochs, True)
    # a bucket too large to hold its ids gathers them through a scratch copy: its ids' share and offsets
    big = spill.ID_CHUNK_ROWS + 1
    scratch = disk.disk_bytes(m, epochs, largest=big).peak - need.peak
    assert scratch >= (8 + 15) * big  # an offset and the id "utt-000000000-x" (15 bytes) a row


def test_a_spill_directory_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(DataprepError, match="cannot make the spill directory there"):
        spill_dir(tmp_path / "a-file" / "plan")


def test_fit_buckets_under_a_file_is_one_line(tmp_path: Path) -> None:
    """Every command that spills makes its folder with the one function: fit-buckets too."""
    m, _ = write_plan_inputs(tmp_path, 200, seed=1, num_buckets=4)
    (tmp_path / "a-file").write_text("x")
    res = CliRunner().invoke(app, ["fit-buckets", str(m), "-o", str(tmp_path / "a-file" / "buckets.json"),
                                   "--memory-limit", "16KiB"])
    assert res.exit_code == 2, res.output
    assert "cannot make" in res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1


@settings(max_examples=FEW_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(60, 700), W=st.integers(1, 6), W2=st.integers(1, 6), seed=st.integers(0, 2**31),
       epochs=st.integers(1, 3), corpora=st.sampled_from([0, 1, 3]), group=st.booleans(),
       data=st.integers(0, 2**31), at=st.floats(0.0, 0.99), dynres=st.booleans(),
       balance=st.sampled_from([0.05, 0.05, 0.0]), rank_groups=st.booleans())
def test_out_of_core_replan_equals_in_memory(tmp_path_factory, n, W, W2, seed, epochs, corpora, group, data,
                                             at, dynres, balance, rank_groups) -> None:
    """A re-plan (another world size, from a step inside any epoch; weighted or not; sync
    groups of 1; dynamic resolution or not; a --balance 0 parent, unweighted; shards written
    from small rank groups or one) under a --memory-limit below the in-memory need: the same
    shards and plan.json."""
    from dataprep.planning import replan

    tmp = tmp_path_factory.mktemp("ooc-replan")
    m, b = write_plan_inputs(tmp, n, seed=data, num_buckets=4, budget=60.0, corpora=corpora)
    weights = {f"c{c}": 1.0 + 2 * c for c in range(corpora)}
    present = set(pl.read_parquet(m)["corpus"].to_list()) if corpora else set()
    opts = dict(world_size=W, seed=seed, epochs=epochs, row_group_steps=2, balance=balance,
                weights={c: w for c, w in weights.items() if c in present} or None,
                dynamic_resolution=DynResConfig() if dynres else None)
    try:
        parent = build_plan(m, b, tmp / "parent", PlanOptions(**opts))
    except DataprepError:
        assume(False)
    step = parent.first_step + int(at * (parent.num_steps - parent.first_step))
    new = dict(world_size=W2, row_group_steps=2, sync_group=1 if group else None)
    try:
        with _spilled(tmp) as seen:
            replan(tmp / "parent", m, tmp / "mem", PlanOptions(**new), at_step=step)
        assert seen == [0]
    except DataprepError:
        assume(False)
    try:
        with pytest.MonkeyPatch.context() as mp, _spilled(tmp) as seen:
            if rank_groups:
                mp.setattr(rank_files, "MAX_GROUP_BYTES", 200)
                mp.setattr(rank_files, "MOVE_ROWS", 16)
                mp.setattr(shards, "PART_ROWS", 8)
            replan(tmp / "parent", m, tmp / "ooc", PlanOptions(**new, memory_limit=n * 100 - 1), at_step=step)
    except DataprepError as exc:
        assert "cannot fill whole balanced steps" in str(exc) or "--memory-limit: bucket" in str(exc)
        assume(False)
    assert len(seen) == 1 and seen[0] > 0
    _same_plan(tmp / "mem", tmp / "ooc", W2)
    _no_spill_left(tmp)


@pytest.mark.parametrize("out_of_core_plan", [False, True])
def test_each_phase_is_announced_as_it_starts(tmp_path: Path, out_of_core_plan: bool) -> None:
    """``on_phase`` hears reading, then each epoch's layout and writing, in order, before that
    epoch's shards are counted (a plan of hundreds of millions of rows spends minutes in each)."""
    m, b = write_plan_inputs(tmp_path, 600, seed=3, num_buckets=3)
    heard: list[str] = []
    written: list[int] = []

    def progress(done: int, total: int) -> None:
        written.append(done)
        heard.append(f"wrote {done}")

    limit = 600 * 100 - 1 if out_of_core_plan else None
    with _spilled(tmp_path) as seen:
        build_plan(m, b, tmp_path / "p", PlanOptions(world_size=2, epochs=2, memory_limit=limit),
                   on_progress=progress, on_phase=heard.append)
    assert (seen[0] > 0) == out_of_core_plan  # "spilling" is heard exactly when the spill goes to disk
    phases = [h for h in heard if not h.startswith("wrote")]
    assert phases[0].startswith("reading the manifest") and ("spilling" in phases[0]) == out_of_core_plan
    assert [p.split(":")[0] for p in phases[1:]] == ["epoch 1/2", "epoch 1/2", "epoch 2/2", "epoch 2/2"]
    assert "laying out steps" in phases[1] and "writing shards" in phases[2]
    assert heard.index(phases[2]) < heard.index("wrote 1") and heard.index(phases[4]) < heard.index("wrote 3")
    assert written == [1, 2, 3, 4]
