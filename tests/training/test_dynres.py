"""Dynamic-resolution features on real audio: log-mel at a fractional hop against a direct
numpy computation, the collate helper (target length, clamp, fallback, evaluation), and the
loader over a plan made with ``plan-batches --dynamic-resolution``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketing.dynres import DynResConfig
from dataprep.testing import write_tone
from dataprep.training import BatchBuilder, collate_dynamic_resolution, load_audio
from dataprep.training.features import N_FFT, SAMPLE_RATE, WIN, FeatureConfig, LogMel, mel_filterbank
from manifests.plan_files import PlanShard
from manifests.plan_meta import read_plan_meta
from tests.training._consumer import Corpus, invoke, shared_corpus

MEL = LogMel(80)


def _wave(tmp: Path, seconds: float, seed: int, sample_rate: int = 16000) -> np.ndarray:
    """Real audio: a FLAC file written and read back (resampled to 16 kHz by the loader)."""
    path = write_tone(tmp / f"w{seed}-{seconds:.3f}.flac", seconds, sample_rate=sample_rate, seed=seed)
    wave = load_audio(f"u{seed}", str(path), 0.0, None)
    noise = np.random.default_rng(seed).standard_normal(wave.shape[0]).astype(np.float32) * 1e-3
    return wave + noise  # no digital silence: every mel band has energy, the log is well conditioned


def _direct_log_mel(wave: np.ndarray, hop: float, frames: int) -> np.ndarray:
    """Frame k centered at round(k * hop) of the reflect-padded signal, Hann(400) in 512, |rfft|^2,
    the same Slaney filter bank, log(x + 2^-24): one frame at a time in float64 numpy."""
    half = N_FFT // 2
    x = np.pad(wave.astype(np.float64), (half, half), mode="reflect")
    win = np.zeros(N_FFT)
    left = (N_FFT - WIN) // 2
    win[left:left + WIN] = np.hanning(WIN)
    fb = mel_filterbank(80).numpy().astype(np.float64)
    out = np.empty((frames, 80))
    for k in range(frames):
        c = int(np.floor(k * hop + 0.5))
        spec = np.fft.rfft(x[c:c + N_FFT] * win)
        out[k] = np.log(fb @ (spec.real ** 2 + spec.imag ** 2) + 2.0 ** -24)
    return out


@settings(max_examples=8, deadline=None)
@given(seconds=st.floats(0.4, 3.0), rate=st.floats(70.0, 130.0), seed=st.integers(0, 50))
def test_features_at_a_given_rate_match_a_direct_computation(tmp_path_factory: pytest.TempPathFactory,
                                                              seconds: float, rate: float, seed: int) -> None:
    wave = _wave(tmp_path_factory.mktemp("w"), seconds, seed, sample_rate=(16000, 22050, 8000)[seed % 3])
    hop = SAMPLE_RATE / rate
    frames = 1 + int(np.floor(wave.shape[0] / hop))
    got = MEL.at_hop(torch.from_numpy(wave), hop, frames).numpy()
    want = _direct_log_mel(wave, hop, frames)
    assert got.shape == (frames, 80)
    np.testing.assert_allclose(got, want, atol=2e-3, rtol=1e-4)


def test_at_the_base_hop_it_is_todays_log_mel(tmp_path: Path) -> None:
    wave = torch.from_numpy(_wave(tmp_path, 2.345, 3))
    np.testing.assert_allclose(MEL.at_hop(wave, 160.0, MEL.num_frames(wave.shape[0])), MEL(wave), atol=1e-5)
    with pytest.raises(ValueError, match="need"):
        MEL.at_hop(wave, 160.0, MEL.num_frames(wave.shape[0]) + 2)


def test_every_utterance_of_a_batch_comes_out_at_the_target_length(tmp_path: Path) -> None:
    waves = [_wave(tmp_path, s, i) for i, s in enumerate([2.0, 1.93, 1.71, 1.6])]
    got = collate_dynamic_resolution(waves)
    assert got.target_frames == 201 and not got.fallback
    assert got.features.shape == (4, 201, 80)
    assert got.feature_lens.tolist() == [201] * 4 and not got.clamped.any()
    np.testing.assert_allclose(got.rates.numpy(), [200 * SAMPLE_RATE / w.shape[0] for w in waves])
    for i, w in enumerate(waves):  # each row is that utterance's own features at its rate
        hop = SAMPLE_RATE / float(got.rates[i])
        np.testing.assert_allclose(got.features[i], MEL.at_hop(torch.from_numpy(w), hop, 201), atol=1e-6)
    assert got.time_mask_widths(40).tolist() == [40, 41, 47, 50]


def test_a_clamped_utterance_is_zero_padded_after_its_frames(tmp_path: Path) -> None:
    waves = [_wave(tmp_path, 2.0, 1), _wave(tmp_path, 1.0, 2)]  # 1 s would need 200 Hz: clamped to 130
    got = collate_dynamic_resolution(waves)
    assert got.clamped.tolist() == [False, True]
    assert got.feature_lens.tolist() == [201, 131] and got.rates.tolist() == [100.0, 130.0]
    assert got.features.shape[1] == 201
    assert (got.features[1, 131:] == 0).all() and (got.features[1, :131] != 0).any()


def test_a_batch_below_the_floor_falls_back_and_eval_never_changes_the_rate(tmp_path: Path) -> None:
    waves = [_wave(tmp_path, 2.0, 4), _wave(tmp_path, 1.5, 5)]
    today = [MEL(torch.from_numpy(w)) for w in waves]
    fell = collate_dynamic_resolution(waves, 60)  # 2 s in 60 frames needs 29.5 Hz < 50 Hz
    ev = collate_dynamic_resolution(waves, 201, evaluation=True)
    for got in (fell, ev):
        assert got.fallback and got.rates.tolist() == [100.0, 100.0]
        assert got.feature_lens.tolist() == [t.shape[0] for t in today]
        assert got.features.shape[1] == max(t.shape[0] for t in today)
        for i, t in enumerate(today):
            assert torch.equal(got.features[i, : t.shape[0]], t)
            assert (got.features[i, t.shape[0]:] == 0).all()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return shared_corpus(tmp_path_factory)


def test_the_loader_featurizes_a_dynamic_resolution_plan_at_the_target(corpus: Corpus, tmp_path: Path) -> None:
    plan = tmp_path / "plan-dynres"
    invoke("plan-batches", str(corpus.manifest), "--buckets", str(corpus.buckets), "--world-size", "1",
           "-o", str(plan), "--dynamic-resolution")
    meta = read_plan_meta(plan)
    cfg = DynResConfig.from_json(meta.extra["dynamic_resolution"]["config"])
    dyn = BatchBuilder(corpus.manifest, [str(corpus.spm)], cache_dir=tmp_path / "cache", dynamic_resolution=cfg)
    ev = BatchBuilder(corpus.manifest, [str(corpus.spm)], cache_dir=tmp_path / "cache", dynamic_resolution=cfg,
                      evaluation=True)
    plain = BatchBuilder(corpus.manifest, [str(corpus.spm)], cache_dir=tmp_path / "cache")
    real = padded = 0
    for pb in PlanShard(plan, 0):
        assert pb.target_frames is not None
        b = dyn.build(pb)
        assert b.features.shape[1] == pb.target_frames
        unclamped = b.rates < cfg.max_rate
        assert (b.feature_lens[unclamped] == pb.target_frames).all()
        assert (b.feature_lens <= pb.target_frames).all()
        real, padded = real + int(b.feature_lens.sum()), padded + b.size * pb.target_frames
        e, p = ev.build(pb), plain.build(pb)
        assert e.rates is None and torch.equal(e.features, p.features) and torch.equal(e.feature_lens, p.feature_lens)
    # the plan's prediction is what the loader does (decoded lengths differ from the
    # manifest's by a few samples at most)
    assert abs((1 - real / padded) - meta.extra["dynamic_resolution"]["frame_padding"]) < 0.01


def test_nemo_features_keep_their_valid_frame_count_and_take_the_fractional_hop(tmp_path: Path) -> None:
    """With NeMo's front end (``samples // hop`` valid frames, per-feature normalization,
    pre-emphasis), the fallback and evaluation batches are NeMo's forward exactly; a dynamic
    batch has the target frames at its own hop, through the same pipeline."""
    nemo = LogMel(FeatureConfig.nemo(dither=0.0, features=40))
    waves = [_wave(tmp_path, 2.0, 6), _wave(tmp_path, 1.7, 7)]
    ev = collate_dynamic_resolution(waves, 201, features=nemo, evaluation=True)
    assert ev.feature_lens.tolist() == [w.shape[0] // 160 for w in waves] == [200, 170]
    for i, w in enumerate(waves):
        feats, lens = nemo(torch.from_numpy(w)[None], torch.tensor([w.shape[0]]))
        assert torch.equal(ev.features[i, : int(lens[0])], feats[0, :, : int(lens[0])].T)
    dyn = collate_dynamic_resolution(waves, 1000, features=nemo.config)  # 2 s: 499.5 Hz, clamped at 130
    assert dyn.feature_lens.tolist() == [261, 222] and dyn.clamped.all() and dyn.features.shape[2] == 40
    fits = collate_dynamic_resolution(waves, 201, features=nemo)  # 2 s in 201 frames: 100 Hz; 1.7 s: 117.6 Hz
    assert fits.feature_lens.tolist() == [201, 201] and not fits.clamped.any()
    np.testing.assert_allclose(fits.features[1], nemo.at_hop(torch.from_numpy(waves[1]), 16000 / float(fits.rates[1]),
                                                            201), atol=1e-6)
    with pytest.raises(ValueError, match="frames/s"):
        collate_dynamic_resolution(waves, features=FeatureConfig.nemo(window_stride=0.02))


def test_the_batch_builder_takes_a_feature_config(corpus: Corpus, tmp_path: Path) -> None:
    plan = tmp_path / "plan"
    invoke("plan-batches", str(corpus.manifest), "--buckets", str(corpus.buckets), "--world-size", "1", "-o", str(plan))
    cfg = FeatureConfig.canary_1b(dither=0.0, features=24)
    b = BatchBuilder(corpus.manifest, [str(corpus.spm)], cache_dir=tmp_path / "cache", features=cfg)
    pb = next(iter(PlanShard(plan, 0)))
    got = b.build(pb)
    mel = LogMel(cfg)
    waves = b.read_audio(b.columns.gather(pb.rows, pb.ids))
    assert got.features.shape[2] == 24
    assert got.feature_lens.tolist() == [w.shape[0] // 160 for w in waves]  # NeMo's count, not 1 + n // hop
    for i, w in enumerate(waves):
        assert torch.equal(got.features[i, : int(got.feature_lens[i])], mel(torch.from_numpy(w)))


def test_the_train_config_names_the_front_end() -> None:
    from dataprep.training_config import FEATURE_SETS, TrainConfig
    from manifests.errors import OptionError

    base = {"plan_dir": "p", "manifest": "m.parquet", "tokenizer": ["t.model"], "checkpoint_dir": "c"}
    assert TrainConfig(**base).features == "ours"
    assert [FeatureConfig.named(n, features=16).features for n in FEATURE_SETS] == [16, 16, 16]
    assert FeatureConfig.named("canary-1b") == FeatureConfig.canary_1b()
    for bad in ("NeMo", "", None, 1):
        with pytest.raises(OptionError, match="features"):
            TrainConfig(**base, features=bad)  # type: ignore[arg-type]
