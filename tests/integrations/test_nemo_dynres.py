"""Dynamic resolution in NeMo training: ``get_plan_dataloader`` puts each batch's
``target_frames`` on the batch, ``DynamicResolutionCallback`` hands it to
``DynamicResolutionPreprocessor``, and a tiny NeMo Conformer trains 2 steps under a real
Lightning ``Trainer`` on a plan made with ``plan-batches --dynamic-resolution --target-frames``.
In eval mode, or without ``target_frames``, the preprocessor is NeMo's, unchanged.

Marked ``nemo``; skipped where ``nemo_toolkit`` is not installed (``make test-nemo``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from bucketing.dynres import DynResConfig, resolve
from dataprep.integrations.nemo import get_plan_dataloader
from manifests.manifest_read import read_manifest
from manifests.plan_files import open_shard
from tests.conftest import needs_module
from tests.training._consumer import Corpus, build_corpus, invoke

pytestmark = [pytest.mark.nemo, needs_module("nemo.collections.asr", "nemo_toolkit is not installed (make test-nemo)")]

# frames per batch (the lowest target accepted); the corpus holds 0.3-2.5 s clips (clamped at 130 Hz) and an
# 11 s recording, which needs 799 / 11 = 72.6 Hz: below a 75 Hz floor, so its batch falls back
F = 800
DYN = {"min_rate": 75.0, "floor_rate": 75.0}
PRE = {"sample_rate": 16000, "window_size": 0.025, "window_stride": 0.01, "features": 32, "n_fft": 512,
       "normalize": "per_feature", "dither": 0.0, "pad_to": 0}


@pytest.fixture(scope="module")
def corpus_plan(tmp_path_factory: pytest.TempPathFactory) -> tuple[Corpus, Path]:
    corpus = build_corpus(tmp_path_factory.mktemp("nemo-dynres"), num_tones=12, shared_limit=0)
    sized = corpus.root / "sized.json"
    invoke("oomptimize", str(corpus.buckets), "--model", "tiny", "--estimate", "--gpu-memory", "40MiB",
           "--max-batch", "4", "--cache-dir", str(corpus.root / "cache"), "-o", str(sized),
           "--dynamic-resolution", "--target-frames", str(F), "--min-rate", "75", "--floor-rate", "75")
    plan = corpus.root / "plan"
    invoke("plan-batches", str(corpus.manifest), "--buckets", str(sized), "-w", "1", "-o", str(plan),
           "--dynamic-resolution", "--target-frames", str(F), "--min-rate", "75", "--floor-rate", "75")
    return corpus, plan


def test_a_tiny_nemo_model_trains_two_steps_at_dynamic_resolution(corpus_plan: tuple[Corpus, Path]) -> None:
    import lightning.pytorch as pl

    from dataprep.integrations.nemo_features import DynamicResolutionCallback
    from tests.integrations._nemo_dynres_model import AudioOnly, TinyASR

    corpus, plan = corpus_plan
    config = {"plan_dir": str(plan), "manifest": str(corpus.manifest), "channel_selector": 0, "sample_rate": 16000}
    loader = get_plan_dataloader(config, global_rank=0, world_size=1, dataset=AudioOnly())
    assert [b.target_frames for b in open_shard(plan, 0)][:2] == [F, F]
    model = TinyASR(PRE, DYN)
    before = [p.detach().clone() for p in model.encoder.parameters()]
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", callbacks=[DynamicResolutionCallback()], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, train_dataloaders=loader)
    steps = len(list(open_shard(plan, 0)))
    assert trainer.global_step == steps == len(model.seen) >= 2
    cfg = DynResConfig(target_frames=F, **DYN)
    kinds = set()
    replay = get_plan_dataloader(config, global_rank=0, world_size=1, dataset=AudioOnly())  # the trained one has ended
    for (target, frames, longest, width), batch in zip(model.seen, replay):
        assert target == F
        n = batch["audio_lens"].numpy()
        res = resolve(n / 16000, np.array([0, len(n)]), [F], cfg)
        if res.fallback[0]:  # the 11 s recording needs < 75 Hz: NeMo's features, NeMo's widths
            kinds.add("fallback")
            assert longest == int(n.max()) // 160 and frames == 1 + int(n.max()) // 160 and width == 10
            continue
        kinds.add("dynamic")
        assert frames == int(res.length[0]) and longest == int(res.frames.max())  # F, or what the clamp gives
        # the time mask covers the same seconds: 10 frames at 100 Hz scaled to the batch's rate
        assert width == round(10 * float(res.rate[np.argmax(n)]) / 100)
    # a batch falls back only where it holds a recording longer than F frames at the floor rate
    # (the 11 s one of ../shared/data/audio; the tones alone never do)
    longest_s = float(read_manifest(corpus.manifest, ["duration"])["duration"].max())
    assert kinds == ({"fallback", "dynamic"} if longest_s > F / DYN["floor_rate"] else {"dynamic"})
    assert any(not torch.equal(a, b) for a, b in zip(before, model.encoder.parameters()))


def test_eval_and_batches_without_a_target_are_nemos(corpus_plan: tuple[Corpus, Path]) -> None:
    from nemo.collections.asr.modules import AudioToMelSpectrogramPreprocessor

    from dataprep.integrations.nemo_features import DynamicResolutionPreprocessor
    from tests.integrations._nemo_dynres_model import AudioOnly

    corpus, plan = corpus_plan
    config = {"plan_dir": str(plan), "manifest": str(corpus.manifest), "channel_selector": 0}
    batch = next(b for b in get_plan_dataloader(config, global_rank=0, world_size=1, dataset=AudioOnly())
                 if int(b["audio_lens"].max()) < 2.9 * 16000)  # one at dynamic resolution (no fallback)
    ours, nemo = DynamicResolutionPreprocessor(**PRE, **DYN), AudioToMelSpectrogramPreprocessor(**PRE)
    want, want_len = nemo(input_signal=batch["audio"], length=batch["audio_lens"])
    for training, target in ((False, F), (True, None)):
        ours.train(training)
        ours.target_frames = target
        got, got_len = ours(input_signal=batch["audio"], length=batch["audio_lens"])
        assert torch.equal(got, want) and torch.equal(got_len, want_len)
    ours.train(True)
    ours.use_batch(batch)
    got, got_len = ours(input_signal=batch["audio"], length=batch["audio_lens"])
    n = batch["audio_lens"].numpy()
    res = resolve(n / 16000, np.array([0, len(n)]), [F], DynResConfig(target_frames=F, **DYN))
    assert got.shape[-1] == int(res.length[0]) and got_len.tolist() == res.frames.tolist()
    assert ours.last_rates is not None and ours.target_frames is None  # used once
