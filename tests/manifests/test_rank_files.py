"""Position files moved into rank groups (dataprep.planning.rank_files): groups cover the
epoch's rank-major batches in order within their byte budget, every batch reads back the
rows and ids it had, and the moved files leave nothing behind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bucketing.batching import run_positions
from dataprep.planning import rank_files
from dataprep.planning.rank_files import move_to_groups, rank_groups
from manifests.spill import SpillFiles


@settings(max_examples=60, deadline=None)
@given(W=st.integers(1, 12), S=st.integers(1, 20), part=st.integers(1, 6), max_rows=st.integers(1, 400),
       seed=st.integers(0, 2**31))
def test_groups_cover_the_batches_in_order_within_the_budget(W, S, part, max_rows, seed) -> None:
    size = np.random.default_rng(seed).integers(0, 30, W * S)
    groups = rank_groups(size, W, part, max_rows)
    assert groups[0].first == 0 and groups[-1].end == W * S
    for a, b in zip(groups, groups[1:]):
        assert a.end == b.first
    for g in groups:
        rows = int(size[g.first:g.end].sum())
        assert g.first == g.ranks.start * S + g.steps.start and g.end == (g.ranks.stop - 1) * S + g.steps.stop
        if len(g.steps) < S:  # a piece of one rank: cut at whole parts, over the budget only as one part
            assert len(g.ranks) == 1 and g.steps.start % part == 0
            assert g.steps.stop == S or g.steps.stop % part == 0
            assert rows <= max_rows or len(g.steps) <= part
        else:  # whole ranks: over the budget only as one rank
            assert rows <= max_rows or len(g.ranks) == 1


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 300), W=st.integers(1, 6), seed=st.integers(0, 2**31), budget=st.integers(1, 3000),
       move_rows=st.integers(1, 50), explicit=st.booleans())
def test_every_batch_reads_back_its_rows_and_ids(tmp_path_factory, n, W, seed, budget, move_rows, explicit) -> None:
    rng = np.random.default_rng(seed)
    root = Path(tmp_path_factory.mktemp("rank-files"))
    keys = rng.permutation(n).astype(np.int32)
    ids = pa.array([f"utt-{k}-" + "x" * int(rng.integers(0, 9)) for k in keys.tolist()])
    files = SpillFiles(root)
    files.append_records("pos", keys, ids)
    files.close()
    # the positions dealt into W * S batches in random order: each a run, or (explicit) positions one by one
    S = int(rng.integers(1, 5))
    cuts = np.sort(rng.integers(0, n + 1, W * S - 1))
    batch_size = np.diff(np.r_[0, cuts, n])
    order = rng.permutation(W * S)  # batch i (rank-major) is the order[i]-th run of positions
    first = np.cumsum(batch_size) - batch_size
    start, size = first[order], batch_size[order]
    want = [run_positions(start[i:i + 1], size[i:i + 1]) for i in range(W * S)]
    run_off = None
    if explicit:
        runs = [np.stack([w, np.ones_like(w)], 1) if i % 2 else np.array([[start[i], size[i]]]) for i, w in
                enumerate(want)]
        run_off = np.r_[0, np.cumsum([r.shape[0] for r in runs])]
        both = np.concatenate(runs)
        start, size = both[:, 0].astype(np.int64), both[:, 1].astype(np.int64)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rank_files, "MOVE_ROWS", move_rows)
        grouped = move_to_groups(SpillFiles(root), np.dtype(np.int32), batch_size[order], start, size, run_off,
                                 W, 1, budget)
    assert not (root / "pos.rec").exists() and not (root / "pos.data").exists()
    got: dict[int, tuple[list[int], list[str]]] = {}
    for g, group in enumerate(grouped.groups):
        records = grouped.load(g)
        for i in range(group.first, group.end):
            rows, batch_ids = records.batches(i, i + 1)
            got[i] = rows.tolist(), batch_ids.to_pylist()
    for i, w in enumerate(want):
        assert got[i] == (keys[w].tolist(), ids.take(pa.array(w)).to_pylist())
    assert not list(root.iterdir())  # each group's files removed once read


def test_position_columns_in_memory_are_read_in_place() -> None:
    rng = np.random.default_rng(3)
    n, W, S = 200, 4, 5
    keys = rng.permutation(n).astype(np.int32)
    ids = pa.array([f"utt-{k}-" + "x" * int(rng.integers(0, 9)) for k in keys.tolist()])
    memory: dict = {}
    files = SpillFiles(Path("/nonexistent"), memory)
    for a in range(0, n, 64):  # several chunks, as an epoch's layout appends them
        files.append_records("pos", keys[a:a + 64], ids.slice(a, 64))
    files.close()
    batch_size = np.diff(np.r_[0, np.sort(rng.integers(0, n + 1, W * S - 1)), n])
    order = rng.permutation(W * S)
    first = np.cumsum(batch_size) - batch_size
    start, size = first[order], batch_size[order]
    grouped = move_to_groups(SpillFiles(Path("/nonexistent"), memory), np.dtype(np.int32), size, start, size, None,
                             W, 1, 64)
    assert len(grouped.groups) > 1 and not any(k.startswith("rg") for k in memory)  # nothing moved
    for g, group in enumerate(grouped.groups):
        records = grouped.load(g)
        for i in range(group.first, group.end):
            rows, batch_ids = records.batches(i, i + 1)
            w = run_positions(start[i:i + 1], size[i:i + 1])
            assert (rows.tolist(), batch_ids.to_pylist()) == (keys[w].tolist(), ids.take(pa.array(w)).to_pylist())
    grouped.remove()
    assert not memory
