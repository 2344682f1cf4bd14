"""Section 1 of ``dataprep report`` streamed in blocks equals the same tables of whole
arrays: histograms, the --max-tps table, the 2D grid, totals, stats, groups and the rows'
blocks, on small manifests with null / NaN durations, tokens and TPS, in any block size."""

from __future__ import annotations

import math
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataprep.report.aggregates import HIST_TOP, Histogram, corpus_aggregates, grid_histogram, tps_cut_table
from dataprep.analysis.stats import QUANTILES, compute_stats
from dataprep.report.stream_sections import RowBlock
from manifests.manifest_write import write_manifest
from tests.analysis.test_stats_stream import same

special = st.sampled_from([math.nan, None])  # infinities: a compiled manifest holds none
number = st.one_of(st.floats(0.01, 90.0), st.integers(0, 40).map(float), special)


@st.composite
def manifests(draw: Any) -> pl.DataFrame:
    n = draw(st.integers(1, 40))
    d = draw(st.lists(number, min_size=n, max_size=n))
    t = draw(st.lists(st.one_of(st.integers(0, 600), st.none()), min_size=n, max_size=n))
    tps = [draw(number) if draw(st.integers(0, 4)) == 0 else (None if x is None or y is None or not x else y / x)
           for x, y in zip(d, t)]
    origin = [f"/c/{draw(st.sampled_from('abc'))}.jsonl:{i}" for i in range(n)]
    return pl.DataFrame({"id": [f"u{i}" for i in range(n)], "duration": pl.Series(d, dtype=pl.Float64),
                         "num_tokens": pl.Series(t, dtype=pl.Int64), "tps": pl.Series(tps, dtype=pl.Float64),
                         "origin": origin, "lang": draw(st.lists(st.sampled_from(["en", "de", None]), min_size=n,
                                                                 max_size=n))})


def whole(df: pl.DataFrame) -> dict[str, Any]:
    """Section 1 of whole arrays, as the report computed it before it streamed."""
    d = df["duration"].cast(pl.Float64).to_numpy()
    t = df["num_tokens"].cast(pl.Float64).to_numpy()
    tps = df["tps"].to_numpy()
    stats = compute_stats(df.select("duration", "num_tokens", "tps"), quantiles=(*QUANTILES[:-1], HIST_TOP, 100))
    top = {c: stats.quantiles[c][f"p{HIST_TOP:g}"] for c in ("duration", "num_tokens", "tps")}
    hours_of = np.where(np.isnan(d), 0.0, d)
    return {"histograms": [asdict(Histogram.of("duration", d, hours_of, top["duration"])),
                           asdict(Histogram.of("num_tokens", t, hours_of, top["num_tokens"], integer=True)),
                           asdict(Histogram.of("tps", tps, hours_of, top["tps"]))],
            "tps_cut": tps_cut_table(tps, d),
            "grid2d": grid_histogram(d, t, top["duration"] or 0.0, top["num_tokens"] or 0.0, None),
            "totals": {"utterances": df.height, "hours": round(stats.hours, 4) if math.isfinite(stats.hours) else 0.0,
                       "tokens": int(np.nansum(t))},
            "stats": asdict(stats), "d": d, "t": np.nan_to_num(t).astype(np.int64)}


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manifests(), st.sampled_from([1, 3, 7, 1 << 20]))
def test_streamed_section_1_equals_whole_arrays(df: pl.DataFrame, block_rows: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.parquet"
        write_manifest(df, path)
        blocks: list[RowBlock] = []
        agg, corp = corpus_aggregates(path, consumers=[blocks.append], codes=True, block_rows=block_rows)
        assert [b.start for b in blocks] == list(range(0, df.height, block_rows))
        d, t = np.concatenate([b.duration for b in blocks]), np.concatenate([b.tokens for b in blocks])
        codes = corp.order[np.concatenate([b.corpus for b in blocks if b.corpus is not None])]
        want = whole(df)
        got = {"histograms": [asdict(h) for h in agg.histograms], "tps_cut": agg.tps_cut, "grid2d": agg.grid2d,
               "totals": agg.totals, "stats": asdict(agg.stats)}
        same(got, {k: v for k, v in want.items() if k not in ("d", "t")})
        for k in ("histograms", "tps_cut", "grid2d", "totals"):  # the page's figures: bit for bit
            assert got[k] == want[k], k
        np.testing.assert_array_equal(d, want["d"])
        np.testing.assert_array_equal(t, want["t"])
        names = df["origin"].str.replace(r":[^:/]*$", "").str.replace("/c/", "")  # source files: a.jsonl ...
        assert [corp.names[c] for c in codes] == names.to_list()
        g = {(x["corpus"], x["lang"]): x["utterances"] for x in corp.groups}
        assert sum(g.values()) == df.height
        assert g == {(c, lang or "-"): n for c, lang, n in pl.DataFrame({"c": names, "l": df["lang"]})
                     .group_by("c", "l").len().iter_rows()}
        if block_rows == 3:  # without sections 2-3: the same page
            none, _ = corpus_aggregates(path, block_rows=block_rows)
            same(asdict(none), asdict(agg))
        if block_rows == 1 << 20:  # selecting 2 values a pass (every bin refined): the same page
            tiny, _ = corpus_aggregates(path, block_rows=block_rows, budget=2)
            assert repr(tiny) == repr(agg)  # every float to its last bit (repr round-trips)
