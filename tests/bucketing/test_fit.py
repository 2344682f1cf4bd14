"""Equal-occupancy fitting: bounds, occupancy, ties and skew, caps, 1D, golden file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketing.allocate import allocate
from bucketing.fit_passes import fit_buckets, fit_spec
from bucketing.fit import (OVERFLOW_MIN_ROWS, OVERFLOW_RATIO, SPLIT_MIN_SHARE, equal_occupancy_cuts,
                           grid_from_spec, merge_sparse_bins, split_wide_bins)
from manifests.buckets_file import parse_buckets

GOLDEN = Path(__file__).parent / "golden" / "buckets_small.json"


def _synthetic(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    d = np.round(rng.gamma(4, 2.5, n) + 0.5, 3)
    t = (d * rng.uniform(2, 5, n)).astype(np.int64) + 9
    return d, t


def _check_grid(grid, d, t) -> None:
    dbin_bounds = grid.max_duration[np.append(True, np.diff(grid.duration_bin) != 0)]
    assert (np.diff(dbin_bounds) > 0).all()
    for j in range(grid.num_duration_bins):
        mt = grid.max_tokens[grid.duration_bin == j]
        assert (np.diff(mt) > 0).all()
    assert grid.max_duration[-1] == d.max()


def test_equal_occupancy_seconds_2d() -> None:
    d, t = _synthetic(200_000)
    g = fit_buckets(d, t, 30, 2, outlier_fence=None, token_fence=None).grid
    assert g.num_buckets == 60
    _check_grid(g, d, t)
    dbin = np.searchsorted(np.unique(g.max_duration), d, side="left")
    share = np.bincount(dbin, weights=d) / d.sum()
    assert np.abs(share * 30 - 1).max() < 0.01
    # token sub-bins: equal seconds inside each duration bin, within the granularity of a token value
    for j in range(30):
        sel = dbin == j
        mt = g.max_tokens[g.duration_bin == j]
        sub = np.searchsorted(mt, t[sel], side="left")
        w = np.bincount(sub, weights=d[sel], minlength=2)
        biggest_tie = max(d[sel][t[sel] == v].sum() for v in np.unique(t[sel]))
        assert abs(w[0] - w[1]) <= biggest_tie + 1e-9


def test_ties_and_skew_never_duplicate_or_empty() -> None:
    # 80% of the audio sits on one duration; tokens tied too
    d = np.concatenate([np.full(8000, 5.0), np.linspace(1, 20, 2000)])
    t = np.concatenate([np.full(8000, 20), np.arange(2000) % 7 + 10])
    fit = fit_buckets(d, t, 30, 2)
    g = fit.grid
    _check_grid(g, d, t)
    dbin = np.searchsorted(np.unique(g.max_duration), d, side="left")
    assert (np.bincount(dbin) > 0).all()
    for j in range(g.num_duration_bins):
        mt = g.max_tokens[g.duration_bin == j]
        sub = np.searchsorted(mt, t[dbin == j], side="left")
        assert (np.bincount(sub, minlength=mt.shape[0]) > 0).all()


def test_fewer_distinct_values_than_bins() -> None:
    d = np.repeat([1.0, 2.0, 3.0], 10)
    t = np.repeat([5, 6, 7], 10)
    fit = fit_buckets(d, t, 30, 2)
    assert list(np.unique(fit.grid.max_duration)) == [1.0, 2.0, 3.0]
    assert fit.grid.num_buckets == 3  # one token value per bin: one sub-bin each
    assert fit.notes


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.01, 100.0), min_size=1, max_size=200), st.integers(1, 40))
def test_cuts_strictly_increasing(weights: list[float], bins: int) -> None:
    cum = np.cumsum(weights)
    cuts = equal_occupancy_cuts(cum, bins)
    assert (np.diff(cuts) > 0).all() and cuts[-1] == len(weights) - 1
    assert len(cuts) == min(bins, len(weights))


def test_one_dimensional_case() -> None:
    d, t = _synthetic(10_000)
    g = fit_buckets(d, None, 10, 1, outlier_fence=None).grid
    assert g.num_buckets == 10 and (g.token_bin == 0).all()
    g2 = fit_buckets(d, t, 10, 1, outlier_fence=None).grid
    assert np.array_equal(g.max_duration, g2.max_duration)
    assert np.array_equal(g2.max_tokens, [t[(d > lo if np.isfinite(lo) else True) & (d <= hi)].max()
                                          for lo, hi in zip(g2.min_duration, g2.max_duration)])


def test_caps_are_reported() -> None:
    d, t = _synthetic(5_000)
    spec, alloc = fit_spec(d, t, num_buckets=8, num_subbuckets=2, min_duration=2.0, max_duration=20.0)
    out = spec.fit["outside_caps"]
    assert out["min_duration"]["rows"] == int((d < 2.0).sum()) > 0
    assert out["max_duration"]["rows"] == int((d > 20.0).sum()) > 0
    assert spec.fit["dropped"] == {"max_duration": int((d > 20.0).sum()), "min_duration": int((d < 2.0).sum())}
    assert spec.buckets[-1].max_duration <= 20.0 and spec.buckets[0].min_duration == 2.0
    assert sum(b.num_utterances for b in spec.buckets) + alloc.num_dropped == d.shape[0]


def test_deterministic_and_spec_round_trip() -> None:
    d, t = _synthetic(3_000)
    a, _ = fit_spec(d, t, num_buckets=6, num_subbuckets=2, manifest_hash="h")
    b, _ = fit_spec(d.copy(), t.copy(), num_buckets=6, num_subbuckets=2, manifest_hash="h")
    assert json.dumps(a.to_json(), sort_keys=True) == json.dumps(b.to_json(), sort_keys=True)
    g = grid_from_spec(parse_buckets(a.to_json()))
    f = fit_buckets(d, t, 6, 2).grid
    assert np.array_equal(g.max_duration, f.max_duration) and np.array_equal(g.max_tokens, f.max_tokens)
    assert a.batch_size_source == {"rule": "padded-budget", "max_duration": 600.0}
    assert a.fit["num_buckets"] == 6 and a.fit["num_subbuckets"] == 2 and a.fit["manifest_hash"] == "h"


def test_overflow_bin_holds_far_out_durations_only() -> None:
    d, t = _synthetic(20_000, seed=3)
    d = np.concatenate([d, [70.0, 120.0, 160.0]])  # a few far-out clips (besides gamma's own tail)
    t = np.concatenate([t, [30, 12, 40]])
    q1, q3 = np.quantile(d, [0.25, 0.75], method="inverted_cdf")
    fence = q3 + 3 * (q3 - q1)
    fit = fit_buckets(d, t, 12, 2)
    g = fit.grid
    _check_grid(g, d, t)
    far = d > fence
    assert fit.overflow_rows == int(far.sum()) and abs(fit.overflow_from - fence) < 1e-9
    # overflow bins grow by OVERFLOW_RATIO: one bucket per (fence r^(k-1), fence r^k] that holds
    # rows, bounded by its longest row; a bin of fewer than OVERFLOW_MIN_ROWS joins a neighbour
    r = OVERFLOW_RATIO
    levels = np.ceil(np.log(d[far] / fence) / np.log(r)).astype(int)
    n_over = fit.overflow_bins
    assert 2 <= n_over <= np.unique(levels).shape[0] and g.num_duration_bins == 12 + n_over
    assert (g.duration_bin >= 12).sum() == n_over  # one bucket each
    a = allocate(d, t, g)
    assert np.array_equal(np.flatnonzero(a.bucket >= g.num_buckets - n_over), np.flatnonzero(far))
    over_bin = a.bucket[far] - (g.num_buckets - n_over)
    rows = np.bincount(over_bin, minlength=n_over)
    assert (rows >= OVERFLOW_MIN_ROWS).all() and g.max_duration[-1] == d.max()
    for j in range(n_over):  # bounded by its longest row; whole levels, merged only where sparse
        assert g.max_duration[g.num_buckets - n_over + j] == d[far][over_bin == j].max()
        held, per_level = np.unique(levels[over_bin == j], return_counts=True)
        assert np.isin(levels, held).sum() == per_level.sum()
        assert held.shape[0] == 1 or (per_level < OVERFLOW_MIN_ROWS).any()
    assert g.min_duration[-n_over] < d[far].min()
    # the 12 bins asked for are equal in seconds over the other rows
    bulk = np.unique(g.max_duration)[:-n_over]
    share = np.bincount(np.searchsorted(bulk, d[~far], side="left"), weights=d[~far]) / d[~far].sum()
    assert np.abs(share * 12 - 1).max() < 0.02
    rep = fit.report()["outliers"]
    assert rep["overflow_bin"]["rows"] == int(far.sum()) > 3 and rep["duration_fence"] == "Q3 + 3 * IQR"
    assert rep["overflow_bin"]["bins"] == n_over
    # without far-out durations, or with the fence off, exactly the bins asked for
    assert fit_buckets(d[~far], t[~far], 12, 2).overflow_from is None
    assert fit_buckets(d, t, 12, 2, outlier_fence=None).grid.num_duration_bins == 12


def test_sparse_overflow_bins_join_a_neighbour() -> None:
    assert merge_sparse_bins(np.array([10.0, 20.0, 30.0]), np.array([3, 1, 4])).tolist() == [10.0, 30.0]
    assert merge_sparse_bins(np.array([10.0, 20.0, 30.0]), np.array([3, 4, 1])).tolist() == [10.0, 30.0]
    assert merge_sparse_bins(np.array([10.0, 20.0, 30.0]), np.array([1, 5, 1])).tolist() == [30.0]
    assert merge_sparse_bins(np.array([10.0]), np.array([1])).tolist() == [10.0]
    assert merge_sparse_bins(np.array([10.0, 20.0]), np.array([2, 2])).tolist() == [10.0, 20.0]


def test_token_fence_moves_outliers_to_a_later_bin() -> None:
    d, t = _synthetic(20_000, seed=5)
    t = t.copy()
    short = np.flatnonzero(d < np.quantile(d, 0.05))[:20]
    t[short] = t.max() + 50  # transcripts far too long for their clips
    plain = fit_buckets(d, t, 10, 2, outlier_fence=None, token_fence=None).grid
    fenced = fit_buckets(d, t, 10, 2, outlier_fence=None).grid
    _check_grid(fenced, d, t)
    assert fenced.max_tokens[1] < plain.max_tokens[1]  # bin 0's top bound no longer set by them
    a = allocate(d, t, fenced)
    assert a.num_dropped == 0 and a.raised == 0 and a.moved >= 20
    moved_to = a.bucket[short]
    assert (fenced.duration_bin[moved_to] == fenced.num_duration_bins - 1).all()  # only the last holds them
    # rows within the fences stay in their own bin
    own = np.searchsorted(np.unique(fenced.max_duration), d, side="left")
    top = np.asarray([fenced.max_tokens[fenced.duration_bin == j].max() for j in range(10)])
    stay = t <= top[own]
    assert (fenced.duration_bin[a.bucket[stay]] == own[stay]).all()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.1, 200.0), st.integers(1, 400)), min_size=1, max_size=300),
       st.integers(1, 8), st.integers(1, 3), st.sampled_from([None, 0.0, 1.5, 3.0]))
def test_fenced_grids_keep_invariants(rows, nb, ns, k) -> None:
    d = np.array([r[0] for r in rows]); t = np.array([r[1] for r in rows])
    g = fit_buckets(d, t, nb, ns, outlier_fence=k, token_fence=k).grid
    _check_grid(g, d, t)
    a = allocate(d, t, g)
    assert a.num_dropped == 0 and a.raised == 0
    assert (np.bincount(a.bucket, minlength=g.num_buckets) > 0).all()  # no empty bucket
    assert (d <= g.max_duration[a.bucket]).all() and (t <= g.max_tokens[a.bucket]).all()


def test_golden_buckets_json() -> None:
    """Bounds for a fixed input; regenerate only with UPDATE_GOLDEN=1."""
    d, t = _synthetic(2_000, seed=7)
    spec, _ = fit_spec(d, t, num_buckets=5, num_subbuckets=2, manifest_hash="golden")
    text = json.dumps(spec.to_json(), indent=2, sort_keys=True) + "\n"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text, encoding="utf-8")
    if not GOLDEN.exists():
        pytest.fail(f"{GOLDEN} missing: run with UPDATE_GOLDEN=1 once")
    assert text == GOLDEN.read_text(encoding="utf-8")


def _long_with_short_tail(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Utterances of 11-16 s (most of the audio) and a sparse tail of 1.4-6.5 s (3% of it), as
    LibriSpeech."""
    rng = np.random.default_rng(seed)
    d = np.round(np.concatenate([rng.uniform(11, 16, 20_000), rng.uniform(1.4, 6.5, 2_800)]), 3)
    return d, (d * 3).astype(np.int64) + 9


def test_a_wide_first_bin_is_split_where_its_parts_hold_audio() -> None:
    d, t = _long_with_short_tail()
    fit = fit_buckets(d, t, 30, 2)
    bounds = np.unique(fit.grid.max_duration)
    assert bounds.shape[0] == 31 and fit.overflow_from is None  # one bin more than asked
    assert np.isin(bounds, d).all()  # bounds are durations that occur
    plain = np.unique(fit_buckets(d, t, 30, 2, outlier_fence=None).grid.max_duration)
    assert plain.shape[0] == 31
    # the first bin spanned > 1.5x; its parts: the top one at most 1.5x, each with a quarter of a bin's audio
    parts = np.concatenate([[d.min()], bounds[:2]])
    assert bounds[1] / d[d > bounds[0]].min() <= OVERFLOW_RATIO  # its rows span at most 1.5x
    audio = np.histogram(d, bins=np.concatenate([[0], bounds]), weights=d)[0]
    assert (audio[:2] >= SPLIT_MIN_SHARE * d.sum() / 30).all()
    assert parts[2] / parts[0] > OVERFLOW_RATIO
    assert any("added by splitting" in n and "1.40" in n for n in fit.notes)
    assert fit.report()["num_duration_bins"] == 31 and fit.report()["num_buckets"] == 30


def test_narrow_bins_and_thin_parts_stay_whole() -> None:
    d, t = _synthetic(50_000)
    d = d[(d > 6) & (d < 13)]  # every bin spans less than 1.5x
    assert np.unique(fit_buckets(d, t[:d.shape[0]], 12, 2).grid.max_duration).shape[0] == 12
    # a wide first bin whose short part holds little audio (a few 1 s clips): not split
    rng = np.random.default_rng(1)
    d2 = np.round(np.concatenate([rng.uniform(2.0, 2.6, 300), rng.uniform(1.0, 1.5, 3), rng.uniform(2.6, 5.0, 5000)]), 3)
    fit = fit_buckets(d2, (d2 * 3).astype(np.int64) + 9, 10, 1, outlier_fence=None)
    assert np.unique(fit.grid.max_duration).shape[0] == 10 and not any("splitting" in n for n in fit.notes)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.5, 40.0, allow_nan=False), min_size=2, max_size=300), st.integers(1, 12))
def test_split_wide_bins_keeps_cuts_and_holds_audio(durations: list[float], num_bins: int) -> None:
    v = np.unique(np.round(np.asarray(durations), 2))
    counts = np.ones(v.shape[0])
    cum = np.cumsum(v * counts)
    cuts = equal_occupancy_cuts(cum, num_bins)
    out = split_wide_bins(v, cum, cuts)
    assert (np.diff(out) > 0).all() and np.isin(cuts, out).all()  # strictly increasing, every cut kept
    share = SPLIT_MIN_SHARE * cum[-1] / cuts.shape[0]
    part_audio = np.diff(np.concatenate([[0.0], cum[out]]))
    added = ~np.isin(out, cuts)
    # an added bound ends a part with a quarter of a bin's audio, and so does the part above it
    assert (part_audio[added] >= share - 1e-9).all()
    assert (part_audio[np.flatnonzero(added) + 1] >= share - 1e-9).all()
