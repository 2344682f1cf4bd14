"""Properties of the planner core (bucketing.plan): coverage, synchronization, equal steps,
capacity and bounds, determinism, different order per epoch, interleaving."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bucketing.plan import EpochPlan, PlanError, PlanInputs, plan_epoch


def _inputs(seed: int, n: int, num_buckets: int, max_bs: int, two_d: bool, unalloc: float = 0.05,
            min_bs: int = 1) -> PlanInputs:
    """Random rows allocated to nested (1D) or 2D bucket bounds; ~unalloc rows left out."""
    rng = np.random.default_rng(seed)
    d = rng.lognormal(1.5, 0.7, n)
    tok = np.maximum(1, (d * rng.uniform(1, 4, n)).astype(np.int64))
    if two_d:  # num_buckets duration bins x 2 token sub-bins
        edges = np.quantile(d, np.linspace(0, 1, num_buckets + 1)[1:])
        dbin = np.searchsorted(edges, d)
        med = np.array([np.median(tok[dbin == k]) if (dbin == k).any() else 1 for k in range(num_buckets)])
        max_d = np.repeat(edges, 2)
        max_t = np.stack([med, np.full(num_buckets, tok.max())], 1).ravel().astype(np.float64)
        bucket = 2 * dbin + (tok > med[dbin])
    else:
        edges = np.quantile(d, np.linspace(0, 1, num_buckets + 1)[1:])
        max_d, max_t = edges, np.full(num_buckets, np.inf)
        bucket = np.searchsorted(edges, d)
    bucket = np.where(rng.random(n) < unalloc, -1, bucket).astype(np.int32)
    bs = rng.integers(min_bs, max_bs + 1, max_d.shape[0])
    return PlanInputs(bucket, bs, d, tok, max_d, max_t)


def check_invariants(p: EpochPlan, inp: PlanInputs) -> None:
    """Coverage, synchronization (same bucket, rows inside its bounds), equal steps, capacity."""
    W, S = p.world_size, p.num_steps
    allocated = np.flatnonzero(np.asarray(inp.bucket_of_row) >= 0)
    # coverage: every allocated row exactly once, on exactly one rank, or listed as dropped
    placed = np.concatenate([p.rows, p.dropped])
    assert placed.shape[0] == allocated.shape[0]
    assert np.array_equal(np.sort(placed), allocated)
    # equal steps: rank-major CSR with exactly W*S non-empty batches
    sizes = p.sizes()
    assert sizes.shape[0] == W * S and (sizes >= 1).all()
    # synchronization: batch (r, s) is in bucket step_bucket[s]; every row fits that bucket
    bucket_of_batch = np.tile(p.step_bucket, W)
    assert (sizes <= np.asarray(inp.batch_sizes)[bucket_of_batch]).all()
    b_of_row = np.repeat(bucket_of_batch, sizes)
    assert (inp.durations[p.rows] <= inp.max_duration[b_of_row]).all()
    assert (inp.num_tokens[p.rows] <= inp.max_tokens[b_of_row]).all()
    # rows stay in their own bucket unless a counted fallback moved them
    moved = int((np.asarray(inp.bucket_of_row)[p.rows] != b_of_row).sum())
    assert moved <= sum(f["rows"] for f in p.fallbacks if f["kind"] in ("carried", "borrowed"))
    assert p.dropped.shape[0] == sum(f["rows"] for f in p.fallbacks if f["kind"] == "dropped")
    # per-batch maxima match the rows
    assert np.allclose(p.max_duration, np.maximum.reduceat(inp.durations[p.rows], p.offsets[:-1]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), n=st.integers(40, 600), buckets=st.integers(1, 6),
       max_bs=st.integers(1, 24), world=st.integers(1, 16), two_d=st.booleans(), epoch=st.integers(0, 3))
@example(seed=0, n=40, buckets=6, max_bs=1, world=16, two_d=True, epoch=0)  # tiny buckets, batch size 1
@example(seed=1, n=200, buckets=1, max_bs=1, world=7, two_d=False, epoch=0)  # 1 bucket, bs 1, 200 % 7 != 0
def test_invariants_hold_for_random_inputs(seed, n, buckets, max_bs, world, two_d, epoch) -> None:
    inp = _inputs(seed, n, buckets, max_bs, two_d)
    if (inp.bucket_of_row >= 0).sum() < world:
        with pytest.raises(PlanError):
            plan_epoch(inp, world, seed, epoch)
        return
    check_invariants(plan_epoch(inp, world, seed, epoch), inp)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), n=st.integers(64, 800), buckets=st.integers(1, 8),
       world=st.integers(1, 32))
def test_nested_buckets_with_batch_size_two_never_drop(seed, n, buckets, world) -> None:
    """With nested bounds and batch sizes >= 2, leftovers always find a synchronized home."""
    inp = _inputs(seed, n, buckets, 30, two_d=False, min_bs=2)
    if (inp.bucket_of_row >= 0).sum() < world:
        return
    p = plan_epoch(inp, world, seed, 0)
    check_invariants(p, inp)
    assert p.dropped.shape[0] == 0


def test_fallbacks_are_rare_at_scale() -> None:
    """200k rows, 30x2 buckets, 64 ranks: tails are re-split in their own bucket, nothing moves."""
    inp = _inputs(7, 200_000, 30, 1, two_d=True, unalloc=0.0)
    bs = np.maximum(2, (600 / inp.max_duration).astype(np.int64))
    inp = PlanInputs(inp.bucket_of_row, bs, inp.durations, inp.num_tokens, inp.max_duration, inp.max_tokens)
    p = plan_epoch(inp, 64, 0, 0)
    check_invariants(p, inp)
    moved = sum(f["rows"] for f in p.fallbacks)
    assert moved / 200_000 < 1e-3, p.fallbacks
    assert p.resplit_buckets > 0  # tails existed and were handled inside their bucket
    assert 0 < p.audio_padding < 0.2 and 0 < p.token_padding < 0.6
    rows_d = inp.durations[p.rows]
    assert p.real_seconds == pytest.approx(rows_d.sum())
    assert p.padded_seconds == pytest.approx(sum(len(r) * inp.durations[r].max() for r in np.split(p.rows, p.offsets[1:-1])))


def test_deterministic_and_seed_and_epoch_change_order() -> None:
    inp = _inputs(3, 3000, 4, 20, two_d=True)
    a, b = plan_epoch(inp, 8, 5, 1), plan_epoch(inp, 8, 5, 1)
    for f in ("step_bucket", "offsets", "rows", "max_duration", "max_tokens", "dropped"):
        assert np.array_equal(getattr(a, f), getattr(b, f))
    other_epoch, other_seed = plan_epoch(inp, 8, 5, 2), plan_epoch(inp, 8, 6, 1)
    for c in (other_epoch, other_seed):
        assert not np.array_equal(a.rows, c.rows)
        assert not np.array_equal(a.step_bucket, c.step_bucket)
        # the same rows, just in another order
        assert np.array_equal(np.sort(a.rows), np.sort(c.rows))


def test_interleaving_random_vs_ascending() -> None:
    inp = _inputs(4, 5000, 6, 20, two_d=False, unalloc=0.0)
    rand = plan_epoch(inp, 4, 0, 0)
    asc = plan_epoch(inp, 4, 0, 0, interleave="ascending")
    assert (np.diff(asc.step_bucket) >= 0).all()
    assert (np.diff(rand.step_bucket) < 0).any()  # not a length curriculum
    assert np.array_equal(np.bincount(rand.step_bucket), np.bincount(asc.step_bucket))
    with pytest.raises(PlanError):
        plan_epoch(inp, 4, 0, 0, interleave="sideways")  # type: ignore[arg-type]


def test_fewer_rows_than_ranks_is_an_error() -> None:
    inp = _inputs(0, 10, 1, 4, two_d=False, unalloc=0.0)
    with pytest.raises(PlanError, match="cannot fill one step of 16 ranks"):
        plan_epoch(inp, 16, 0, 0)


def test_tiny_bucket_is_carried_to_its_container() -> None:
    """A bucket with fewer rows than ranks trains inside the next bucket that contains it."""
    d = np.r_[np.full(3, 1.0), np.full(64, 5.0)]
    tok = np.full(d.shape[0], 10)
    inp = PlanInputs(np.r_[np.zeros(3), np.ones(64)].astype(np.int32), np.array([8, 8]), d, tok,
                     np.array([2.0, 6.0]), np.array([20.0, 20.0]))
    p = plan_epoch(inp, 8, 0, 0)
    check_invariants(p, inp)
    assert p.fallbacks == [{"kind": "carried", "from": 0, "to": 1, "rows": 3}]
    assert set(p.step_bucket.tolist()) == {1}
