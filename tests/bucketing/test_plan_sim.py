"""Step-time cost model and tail-worker simulator."""

from __future__ import annotations

import numpy as np
import pytest

from bucketing.costmodel import CostModel
from bucketing.simulate import epoch_time_idle, simulate, synchronized_matrix, unsynchronized_matrix


def test_cost_model_terms_and_overrides() -> None:
    m = CostModel(overhead=1.0, per_frame=0.0, per_frame2=0.0, per_token=0.0, per_token2=0.0)
    assert np.allclose(m.step_time([4, 8], [1.0, 2.0], [3, 4]), 1.0)
    m2 = m.with_overrides(["per_frame2=1e-6", "per_token=0.5"])
    # 2 utterances x (1e-6 * 100^2 frames^2 + 0.5 * 3 tokens) + 1 s
    assert m2.step_time([2], [1.0], [3])[0] == pytest.approx(1.0 + 2 * (1e-6 * 100**2 + 1.5))
    with pytest.raises(ValueError, match="NAME=VALUE"):
        m.with_overrides(["nope=1"])
    with pytest.raises(ValueError, match="not a number"):
        m.with_overrides(["overhead=fast"])


def test_idle_fraction_definition() -> None:
    t, idle = epoch_time_idle(np.array([[1.0, 3.0], [2.0, 2.0]]))
    assert t == 5.0 and idle == pytest.approx(1 - 8 / 10)
    t, idle = epoch_time_idle(np.array([[1.0, np.nan]]))
    assert t == 1.0 and idle == pytest.approx(0.5)


def test_same_cost_per_bucket_synchronized_has_no_idle() -> None:
    rng = np.random.default_rng(0)
    bucket = np.repeat(np.arange(10), 64)
    cost = 0.1 + bucket * 0.05
    r = simulate(bucket, cost, 16, seed=1)
    assert r.idle_sync == pytest.approx(0.0, abs=1e-12) and r.idle_unsync > 0.2 and r.speedup > 0.2
    # every batch is dealt exactly once either way
    assert np.nansum(synchronized_matrix(bucket, cost, 16, rng)) == pytest.approx(cost.sum())
    assert np.nansum(unsynchronized_matrix(cost, 16, rng)) == pytest.approx(cost.sum())


def test_unsynchronized_idle_grows_with_world_size() -> None:
    rng = np.random.default_rng(2)
    bucket = rng.integers(0, 30, 50_000)
    cost = 0.05 + 0.02 * bucket * rng.uniform(0.9, 1.1, bucket.shape[0])
    res = [simulate(bucket, cost, w, seed=0) for w in (2, 16, 128)]
    assert res[0].idle_unsync < res[1].idle_unsync < res[2].idle_unsync
    assert res[0].speedup < res[1].speedup < res[2].speedup
    assert all(r.idle_sync < 0.1 < r.idle_unsync for r in res)  # only the ±10% jitter is left
