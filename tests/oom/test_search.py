from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from oom.cache import ProbeCache, budget_probe
from oom.search import ProbeResult, enforce_monotone, find_max_batch, search_buckets


def limit_probe(limit: int, calls: list[int] | None = None):
    def probe(b: int) -> ProbeResult:
        if calls is not None:
            calls.append(b)
        return ProbeResult(fits=b <= limit, peak_bytes=b * 100, step_seconds=0.001 * b)

    return probe


@given(limit=st.integers(0, 5000), start=st.integers(1, 3000), tol=st.sampled_from([0.0, 0.01, 0.05, 0.2]))
@example(limit=0, start=1, tol=0.0)
@example(limit=1, start=4096, tol=0.05)
@settings(max_examples=200, deadline=None)
def test_largest_feasible_within_tolerance(limit: int, start: int, tol: float) -> None:
    calls: list[int] = []
    res = find_max_batch(limit_probe(limit, calls), start=start, tolerance=tol, max_batch=4096)
    r = res.batch_size
    assert r <= limit  # never a batch that does not fit
    if limit >= 4096:
        assert r == 4096
    elif limit >= 1:
        # the smallest failure probed is within the tolerance of the result
        fails = [b for b in calls if b > limit]
        assert fails and min(fails) - r <= max(1, int(tol * r))
        assert res.best is not None and res.best.fits
    else:
        assert r == 0
    assert len(calls) == len(set(calls))  # each size probed once


shapes_st = st.lists(
    st.tuples(st.integers(1, 40), st.integers(1, 300)), min_size=1, max_size=12, unique=True
)


@given(shapes=shapes_st, seed=st.integers(0, 10**6))
@settings(max_examples=100, deadline=None)
def test_bucket_sizes_monotone_even_with_noisy_probe(shapes: list[tuple[int, int]], seed: int) -> None:
    # A noisy capacity (not monotone in the shape): the enforced result still is.
    def cap(i: int) -> int:
        d, t = shapes[i]
        return max(0, 20000 // (d * 10 + t) + ((seed * (i + 7)) % 13) - 6)

    sizes, raw = search_buckets(shapes, lambda i: limit_probe(cap(i)), tolerance=0.0)
    for i, (d, t) in enumerate(shapes):
        assert sizes[i] <= raw[i].batch_size <= cap(i)
        for j, (d2, t2) in enumerate(shapes):
            if d2 <= d and t2 <= t:
                assert sizes[i] <= sizes[j]


def test_enforce_monotone_never_raises() -> None:
    shapes = [(1, 10), (1, 20), (2, 10), (2, 20)]
    assert enforce_monotone(shapes, [10, 12, 8, 9]) == [10, 10, 8, 8]


def test_next_bucket_starts_from_previous_result() -> None:
    starts: dict[int, list[int]] = {}

    def probe_for(i: int):
        seen = starts.setdefault(i, [])

        def probe(b: int) -> ProbeResult:
            seen.append(b)
            return ProbeResult(fits=b <= [400, 200, 100][i])

        return probe

    search_buckets([(1, 5), (2, 5), (3, 5)], probe_for, tolerance=0.0)
    assert starts[2][0] == 1  # largest bucket first, from the start value
    assert starts[1][0] == 100 and starts[0][0] == 200


def test_cache_hit_on_rerun_does_not_probe(tmp_path) -> None:
    shapes = [(100, 10), (200, 20), (300, 30)]
    calls: list[int] = []

    def run() -> list[int]:
        def probe_for(i: int):
            cache = ProbeCache(tmp_path, {"model": "m", "gpu": "g", "shape": list(shapes[i])})
            return budget_probe(limit_probe(1000 // (i + 1), calls), budget_bytes=10**9, cache=cache)

        return search_buckets(shapes, probe_for, tolerance=0.0)[0]

    first = run()
    n = len(calls)
    assert n > 0
    assert run() == first
    assert len(calls) == n  # every probe answered from the cache


def test_budget_is_applied_to_cached_peaks(tmp_path) -> None:
    cache = ProbeCache(tmp_path, {"k": 1})
    res = find_max_batch(budget_probe(limit_probe(10**6), budget_bytes=5000, cache=cache), tolerance=0.0)
    assert res.batch_size == 50  # peak = 100 * b <= 5000
    calls: list[int] = []
    res2 = find_max_batch(budget_probe(limit_probe(10**6, calls), budget_bytes=2000, cache=ProbeCache(tmp_path, {"k": 1})), tolerance=0.0)
    assert res2.batch_size == 20
