"""In-bucket batch forming and the padding report, checked against brute force."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketing.allocate import allocate
from bucketing.batching import form_batches, form_batches_cumulative
from bucketing.bucket_order import BucketGrouping, _block_offers, _even_out
from bucketing.fit_passes import fit_buckets
from bucketing.padding import PaddingSums, measure, padding_report


def _rows(draw_n: int, seed: int):
    rng = np.random.default_rng(seed)
    d = np.round(rng.uniform(0.5, 30, draw_n), 2)
    t = rng.integers(1, 120, draw_n)
    return d, t


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 400), st.integers(0, 10_000), st.integers(1, 6), st.integers(1, 40),
       st.sampled_from(["auto", "tokens", "duration", "none"]))
def test_batches_cover_rows_once_and_respect_sizes(n, seed, nb, window, sort_by) -> None:
    rng = np.random.default_rng(seed)
    bucket = rng.integers(-1, nb, n)
    sizes = rng.integers(1, 12, nb)
    d, t = _rows(n, seed)
    x = form_batches(bucket, sizes, np.random.default_rng(seed), t, duration=d, window=window, sort_by=sort_by)
    assert np.array_equal(np.sort(x.rows), np.flatnonzero(bucket >= 0))
    assert (bucket[x.rows] == np.repeat(x.bucket, x.sizes())).all()
    assert (x.sizes() <= sizes[x.bucket]).all() and (x.sizes() >= 1).all()
    assert (np.diff(x.bucket) >= 0).all()
    for k in np.unique(x.bucket):  # only a bucket's last batch may be short
        s = x.sizes()[x.bucket == k]
        assert (s[:-1] == sizes[k]).all()
    y = form_batches(bucket, sizes, np.random.default_rng(seed), t, duration=d, window=window, sort_by=sort_by)
    assert np.array_equal(x.rows, y.rows) and np.array_equal(x.offsets, y.offsets)


def _cost(x, d, t, w):
    """The grouping cost form_batches minimizes: w * audio padding + token padding, as shares."""
    sizes = x.sizes()
    pad_d = (sizes * np.maximum.reduceat(d[x.rows], x.offsets[:-1])).sum() - d[x.rows].sum()
    pad_t = (sizes * np.maximum.reduceat(t[x.rows], x.offsets[:-1])).sum() - t[x.rows].sum()
    return w * pad_d / d[x.rows].sum() + pad_t / t[x.rows].sum()


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 6), st.sampled_from([1.0, 5.0]))
def test_small_buckets_peel_boxes_no_worse_than_sorts(seed, nb, w) -> None:
    # a few batches per bucket (the Common Voice regime): box peeling is tried and kept
    # only where it beats every sort, so the default never costs more than a sort
    rng = np.random.default_rng(seed)
    sizes = rng.integers(5, 40, nb)
    counts = sizes * rng.integers(2, 6, nb) + rng.integers(0, 5, nb)
    bucket = np.repeat(np.arange(nb), counts)
    n = bucket.shape[0]
    d = np.round(rng.uniform(1, 3, n) * (1 + bucket), 2)
    t = (d * rng.gamma(2, 3, n)).astype(np.int64) + 9  # long token tails, as real transcripts
    best = form_batches(bucket, sizes, np.random.default_rng(seed), t, duration=d, audio_weight=w)
    assert np.array_equal(np.sort(best.rows), np.arange(n))
    for k in range(nb):  # full batches, one short batch last
        s = best.sizes()[best.bucket == k]
        assert (s[:-1] == sizes[k]).all() and s[-1] <= sizes[k]
    for g in (1, 10**6):  # token sort, duration sort
        x = form_batches(bucket, sizes, np.random.default_rng(seed), t, duration=d, groups=g, audio_weight=w)
        assert _cost(best, d, t, w) <= _cost(x, d, t, w) + 1e-12


def test_peeling_cuts_padding_on_a_two_dimensional_spread() -> None:
    rng = np.random.default_rng(0)
    n = 900
    d = rng.uniform(1.0, 2.5, n)
    t = (d * rng.uniform(5, 20, n)).astype(np.int64) + 9
    bucket = np.zeros(n, dtype=np.int64)
    sizes = np.array([240])
    peeled = measure(form_batches(bucket, sizes, np.random.default_rng(0), t, duration=d), d, t)
    for g in (1, 10**6):
        x = measure(form_batches(bucket, sizes, np.random.default_rng(0), t, duration=d, groups=g), d, t)
        assert 5 * peeled.audio_padding + peeled.token_padding < 5 * x.audio_padding + x.token_padding


def _brute(batches, d, t, fixed=None):
    real_d = padded_d = real_t = padded_t = 0.0
    for i in range(batches.num_batches):
        rows = [int(r) for r in batches.rows[batches.offsets[i]:batches.offsets[i + 1]]]
        real_d += sum(d[r] for r in rows)
        real_t += sum(t[r] for r in rows)
        padded_d += len(rows) * (fixed if fixed else max(d[r] for r in rows))
        padded_t += len(rows) * max(t[r] for r in rows)
    return 1 - real_d / padded_d, 1 - real_t / padded_t


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 120), st.integers(0, 1000))
def test_padding_matches_brute_force(n, seed) -> None:
    d, t = _rows(n, seed)
    grid = fit_buckets(d, t, 3, 2).grid
    a = allocate(d, t, grid)
    sizes = np.random.default_rng(seed).integers(1, 9, grid.num_buckets)
    x = form_batches(a.bucket, sizes, np.random.default_rng(seed), t, duration=d)
    p = measure(x, d, t)
    bd, bt = _brute(x, d, t)
    assert abs(p.audio_padding - bd) < 1e-9 and abs(p.token_padding - bt) < 1e-9
    assert p.num_batches == x.num_batches and abs(p.mean_batch_size - n / x.num_batches) < 1e-9
    pf = measure(x, d, t, fixed_audio=30.0)
    assert abs(pf.audio_padding - _brute(x, d, t, fixed=30.0)[0]) < 1e-9
    sums = PaddingSums(grid.num_buckets)
    for i in range(x.num_batches):
        r = x.rows[x.offsets[i]:x.offsets[i + 1]]
        sums.add(int(x.bucket[i]), d[r], t[r].astype(np.int64), np.array([0, r.shape[0]]))
    pb = sums.per_bucket()
    for k in range(grid.num_buckets):
        sel = np.flatnonzero(x.bucket == k)
        if sel.shape[0] == 0:
            continue
        rows = np.concatenate([x.rows[x.offsets[i]:x.offsets[i + 1]] for i in sel])
        padded = sum((x.offsets[i + 1] - x.offsets[i]) * d[x.rows[x.offsets[i]:x.offsets[i + 1]]].max() for i in sel)
        assert abs(pb["audio_padding"][k] - (1 - d[rows].sum() / padded)) < 1e-9


def test_cumulative_heuristic_is_greedy() -> None:
    d, _ = _rows(500, 3)
    bucket = np.zeros(500, dtype=np.int64)
    x = form_batches_cumulative(bucket, d, 100.0, np.random.default_rng(0))
    sums = np.add.reduceat(d[x.rows], x.offsets[:-1])
    assert (sums <= 100.0 + 1e-9).all()
    nxt = d[x.rows[x.offsets[1:-1]]]  # first row of the next batch would not have fitted
    assert (sums[:-1] + nxt > 100.0).all()
    assert np.array_equal(np.sort(x.rows), np.arange(500))


def test_grouping_cuts_padding_and_report_orders_schemes() -> None:
    rng = np.random.default_rng(1)
    d = np.round(rng.gamma(4, 2.5, 20_000) + 0.5, 3)
    t = (d * rng.uniform(2, 5, d.shape[0])).astype(np.int64) + 9
    grid = fit_buckets(d, t, 10, 2).grid
    a = allocate(d, t, grid)
    sizes = np.floor(600 / grid.max_duration).astype(np.int64)
    plain = measure(form_batches(a.bucket, sizes, np.random.default_rng(0), t, window=1), d, t)
    grouped = measure(form_batches(a.bucket, sizes, np.random.default_rng(0), t, duration=d), d, t)
    assert grouped.token_padding < plain.token_padding and grouped.audio_padding < plain.audio_padding
    rep = padding_report(d, t, grid, sizes, budget=600)
    s = rep["schemes"]
    # 2D buckets trade a little audio padding (token sub-bins hold mixed durations) for tokens
    assert s["1d-budget"]["audio_padding"] < s["1d-cumulative"]["audio_padding"] < s["fixed-30s"]["audio_padding"]
    assert s["2d"]["audio_padding"] < 1.25 * s["1d-budget"]["audio_padding"]
    assert s["2d"]["token_padding"] < s["1d-budget"]["token_padding"] < s["fixed-30s"]["token_padding"]
    assert s["fixed-30s"]["excluded"] == int((d > 30).sum())
    assert sum(b["num_rows"] for b in rep["per_bucket"]) == d.shape[0]


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3000), st.integers(0, 10_000), st.integers(1, 30), st.sampled_from([2, 4, 16]),
       st.sampled_from(["both", "tokens", "duration"]), st.integers(1, 4000), st.integers(-1, 3))
def test_order_in_chunks_equals_whole_bucket(n, seed, size, window, sort_by, chunk, extra) -> None:
    """A bucket ordered in parts of whole windows (what the out-of-core planner holds) gets
    the positions, and leaves the rng, as ordering it whole does; also for near-equal batches
    (``extra`` batches beyond the full ones; -1: full batches)."""
    batches = None if extra < 0 else min(n, -(-n // size) + extra)
    d, t = _rows(n, seed)
    if seed % 5 == 0:
        d[:] = 7.0  # one duration: a zero-width key range
    g = BucketGrouping(sort_by, window).with_totals(float(d.sum()) * 2, float(t.sum()) * 2)
    r1, r2 = np.random.default_rng(seed), np.random.default_rng(seed)
    whole = g.order(n, size, r1, d, t, batches=batches)
    parts = list(g.order_chunks(n, size, r2, d, t, chunk, batches=batches))
    if batches is None:
        assert all(p.shape[0] % (size * window) == 0 for p in parts[:-1])
    assert np.array_equal(np.concatenate(parts), whole)
    assert np.array_equal(np.sort(whole), np.arange(n))
    assert r1.random() == r2.random()


@settings(max_examples=200, deadline=None)
@given(blocks=st.integers(0, 6), size=st.integers(1, 6), extra=st.integers(0, 6), seed=st.integers(0, 2**32 - 1),
       ties=st.booleans())
def test_block_offers_are_the_lexsort_firsts(blocks: int, size: int, extra: int, seed: int, ties: bool) -> None:
    """Each full block's offer is the row a lexsort by (block, grow, -length) puts first."""
    rng = np.random.default_rng(seed)
    n = blocks * size + min(extra, size)
    draw = (lambda: rng.choice([0.0, -0.0, 1.0, 2.0], n)) if ties else (lambda: rng.random(n))
    grow, length = draw(), draw()
    expect = np.lexsort((-length, grow, np.arange(n) // size))[np.arange(blocks) * size]
    np.testing.assert_array_equal(_block_offers(grow, length, blocks, size), expect)


def _even_out_whole(p: np.ndarray, d: np.ndarray, t: np.ndarray, batches: int, q: int, r: int) -> np.ndarray:
    """The evening out as first written, on a whole bucket at once: the oracle of the one in parts."""
    cnt = p.shape[0]
    pos = np.arange(cnt, dtype=np.int64)
    blk = pos // (q + 1)
    dd, tt = d[p], t[p]
    last = blk == batches - 1
    grow = np.maximum(dd - dd[last].max(), 0.0) + np.maximum(tt - tt[last].max(), 0.0)
    first = np.lexsort((-(dd + tt), grow, blk))  # each block's offer: least grow, then longest, then first
    offer = first[np.searchsorted(blk[first], np.arange(batches - 1))]
    donors = offer[np.lexsort((np.arange(batches - 1), -(dd + tt)[offer], grow[offer]))[:batches - r - 1]]
    moved = np.zeros(cnt, dtype=bool)
    moved[donors] = True
    gives = np.zeros(batches, dtype=bool)
    gives[blk[donors]] = True
    keep = ~gives[blk] & ~last
    return p[np.concatenate([pos[keep], pos[gives[blk] & ~moved], pos[last], pos[moved]])]


@settings(max_examples=150, deadline=None)
@given(size=st.integers(2, 9), full=st.integers(1, 40), short=st.integers(1, 8), chunk=st.integers(1, 200),
       seed=st.integers(0, 2**32 - 1), ties=st.booleans())
def test_even_out_in_parts_equals_whole(size: int, full: int, short: int, chunk: int, seed: int, ties: bool) -> None:
    """Evening a bucket out part by part (per block three numbers, one part of prices at once)
    gives the positions the whole-bucket evening gives, in parts of whole batches."""
    q = size - 1
    last = max(min(short, q), q - full + 1)  # the short block: so 0 < batches - r <= q and r >= 1
    batches = full + 1
    cnt = full * size + last
    r = cnt - batches * q
    rng = np.random.default_rng(seed)
    draw = (lambda: rng.choice([0.0, 0.5, 1.0], cnt)) if ties else (lambda: rng.random(cnt))
    d, t = draw(), draw()
    p = rng.permutation(cnt).astype(np.int32)
    parts = list(_even_out(p, lambda x: (d[x], t[x]), batches, q, r, chunk))
    expect = _even_out_whole(p, d, t, batches, q, r)
    np.testing.assert_array_equal(np.concatenate(parts), expect)
    ends = np.cumsum([x.shape[0] for x in parts])
    starts = np.cumsum([0] + [q + 1] * r + [q] * (batches - r))  # the near-equal batches' bounds
    assert set(ends.tolist()) <= set(starts.tolist())


@pytest.mark.parametrize("as_float", [False, True])
@pytest.mark.parametrize("rows,top", [(1000, 10**6), (100_000, 2**40), (7, 2**52)])
def test_exact_bincount_is_exact_and_order_free(rows: int, top: int, as_float: bool) -> None:
    """Per-group integer sums exact (as Python's ints) on both paths (one float64 sum, or 16-bit
    halves when a total could reach 2**53), for int64 weights and whole float64 ones, and the
    same in any order or split."""
    from bucketing.padding import exact_bincount

    rng = np.random.default_rng(rows)
    g, w = rng.integers(0, 4, rows), rng.integers(0, top, rows, dtype=np.int64)
    if as_float:
        w = w.astype(np.float64)
    want = [sum(int(x) for x in w[g == k]) for k in range(4)]
    assert exact_bincount(g, w, 4).tolist() == want
    perm = rng.permutation(rows)
    half = rows // 2
    parts = exact_bincount(g[perm][:half], w[perm][:half], 4) + exact_bincount(g[perm][half:], w[perm][half:], 4)
    assert parts.tolist() == want
