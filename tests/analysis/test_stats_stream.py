"""Streamed statistics (``dataprep.analysis.exact``, :func:`stream_stats`) against today's
in-memory polars figures (``tests/analysis/today_stats.py``), on random frames cut into blocks
of a few rows: counts, quantiles, orders and thresholds equal bit for bit; sums correctly
rounded (``math.fsum``), so equal to polars' to its own rounding."""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dataprep.analysis.exact import (ExactSums, OrderSelector, float_keys, key_floats, numpy_percentiles, numpy_ranks,
                                   polars_quantile, polars_ranks)
from dataprep.analysis.stats_and_filter import stats_report
from dataprep.analysis.stats import QUANTILES, compute_stats, stream_stats
from manifests.manifest_write import write_manifest
from tests.analysis.today_stats import compute_stats_today

FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
special = st.sampled_from([math.nan, math.inf, None, 0.0])
number = st.one_of(st.floats(0.0, 300.0), st.integers(0, 40).map(float), special)


def blocks_of(df: pl.DataFrame, rows: int):
    return lambda: (df.slice(a, rows) for a in range(0, max(df.height, 1), rows))


def same(a: Any, b: Any, path: str = "") -> None:
    """Equal figures; an ``hours`` float may differ from polars' sum by its rounding only."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        assert math.isnan(b), path
    elif path.endswith("hours") and isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-12), path
    else:
        assert a == b, (path, a, b)


@st.composite
def frames(draw: Any) -> pl.DataFrame:
    n = draw(st.integers(0, 60))
    d = draw(st.lists(number, min_size=n, max_size=n))
    t = draw(st.lists(st.one_of(st.integers(0, 400), st.none()), min_size=n, max_size=n))
    tps = [None if (x is None or y is None) else (y / x if x else math.inf) for x, y in zip(d, t)]
    # some rows with their own tps (NaN / null / anything), as a manifest read from elsewhere may hold
    tps = [draw(number) if draw(st.integers(0, 9)) == 0 else v for v in tps]
    lang = draw(st.lists(st.sampled_from(["en", "de", "ps", None]), min_size=n, max_size=n))
    cols: dict[str, Any] = {"duration": pl.Series(d, dtype=pl.Float64), "num_tokens": pl.Series(t, dtype=pl.Int32),
                            "tps": pl.Series(tps, dtype=pl.Float64), "lang": pl.Series(lang, dtype=pl.String)}
    if draw(st.booleans()):
        cols["corpus"] = pl.Series(draw(st.lists(st.sampled_from(["a", "b", None]), min_size=n, max_size=n)),
                                   dtype=pl.String)
    return pl.DataFrame(cols)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames(), st.integers(2, 9), st.sampled_from([1, 3, 1 << 24]))
@example(pl.DataFrame({"duration": [1.0, 2.0, math.inf], "num_tokens": [3, 4, 5], "tps": [3.0, 2.0, 0.0],
                       "lang": ["en", None, "en"]}), 1, 1)
def test_streamed_stats_equal_todays_figures(df: pl.DataFrame, rows: int, budget: int) -> None:
    """Blocks of a few rows and a tiny selection budget (every bin refined to the last bit)."""
    qs = (*QUANTILES[:-1], 99.9, QUANTILES[-1])
    got = stream_stats(blocks_of(df, rows), quantiles=qs, budget=budget)
    want = compute_stats_today(df, quantiles=qs)
    same(asdict(got), asdict(want))
    assert got.to_json() == want.to_json()
    clean = df["duration"].fill_nan(None).drop_nulls().to_list()
    assert got.hours * 3600 == pytest.approx(math.fsum(clean), rel=1e-15) or math.isnan(math.fsum(clean))
    assert sum(b.count for b in got.tps_by_duration) == len(clean)
    assert sum(x.utterances for x in got.languages) == got.utterances == df.height


@FAST
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), max_size=80),
       st.lists(st.integers(0, 3), min_size=80, max_size=80), st.integers(1, 9))
def test_exact_sums_are_fsum_whatever_the_blocks(values: list[float], groups: list[int], rows: int) -> None:
    g = np.array(groups[: len(values)], dtype=np.int64)
    sums = ExactSums()
    for a in range(0, len(values), rows):
        sums.add(np.array(values[a:a + rows], dtype=np.float64), g[a:a + rows])
    for k in range(4):
        mine = [v for v, h in zip(values, g) if h == k]
        try:
            ref = math.fsum(mine)
        except OverflowError:  # fsum raises where the exact sum is beyond float64
            ref = math.inf if sum(v for v in mine if math.isfinite(v)) > 0 else -math.inf
        except ValueError:  # inf - inf
            ref = math.nan
        got = sums.total(k)
        assert (math.isnan(got) and math.isnan(ref)) or got == ref, (k, got, ref)


@FAST
@given(st.lists(st.floats(allow_nan=False, width=64), min_size=1, max_size=120), st.integers(1, 50),
       st.sampled_from([1, 2, 7, 1 << 20]))
def test_order_selector_is_sorting(values: list[float], rows: int, budget: int) -> None:
    x = np.array(values, dtype=np.float64)
    assert np.array_equal(key_floats(float_keys(x)), x + 0.0)
    sel = OrderSelector(budget)
    for a in range(0, x.size, rows):
        sel.add(x[a:a + rows])
    sel.end_pass()
    sel.request({0: range(x.size)})
    while sel.pending:
        for a in range(0, x.size, rows):
            sel.add(x[a:a + rows])
        sel.end_pass()
    assert sel.passes <= 5
    assert [sel.value(0, r) for r in range(x.size)] == np.sort(x + 0.0).tolist()


def _select(x: np.ndarray, ranks: list[int], budget: int) -> OrderSelector:
    sel = OrderSelector(budget)
    for a in range(0, x.size, 7000):
        sel.add(x[a:a + 7000])
    sel.end_pass()
    sel.request({0: ranks})
    while sel.pending:
        for a in range(0, x.size, 7000):
            sel.add(x[::-1][a:a + 7000])
        sel.end_pass()
    assert [sel.value(0, r) for r in ranks] == np.sort(x)[ranks].tolist()
    return sel


@pytest.mark.parametrize(("case", "passes"), [("repeated", 2), ("even", 2), ("extremes", 2), ("bunched", 3)])
def test_the_pass_counting_a_bin_over_the_budget_resolves_what_it_can(case: str, passes: int) -> None:
    """A bin of [8, 8.5) s holding 20,000 values, 5x the budget: counting its next 16 bits
    also gives its smallest and largest value, every rank when it holds one value (an integer
    column's bins), and a rank whose window (placed as if the values were even) held it;
    values bunched away from the guess take one more pass. Exact in every case."""
    rng = np.random.default_rng(0)
    x = {"repeated": np.full(20_000, 8.0), "even": rng.uniform(8.0, 8.5, 20_000),
         "extremes": rng.uniform(8.0, 8.5, 20_000),
         "bunched": np.concatenate([rng.uniform(8.0, 8.5, 1_000), rng.uniform(8.49, 8.5, 19_000)])}[case]
    ranks = [0, 19_999] if case == "extremes" else [0, 9_999, 10_000]
    assert _select(x, ranks, budget=4_000).passes == passes


@FAST
@given(st.lists(st.floats(0.0, 1e6) | st.sampled_from([0.5, 3.0, math.inf]), min_size=1, max_size=40),
       st.integers(0, 5), st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0, 0.999]))
def test_interpolation_is_numpys_and_polars(values: list[float], nulls: int, q: float) -> None:
    s = np.sort(np.array(values))
    levels = [q * 100, 0.0, 50.0, 100.0]
    with np.errstate(invalid="ignore"):
        want = np.percentile(np.array(values), levels)
    got = numpy_percentiles((s[a], s[b], w) for a, b, w in numpy_ranks(len(values), levels))
    assert np.array_equal(np.array(got), want, equal_nan=True)
    r = polars_ranks(len(values), nulls, q)
    ref = pl.Series([*values, *[None] * nulls], dtype=pl.Float64).quantile(q, interpolation="linear")
    assert polars_quantile(s[r[0]], s[r[1]], r) == ref


def test_stats_report_reads_in_blocks_and_equals_one_frame(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    n = 5000
    d = rng.lognormal(1.5, 0.6, n)
    t = np.round(d * rng.normal(12, 2, n)).astype(np.int64) + 9
    df = pl.DataFrame({"id": [f"u{i}" for i in range(n)], "audio_path": "a.wav", "duration": d, "text": "x",
                       "num_tokens": t, "tps": t / d, "lang": rng.choice(["en", "de"], n)})
    path = tmp_path / "m.parquet"
    write_manifest(df, path)
    streamed, _ = stats_report(path, block_rows=333)
    same(asdict(streamed), asdict(compute_stats_today(df)))
    assert streamed == compute_stats(df)
    # a selection budget of 3 values: every bin refined to its last bits, more passes, the same bytes
    stats_report(path, tmp_path / "default.json")
    stats_report(path, tmp_path / "tiny.json", block_rows=333, budget=3)
    assert (tmp_path / "tiny.json").read_bytes() == (tmp_path / "default.json").read_bytes()
