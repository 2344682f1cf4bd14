"""Our NeMo front end (``LogMel(FeatureConfig.nemo(...))``) against NeMo's own
``AudioToMelSpectrogramPreprocessor`` on real FLAC clips of different lengths, dither off:
NeMo's defaults, the Canary-1B config and overrides in NeMo's argument names, within 1e-4.

Marked ``nemo``; skipped where ``nemo_toolkit`` is not installed (``make test-nemo``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
import torch

from dataprep.training.features import FeatureConfig, LogMel
from tests.conftest import needs_module

pytestmark = [pytest.mark.nemo, needs_module("nemo.collections.asr", "nemo_toolkit is not installed (make test-nemo)")]

CANARY_1B = {"sample_rate": 16000, "normalize": "per_feature", "window_size": 0.025, "window_stride": 0.01,
             "window": "hann", "features": 128, "n_fft": 512, "log": True, "frame_splicing": 1, "dither": 1e-5,
             "pad_to": 0, "pad_value": 0.0}


def write_clip(path: Path, seconds: float, seed: int, sample_rate: int = 16000) -> np.ndarray:
    """A real 16-bit FLAC clip (voiced harmonics with a moving pitch, noise bursts, room noise),
    written and read back with soundfile."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sample_rate)) / sample_rate
    f0 = rng.uniform(90, 220) * (1 + 0.1 * np.sin(2 * np.pi * rng.uniform(0.5, 3) * t))
    phase = 2 * np.pi * np.cumsum(f0) / sample_rate
    voiced = sum(np.sin(k * phase) / k for k in range(1, 12)) * (np.sin(2 * np.pi * 2.5 * t) > -0.2)
    sig = 0.1 * voiced + 0.02 * rng.standard_normal(t.shape[0]) * (np.sin(2 * np.pi * 1.3 * t) > 0.5)
    sig = sig + 0.003 * rng.standard_normal(t.shape[0])
    soundfile.write(path, np.clip(sig, -1, 1).astype(np.float32), sample_rate, subtype="PCM_16")
    data, sr = soundfile.read(path, dtype="float32")
    assert sr == sample_rate
    return data


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.Tensor, torch.Tensor]:
    tmp = tmp_path_factory.mktemp("clips")
    clips = [write_clip(tmp / f"c{i}.flac", s, i) for i, s in enumerate((3.7, 1.234, 2.0, 0.51))]
    n = torch.tensor([c.shape[0] for c in clips])
    x = torch.zeros(len(clips), int(n.max()))
    for i, c in enumerate(clips):
        x[i, : c.shape[0]] = torch.from_numpy(c)
    return x, n


def nemo_features(args: dict[str, Any], x: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from nemo.collections.asr.modules import AudioToMelSpectrogramPreprocessor

    pre = AudioToMelSpectrogramPreprocessor(**args)
    pre.eval()
    return pre(input_signal=x.clone(), length=n.clone())


@pytest.mark.parametrize("args", [
    {"dither": 0.0},
    {**CANARY_1B, "dither": 0.0},
    {"dither": 0.0, "features": 80, "window_size": 0.025, "pad_to": 8, "preemph": 0.9, "lowfreq": 20, "highfreq": 7600},
    {"dither": 0.0, "normalize": "NA", "window_size": None, "window_stride": None, "n_window_size": 400, "n_window_stride": 160, "n_fft": 1024, "pad_value": -1.0},
    {"dither": 0.0, "normalize": "all_features", "log_zero_guard_type": "clamp", "log_zero_guard_value": 1e-5,
     "mag_power": 1.0, "preemph": None},
], ids=["nemo-defaults", "canary-1b", "overrides", "no-normalize", "all-features"])
def test_our_front_end_equals_nemos_preprocessor(batch: tuple[torch.Tensor, torch.Tensor], args: dict[str, Any]) -> None:
    x, n = batch
    want, want_len = nemo_features(args, x, n)
    cfg = FeatureConfig.canary_1b(dither=0.0) if args == {**CANARY_1B, "dither": 0.0} else FeatureConfig.nemo(**args)
    got, got_len = LogMel(cfg)(x.clone(), n.clone())
    assert got.shape == want.shape
    assert got_len.tolist() == want_len.tolist() == (n // cfg.n_window_stride).tolist()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_the_canary_config_is_canary_1b_preprocessor_section() -> None:
    assert FeatureConfig.canary_1b(dither=0.0) == FeatureConfig.nemo(**{**CANARY_1B, "dither": 0.0})
    c = FeatureConfig.canary_1b()
    assert (c.n_window_size, c.n_window_stride, c.n_fft, c.features, c.pad_to, c.preemph) == (400, 160, 512, 128, 0, 0.97)
    with pytest.raises(ValueError, match="frame_splicing"):
        FeatureConfig.nemo(frame_splicing=3)
    with pytest.raises(ValueError, match="unknown NeMo preprocessor argument"):
        FeatureConfig.nemo(n_mels=80)


def test_the_fractional_hop_is_the_same_pipeline(batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    """At NeMo's own hop and frame count, ``at_hops`` gives NeMo's features; at a fractional
    hop the utterance gets exactly the frames asked for, normalized over them."""
    x, n = batch
    cfg = FeatureConfig.canary_1b(dither=0.0)
    want, want_len = nemo_features({**CANARY_1B, "dither": 0.0}, x, n)
    mel = LogMel(cfg)
    got, got_len = mel.at_hops(x, n, torch.full((4,), 160.0, dtype=torch.float64), n // 160)
    torch.testing.assert_close(got, want[:, :, : got.shape[-1]], atol=1e-4, rtol=0)
    hops = (n - 1).double() / 199  # 200 frames each
    dyn, lens = mel.at_hops(x, n, hops, torch.full((4,), 200))
    assert dyn.shape == (4, 128, 200) and lens.tolist() == [200] * 4
    m = dyn.mean(dim=2)
    torch.testing.assert_close(m, torch.zeros_like(m), atol=1e-4, rtol=0)  # per-feature normalized
