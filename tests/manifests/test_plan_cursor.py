"""PlanCursor: resume at any step gives exactly the rest of an uninterrupted run, the worker split
covers each step once, ``len`` is what is yielded (a re-planned plan included), states round-trip,
and hostile states or arguments are one-line DataprepErrors, never coerced."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataprep.planning.build import build_plan
from dataprep.planning.options import PlanOptions
from dataprep.planning.replan import replan
from dataprep.testing import write_plan_inputs
from manifests.errors import DataprepError, ManifestError
from manifests.plan_cursor import STATE_KEYS, PlanCursor, PlanStateError
from manifests.plan_files import PlanShard
from manifests.plan_meta import plan_hash_of

W, W2 = 2, 3
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


class Plans:
    """A real two-epoch plan for W ranks and its re-plan for W2 ranks at a step inside epoch 0."""

    def __init__(self, root: Path) -> None:
        manifest, buckets = write_plan_inputs(root, 600, seed=3, num_buckets=4)
        self.plan = root / "plan"
        self.meta = build_plan(manifest, buckets, self.plan, PlanOptions(world_size=W, epochs=2, row_group_steps=4))
        self.at = self.meta.steps_per_epoch[0] // 2
        self.replanned = root / "replanned"
        self.rmeta = replan(self.plan, manifest, self.replanned, PlanOptions(world_size=W2, row_group_steps=4), at_step=self.at)


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> Plans:
    return Plans(tmp_path_factory.mktemp("cursor"))


def run(cursor: PlanCursor, worker: tuple[int, int] = (0, 1)) -> list[tuple[int, list[int]]]:
    return [(pb.step, pb.rows.tolist()) for pb in cursor.iter_batches(worker)]


def shard_batches(plan: Path, rank: int) -> list[tuple[int, list[int]]]:
    """The whole shard, read without the cursor: the uninterrupted run."""
    return [(pb.step, pb.rows.tolist()) for pb in PlanShard(plan, rank)]


def test_a_replanned_plan_starts_at_its_at_step_and_len_counts_only_its_steps(plans: Plans) -> None:
    assert plans.rmeta.first_step == plans.at > 0
    for rank in range(W2):
        cursor = PlanCursor(plans.replanned, rank)
        assert cursor.steps == range(plans.at, plans.rmeta.num_steps)
        assert len(cursor) == plans.rmeta.num_steps - plans.at  # not num_steps: steps < at_step are not there
        got = run(cursor)
        assert len(got) == plans.rmeta.num_steps - plans.at and got == shard_batches(plans.replanned, rank)
        assert len(cursor) == 0 and cursor.next_step == plans.rmeta.num_steps
    with pytest.raises(DataprepError, match=f"re-planned at step {plans.at}") as exc:
        PlanCursor(plans.replanned, 0, start_step=0)
    assert "\n" not in str(exc.value)


@SETTINGS
@given(data=st.data())
def test_resume_at_any_step_gives_the_rest_of_the_uninterrupted_run(plans: Plans, data: st.DataObject) -> None:
    plan, meta, world = data.draw(st.sampled_from([(plans.plan, plans.meta, W), (plans.replanned, plans.rmeta, W2)]))
    rank = data.draw(st.integers(0, world - 1))
    full = shard_batches(plan, rank)
    k = data.draw(st.integers(meta.first_step, meta.num_steps))
    # interrupted: a cursor consumes up to k, its state resumes a fresh cursor (any rank's state works)
    first = PlanCursor(plan, rank)
    it = first.iter_batches((0, 1))
    head = [next(it) for _ in range(k - meta.first_step)]
    assert first.next_step == k and [b.step for b in head] == list(range(meta.first_step, k))
    resumed = PlanCursor(plan, rank)
    resumed.load_state_dict(first.state_dict())
    assert len(resumed) == meta.num_steps - k
    tail = run(resumed)
    assert [(b.step, b.rows.tolist()) for b in head] + tail == full
    assert tail == run(PlanCursor(plan, rank, start_step=k))  # a start step is the same as a resume


@SETTINGS
@given(data=st.data())
def test_worker_split_covers_each_step_once_in_any_window(plans: Plans, data: st.DataObject) -> None:
    plan, meta, world = data.draw(st.sampled_from([(plans.plan, plans.meta, W), (plans.replanned, plans.rmeta, W2)]))
    rank = data.draw(st.integers(0, world - 1))
    stop = data.draw(st.integers(meta.first_step, meta.num_steps))
    start = data.draw(st.integers(meta.first_step, stop))
    n = data.draw(st.integers(1, 5))
    whole = run(PlanCursor(plan, rank, start, stop))
    assert [s for s, _ in whole] == list(range(start, stop))
    shares = []
    for w in range(n):
        cursor = PlanCursor(plan, rank, start, stop)
        expected_steps = list(cursor.worker_steps(w, n))
        got = run(cursor, (w, n))
        assert [s for s, _ in got] == expected_steps
        shares.append(got)
    merged = sorted(b for share in shares for b in share)
    assert merged == whole  # every step exactly once, with the same batch
    # the DataLoader's round-robin order (worker i % n) rebuilds the run in step order
    assert [shares[i % n][i // n] for i in range(len(whole))] == whole


@SETTINGS
@given(data=st.data())
def test_len_equals_the_batches_yielded(plans: Plans, data: st.DataObject) -> None:
    plan, meta, world = data.draw(st.sampled_from([(plans.plan, plans.meta, W), (plans.replanned, plans.rmeta, W2)]))
    stop = data.draw(st.integers(meta.first_step, meta.num_steps))
    start = data.draw(st.integers(meta.first_step, stop))
    cursor = PlanCursor(plan, data.draw(st.integers(0, world - 1)), start, stop)
    n = len(cursor)
    assert n == len(run(cursor)) == stop - start
    cursor.rewind()
    assert len(cursor) == n


def test_state_round_trip_and_parent_state(plans: Plans) -> None:
    a = PlanCursor(plans.plan, 1)
    it = a.iter_batches((0, 1))
    for _ in range(5):
        next(it)
    state = a.state_dict()
    assert state == {"plan_hash": plans.meta.plan_hash, "rank": 1, "next_step": 5} and set(state) == set(STATE_KEYS)
    b = PlanCursor(plans.plan, 0)  # rank 0's cursor takes rank 1's state: only the step matters
    b.load_state_dict(state)
    assert b.next_step == 5 and b.state_dict() == {**state, "rank": 0}
    # a checkpoint of the parent plan at exactly the re-plan step continues on the re-plan
    child = PlanCursor(plans.replanned, 2)
    child.load_state_dict({"plan_hash": plans.meta.plan_hash, "rank": 1, "next_step": plans.at})
    assert child.next_step == plans.at
    with pytest.raises(PlanStateError, match=f"re-planned at step {plans.at}"):
        child.load_state_dict({"plan_hash": plans.meta.plan_hash, "rank": 1, "next_step": plans.at + 1})
    with pytest.raises(PlanStateError, match="rank: must be <= 1"):  # the parent had 2 ranks
        child.load_state_dict({"plan_hash": plans.meta.plan_hash, "rank": 2, "next_step": plans.at})


#: values that are not a step, a rank or a hash: no coercion of any of them
BAD_VALUES = [None, "5", "1", 0.5, 1.0, True, False, [1], {"a": 1}, np.int64(1), float("nan"), -1, 10**12, "x" * 70]


@SETTINGS
@given(data=st.data())
def test_hostile_states_are_one_line_errors_and_change_nothing(plans: Plans, data: st.DataObject) -> None:
    cursor = PlanCursor(plans.plan, 0, start_step=3)
    good = cursor.state_dict()
    kind = data.draw(st.sampled_from(["value", "missing", "extra", "not a dict", "other plan"]))
    state: Any
    if kind == "value":
        key = data.draw(st.sampled_from(STATE_KEYS))
        state = {**good, key: data.draw(st.sampled_from(BAD_VALUES))}
    elif kind == "missing":
        gone = data.draw(st.sampled_from(STATE_KEYS))
        state = {k: v for k, v in good.items() if k != gone}
    elif kind == "extra":
        state = {**good, data.draw(st.sampled_from(["epoch", "next_Step", "", "garbage"])): 1}
    elif kind == "not a dict":
        state = data.draw(st.sampled_from([None, [], "state", 3, list(good.items())]))
    else:
        state = {**good, "plan_hash": data.draw(st.sampled_from(["0" * 64, plans.rmeta.plan_hash]))}
    with pytest.raises(PlanStateError) as exc:
        cursor.load_state_dict(state)
    assert isinstance(exc.value, DataprepError)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"{plans.plan}: sampler state")
    assert cursor.next_step == 3  # a refused state changes nothing


@pytest.mark.parametrize("rank", [0.5, "1", True, None, -1, 2, np.int64(0)])
def test_hostile_rank_is_refused(plans: Plans, rank: Any) -> None:
    with pytest.raises(DataprepError, match="rank") as exc:
        PlanCursor(plans.plan, rank)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize(("kwargs", "problem"), [
    ({"start_step": "3"}, "start step: expected an integer"),
    ({"start_step": 3.0}, "start step: expected an integer"),
    ({"start_step": -1}, "start step: -1 is outside"),
    ({"stop_step": 10**9}, "stop step"),
    ({"start_step": 6, "stop_step": 5}, "start step: 6 is outside steps 0..5"),
    ({"world_size": 3}, "world size 3 given"),
    ({"world_size": "2"}, "world_size: expected an integer"),
])
def test_hostile_steps_and_world_size_are_refused(plans: Plans, kwargs: dict[str, Any], problem: str) -> None:
    with pytest.raises(DataprepError, match=problem):
        PlanCursor(plans.plan, 0, **kwargs)
    cursor = PlanCursor(plans.plan, 0)
    with pytest.raises(DataprepError, match="step: expected an integer, got true"):
        cursor.seek(True)  # type: ignore[arg-type]
    with pytest.raises(DataprepError, match="worker 2 is outside"):
        cursor.worker_steps(2, 2)


# --------------------------------------------------------------------------- garbage states

#: values of no particular type: scalars (huge integers past Python's 4300-digit limit included)
#: and small nested lists and dicts
_HUGE = st.sampled_from([400, 5000]).map(lambda n: 10**n) | st.sampled_from([400, 5000]).map(lambda n: -(10**n))
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=70),
                     st.binary(max_size=8), _HUGE, st.sampled_from([2**63, "0" * 64]))
_GARBAGE = st.recursive(_SCALARS, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
                        max_leaves=6)


def _garbage_state(data: st.DataObject, meta: Any, parent_hash: str | None) -> Any:
    """A state near a real one: each field right, near the plan's bounds, or garbage; keys dropped
    or added at random; sometimes no dict at all."""
    hashes = [meta.plan_hash, "0" * 64, *([parent_hash] if parent_hash else [])]
    state: dict[Any, Any] = {
        "plan_hash": data.draw(st.sampled_from(hashes) | _GARBAGE),
        "rank": data.draw(st.integers(-2, 4) | _HUGE | _GARBAGE),
        "next_step": data.draw(st.integers(meta.first_step - 2, meta.num_steps + 2) | _HUGE | _GARBAGE),
    }
    for key in data.draw(st.lists(st.sampled_from(STATE_KEYS), max_size=2)):
        state.pop(key, None)
    for key in data.draw(st.lists(st.sampled_from(["epoch", "Rank", "", 1, None, ("x",)]), max_size=1)):
        state[key] = data.draw(_GARBAGE)
    return data.draw(st.just(state) | _GARBAGE)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_garbage_states_are_one_line_refusals_or_resume_exactly(plans: Plans, data: st.DataObject) -> None:
    """Any state a trainer could hand back: a one-line PlanStateError that changes nothing, or a
    resume whose batches are exactly the uninterrupted run's from that step; never a raw
    KeyError / TypeError / OverflowError, never other batches."""
    replanned = data.draw(st.booleans())
    plan, meta, world = (plans.replanned, plans.rmeta, W2) if replanned else (plans.plan, plans.meta, W)
    rank = data.draw(st.integers(0, world - 1))
    state = _garbage_state(data, meta, plans.meta.plan_hash if replanned else None)
    cursor = PlanCursor(plan, rank)
    try:
        cursor.load_state_dict(state)
    except PlanStateError as exc:
        msg = str(exc)
        assert "\n" not in msg and msg.startswith(f"{plan}: sampler state") and len(msg) < 400, msg
        assert cursor.next_step == meta.first_step
        return
    assert isinstance(state, dict) and set(state) == set(STATE_KEYS)
    step = state["next_step"]
    assert type(step) is int and type(state["rank"]) is int
    if state["plan_hash"] == meta.plan_hash:
        assert meta.first_step <= step <= meta.num_steps and 0 <= state["rank"] < world
    else:  # the re-plan parent's state at exactly the step the plan was re-planned at
        assert replanned and state["plan_hash"] == plans.meta.plan_hash and step == plans.at
        assert 0 <= state["rank"] < W
    assert cursor.next_step == step and len(cursor) == meta.num_steps - step
    assert run(cursor) == shard_batches(plan, rank)[step - meta.first_step:]


def _swap_shards(plan: Path, dst: Path) -> None:
    """Copy ``plan`` with the files of ranks 0 and 1 swapped and ``plan.json`` made to match
    (shard facts swapped, plan_hash recomputed): a plan every file check accepts."""
    shutil.copytree(plan, dst)
    a, b = dst / "rank-00000.parquet", dst / "rank-00001.parquet"
    tmp = dst / "swap"
    a.rename(tmp), b.rename(a), tmp.rename(b)
    obj = json.loads((dst / "plan.json").read_text())
    s0, s1 = obj["shards"][0], obj["shards"][1]
    obj["shards"][0], obj["shards"][1] = {**s1, "file": s0["file"]}, {**s0, "file": s1["file"]}
    obj["plan_hash"] = plan_hash_of(obj)
    (dst / "plan.json").write_text(json.dumps(obj))


def test_a_shard_of_another_rank_is_refused(plans: Plans, tmp_path: Path) -> None:
    swapped = tmp_path / "swapped"
    _swap_shards(plans.plan, swapped)
    for rank, other in ((0, 1), (1, 0)):
        with pytest.raises(ManifestError, match=rf"rank-0000{rank}\.parquet: the shard is rank {other} of its plan, "
                                                rf"{rank} is opened") as exc:
            list(PlanCursor(swapped, rank))
        assert "\n" not in str(exc.value)
        with pytest.raises(ManifestError, match=f"the shard is rank {other}"):
            PlanShard(swapped, rank)


def test_a_shard_read_outside_the_plan_is_refused(plans: Plans) -> None:
    shard = PlanShard(plans.plan, 0)
    for start in (-1, plans.meta.num_steps + 1, 10**5000, np.int64(-1)):
        for read in (shard.iter_batches, shard.read, shard.iter_tables):
            with pytest.raises(ManifestError, match="start step .* is outside the plan's steps") as exc:
                list(read(start)) if read is not shard.read else read(start)
            assert "\n" not in str(exc.value)
    assert shard.read(plans.meta.num_steps).num_rows == 0  # the end itself: nothing left, not an error
    rshard = PlanShard(plans.replanned, 0)
    with pytest.raises(ManifestError, match=rf"start step 0 is outside the plan's steps {plans.at}\.\."):
        list(rshard.iter_batches(0))
    assert next(b.step for b in rshard) == plans.at  # the default start is the plan's first step
    for epoch in (plans.meta.epochs, -1, 10**12, True, 0.0):
        with pytest.raises(ManifestError, match="is not one of the plan's epochs"):
            shard.read_epoch(epoch, ["rows"])  # type: ignore[arg-type]
