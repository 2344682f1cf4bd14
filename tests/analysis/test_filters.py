"""``dataprep.analysis.filters`` and ``dataprep filter``: conservation, first-failing reason, counts,
kept order, rejects file contents; on random frames and on ../shared/data."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dataprep.cli import app
from dataprep.analysis.filters import FILTER_NAMES, Thresholds, apply_filters
from manifests.errors import DataprepError
from manifests.hash_cache import manifest_hash
from manifests.manifest_read import read_manifest, read_metadata
from manifests.manifest_write import write_manifest
from manifests.schema import MANIFEST_COLUMNS
from tests.conftest import manifest_from_csv

runner = CliRunner()
PROMPT = 9

# The rules, restated independently of dataprep.analysis.filters: name -> (column, row fails?)
RULES = {
    "max_tps": ("tps", lambda v, b: v > b),
    "min_tps": ("tps", lambda v, b: v < b),
    "min_duration": ("duration", lambda v, b: v < b),
    "max_duration": ("duration", lambda v, b: v > b),
    "min_tokens": ("num_tokens", lambda v, b: v < b),
    "max_tokens": ("num_tokens", lambda v, b: v > b),
}


def failing_rules(row: dict, th: Thresholds) -> list[str]:
    """Every rule the row fails, in priority order; a missing/NaN value fails its rules."""
    out = []
    for name in FILTER_NAMES:
        bound = getattr(th, name)
        if bound is None:
            continue
        col, fails = RULES[name]
        v = row[col]
        if v is None or (isinstance(v, float) and math.isnan(v)) or fails(v, bound):
            out.append(name)
    return out


def check_result(df: pl.DataFrame, th: Thresholds) -> None:
    r = apply_filters(df, th)
    # conservation, and every row lands exactly once
    assert r.rows_in == df.height == r.kept.height + r.rejected.height
    assert sorted(r.kept["id"].to_list() + r.rejected["id"].to_list()) == sorted(df["id"].to_list())
    expected = {row["id"]: failing_rules(row, th) for row in df.iter_rows(named=True)}
    # kept rows pass every filter and keep the input order
    assert r.kept["id"].to_list() == [i for i in df["id"].to_list() if not expected[i]]
    assert r.kept.columns == df.columns
    # each rejected row truly fails its reason, and it is the FIRST rule it fails
    for row in r.rejected.iter_rows(named=True):
        assert row["reason"] == expected[row["id"]][0], row
        assert row["detail"].startswith(RULES[row["reason"]][0])
    assert r.rejected["id"].to_list() == [i for i in df["id"].to_list() if expected[i]]
    # per-filter counts: every rule failed, and the ones attributed as the reason
    for c in r.counts:
        assert c.failed == sum(c.name in v for v in expected.values()), c
        assert c.rejected == sum(bool(v) and v[0] == c.name for v in expected.values()), c
    assert [c.name for c in r.counts] == [n for n in FILTER_NAMES if getattr(th, n) is not None]


@st.composite
def frames(draw: st.DrawFn) -> pl.DataFrame:
    n = draw(st.integers(0, 60))
    dur = draw(st.lists(st.one_of(st.floats(0.01, 60.0), st.none(), st.just(float("nan"))), min_size=n, max_size=n))
    tok = draw(st.lists(st.one_of(st.integers(0, 600), st.none()), min_size=n, max_size=n))
    tps = [None if d is None or t is None else t / d for d, t in zip(dur, tok)]
    return pl.DataFrame(
        {"id": [f"r{i}" for i in range(n)], "duration": dur, "num_tokens": tok, "tps": tps},
        schema={"id": pl.String, "duration": pl.Float64, "num_tokens": pl.Int32, "tps": pl.Float64},
    )


@st.composite
def thresholds(draw: st.DrawFn) -> Thresholds:
    def pair(lo: float, hi: float, ints: bool = False) -> tuple:
        a, b = (draw(st.one_of(st.none(), st.integers(int(lo), int(hi)) if ints else st.floats(lo, hi))) for _ in "ab")
        if a is not None and b is not None and a > b:
            a, b = b, a
        return a, b

    min_tps, max_tps = pair(0.0, 40.0)
    min_d, max_d = pair(0.0, 60.0)
    min_t, max_t = pair(0, 600, ints=True)
    return Thresholds(max_tps=max_tps, min_tps=min_tps, min_duration=min_d, max_duration=max_d,
                      min_tokens=min_t, max_tokens=max_t)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames(), thresholds())
@example(  # a row exactly on a bound is kept; one just above is not
    pl.DataFrame({"id": ["a", "b"], "duration": [1.0, 1.0], "num_tokens": [25, 26], "tps": [25.0, 26.0]}),
    Thresholds(max_tps=25.0),
)
def test_conservation_and_first_failing_reason(df: pl.DataFrame, th: Thresholds) -> None:
    check_result(df, th)


def test_detail_lines_and_null_values() -> None:
    df = pl.DataFrame(
        {"id": list("abcdef"), "duration": [1.0, 0.3, 50.0, None, 10.0, 2.0],
         "num_tokens": [40, 5, 100, 10, None, 50], "tps": [31.2, 16.67, 2.0, None, float("nan"), 25.0001]}
    )
    r = apply_filters(df, Thresholds(max_tps=25, min_duration=0.5, max_duration=40, min_tokens=6))
    got = dict(zip(r.rejected["id"], zip(r.rejected["reason"], r.rejected["detail"])))
    assert got == {
        "a": ("max_tps", "tps 31.2 > 25"),
        "b": ("min_duration", "duration 0.3 < 0.5"),
        "c": ("max_duration", "duration 50 > 40"),
        "d": ("max_tps", "tps is missing"),
        "e": ("max_tps", "tps is NaN"),
        "f": ("max_tps", "tps 25.0001 > 25"),  # rounding must not hide why it failed
    }
    assert r.kept.height == 0
    assert {c.name: (c.failed, c.rejected) for c in r.counts} == {
        "max_tps": (4, 4), "min_duration": (2, 1), "max_duration": (2, 1), "min_tokens": (2, 0)
    }


def test_no_filter_keeps_everything_and_bad_bounds_are_user_errors() -> None:
    df = pl.DataFrame({"id": ["a"], "duration": [1.0], "num_tokens": [3], "tps": [3.0]})
    r = apply_filters(df, Thresholds())
    assert r.kept.equals(df) and r.rejected.height == 0 and r.counts == ()
    with pytest.raises(DataprepError, match="min_tps: 30 is above the maximum 25"):
        Thresholds(min_tps=30, max_tps=25)
    with pytest.raises(DataprepError, match="max_duration: must be >= 0"):
        Thresholds(max_duration=-1)
    with pytest.raises(DataprepError, match="num_tokens"):
        apply_filters(df.drop("num_tokens"), Thresholds(max_tokens=5))


# ---------------------------------------------------------------- CLI on a generated corpus


@pytest.fixture(scope="module")
def generated_manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3,000-utterance synthetic corpus (1% fast-speech outliers) tokenized by a
    sentencepiece model trained on its own transcripts."""
    from dataprep.testing import synthetic_manifest

    df = synthetic_manifest(3000, seed=11, outlier_share=0.02, prompt_tokens=PROMPT).with_columns(
        extra=pl.lit('{"speaker": 1}'))
    path = tmp_path_factory.mktemp("gen") / "manifest.parquet"
    write_manifest(df, path)
    return path


def run_filter(manifest: Path, out: Path, *args: str) -> tuple[pl.DataFrame, pl.DataFrame, str]:
    res = runner.invoke(app, ["filter", str(manifest), *args, "-o", str(out)])
    assert res.exit_code == 0, res.output
    return read_manifest(out), pl.read_parquet(out.with_name(f"{out.stem}.rejects.parquet")), res.stdout


def test_cli_filter_as_a_user_types_it(generated_manifest: Path, tmp_path: Path) -> None:
    src = read_manifest(generated_manifest)
    tps25 = float(np.percentile(src["tps"].to_numpy(), 97))  # a bound that removes ~3%
    kept, rej, stdout = run_filter(
        generated_manifest, tmp_path / "kept.parquet", "--max-tps", f"{tps25}", "--min-duration", "1", "--max-tokens", "150"
    )
    assert kept.height + rej.height == src.height
    assert rej.height > 0 and kept.height > 0
    assert f"rows in {src.height:,}" in stdout and f"kept {kept.height:,}" in stdout and f"rejected {rej.height:,}" in stdout
    for name in ("max_tps", "min_duration", "max_tokens"):
        assert name in stdout
    # kept keeps input order; rejects carry every manifest column, origin included
    order = {i: k for k, i in enumerate(src["id"])}
    assert [order[i] for i in kept["id"]] == sorted(order[i] for i in kept["id"])
    assert list(rej.columns) == [*MANIFEST_COLUMNS, "reason", "detail"]
    assert rej["origin"].null_count() == 0 and rej["text"].null_count() == 0
    assert set(rej["reason"]) <= {"max_tps", "min_duration", "max_tokens"}
    assert (kept["tps"] <= tps25).all() and (kept["duration"] >= 1).all() and (kept["num_tokens"] <= 150).all()
    # provenance: the input's content hash and the thresholds
    meta = read_metadata(tmp_path / "kept.parquet")
    assert meta["kind"] == "manifest"
    assert meta["provenance"]["input_hash"] == manifest_hash(generated_manifest)
    assert meta["provenance"]["thresholds"] == {"max_tps": tps25, "min_duration": 1.0, "max_tokens": 150}
    assert read_metadata(tmp_path / "kept.rejects.parquet")["kind"] == "rejects"

    # determinism: same input and options => byte-identical outputs
    run_filter(generated_manifest, tmp_path / "again.parquet", "--max-tps", f"{tps25}", "--min-duration", "1",
               "--max-tokens", "150")
    assert (tmp_path / "again.parquet").read_bytes() == (tmp_path / "kept.parquet").read_bytes()


def test_cli_filter_explicit_rejects_path_and_no_filters(generated_manifest: Path, tmp_path: Path) -> None:
    res = runner.invoke(app, ["filter", str(generated_manifest), "-o", str(tmp_path / "k.parquet"),
                              "--rejects", str(tmp_path / "sub" / "r.parquet")])
    assert res.exit_code == 0, res.output
    assert read_manifest(tmp_path / "k.parquet").height == read_manifest(generated_manifest).height
    assert pl.read_parquet(tmp_path / "sub" / "r.parquet").height == 0
    assert "no filter given" in res.output


def test_cli_filter_user_errors(generated_manifest: Path, tmp_path: Path) -> None:
    out = str(tmp_path / "k.parquet")
    for args, msg in (
        (["--min-tps", "30", "--max-tps", "25"], "--min-tps: 30 is above the maximum 25"),
        (["--rejects", out], "same file"),
    ):
        res = runner.invoke(app, ["filter", str(generated_manifest), "-o", out, *args])
        assert res.exit_code == 2 and "error:" in res.output and msg in res.output, res.output
        assert "Traceback" not in res.output
    assert not Path(out).exists()
    res = runner.invoke(app, ["filter", str(tmp_path / "missing.parquet"), "-o", out, "--max-tps", "25"])
    assert res.exit_code == 2 and "missing.parquet" in res.output
    assert "25" in runner.invoke(app, ["filter", "--help"]).output  # the paper's choice is documented


# ---------------------------------------------------------------- ../shared/data


@pytest.mark.shared
def test_cli_filter_common_voice_outliers(shared_spm_path: Path, tmp_path: Path) -> None:
    df = manifest_from_csv("commonvoice.id_ps.csv", shared_spm_path, PROMPT)
    manifest = tmp_path / "cv.parquet"
    write_manifest(df, manifest)
    kept, rej, stdout = run_filter(manifest, tmp_path / "cv.kept.parquet",
                                   "--max-tps", "25", "--max-duration", "40", "--min-duration", "0.5")
    d = df["duration"].to_numpy()
    tps = df["tps"].to_numpy()
    assert kept.height + rej.height == df.height == 20856
    # independent count: a row is rejected iff it fails any rule
    assert rej.height == int(np.sum((tps > 25) | (d > 40) | (d < 0.5)))
    by_reason = dict(rej.group_by("reason").len().iter_rows())
    assert by_reason.get("max_tps", 0) == int(np.sum(tps > 25)) > 0
    assert by_reason.get("max_duration", 0) == int(np.sum((d > 40) & ~(tps > 25))) > 0
    # every long clip came from the invalidated split; its origin points at its CSV line
    long = rej.filter(pl.col("reason") == "max_duration")
    assert long["extra"].str.contains('"invalidated"').all()
    assert long["origin"].str.starts_with("commonvoice.id_ps.csv:").all()
    assert kept["id"].to_list() == df.filter(~((pl.col("tps") > 25) | (pl.col("duration") > 40) | (pl.col("duration") < 0.5)))["id"].to_list()
    check_result(df.select("id", "duration", "num_tokens", "tps").head(2000),
                 Thresholds(max_tps=12, min_tps=3, max_duration=9, min_tokens=15))
