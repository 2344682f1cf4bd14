"""Sections 2 (buckets) and 3 (plan) of ``dataprep report`` streamed in blocks equal the
whole-array tables: rows and hours per bucket after the carried tails (as ``assign`` of every
row and a weighted ``np.bincount``, bit for bit) and the padding's sample, the per-epoch
corpus shares (row-order sums) in any split of the rows into ranges, and a report under a
budget of one row per range equals one under the default."""

from __future__ import annotations

import re
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.conftest import SLOW_EXAMPLES

from bucketing.allocate import assign
from bucketing.fit_passes import fit_spec
from bucketing.dynres import DynResConfig
from bucketing.fit import grid_from_spec
from dataprep.planning.build import build_plan
from dataprep.planning.options import PlanOptions
from dataprep.planning.simulate import read_epoch_batches
import dataprep.report.aggregates as aggregates
import dataprep.report.stream_sections as stream_sections
from dataprep.report.aggregates import collect_report, row_blocks
from dataprep.report.buckets_section import bucket_rows, bucket_section
from dataprep.report.plan_section import share_table
from dataprep.analysis.padding import batch_sizes_for, manifest_padding_report
from dataprep.report.stream_sections import (SHARE_BYTES_PER_ROW, SPILL_BYTES_PER_ROW, CorpusShares, planned_times, sample_rows, spill_planned_rows)
from dataprep.testing import write_plan_inputs
from manifests.errors import DataprepError
from manifests.manifest_write import write_manifest
from manifests.plan_meta import read_plan_meta
from manifests.spill import SpillFiles


def write_rows(d: np.ndarray, t: np.ndarray, path: Path) -> Path:
    """Durations (s) and tokens as a manifest (the other columns null)."""
    write_manifest(pl.DataFrame({"id": [f"u{i}" for i in range(d.shape[0])], "duration": d, "num_tokens": t}), path)
    return path


def today_buckets(d: np.ndarray, t: np.ndarray, spec: Any, sample: int, work: Path) -> list[dict[str, Any]]:
    """Per-bucket rows of section 2 from whole arrays: ``dataprep padding``'s figures of the
    report's seeded sample (written as a manifest here), rows and hours of every row assigned."""
    n = d.shape[0]
    pick = sample_rows(n, sample) if n > sample else slice(None)  # the report's seeded sample
    rep = manifest_padding_report(write_rows(d[pick], t[pick], work / "sample.parquet"), spec,
                                  dynamic_resolution=DynResConfig(), name="b")
    if n > sample:
        _, bs = batch_sizes_for(spec)
        bucket = assign(d, t, grid_from_spec(spec), bs).bucket
        ok = bucket >= 0
        exact_n = np.bincount(bucket[ok], minlength=len(spec.buckets))
        exact_h = np.bincount(bucket[ok], weights=d[ok], minlength=len(spec.buckets)) / 3600.0
        rep["per_bucket"] = [{**pb, "num_rows": int(exact_n[i]), "hours": float(exact_h[i])}
                             for i, pb in enumerate(rep["per_bucket"])]
    return rep["per_bucket"]


@st.composite
def corpora(draw: Any) -> tuple[np.ndarray, np.ndarray, Any]:
    """Durations (some NaN: left out as beyond the grid) and tokens, a spec fitted on them
    with small batches (tails carried often)."""
    n = draw(st.integers(8, 160))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    d = np.round(rng.lognormal(1.2, 0.7, n), draw(st.sampled_from([1, 6])))  # ties too
    t = (d * rng.uniform(1, 5, n)).astype(np.int64) + rng.integers(0, 3, n)
    spec, _ = fit_spec(d, t, num_buckets=draw(st.integers(1, 4)),
                       num_subbuckets=draw(st.sampled_from([1, 2, 2, 3])),
                       max_duration_budget=draw(st.sampled_from([20.0, 30.0, 60.0, 200.0])))
    d[rng.random(n) < 0.05] = np.nan
    return d, t, spec


@settings(max_examples=SLOW_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corpora(), st.integers(1, 200), st.integers(1, 40))
def test_streamed_buckets_equal_every_row_assigned(data: tuple[np.ndarray, np.ndarray, Any], block: int,
                                                   sample: int) -> None:
    d, t, spec = data
    n = d.shape[0]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        manifest = write_rows(d, t, work / "m.parquet")
        rows = bucket_rows(n, spec, sample)
        blocks = list(row_blocks(manifest, block))
        for b in blocks:
            rows.add(b)
        try:
            want = today_buckets(d, t, spec, sample, work)
        except DataprepError as exc:  # a NaN duration among the rows measured: the same one-line error
            with pytest.raises(DataprepError, match=re.escape(str(exc).split(": ", 1)[1])):
                bucket_section(rows, spec, manifest, lambda: iter(blocks))
            return
        got = bucket_section(rows, spec, manifest, lambda: iter(blocks))
        assert not [p for p in work.iterdir() if p.name not in ("m.parquet", "sample.parquet")]  # spill removed
    assert [r["utterances"] for r in got.buckets] == [pb["num_rows"] for pb in want]
    assert [r["hours"] for r in got.buckets] == [round(pb["hours"], 4) for pb in want]
    assert [(r["audio_padding"], r["token_padding"], r["batches"]) for r in got.buckets] == \
        [(pb["audio_padding"], pb["token_padding"], pb["num_batches"]) for pb in want]
    if rows.exact:  # the exact seconds, bit for bit
        _, bs = batch_sizes_for(spec)
        bucket = assign(d, t, grid_from_spec(spec), bs).bucket
        ok = bucket >= 0
        assert np.array_equal(rows.counts, np.bincount(bucket[ok], minlength=len(spec.buckets)))
        assert np.array_equal(rows.seconds, np.bincount(bucket[ok], weights=d[ok], minlength=len(spec.buckets)))
        pick = sample_rows(n, sample)
        np.testing.assert_array_equal(rows.d, d[pick])
        np.testing.assert_array_equal(rows.t, t[pick])
    assert got.measured_rows == min(n, sample) and got.rows == n


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 60), st.integers(1, 4), st.integers(2, 5))
def test_corpus_shares_in_ranges_equal_one_whole_bincount(seed: int, step: int, epochs: int, names: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 120))
    code = rng.integers(0, names, n).astype(np.int32)
    d = np.round(rng.lognormal(1.0, 1.0, n), 3) * (rng.random(n) > 0.1)
    planned = [rng.integers(0, n, int(rng.integers(0, 2 * n))) for _ in range(epochs)]  # rows repeat, some not
    acc = CorpusShares(epochs, names)
    for a in range(0, n, step):
        for e, rows in enumerate(planned):
            inside = rows[(rows >= a) & (rows < a + step)] - a
            acc.add(e, code[a:a + step], d[a:a + step], np.bincount(inside, minlength=min(step, n - a)))
    for e, rows in enumerate(planned):
        times = np.bincount(rows, minlength=n)
        assert np.array_equal(acc.n[e], np.bincount(code[rows], minlength=names))
        assert np.array_equal(acc.seconds[e], np.bincount(code, weights=d * times, minlength=names))


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A three-corpus manifest (one corpus nearly empty) and a W=3, 3-epoch plan of it."""
    folder = tmp_path_factory.mktemp("sections")
    kept, buckets = write_plan_inputs(folder, 1500, seed=5, num_buckets=6, budget=60.0)
    df = pl.read_parquet(kept)
    origin = [f"/data/{'abc'[0 if i % 5 else (1 if i % 7 else 2)]}/x.jsonl:{i}" for i in range(df.height)]
    df = df.with_columns((pl.col("num_tokens") / pl.col("duration")).alias("tps"), pl.Series("origin", origin))
    write_manifest(df, kept)
    build_plan(kept, buckets, folder / "plan", PlanOptions(world_size=3, epochs=3))
    return {"kept": kept, "buckets": buckets, "plan": folder / "plan"}


def test_planned_rows_spilled_by_range_count_the_epochs_rows(planned: dict[str, Path], tmp_path: Path) -> None:
    meta = read_plan_meta(planned["plan"])
    n = meta.manifest.rows
    for e in range(meta.epochs):
        rows = np.concatenate([c.values.to_numpy() for c in read_epoch_batches(planned["plan"], e)["rows"]])
        want = np.bincount(rows, minlength=n)
        for step in (n, 1, 17, 400, n - 1):
            files = SpillFiles(tmp_path / f"{e}.{step}")
            files.root.mkdir()
            spill_planned_rows(planned["plan"], meta, e, step, files)
            got = [planned_times(files, k, min(step, n - a)) for k, a in enumerate(range(0, n, step))]
            np.testing.assert_array_equal(np.concatenate(got), want)


def test_a_report_in_small_ranges_and_blocks_equals_the_default(planned: dict[str, Path],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the default limit the rows are held (nothing spilled); under a small one (below
    the shares' 44 bytes a row, above what the padding report's largest bucket needs to plan)
    they are spilled and read back in ranges of 211 rows: the same report."""
    spills: list[Path] = []
    real = aggregates.spill_dir
    monkeypatch.setattr(aggregates, "spill_dir", lambda where: spills.append(real(where)) or spills[-1])
    full = collect_report(planned["kept"], plan=planned["plan"], world_sizes=[2])
    assert not spills
    monkeypatch.setattr(stream_sections, "SHARE_RANGE_ROWS", 211)
    n = read_plan_meta(planned["plan"]).manifest.rows
    tiny = collect_report(planned["kept"], plan=planned["plan"], world_sizes=[2],
                          memory_limit=n * (SHARE_BYTES_PER_ROW + SPILL_BYTES_PER_ROW) - 1, block_rows=97)
    assert len(spills) == 1
    assert asdict(tiny) == asdict(full)
    assert not list(planned["kept"].parent.glob(".*spill*"))  # the spill files are removed
    # the shares: every epoch's planned rows joined to the manifest, hours in row order
    df = pl.read_parquet(planned["kept"])
    meta = read_plan_meta(planned["plan"])
    corpus = df["origin"].str.replace(r":[^:/]*$", "").str.replace("/data/", "")  # named by a/x.jsonl ...
    names = sorted(set(corpus.to_list()))
    code = np.asarray([names.index(c) for c in corpus.to_list()])
    d = df["duration"].to_numpy()
    n_e, h_e = [], []
    for e in range(meta.epochs):
        rows = np.concatenate([c.values.to_numpy() for c in read_epoch_batches(planned["plan"], e)["rows"]])
        n_e.append(np.bincount(code[rows], minlength=len(names)))
        h_e.append(np.bincount(code, weights=d * np.bincount(rows, minlength=d.shape[0]), minlength=len(names)))
    assert full.plan is not None and full.plan.shares == share_table(np.asarray(n_e), np.asarray(h_e), names)
    assert {s["corpus"] for s in full.plan.shares} == set(names)


def test_streamed_bucket_section_of_a_file_equals_whole_arrays(planned: dict[str, Path], tmp_path: Path) -> None:
    """Row blocks read from the file (a second pass for the carried tails) give today's table."""
    from manifests.buckets_file import read_buckets

    spec = read_buckets(planned["buckets"])
    df = pl.read_parquet(planned["kept"])
    d, t = df["duration"].to_numpy(), df["num_tokens"].to_numpy().astype(np.int64)
    rows = bucket_rows(df.height, spec, 300)
    for b in row_blocks(planned["kept"], 64):
        rows.add(b)
    got = bucket_section(rows, spec, planned["kept"], lambda: row_blocks(planned["kept"], 64))
    want = today_buckets(d, t, spec, 300, tmp_path)
    assert [r["utterances"] for r in got.buckets] == [pb["num_rows"] for pb in want]
    assert [r["hours"] for r in got.buckets] == [round(pb["hours"], 4) for pb in want]
    assert [r["audio_padding"] for r in got.buckets] == [pb["audio_padding"] for pb in want]


def test_the_padding_sample_is_distinct_ascending_and_spread() -> None:
    """The seeded sample: ``sample`` distinct rows, ascending, spread over the whole range
    (each tenth of the rows holds about a tenth), the same every call; None when all fit."""
    pick = sample_rows(1_000_003, 20_000)
    assert pick is not None and pick.shape == (20_000,) and (np.diff(pick) > 0).all()
    assert 0 <= pick[0] and pick[-1] < 1_000_003
    per_tenth = np.bincount(pick * 10 // 1_000_003, minlength=10)
    assert (np.abs(per_tenth - 2_000) < 200).all(), per_tenth
    assert np.array_equal(sample_rows(1_000_003, 20_000), pick)
    assert sample_rows(5, 5) is None
