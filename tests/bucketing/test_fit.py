"""Equal-occupancy fitting: bounds, occupancy, ties and skew, caps, 1D, golden file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketing.allocate import fit_spec
from bucketing.fit import equal_occupancy_cuts, fit_buckets, grid_from_spec
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
    g = fit_buckets(d, t, 30, 2).grid
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
    g = fit_buckets(d, None, 10, 1).grid
    assert g.num_buckets == 10 and (g.token_bin == 0).all()
    g2 = fit_buckets(d, t, 10, 1).grid
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
