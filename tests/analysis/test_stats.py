"""``dataprep.analysis.stats`` and ``dataprep stats``: every figure checked against an independent
computation (csv + numpy + statistics), on generated frames and on ../shared/data."""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import sentencepiece as spm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dataprep.cli import app
from dataprep.analysis.stats import DURATION_BIN_EDGES, QUANTILES, bin_labels, compute_stats, duration_bin_index
from manifests.errors import DataprepError
from manifests.hash_cache import manifest_hash
from manifests.manifest_write import write_manifest
from tests.conftest import manifest_from_csv, shared_file

runner = CliRunner()
PROMPT = 9


# ---------------------------------------------------------------- independent reference


def reference_stats(duration: np.ndarray, tokens: np.ndarray, langs: list[str]) -> dict:
    """The figures, computed with numpy / statistics / math only (no polars, no dataprep)."""
    tps = tokens / duration
    ref: dict = {
        "utterances": len(duration),
        "hours": math.fsum(duration.tolist()) / 3600,
        "quantiles": {
            name: dict(zip(QUANTILES, np.percentile(col, QUANTILES)))
            for name, col in (("duration", duration), ("num_tokens", tokens.astype(float)), ("tps", tps))
        },
        "langs": {},
        "bins": [],
        "tps>25": int(np.sum(tps > 25)),
        "dur>40": int(np.sum(duration > 40)),
        "dur<0.5": int(np.sum(duration < 0.5)),
    }
    for lang in sorted(set(langs)):
        sel = np.array([x == lang for x in langs])
        ref["langs"][lang] = (int(sel.sum()), math.fsum(duration[sel].tolist()) / 3600, statistics.median(tps[sel].tolist()))
    for lo, hi in zip(DURATION_BIN_EDGES[:-1], DURATION_BIN_EDGES[1:]):
        sel = (duration >= lo) & (duration < hi)
        t = tps[sel]
        ref["bins"].append(
            (int(sel.sum()), None if not sel.any() else (np.percentile(t, 10), statistics.median(t.tolist()), np.percentile(t, 90)))
        )
    return ref


def assert_matches(s, ref: dict) -> None:
    assert s.utterances == ref["utterances"]
    assert s.hours == pytest.approx(ref["hours"], rel=1e-12)
    for col, qs in ref["quantiles"].items():
        for q, v in qs.items():
            assert s.quantiles[col][f"p{q}"] == pytest.approx(v, rel=1e-9, abs=1e-9), (col, q)
    assert [x.lang for x in s.languages] == list(ref["langs"])
    for x in s.languages:
        n, hours, med = ref["langs"][x.lang]
        assert (x.utterances, x.hours, x.median_tps) == (n, pytest.approx(hours, rel=1e-12), pytest.approx(med, rel=1e-12))
    assert sum(b.count for b in s.tps_by_duration) == s.utterances
    for b, (n, qs) in zip(s.tps_by_duration, ref["bins"]):
        assert b.count == n, b.label
        if qs is None:
            assert (b.tps_p10, b.tps_median, b.tps_p90) == (None, None, None)
        else:
            assert (b.tps_p10, b.tps_median, b.tps_p90) == tuple(pytest.approx(v, rel=1e-9) for v in qs), b.label
    counts = {t.name: t.count for t in s.thresholds}
    assert counts == {"tps > 25": ref["tps>25"], "duration > 40": ref["dur>40"], "duration < 0.5": ref["dur<0.5"]}


def frame(duration: np.ndarray, tokens: np.ndarray, langs: list[str]) -> pl.DataFrame:
    return pl.DataFrame(
        {"id": [f"u{i}" for i in range(len(duration))], "duration": duration, "num_tokens": tokens,
         "tps": tokens / duration, "lang": langs}
    )


# ---------------------------------------------------------------- generated data


def test_bins_cover_the_line_with_half_open_intervals() -> None:
    assert bin_labels() == ["0-2", "2-5", "5-10", "10-15", "15-20", "20-30", "30-40", "40+"]
    d = np.array([0.0, 1.999, 2.0, 4.99, 5.0, 39.99, 40.0, 160.2])
    assert duration_bin_index(d).tolist() == [0, 0, 1, 1, 2, 6, 7, 7]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.floats(0.05, 200.0, allow_nan=False),
            st.integers(1, 3000),
            st.sampled_from(["en", "de", "ps"]),
        ),
        min_size=1,
        max_size=300,
    )
)
def test_stats_equal_numpy_on_random_frames(rows: list[tuple[float, int, str]]) -> None:
    d = np.array([r[0] for r in rows])
    t = np.array([r[1] for r in rows], dtype=np.int64)
    langs = [r[2] for r in rows]
    assert_matches(compute_stats(frame(d, t, langs)), reference_stats(d, t, langs))


def test_figure3_shape_on_a_generated_corpus() -> None:
    """Short clips speak faster (more tokens/s) than long ones; the bins must show it."""
    rng = np.random.default_rng(7)
    d = rng.uniform(0.3, 60.0, 20_000)
    # constant speaking rate plus a fixed prompt: TPS falls with duration, as in Figure 3
    t = np.round(d * rng.normal(12.0, 1.5, d.size)).astype(np.int64) + PROMPT
    langs = ["en"] * d.size
    s = compute_stats(frame(d, t, langs))
    assert_matches(s, reference_stats(d, t, langs))
    med = [b.tps_median for b in s.tps_by_duration]
    assert all(a > b for a, b in zip(med, med[1:-1])), med
    assert s.thresholds[0].count > 0 and s.thresholds[1].count > 0 and s.thresholds[2].count > 0


def test_nan_and_null_are_left_out_and_empty_frames_give_none() -> None:
    df = pl.DataFrame(
        {"duration": [1.0, 3.0, None, 4.0], "num_tokens": [10, None, 5, 40], "tps": [10.0, float("nan"), None, 10.0],
         "lang": ["en", None, "en", "en"]}
    )
    s = compute_stats(df)
    assert s.utterances == 4
    assert s.quantiles["tps"]["p50"] == 10.0 and s.quantiles["num_tokens"]["p100"] == 40.0
    assert s.quantiles["duration"]["p50"] == 3.0
    assert {x.lang: x.utterances for x in s.languages} == {"(none)": 1, "en": 3}
    assert sum(b.count for b in s.tps_by_duration) == 3  # the null duration has no bin

    empty = compute_stats(df.head(0))
    assert empty.utterances == 0 and empty.hours == 0.0 and empty.languages == ()
    assert all(v is None for qs in empty.quantiles.values() for v in qs.values())
    doc = empty.to_json()
    json.dumps(doc, allow_nan=False)  # no NaN/inf leaks into JSON


def test_json_rounds_to_four_places_and_is_plain() -> None:
    d = np.array([1.23456789, 2.0, 3.3333333])
    t = np.array([10, 20, 33])
    doc = compute_stats(frame(d, t, ["en"] * 3)).to_json()
    assert doc["quantiles"]["duration"]["p0"] == 1.2346
    assert doc["totals"] == {"utterances": 3, "hours": round((1.23456789 + 2.0 + 3.3333333) / 3600, 4)}
    assert doc["tps_by_duration"][-1]["max_duration"] is None
    assert doc["thresholds"]["tps > 25"] == {"count": 0, "fraction": 0.0}
    json.dumps(doc, allow_nan=False)


@pytest.fixture(scope="module")
def generated_manifest(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pl.DataFrame]:
    """A 3,000-utterance synthetic corpus tokenized by a sentencepiece model trained on it."""
    from dataprep.testing import synthetic_manifest

    df = synthetic_manifest(3000, seed=3, prompt_tokens=PROMPT).drop("audio_path")
    path = tmp_path_factory.mktemp("gen") / "manifest.parquet"
    write_manifest(df, path)
    return path, df


def test_cli_stats_on_generated_manifest(generated_manifest: tuple[Path, pl.DataFrame], tmp_path: Path) -> None:
    path, df = generated_manifest
    res = runner.invoke(app, ["stats", str(path), "--json", str(tmp_path / "s.json")])
    assert res.exit_code == 0, res.output
    for title in ("Totals", "Per language", "Quantiles", "TPS by duration", "tps > 25", "40+"):
        assert title in res.stdout
    doc = json.loads((tmp_path / "s.json").read_text())
    d = df["duration"].to_numpy()
    assert doc["totals"]["utterances"] == 3000
    assert doc["totals"]["hours"] == pytest.approx(math.fsum(d.tolist()) / 3600, abs=1e-4)
    assert doc["quantiles"]["duration"]["p99"] == pytest.approx(np.percentile(d, 99), abs=1e-4)
    assert doc["manifest"]["content_hash"] == manifest_hash(path)


def test_cli_stats_user_errors(tmp_path: Path) -> None:
    res = runner.invoke(app, ["stats", str(tmp_path / "nope.parquet")])
    assert res.exit_code == 2 and "error:" in res.output and "nope.parquet" in res.output
    bogus = tmp_path / "bogus.parquet"
    bogus.write_text("id,duration\n")
    res = runner.invoke(app, ["stats", str(bogus)])
    assert res.exit_code == 2 and "not a readable Parquet" in res.output
    assert "Traceback" not in res.output


def test_plots_without_matplotlib_say_which_extra(
    generated_manifest: tuple[Path, pl.DataFrame], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dataprep.report.plots import plot_aggregates

    # None in sys.modules makes the import fail as if the package were not installed
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    with pytest.raises(DataprepError, match=re.escape("pip install 'speech-dataprep[plots]'")):
        plot_aggregates(generated_manifest[1])
    res = runner.invoke(app, ["stats", str(generated_manifest[0]), "--plots", str(tmp_path / "p")])
    assert res.exit_code == 2 and "pip install 'speech-dataprep[plots]'" in res.output


# ---------------------------------------------------------------- ../shared/data


def read_csv_independently(name: str, sp: spm.SentencePieceProcessor) -> tuple[np.ndarray, np.ndarray, list[str], list[dict]]:
    with open(shared_file(name), newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    duration = np.array([float(r["duration"]) for r in rows])
    tokens = np.array([len(sp.encode(r["text"])) + PROMPT for r in rows], dtype=np.int64)
    return duration, tokens, [r["lang"] for r in rows], rows


@pytest.mark.shared
@pytest.mark.parametrize("name", ["librispeech.train-clean-100.csv", "commonvoice.id_ps.csv"])
def test_stats_on_real_corpora_match_independent_figures(name: str, shared_spm_path: Path) -> None:
    sp = spm.SentencePieceProcessor(model_file=str(shared_spm_path))
    d, t, langs, _ = read_csv_independently(name, sp)
    s = compute_stats(manifest_from_csv(name, shared_spm_path, PROMPT))
    assert_matches(s, reference_stats(d, t, langs))
    if name.startswith("librispeech"):
        assert s.hours == pytest.approx(100.6, abs=0.05)  # the README's figure for train-clean-100
        med = {b.label: b.tps_median for b in s.tps_by_duration}
        # Figure 3's shape: short clips have higher TPS than 15 s+ clips
        assert med["2-5"] > med["10-15"] > med["15-20"] * 0.99 and med["2-5"] > 1.15 * med["15-20"]


@pytest.mark.shared
def test_common_voice_outliers_and_languages(shared_spm_path: Path) -> None:
    name = "commonvoice.id_ps.csv"
    sp = spm.SentencePieceProcessor(model_file=str(shared_spm_path))
    d, t, langs, rows = read_csv_independently(name, sp)
    s = compute_stats(manifest_from_csv(name, shared_spm_path, PROMPT))
    counts = {x.name: x.count for x in s.thresholds}
    # the invalidated split holds clips up to 160 s: every clip above 40 s is there
    long_splits = {r["split"] for r, x in zip(rows, d) if x > 40}
    assert counts["duration > 40"] == int(np.sum(d > 40)) > 0 and long_splits == {"invalidated"}
    assert s.quantiles["duration"]["p100"] == pytest.approx(max(d)) and max(d) > 150
    assert counts["tps > 25"] == int(np.sum(t / d > 25)) > 0
    assert s.tps_by_duration[-1].count == int(np.sum(d >= 40))

    # Pashto speaks ~7 chars/s, Indonesian ~11: with characters as tokens the per-language
    # median TPS must show it ...
    chars = np.array([len(r["text"]) for r in rows], dtype=np.int64)
    by_char = {x.lang: x.median_tps for x in compute_stats(frame(d, chars, langs)).languages}
    for lang, lo, hi in (("ps", 6.0, 8.5), ("id", 9.5, 12.5)):
        ref = statistics.median((chars / d)[np.array(langs) == lang].tolist())
        assert by_char[lang] == pytest.approx(ref) and lo < ref < hi
    # ... and with the shared 1024-piece model Pashto costs more tokens per character.
    spm_tps = {x.lang: x.median_tps for x in s.languages}
    assert spm_tps["ps"] / by_char["ps"] > 1.15 * spm_tps["id"] / by_char["id"]


@pytest.mark.shared
def test_cli_stats_json_and_plots_on_common_voice(shared_spm_path: Path, tmp_path: Path) -> None:
    df = manifest_from_csv("commonvoice.id_ps.csv", shared_spm_path, PROMPT)
    manifest = tmp_path / "cv.parquet"
    write_manifest(df, manifest)
    res = runner.invoke(
        app, ["stats", str(manifest), "--json", str(tmp_path / "stats.json"), "--plots", str(tmp_path / "plots")]
    )
    assert res.exit_code == 0, res.output
    assert "ps" in res.stdout and "id" in res.stdout and "duration > 40" in res.stdout

    raw = (tmp_path / "stats.json").read_bytes()
    doc = json.loads(raw)
    assert list(doc) == sorted(doc)  # sorted keys
    d = df["duration"].to_numpy()
    assert doc["totals"]["utterances"] == len(d) == 20856
    assert doc["totals"]["hours"] == pytest.approx(math.fsum(d.tolist()) / 3600, abs=1e-4)
    assert doc["thresholds"]["duration > 40"]["count"] == int(np.sum(d > 40))
    assert set(doc["languages"]) == {"id", "ps"}
    ps = df.filter(pl.col("lang") == "ps")["tps"].to_list()
    assert doc["languages"]["ps"]["median_tps"] == pytest.approx(statistics.median(ps), abs=1e-4)

    for png in ("duration_hist.png", "tps_by_duration.png", "tokens_vs_duration.png"):
        data = (tmp_path / "plots" / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", png
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        assert width >= 500 and height >= 300 and len(data) > 10_000, (png, width, height, len(data))

    # same input => byte-identical JSON and PNGs
    res2 = runner.invoke(
        app, ["stats", str(manifest), "--json", str(tmp_path / "again.json"), "--plots", str(tmp_path / "plots2")]
    )
    assert res2.exit_code == 0
    assert (tmp_path / "again.json").read_bytes() == raw
    for png in ("duration_hist.png", "tps_by_duration.png", "tokens_vs_duration.png"):
        assert (tmp_path / "plots2" / png).read_bytes() == (tmp_path / "plots" / png).read_bytes()
