"""The torch loader over a real plan: segments, resampling, log-mel, tokens, determinism, bad audio."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import soundfile
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataprep.training.features import HOP, SAMPLE_RATE, LogMel, mel_filterbank
from dataprep.training import (
    AudioError,
    BatchBuilder,
    ColumnCache,
    PlanDataset,
    load_audio,
    make_loader,
)
from dataprep.testing import write_tone
from manifests.errors import DataprepError
from manifests.manifest_read import read_manifest
from manifests.manifest_write import write_manifest
from manifests.plan_files import PlanShard
from tests.training._consumer import Corpus, shared_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return shared_corpus(tmp_path_factory)


def builder(c: Corpus, tmp: Path, **kw: object) -> BatchBuilder:
    return BatchBuilder(c.manifest, [str(c.spm)], cache_dir=tmp / "cache", **kw)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- features


def test_filterbank_shape_and_triangles() -> None:
    fb = mel_filterbank(80)
    assert fb.shape == (80, 257)
    assert (fb >= 0).all()
    peaks = fb.argmax(dim=1)
    assert (peaks[1:] >= peaks[:-1]).all()  # centers rise with the filter index
    assert (fb.sum(dim=0)[1:200] > 0).all()  # the band is covered without holes


@settings(max_examples=15, deadline=None)
@given(freq=st.floats(min_value=300.0, max_value=7000.0), seconds=st.floats(min_value=0.05, max_value=1.0))
def test_log_mel_frames_and_tone_peak(freq: float, seconds: float) -> None:
    n = int(seconds * SAMPLE_RATE)
    wave = torch.sin(2 * math.pi * freq * torch.arange(n) / SAMPLE_RATE)
    mel = LogMel(80)
    feats = mel(wave)
    assert feats.shape == (1 + n // HOP, 80)  # 10 ms hop, centered
    fb = mel_filterbank(80)
    expected = int(fb[:, int(round(freq / (SAMPLE_RATE / 2) * 256))].argmax())
    assert abs(int(feats.mean(dim=0).argmax()) - expected) <= 1


# --------------------------------------------------------------------------- audio


def test_load_audio_reads_only_the_segment_and_resamples(tmp_path: Path) -> None:
    path = write_tone(tmp_path / "a.flac", 6.0, sample_rate=44100, channels=2, seed=3)
    whole, sr = soundfile.read(path, dtype="float32")
    seg = load_audio("u1", str(path), 2.0, 1.5, sample_rate=44100)
    np.testing.assert_array_equal(seg, whole[88200:88200 + 66150].mean(axis=1))
    res = load_audio("u1", str(path), 2.0, 1.5)
    assert abs(res.shape[0] - 1.5 * SAMPLE_RATE) <= 1


@pytest.mark.parametrize("kind", ["missing", "corrupt", "truncated"])
def test_load_audio_errors_name_utterance_and_file(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "x.wav"
    if kind == "corrupt":
        path.write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunkjunk" * 10)
    elif kind == "truncated":
        write_tone(path, 1.0)
    with pytest.raises(AudioError) as exc:
        load_audio("utt-42", str(path), 0.0, 3.0)
    msg = str(exc.value)
    assert "utt-42" in msg and str(path) in msg and "\n" not in msg


# --------------------------------------------------------------------------- dataset over a plan


def test_batches_follow_the_shard_with_real_tensors(corpus: Corpus, tmp_path: Path) -> None:
    plan = corpus.plan(2)
    df = read_manifest(corpus.manifest)
    b = builder(corpus, tmp_path)
    for rank in range(2):
        shard = list(PlanShard(plan, rank))
        batches = list(make_loader(PlanDataset(plan, rank, b)))
        assert [x.step for x in batches] == [p.step for p in shard]
        for x, p in zip(batches, shard):
            assert x.ids == p.ids and x.bucket == p.bucket
            dur = df["duration"].to_numpy()[p.rows]
            # frames: 100 per second of audio (+1 for the centered first frame)
            assert (x.feature_lens - torch.from_numpy(np.round(dur * 100)).long()).abs().max() <= 2
            assert x.features.shape == (len(p.ids), int(x.feature_lens.max()), 80)
            assert torch.isfinite(x.features).all()
            assert x.tokens.shape[0] == len(p.ids) and int(x.token_lens.min()) >= 2
            pad = x.features[0, int(x.feature_lens[0]):]
            assert (pad == 0).all()


def test_deterministic_whatever_the_worker_count(corpus: Corpus, tmp_path: Path) -> None:
    plan = corpus.plan(2)
    b = builder(corpus, tmp_path)
    ref = list(make_loader(PlanDataset(plan, 1, b), num_workers=0))
    got = list(make_loader(PlanDataset(plan, 1, b), num_workers=2, timeout_s=60))
    assert [x.step for x in got] == [x.step for x in ref]
    for a, c in zip(ref, got):
        assert a.ids == c.ids
        assert torch.equal(a.features, c.features) and torch.equal(a.tokens, c.tokens)


def test_start_step_gives_the_tail_of_the_full_run(corpus: Corpus, tmp_path: Path) -> None:
    plan = corpus.plan(2)
    b = builder(corpus, tmp_path)
    full = list(make_loader(PlanDataset(plan, 0, b)))
    k = len(full) // 2
    tail = list(make_loader(PlanDataset(plan, 0, b, start_step=full[k].step)))
    assert [x.ids for x in tail] == [x.ids for x in full[k:]]
    assert all(torch.equal(a.features, c.features) for a, c in zip(tail, full[k:]))


@pytest.fixture(scope="module")
def odd_manifest(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pl.DataFrame]:
    """A manifest with shared and unique audio files, nulls (offset, text, lang) and non-ASCII text."""
    rng = np.random.default_rng(7)
    n = 300
    shared = [f"/data/long-{i}.flac" for i in range(3)]
    paths = [shared[i % 3] if i % 4 else f"/data/ünique/{i:04d}.wav" for i in range(n)]
    df = pl.DataFrame({
        "id": [f"utt-{i:04d}" for i in range(n)],
        "audio_path": paths,
        "offset": [None if i % 5 == 0 else float(i) for i in range(n)],
        "duration": rng.uniform(0.5, 20.0, n).round(2),
        "text": [None if i % 17 == 0 else f"texte {i} é 日本" * (1 + i % 3) for i in range(n)],
        "lang": [None if i % 7 == 0 else ("fr" if i % 2 else "en") for i in range(n)],
        "num_tokens": rng.integers(1, 90, n).astype(np.int32),
    }).with_columns((pl.col("num_tokens") / pl.col("duration")).alias("tps"))
    path = tmp_path_factory.mktemp("odd") / "m.parquet"
    write_manifest(df, path)
    return path, read_manifest(path)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(picks=st.lists(st.integers(min_value=0, max_value=299), max_size=80))
def test_gather_equals_the_manifest_rows(odd_manifest: tuple[Path, pl.DataFrame], tmp_path: Path,
                                         picks: list[int]) -> None:
    path, df = odd_manifest
    cols = ColumnCache.open(path, tmp_path / "c")
    rows = np.array(picks, dtype=np.int64)
    ids = df["id"].gather(rows).to_list()
    m = cols.gather(rows, ids)
    assert m.ids == ids and len(m) == len(picks)
    assert m.audio_paths == df["audio_path"].gather(rows).to_list()
    assert m.texts == df["text"].fill_null("").gather(rows).to_list()
    assert m.langs == df["lang"].gather(rows).to_list()
    np.testing.assert_array_equal(m.offsets, df["offset"].fill_null(0.0).to_numpy()[rows])
    np.testing.assert_array_equal(m.durations, df["duration"].to_numpy()[rows])
    np.testing.assert_array_equal(m.num_tokens, df["num_tokens"].to_numpy()[rows])
    assert m.num_tokens.dtype == np.int64 and m.offsets.dtype == np.float64


def test_cache_dictionary_encodes_paths_and_is_reused(odd_manifest: tuple[Path, pl.DataFrame],
                                                      tmp_path: Path) -> None:
    path, df = odd_manifest
    cols = ColumnCache.open(path, tmp_path)
    assert sorted(cols.audio_files.to_pylist()) == sorted(df["audio_path"].unique().to_list())
    assert sorted(cols.langs, key=str) == sorted(set(df["lang"].to_list()), key=str)
    (cache,) = tmp_path.glob("*.arrow")
    stamp = cache.stat().st_mtime_ns
    again = ColumnCache.open(path, tmp_path)  # maps the file, does not rebuild it
    assert cache.stat().st_mtime_ns == stamp and again.num_rows == df.height


def test_unreadable_cache_is_rebuilt(odd_manifest: tuple[Path, pl.DataFrame], tmp_path: Path) -> None:
    path, df = odd_manifest
    ColumnCache.open(path, tmp_path)
    (cache,) = tmp_path.glob("*.arrow")
    cache.write_bytes(cache.read_bytes()[: cache.stat().st_size // 2])  # as a crash mid-write could leave it
    cols = ColumnCache.open(path, tmp_path)
    assert cols.gather(np.array([3]), ["x"]).audio_paths == [df["audio_path"][3]]
    assert sorted(p.name for p in tmp_path.iterdir()) == [cache.name, cache.name + ".lock"]


def test_concurrent_openers_build_one_cache(odd_manifest: tuple[Path, pl.DataFrame], tmp_path: Path) -> None:
    path, df = odd_manifest
    with ThreadPoolExecutor(4) as pool:  # flock holds between threads too (one open file each)
        opened = list(pool.map(lambda _: ColumnCache.open(path, tmp_path), range(4)))
    rows = np.arange(df.height)
    texts = [c.gather(rows, [""] * df.height).texts for c in opened]
    assert all(t == texts[0] for t in texts)
    assert len(list(tmp_path.glob("*.arrow"))) == 1 and not list(tmp_path.glob(".*.tmp"))


def test_gather_refuses_rows_past_the_manifest(odd_manifest: tuple[Path, pl.DataFrame], tmp_path: Path) -> None:
    path, df = odd_manifest
    cols = ColumnCache.open(path, tmp_path)
    with pytest.raises(DataprepError, match="another manifest"):
        cols.gather(np.array([0, df.height]), ["a", "b"])


def _break_one(c: Corpus, tmp: Path, kind: str) -> tuple[Path, str, str]:
    """A copy of the manifest where one utterance's audio is missing or corrupt."""
    df = read_manifest(c.manifest)
    victim = 0
    bad = tmp / ("gone.wav" if kind == "missing" else "corrupt.flac")
    if kind == "corrupt":
        bad.write_bytes(b"fLaC" + bytes(range(256)) * 4)
    df = df.with_columns(df["audio_path"].scatter(victim, str(bad)))
    out = tmp / "broken.parquet"
    write_manifest(df, out)
    return out, df["id"][victim], str(bad)


@pytest.mark.parametrize("kind", ["missing", "corrupt"])
def test_bad_audio_error_or_skip(corpus: Corpus, tmp_path: Path, kind: str) -> None:
    plan = corpus.plan(1)
    manifest, uid, path = _break_one(corpus, tmp_path, kind)
    strict = BatchBuilder(manifest, [str(corpus.spm)], cache_dir=tmp_path / "cache")
    with pytest.raises(AudioError) as exc:
        list(make_loader(PlanDataset(plan, 0, strict)))
    assert uid in str(exc.value) and path in str(exc.value)
    lenient = BatchBuilder(manifest, [str(corpus.spm)], cache_dir=tmp_path / "cache", skip_bad_audio=True)
    batches = list(make_loader(PlanDataset(plan, 0, lenient)))
    skipped = [s for x in batches for s in x.skipped]
    assert [s["id"] for s in skipped] == [uid] and skipped[0]["audio_path"] == path
    seen = [i for x in batches for i in x.ids]
    assert uid not in seen and len(seen) == read_manifest(manifest).height - 1
