"""The report's aggregates: every table adds up to the manifest it summarizes, the --max-tps
slider agrees with ``filter`` itself, and a plan of another manifest or buckets file is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dataprep.planning.build import build_plan

from dataprep.planning.options import PlanOptions
from dataprep.report.aggregates import (MAX_GROUPS, CorpusGroups, Histogram, collect_report, corpora, grid_histogram,
                                        rejects_aggregates, tps_cut_table)
from dataprep.report.buckets_section import SCHEME_SAMPLE_ROWS, bucket_rows, bucket_section
from dataprep.report.stream_sections import RowBlock
from dataprep.analysis.filters import Thresholds, apply_filters
from dataprep.testing import write_plan_inputs
from manifests.buckets_file import read_buckets
from manifests.errors import DataprepError, ManifestError
from manifests.manifest_write import reasons_count, write_manifest, write_rejects


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A two-corpus, two-language manifest (with a NaN TPS row), a fitted buckets.json, a
    W=4 plan and a rejects file."""
    folder = tmp_path_factory.mktemp("agg")
    kept, buckets = write_plan_inputs(folder, 3000, seed=3, num_buckets=8)
    df = pl.read_parquet(kept)
    n = df.height
    rng = np.random.default_rng(0)
    df = df.with_columns(
        (pl.col("num_tokens") / pl.col("duration")).alias("tps"),
        pl.Series("lang", rng.choice(["en", "de"], n)),
        pl.Series("origin", [f"/data/{'a' if i % 3 else 'b'}/train.jsonl:{i + 1}" for i in range(n)]),
    ).with_columns(pl.when(pl.int_range(pl.len()) == 7).then(float("nan")).otherwise(pl.col("tps")).alias("tps"))
    write_manifest(df, kept)
    build_plan(kept, buckets, folder / "plan", PlanOptions(world_size=4, epochs=2))
    rej = df.head(40).with_columns(pl.Series("reason", ["max_tps"] * 25 + ["empty_text"] * 15),
                                   pl.lit("why").alias("detail"))
    write_rejects(rej, folder / "rejects.parquet")
    return {"kept": kept, "buckets": buckets, "plan": folder / "plan", "rejects": folder / "rejects.parquet",
            "folder": folder}


def test_every_table_adds_up_to_the_manifest(inputs: dict[str, Path]) -> None:
    df = pl.read_parquet(inputs["kept"])
    r = collect_report(inputs["kept"], rejects=[inputs["rejects"]], buckets=inputs["buckets"], plan=inputs["plan"],
                       world_sizes=[2, 8])
    c = r.corpus
    assert c.totals["utterances"] == df.height
    assert c.totals["hours"] == pytest.approx(df["duration"].sum() / 3600, abs=1e-3)
    assert sum(g["utterances"] for g in c.groups) == df.height
    assert {g["corpus"] for g in c.groups} == {"a/train.jsonl", "b/train.jsonl"}  # source files, told apart
    for h in c.histograms:
        finite = df[h.column].cast(pl.Float64).is_finite().sum()
        assert sum(b["n"] for b in h.bins) == finite, h.column
    assert sum(x["n"] for x in c.grid2d["cells"]) == df.height
    # a box per bucket that starts inside the plotted extent (far overflow bins lie beyond it)
    starts = [b.min_duration or 0.0 for b in read_buckets(inputs["buckets"]).buckets]
    assert len(c.grid2d["boxes"]) == sum(lo < c.grid2d["max_duration"] for lo in starts) >= 10
    assert sum(b["utterances"] for b in r.buckets.buckets) == df.height  # no row dropped by the 2D scheme
    assert {s["scheme"] for s in r.buckets.schemes} >= {"2d", "1d-budget", "2d-dynamic-resolution"}
    p = r.plan
    assert p.summary["world_size"] == 4 and len(p.ranks) == 4
    assert sum(x["utterances"] for x in p.ranks) == df.height  # epoch 0 trains every row once
    assert [s["world_size"] for s in p.simulate] == [4, 2, 8]
    for e in (0, 1):
        shares = [s for s in p.shares if s["epoch"] == e]
        assert {s["corpus"] for s in shares} == {"a/train.jsonl", "b/train.jsonl"}
        assert sum(s["share"] for s in shares) == pytest.approx(1.0, abs=1e-5)
    b_share = next(s["share"] for s in p.shares if s["epoch"] == 0 and s["corpus"].startswith("b/"))
    assert b_share == pytest.approx(1 / 3, abs=1e-3)
    assert r.rejects[0].rows == 40
    assert {x["reason"]: x["rows"] for x in r.rejects[0].reasons} == reasons_count(pl.read_parquet(inputs["rejects"]))
    assert all(len(x["examples"]) == 3 for x in r.rejects[0].reasons)


def test_the_tps_slider_keeps_what_filter_keeps(inputs: dict[str, Path]) -> None:
    df = pl.read_parquet(inputs["kept"])
    table = tps_cut_table(df["tps"].to_numpy(), df["duration"].to_numpy())
    for row in table[:: max(1, len(table) // 12)] + table[-1:]:
        kept = apply_filters(df, Thresholds(max_tps=row["max_tps"])).kept
        assert row["kept"] == kept.height, row
        assert row["kept_hours"] == pytest.approx(kept["duration"].sum() / 3600, abs=1e-3)
    assert table[-1]["kept"] == df.height - 1  # the NaN-TPS row is never kept


@given(st.lists(st.floats(0.05, 60.0), min_size=1, max_size=60))
def test_tps_cut_counts_are_exact_at_every_position(tps: list[float]) -> None:
    t = np.asarray(tps)
    d = np.ones_like(t)
    for row in tps_cut_table(t, d):
        assert row["kept"] == int((t <= row["max_tps"]).sum())


def test_histograms_and_grid_are_bounded_whatever_the_rows() -> None:
    rng = np.random.default_rng(1)
    d = rng.lognormal(1.5, 0.7, 200_000)
    h = Histogram.of("duration", d, d, float(np.percentile(d, 99.9)))
    assert len(h.bins) <= 81 and sum(b["n"] for b in h.bins) == d.shape[0]
    g = grid_histogram(d, d * 3, 10.0, 30.0, None)
    assert len(g["cells"]) <= 60 * 60 and sum(c["n"] for c in g["cells"]) == d.shape[0]


def test_many_corpora_fold_into_one_other_row(tmp_path: Path) -> None:
    n = 500
    df = pl.DataFrame({"id": [f"u{i}" for i in range(n)], "duration": np.full(n, 2.0), "num_tokens": np.full(n, 9),
                       "tps": np.full(n, 4.5), "origin": [f"/c/{i % 100}.tar:m{i}" for i in range(n)]})
    write_manifest(df, tmp_path / "m.parquet")
    corp = corpora(tmp_path / "m.parquet")
    assert len(corp.names) == 100 and corp.codes.max() == 99
    assert [corp.names[c] for c in corp.codes[:3]] == ["0.tar", "1.tar", "2.tar"]  # source files, shortest names
    groups = corp.groups
    assert len(groups) == MAX_GROUPS
    assert groups[-1]["corpus"].startswith("(other: 41 groups)")
    assert sum(g["utterances"] for g in groups) == n


def test_corpus_groups_keep_no_row_of_a_block() -> None:
    """The groups kept per block own their few strings: a key longer than 12 bytes is a view
    into the block's strings in polars, which kept every block's origins alive (regression)."""
    held = []
    for n in (1_000, 50_000):
        groups = CorpusGroups(codes=False)
        groups.add(pl.DataFrame({"origin": [f"corpora/common-voice/train.jsonl:{i}" for i in range(n)],
                                 "duration": np.full(n, 2.0), "num_tokens": np.full(n, 9)}))
        held.append(groups.nbytes)
    assert held[0] == held[1] < 1_000


def test_a_plan_of_another_manifest_or_buckets_file_is_refused(inputs: dict[str, Path], tmp_path: Path) -> None:
    other = tmp_path / "other.parquet"
    write_manifest(pl.read_parquet(inputs["kept"]).head(100), other)
    with pytest.raises(ManifestError, match="differs from the plan.s manifest"):
        collect_report(other, plan=inputs["plan"])
    edited = tmp_path / "buckets.json"
    edited.write_text(inputs["buckets"].read_text().replace('"version": 1', '"version":1'))
    with pytest.raises(ManifestError, match="not the buckets file the plan was made with"):
        collect_report(inputs["kept"], buckets=edited, plan=inputs["plan"])
    with pytest.raises(ManifestError, match="not a rejects file"):
        rejects_aggregates(inputs["kept"])
    with pytest.raises(DataprepError, match="world sizes"):
        collect_report(inputs["kept"], world_sizes=[0])


def test_without_buckets_the_plan_shows_its_own(inputs: dict[str, Path]) -> None:
    r = collect_report(inputs["kept"], plan=inputs["plan"], world_sizes=[2])
    assert r.buckets is not None and "(from the plan)" in r.buckets.file
    assert len(r.buckets.buckets) == len(read_buckets(inputs["buckets"]).buckets)


def test_padding_on_a_sample_keeps_rows_and_hours_per_bucket_exact(inputs: dict[str, Path]) -> None:
    df = pl.read_parquet(inputs["kept"])
    d, t = df["duration"].to_numpy(), df["num_tokens"].to_numpy().astype(np.int64)
    spec = read_buckets(inputs["buckets"])
    block = RowBlock(0, d, t)

    def section(sample: int):
        rows = bucket_rows(df.height, spec, sample)
        rows.add(block)
        return bucket_section(rows, spec, inputs["kept"], lambda: iter([block]))

    full, part = section(SCHEME_SAMPLE_ROWS), section(1500)
    assert (full.measured_rows, part.measured_rows, part.rows) == (df.height, 1500, df.height)
    assert [b["utterances"] for b in part.buckets] == [b["utterances"] for b in full.buckets]
    assert [b["hours"] for b in part.buckets] == pytest.approx([b["hours"] for b in full.buckets], abs=1e-4)
    for a, b in zip(full.schemes, part.schemes):
        assert a["scheme"] == b["scheme"] and abs(a["audio_padding"] - b["audio_padding"]) < 0.05


def test_long_epochs_are_drawn_as_windows_of_steps() -> None:
    from dataprep.report.plan_section import MAX_STEP_POINTS, _step_rows

    rng = np.random.default_rng(2)
    S, W = 2 * MAX_STEP_POINTS + 7, 4
    bucket = rng.integers(0, 5, (S, W))
    size = rng.integers(1, 50, (S, W))
    max_d = rng.uniform(1, 20, (S, W))
    times = rng.uniform(0.1, 1.0, (S, W))
    rows, w = _step_rows(bucket, size, max_d, times)
    assert w == 3 and len(rows) <= MAX_STEP_POINTS
    assert [r["step"] for r in rows] == list(range(0, S, 3))
    assert rows[1]["time_max"] == pytest.approx(times[3:6].max(), abs=1e-4)
    assert rows[-1]["batch"] == pytest.approx(size[S - 1:].mean(), abs=0.01)
    one, w1 = _step_rows(bucket[:10], size[:10], max_d[:10], times[:10])
    assert w1 == 1 and [r["buckets"] for r in one] == [len(set(b)) for b in bucket[:10]]
