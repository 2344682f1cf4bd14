"""PlanCursor: resume at any step gives exactly the rest of an uninterrupted run, the worker split
covers each step once, ``len`` is what is yielded (a re-planned plan included), states round-trip,
and hostile states or arguments are one-line DataprepErrors, never coerced."""

from __future__ import annotations

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
from manifests.errors import DataprepError
from manifests.plan_cursor import STATE_KEYS, PlanCursor, PlanStateError
from manifests.plan_files import PlanShard

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
