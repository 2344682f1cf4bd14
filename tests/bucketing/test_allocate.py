"""Allocation: every row in exactly one bucket that holds it; strict drops reported; budget rule."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bucketing.allocate import allocate
from bucketing.budget import padded_budget_batch_sizes
from bucketing.fit import Grid, grid_from_spec
from bucketing.fit_passes import fit_buckets
from manifests.buckets_file import parse_buckets
from manifests.errors import ManifestError

rows_st = st.lists(st.tuples(st.floats(0.1, 60.0), st.integers(1, 400)), min_size=1, max_size=300)


def _holds(grid: Grid, b: np.ndarray, d: np.ndarray, t: np.ndarray, max_tokens: np.ndarray) -> np.ndarray:
    """A bucket holds a row when the row is within its upper bounds (a row may sit in a
    longer-duration bin than its own when its tokens need it)."""
    return (d <= grid.max_duration[b]) & (t <= max_tokens[b])


@settings(max_examples=80, deadline=None)
@given(rows_st, rows_st, st.integers(1, 8), st.integers(1, 3))
@example([(1.0, 5)], [(1.0, 500)], 1, 1)
def test_every_row_lands_in_exactly_one_bucket_that_holds_it(fit_rows, new_rows, nb, ns) -> None:
    fd = np.array([r[0] for r in fit_rows]); ft = np.array([r[1] for r in fit_rows])
    grid = fit_buckets(fd, ft, nb, ns).grid
    d = np.array([r[0] for r in new_rows]); t = np.array([r[1] for r in new_rows])
    a = allocate(d, t, grid)
    dropped = np.concatenate([v for v in a.dropped.values()] or [np.zeros(0, np.int64)])
    assert set(a.dropped) <= {"max_duration"}  # flexible: only rows longer than the grid
    assert np.array_equal(np.sort(dropped), np.flatnonzero(a.bucket < 0))
    assert np.array_equal(np.flatnonzero(a.bucket < 0), np.flatnonzero(d > grid.max_duration[-1]))
    ok = a.bucket >= 0
    b = a.bucket[ok].astype(np.int64)
    assert _holds(grid, b, d[ok], t[ok], a.max_tokens).all()
    # smallest: no earlier bucket (in grid order) holds the row, except bins before its own
    for i in np.flatnonzero(ok)[:50]:
        fits = (grid.max_duration >= d[i]) & (a.max_tokens >= t[i])
        assert a.bucket[i] == np.flatnonzero(fits)[0]
    # the fitted data itself always fits, never raising a bound: with the token fence, only
    # rows above their bin's fenced top bound move; without fences nothing moves
    own = allocate(fd, ft, grid)
    assert own.num_dropped == 0 and own.raised == 0
    own_bin = np.searchsorted(np.unique(grid.max_duration), fd, side="left")
    top = np.asarray([grid.max_tokens[grid.duration_bin == j].max() for j in range(grid.num_duration_bins)])
    assert own.moved == int((ft > top[own_bin]).sum())
    plain = fit_buckets(fd, ft, nb, ns, outlier_fence=None, token_fence=None).grid
    own = allocate(fd, ft, plain)
    assert own.num_dropped == 0 and own.moved == 0 and own.raised == 0


def test_strict_drops_are_reported_with_reason() -> None:
    spec = parse_buckets({"buckets": [
        {"max_duration": 5.0, "max_tokens": 20}, {"max_duration": 5.0, "max_tokens": 40},
        {"max_duration": 10.0, "max_tokens": 60}, {"max_duration": 10.0, "max_tokens": 100}]})
    grid = grid_from_spec(spec)
    d = np.array([1.0, 4.0, 4.0, 9.0, 12.0, 5.0])
    t = np.array([10, 30, 70, 120, 10, 40])
    strict = allocate(d, t, grid, strict=True)
    assert strict.bucket.tolist() == [0, 1, -1, -1, -1, 1]
    assert strict.dropped["exceeds_bucket"].tolist() == [2, 3, 4]
    flex = allocate(d, t, grid)
    assert flex.bucket.tolist() == [0, 1, 3, 3, -1, 1]  # row 2 moved to bin 1; row 3 raises bucket 3
    assert flex.moved == 1 and flex.raised == 1 and flex.max_tokens[-1] == 120
    assert flex.dropped["max_duration"].tolist() == [4]


def test_hand_written_nemo_bins_and_bad_order() -> None:
    grid = grid_from_spec(parse_buckets({"buckets": [{"max_duration": x} for x in (2.0, 5.0, 9.0)]}))
    a = allocate(np.array([1.0, 2.0, 2.5, 9.0]), np.array([1000, 5, 5, 5]), grid)
    assert a.bucket.tolist() == [0, 0, 1, 2]
    with pytest.raises(ManifestError, match="max_tokens must increase"):
        grid_from_spec(parse_buckets({"buckets": [{"max_duration": 2.0, "max_tokens": 9},
                                                   {"max_duration": 2.0, "max_tokens": 9}]}))
    with pytest.raises(ManifestError, match="non-decreasing"):
        grid_from_spec(parse_buckets({"buckets": [{"max_duration": 3.0}, {"max_duration": 2.0}]}))


def test_padded_budget_rule() -> None:
    md = np.array([2.0, 12.0, 25.0, 700.0])
    mt = np.array([30, 100, 400, 1000])
    assert padded_budget_batch_sizes(md, max_duration_budget=600).tolist() == [300, 50, 24, 1]
    assert padded_budget_batch_sizes(md, max_frames_budget=60_000).tolist() == [300, 50, 24, 1]
    both = padded_budget_batch_sizes(md, mt, max_duration_budget=600, max_tokens_budget=6000)
    assert both.tolist() == [200, 50, 15, 1]
    with pytest.raises(ValueError):
        padded_budget_batch_sizes(md)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.01, 50.0), min_size=1, max_size=40, unique=True), st.integers(0, 10_000))
@example([0.010000000000000002, 0.01], 0)  # bounds one ulp apart: the table must not be used
def test_bin_of_equals_searchsorted(bounds, seed) -> None:
    # the lookup table must agree with a binary search exactly, also on and next to bounds
    from bucketing.allocate import bin_of

    b = np.sort(np.asarray(bounds))
    rng = np.random.default_rng(seed)
    near = np.concatenate([b, np.nextafter(b, 0), np.nextafter(b, 100)])
    v = np.concatenate([near, rng.uniform(-1, 60, 20_000), [0.0, np.inf, np.nan]])
    assert np.array_equal(bin_of(v, b), np.searchsorted(b, v, side="left"))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 400), nd=st.integers(1, 5), ns=st.integers(1, 3), seed=st.integers(0, 10_000),
       max_bs=st.integers(1, 12), across=st.booleans(), frac=st.sampled_from([0.25, 0.5, 1.0]))
def test_carried_tails_stay_in_a_bucket_that_holds_them(n, nd, ns, seed, max_bs, across, frac) -> None:
    from bucketing.allocate import carry_tails

    rng = np.random.default_rng(seed)
    d = rng.uniform(0.5, 20, n).round(2)
    t = np.maximum(1, (d * rng.uniform(1, 6, n))).astype(np.int64)
    grid = fit_buckets(d, t, num_buckets=nd, num_subbuckets=ns).grid
    alloc = allocate(d, t, grid)
    bs = rng.integers(1, max_bs + 1, grid.num_buckets)
    mt = alloc.max_tokens
    b, carried = carry_tails(alloc.bucket, d, t, bs, mt, grid.duration_bin, across_bins=across,
                             max_tail_fraction=frac)
    ok = b >= 0
    assert np.array_equal(ok, alloc.bucket >= 0)  # left-out rows stay out, nothing else leaves
    assert (d[ok] <= grid.max_duration[b[ok]]).all() and (t[ok] <= mt[b[ok]]).all()
    assert (b[ok] >= alloc.bucket[ok]).all()  # rows only move on to later buckets
    assert carried == int((b != alloc.bucket).sum())
    counts = np.bincount(b[ok], minlength=grid.num_buckets)
    if not across:  # rows keep their duration bin
        assert np.array_equal(grid.duration_bin[b[ok]], grid.duration_bin[alloc.bucket[ok]])
    # a bucket ends with whole batches unless its tail is over the fraction carried, or no
    # bucket it may pass rows to holds the tail
    for k in range(grid.num_buckets - 1):
        if 0 < counts[k] % bs[k] <= frac * bs[k]:
            rows = np.flatnonzero(b == k)
            allowed = np.arange(k + 1, grid.num_buckets)
            if not across:
                allowed = allowed[grid.duration_bin[allowed] == grid.duration_bin[k]]
            assert not (t[rows][:, None] <= mt[None, allowed]).any(axis=1).all()
