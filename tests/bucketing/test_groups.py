"""Sync groups (bucketing.groups) and the strategy simulator (bucketing.simulate): exactly once
per epoch for every group size, balance / one bucket within groups, G = W unchanged, SYNC equal
to the tail-worker simulation, ADPSGD / HYBRID figures that follow from their definitions."""

from __future__ import annotations

import numpy as np
import pytest

from bucketing.costmodel import CostModel
from bucketing.groups import regroup
from bucketing.plan import PlanError, plan_epoch
from bucketing.simulate import epoch_time_idle, simulate_strategy
from tests.bucketing.test_balance import _budget_inputs

W = 8


@pytest.fixture(scope="module")
def inp():
    return _budget_inputs(4, 8000, 8)


@pytest.mark.parametrize("balance", [0.0, 0.05])
@pytest.mark.parametrize("G", [1, 2, 4, 8])
def test_every_group_size_plans_each_row_once_with_steps_synchronized_in_groups(inp, balance: float, G: int) -> None:
    base = plan_epoch(inp, W, 1, 0, balance=balance)
    p = regroup(base, G, seed=1)
    S = p.num_steps
    assert S == base.num_steps and p.sizes().shape[0] == W * S
    assert np.array_equal(np.sort(p.rows), np.flatnonzero(np.asarray(inp.bucket_of_row) >= 0))
    # inside a group, step s is one step of the base plan: same batches as there, same bucket if base had one
    bucket = p.bucket_of_batch().reshape(W, S)
    t = CostModel().step_time(p.sizes(), p.max_duration, p.max_tokens).reshape(W, S)
    base_t = CostModel().step_time(base.sizes(), base.max_duration, base.max_tokens).reshape(W, S)
    for q in range(W // G):
        grp = slice(q * G, (q + 1) * G)
        if balance == 0:
            assert (bucket[grp] == bucket[grp][:1]).all()
        # a group's steps are a permutation of the base plan's steps for its ranks
        assert sorted(map(tuple, t[grp].T.round(9))) == sorted(map(tuple, base_t[grp].T.round(9)))
    if G == W:
        assert p is base
    elif G == 1:
        assert not (bucket == bucket[:1]).all()  # learners draw their own buckets


def test_group_size_must_divide_the_world(inp) -> None:
    with pytest.raises(PlanError, match="divide"):
        regroup(plan_epoch(inp, W, 0, 0), 3, 0)


def test_sync_strategy_is_the_tail_worker_simulation(inp) -> None:
    p = plan_epoch(inp, W, 0, 0)
    t = CostModel().step_time(p.sizes(), p.max_duration, p.max_tokens).reshape(W, -1).T
    sizes = p.sizes().reshape(W, -1).T
    r = simulate_strategy(t, sizes, "sync")
    total, idle = epoch_time_idle(t)
    assert r.time == pytest.approx(total) and r.idle == pytest.approx(idle) and r.staleness == 0
    assert r.utt_per_s == pytest.approx(sizes.sum() / total)
    # ADPSGD without exchange cost never waits longer than SYNC: a learner waits at most for its neighbour
    a = simulate_strategy(t, sizes, "adpsgd", exchange=0.0)
    h = simulate_strategy(t, sizes, "hybrid", group_size=4, exchange=0.0)
    assert a.time <= r.time + 1e-9 and h.time <= r.time + 1e-9 and a.idle <= r.idle + 1e-12
    # a hybrid of one group is SYNC
    assert simulate_strategy(t, sizes, "hybrid", group_size=W, exchange=0.0).time == pytest.approx(r.time)


def test_a_slow_rank_slows_sync_every_step_and_is_tolerated_with_staleness() -> None:
    S = 200
    t = np.full((S, 4), 1.0)
    sizes = np.ones((S, 4), dtype=np.int64)
    sync = simulate_strategy(t, sizes, "sync", slow={2: 1.5})
    assert sync.time == pytest.approx(1.5 * S) and sync.idle == pytest.approx(1 - 4.5 / 6)
    ad = simulate_strategy(t, sizes, "adpsgd", exchange=0.0, slow={2: 1.5})
    assert ad.staleness >= 1 and ad.time <= sync.time + 1e-9
    with pytest.raises(ValueError, match="slow rank 9"):
        simulate_strategy(t, sizes, "sync", slow={9: 2.0})
    with pytest.raises(ValueError, match="unknown strategy"):
        simulate_strategy(t, sizes, "ring")
