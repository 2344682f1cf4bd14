"""The torch loader over a real plan: segments, resampling, log-mel, tokens, determinism, bad audio."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dataprep.features import HOP, SAMPLE_RATE, LogMel, mel_filterbank
from dataprep.loader import AudioError, BatchBuilder, ManifestColumns, PlanDataset, load_audio, make_loader
from dataprep.testing import write_tone
from manifests.io import read_manifest, write_manifest
from manifests.plan_files import PlanShard
from tests.dataprep._consumer import Corpus, shared_corpus


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


def test_cache_maps_the_manifest_columns(corpus: Corpus, tmp_path: Path) -> None:
    cols = ManifestColumns.open(corpus.manifest, tmp_path / "c")
    again = ManifestColumns.open(corpus.manifest, tmp_path / "c")  # from the cache file
    df = read_manifest(corpus.manifest)
    rows = np.array([5, 0, df.height - 1])
    for m in (cols.gather(rows), again.gather(rows)):
        assert m.ids == df["id"].gather(rows).to_list()
        np.testing.assert_array_equal(m.durations, df["duration"].to_numpy()[rows])


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
