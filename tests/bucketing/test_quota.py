"""Weighted epochs (bucketing.quota): NeMo's probabilities, exact quotas, coverage before repeats."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketing.quota import (
    QuotaError,
    QuotaSampler,
    Shuffle,
    blend_probabilities,
    corpus_indices,
    group_rows,
    epoch_size_for_hours,
    flat_tree,
    is_weighted,
    quotas,
    reweight,
)


def test_reweight_is_nemos_formula() -> None:
    # NeMo's docstring examples (temperature_reweighting)
    assert reweight([197, 2159], 1.0) == pytest.approx([0.0836, 0.9164], abs=1e-4)
    assert reweight([197, 2159], 0.0).tolist() == [0.5, 0.5]
    w = np.array([1.0, 10.0, 100.0])
    assert reweight(w, 0.5) == pytest.approx(w ** 0.5 / (w ** 0.5).sum())
    with pytest.raises(QuotaError):
        reweight([1.0, 0.0], 1.0)


def test_nested_blend_multiplies_levels_with_per_level_temperatures() -> None:
    tree = {"temperature": [1.0, 0.5], "children": [
        {"weight": 0.7, "children": [{"weight": 100.0, "corpus": "a"}, {"weight": 4.0, "corpus": "b"}]},
        {"weight": 0.3, "corpus": "c"},
    ]}
    p = blend_probabilities(tree)
    inner = np.sqrt([100.0, 4.0]) / np.sqrt([100.0, 4.0]).sum()
    assert p == pytest.approx({"a": 0.7 * inner[0], "b": 0.7 * inner[1], "c": 0.3})
    scalar = blend_probabilities({**tree, "temperature": 0.5})
    top = np.sqrt([0.7, 0.3]) / np.sqrt([0.7, 0.3]).sum()
    assert scalar == pytest.approx({"a": top[0] * inner[0], "b": top[0] * inner[1], "c": top[1]})
    assert blend_probabilities(tree, temperature=0.0) == pytest.approx({"a": 0.25, "b": 0.25, "c": 0.5})
    assert sum(p.values()) == pytest.approx(1.0)
    unweighted = {"temperature": None, "children": [{"weight": None, "corpus": "x"}, {"weight": None, "corpus": "y"}]}
    assert not is_weighted(unweighted) and is_weighted(tree)
    assert blend_probabilities(flat_tree({"x": 3.0, "y": 1.0}, None)) == {"x": 0.75, "y": 0.25}


def test_quotas_round_half_up_and_epoch_hours() -> None:
    assert quotas([0.25, 0.75], 10).tolist() == [3, 8]
    assert quotas([0.5, 0.5], 7).tolist() == [4, 4]
    n = epoch_size_for_hours([0.5, 0.5], [2.0, 6.0], 1.0)
    assert n == 900  # 3600 s / (0.5 * 2 + 0.5 * 6) s per utterance


@st.composite
def corpora(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, int]:
    C = draw(st.integers(1, 5))
    sizes = draw(st.lists(st.integers(1, 40), min_size=C, max_size=C))
    q = draw(st.lists(st.integers(0, 120), min_size=C, max_size=C))
    codes = np.repeat(np.arange(C), sizes)
    perm = np.random.default_rng(draw(st.integers(0, 9))).permutation(codes.shape[0])
    codes = codes[perm]
    codes[draw(st.lists(st.integers(0, codes.shape[0] - 1), max_size=3))] = -1  # rows in no bucket
    present = np.bincount(codes[codes >= 0], minlength=C)
    q = np.where(present > 0, q, 0)
    return codes, np.asarray(q, np.int64), draw(st.integers(0, 2**31))


def _sampler(codes: np.ndarray, q: np.ndarray, seed: int) -> QuotaSampler:
    return QuotaSampler(np.bincount(codes[codes >= 0], minlength=q.shape[0]), q, seed)


@settings(max_examples=60, deadline=None)
@given(corpora(), st.integers(1, 8))
def test_every_epoch_gives_exactly_the_quota_and_covers_before_repeating(data: tuple, epochs: int) -> None:
    codes, q, seed = data
    s = _sampler(codes, q, seed)
    C = q.shape[0]
    seen_total = [np.zeros(codes.shape[0], np.int64) for _ in range(C)]
    again = _sampler(codes, q, seed)
    for e in range(epochs):
        rows = s.epoch_rows(group_rows(codes, C), e)
        assert np.array_equal(rows, again.epoch_rows(group_rows(codes, C), e))  # deterministic
        assert (np.diff(rows) >= 0).all()  # ascending, a repeated row in one run
        assert (codes[rows] >= 0).all()
        per = np.bincount(codes[rows], minlength=C)
        assert per.tolist() == q.tolist()  # exactly the quota
        times = np.bincount(rows, minlength=codes.shape[0])
        for c in range(C):
            mine = codes == c
            n = int(mine.sum())
            if not n:
                continue
            f, r = divmod(int(q[c]), n)
            assert set(np.unique(times[mine])) <= {f, f + 1}  # each row floor(k) or ceil(k) times
            assert int((times[mine] == f + 1).sum()) == r
            seen_total[c] += times
            # the drawn rows so far: each row's count differs by at most one (all before repeats)
            extra = seen_total[c][mine] - f * (e + 1)
            assert extra.max() - extra.min() <= 1
    # any epoch first (a re-plan), and block by block: the same rows
    assert np.array_equal(_sampler(codes, q, seed).epoch_rows(group_rows(codes, C), epochs - 1), rows)
    keep = np.flatnonzero(codes >= 0)
    start = np.zeros(C, np.int64)
    index = np.concatenate([np.empty(0, np.int64)] + [corpus_indices(codes[keep][a:a + 3], start)
                                                      for a in range(0, keep.shape[0], 3)])
    assert start.tolist() == np.bincount(codes[keep], minlength=C).tolist()
    assert np.array_equal(np.repeat(keep, s.times(codes[keep], index, epochs - 1)), rows)


@given(st.integers(1, 3000), st.lists(st.integers(0, 2**40), min_size=1, max_size=3))
@settings(max_examples=40, deadline=None)
def test_shuffle_is_a_permutation_and_inverse_undoes_it(m: int, key: list[int]) -> None:
    s = Shuffle(m, key)
    f = s.forward(np.arange(m))
    assert np.array_equal(np.sort(f), np.arange(m))
    assert np.array_equal(s.inverse(f), np.arange(m))
    assert np.array_equal(Shuffle(m, key).forward(np.arange(m)), f)  # keyed, deterministic


def test_shuffle_mixes() -> None:
    """A keyed shuffle looks random: positions of consecutive indices are uncorrelated and two
    keys give unrelated orders (Spearman's rho near 0 for 100,000 indices)."""
    m = 100_000
    a, b = Shuffle(m, (1,)).forward(np.arange(m)), Shuffle(m, (2,)).forward(np.arange(m))
    assert abs(np.corrcoef(a, np.arange(m))[0, 1]) < 0.02
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.02
    assert abs(np.corrcoef(a[:-1], a[1:])[0, 1]) < 0.02


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 4), st.floats(0.0, 0.1), st.sampled_from(["random", "ascending"]))
def test_planner_batches_a_weighted_epoch_exactly_as_its_multiset(seed: int, world: int, balance: float,
                                                                  interleave: str) -> None:
    from bucketing.plan import PlanInputs, plan_epoch

    rng = np.random.default_rng(seed)
    n = int(rng.integers(40, 200))
    d = rng.uniform(0.5, 8.0, n)
    t = (d * rng.uniform(2, 5, n)).astype(np.int64) + 3
    bucket = np.minimum((d // 2.5).astype(np.int32), 2)
    bucket[rng.integers(0, n, 3)] = -1  # rows in no bucket are never planned
    codes = rng.integers(0, 3, n)
    codes[bucket < 0] = -1
    q = rng.integers(5, 150, 3)
    q = np.where(np.bincount(codes[codes >= 0], minlength=3) > 0, q, 0)
    rows = _sampler(codes, q, seed).epoch_rows(group_rows(codes, 3), 0)
    inputs = PlanInputs(bucket, np.array([6, 4, 3]), d, t, np.array([2.5, 5.0, 8.0]), None, rows=rows)
    ep = plan_epoch(inputs, world, seed, 0, interleave=interleave, balance=balance)  # type: ignore[arg-type]
    got = np.bincount(np.concatenate([ep.rows, ep.dropped]), minlength=n)
    assert np.array_equal(got, np.bincount(rows, minlength=n))  # each row exactly as often as drawn
    assert ep.real_seconds == pytest.approx(float(d[ep.rows].sum()))
    sizes = ep.sizes()
    assert (sizes > 0).all() and (sizes <= np.array([6, 4, 3])[ep.bucket_of_batch()]).all()
