"""Resampling as NeMo's Lhotse dataloader does: ``load_audio(..., resampler="lhotse")`` gives the
samples of ``cut.resample(16000).load_audio()`` for speech-like audio at 8 / 16 / 22.05 / 44.1 /
48 kHz (whole files and segments on half-sample ties), and our loader's NeMo log-mel equals
that of NeMo's own path (``get_plan_dataloader`` -> ``LhotseSpeechToTextBpeDataset`` ->
``AudioToMelSpectrogramPreprocessor``). The default, soxr, does not (figures in docs/trainers.md).

The NeMo comparison is marked ``nemo`` (run with NeMo's venv); the Lhotse one runs wherever
lhotse is installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
import torch

from dataprep.training.batches import BatchBuilder
from dataprep.training.features import FeatureConfig
from manifests.errors import OptionError
from manifests.manifest_read import read_manifest
from manifests.plan_files import open_shard
from tests.integrations._speechlike import RATES, SpeechCorpus, speech_corpus

pytest.importorskip("lhotse", reason="lhotse is not installed: pip install 'speech-dataprep[lhotse]'")

from dataprep.integrations.cuts import cut_for_row  # noqa: E402
from dataprep.training.audio import load_audio  # noqa: E402

#: NeMo's preprocessor arguments of the comparison (80 mels, 25 ms / 10 ms, dither off, no pad_to)
PRE = {"sample_rate": 16000, "window_size": 0.025, "window_stride": 0.01, "features": 80, "n_fft": 512,
       "normalize": "per_feature", "dither": 0.0, "pad_to": 0}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> SpeechCorpus:
    return speech_corpus(tmp_path_factory)


def _rows(corpus: SpeechCorpus) -> list[dict[str, Any]]:
    return read_manifest(corpus.manifest).to_dicts()


def test_lhotse_resampler_gives_lhotses_samples(corpus: SpeechCorpus) -> None:
    rows = _rows(corpus)
    rates_seen = set()
    for r in rows:
        want = cut_for_row(r).resample(16000).load_audio().mean(axis=0).astype(np.float32)
        got = load_audio(r["id"], r["audio_path"], r["offset"] or 0.0, r["duration"], resampler="lhotse")
        np.testing.assert_array_equal(got, want, err_msg=r["id"])
        soxr = load_audio(r["id"], r["audio_path"], r["offset"] or 0.0, r["duration"])
        rate = soundfile.info(r["audio_path"]).samplerate
        rates_seen.add(rate)
        if rate != 16000:  # the default is another resampler
            assert soxr.shape == want.shape and np.abs(soxr - want).max() > 1e-4, r["id"]
        else:
            np.testing.assert_array_equal(soxr, want)
    assert rates_seen >= set(RATES)


def test_an_unknown_resampler_is_refused_in_one_line(corpus: SpeechCorpus) -> None:
    r = _rows(corpus)[0]
    with pytest.raises(OptionError, match="resampler: must be soxr or lhotse, got 'sox'"):
        load_audio(r["id"], r["audio_path"], 0.0, r["duration"], resampler="sox")  # type: ignore[arg-type]
    with pytest.raises(OptionError, match="resampler"):
        BatchBuilder(corpus.manifest, [str(corpus.spm)], resampler="scipy")


def _ours(corpus: SpeechCorpus, resampler: str) -> dict[str, torch.Tensor]:
    """Our loader's NeMo log-mel (frames, n_mels) per utterance id, over the plan."""
    b = BatchBuilder(corpus.manifest, [str(corpus.spm)], features=FeatureConfig.nemo(**{
        k: v for k, v in PRE.items() if k not in ("window_size", "window_stride")},
        n_window_size=400, n_window_stride=160), resampler=resampler, io_threads=1)
    out = {}
    for pb in open_shard(corpus.plan, 0):
        batch = b.build(pb)
        for i, utt in enumerate(batch.ids):
            out[utt] = batch.features[i, : int(batch.feature_lens[i])]
    return out


@pytest.mark.nemo
def test_our_loader_gives_nemos_lhotse_features(corpus: SpeechCorpus) -> None:
    pytest.importorskip("nemo.collections.asr", reason="nemo_toolkit is not installed (make test-nemo)")
    from nemo.collections.asr.data.audio_to_text_lhotse import (
        LhotseSpeechToTextBpeDataset,
    )
    from nemo.collections.asr.modules import AudioToMelSpectrogramPreprocessor
    from nemo.collections.common.tokenizers.sentencepiece_tokenizer import (
        SentencePieceTokenizer,
    )

    from dataprep.integrations.nemo import get_plan_dataloader

    config = {"plan_dir": str(corpus.plan), "manifest": str(corpus.manifest), "sample_rate": 16000}
    dataset = LhotseSpeechToTextBpeDataset(tokenizer=SentencePieceTokenizer(str(corpus.spm)), return_cuts=True)
    pre = AudioToMelSpectrogramPreprocessor(**PRE).eval()
    nemo: dict[str, torch.Tensor] = {}
    for audio, audio_lens, _, _, cuts in get_plan_dataloader(config, 0, 1, dataset):
        with torch.no_grad():
            feats, lens = pre(input_signal=audio, length=audio_lens)
        for i, c in enumerate(cuts):
            nemo[c.id] = feats[i, :, : int(lens[i])].T
    rate = {r["id"]: soundfile.info(r["audio_path"]).samplerate for r in _rows(corpus)}
    ours, soxr = _ours(corpus, "lhotse"), _ours(corpus, "soxr")
    assert set(ours) == set(nemo) == set(soxr) and set(rate.values()) >= set(RATES)
    worst = {name: dict.fromkeys(sorted(set(rate.values())), 0.0) for name in ("lhotse", "soxr")}
    for utt, want in nemo.items():
        for name, got in (("lhotse", ours[utt]), ("soxr", soxr[utt])):
            assert got.shape == want.shape, (name, utt)
            worst[name][rate[utt]] = max(worst[name][rate[utt]], float((got - want).abs().max()))
    print("max |our features - NeMo's| per source rate:", worst)
    assert max(worst["lhotse"].values()) < 1e-3, worst
    assert worst["soxr"][16000] < 1e-3 and min(v for k, v in worst["soxr"].items() if k != 16000) > 1e-2, worst


def test_train_resampler_flag(corpus: SpeechCorpus, tmp_path: Path) -> None:
    """``dataprep train --resampler lhotse`` trains the same batches on other tensors than the
    default soxr; an unknown name is one line naming the flag."""
    import json

    from typer.testing import CliRunner

    from dataprep.cli import app
    from tests.training._consumer import invoke

    args = ["train", str(corpus.plan), "--manifest", str(corpus.manifest), "--tokenizer", str(corpus.spm),
            "--cache-dir", str(corpus.root / "cache"), "--quiet", "--trace", "--steps", "2"]
    traces = {}
    for name in ("soxr", "lhotse"):
        invoke(*args, "--checkpoint-dir", str(tmp_path / name), "--resampler", name)
        lines = (tmp_path / name / "trace-rank-00000.jsonl").read_text().splitlines()
        traces[name] = [json.loads(x) for x in lines]
        assert [t["step"] for t in traces[name]] == [0, 1]
    assert [t["ids"] for t in traces["soxr"]] == [t["ids"] for t in traces["lhotse"]]
    assert traces["soxr"] != traces["lhotse"]
    res = CliRunner().invoke(app, [*args, "--checkpoint-dir", str(tmp_path / "bad"), "--resampler", "sox"])
    assert res.exit_code == 2 and res.output.startswith("error: --resampler: must be soxr or lhotse, got 'sox'")
