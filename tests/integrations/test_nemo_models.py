"""Parakeet (RNNT, TDT), CTC and hybrid NeMo models train on a plan: ``use_plans`` points each
class's own ``_setup_dataloader_from_config`` at ``get_plan_dataloader``, and tiny models built
from configs (one-layer FastConformer, no downloaded weights, a sentencepiece tokenizer trained
on real LibriSpeech transcripts) train 2 steps on CPU under a real Lightning ``Trainer``, each
batch the plan's utterances in order with the tokens of their transcripts. NeMo 3.0's TDT losses
run on CUDA only, so TDT trains where a GPU is present (on CPU its loader is checked).

Marked ``nemo``; skipped where ``nemo_toolkit`` is not installed (``make test-nemo``).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from dataprep.integrations.nemo_models import use_plans
from dataprep.training.audio import half_up
from manifests.errors import DataprepError
from manifests.manifest_read import read_manifest
from manifests.plan_files import open_shard
from tests.conftest import needs_module
from tests.integrations._canary_train import _vocab_files
from tests.integrations._nemo_asr import config
from tests.integrations._speechlike import SpeechCorpus, speech_corpus

pytestmark = [pytest.mark.nemo, needs_module("nemo.collections.asr", "nemo_toolkit is not installed (make test-nemo)")]

STEPS = 2


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> SpeechCorpus:
    return speech_corpus(tmp_path_factory)


@pytest.fixture(scope="module")
def tokenizer_dir(corpus: SpeechCorpus) -> Path:
    folder = corpus.root / "nemo-tokenizer"
    folder.mkdir(exist_ok=True)
    shutil.copy(corpus.spm, folder / "tokenizer.model")
    _vocab_files(folder)
    return folder


def _classes() -> dict[str, Any]:
    """The NeMo model class of each kind (NeMo imported when a test runs, not at collection)."""
    from nemo.collections.asr.models import EncDecCTCModelBPE, EncDecHybridRNNTCTCBPEModel, EncDecRNNTBPEModel

    return {"rnnt": EncDecRNNTBPEModel, "tdt": EncDecRNNTBPEModel, "ctc": EncDecCTCModelBPE,
            "hybrid": EncDecHybridRNNTCTCBPEModel}


def test_use_plans_points_each_models_own_loader_at_the_plan() -> None:
    import nemo.collections.asr.models.rnnt_bpe_models as rnnt_bpe
    from nemo.collections.asr.models import (
        EncDecCTCModelBPE,
        EncDecHybridRNNTCTCBPEModel,
        EncDecMultiTaskModel,
        EncDecRNNTBPEModel,
    )

    from dataprep.integrations.nemo import get_plan_dataloader

    changed = use_plans(EncDecRNNTBPEModel, EncDecCTCModelBPE, EncDecHybridRNNTCTCBPEModel, EncDecMultiTaskModel)
    assert changed == ["nemo.collections.asr.models.rnnt_bpe_models", "nemo.collections.asr.models.ctc_bpe_models",
                       "nemo.collections.asr.models.hybrid_rnnt_ctc_bpe_models",
                       "nemo.collections.asr.models.aed_multitask_models"]
    assert rnnt_bpe.get_lhotse_dataloader_from_config is get_plan_dataloader

    class Mine(EncDecRNNTBPEModel):  # a subclass: its inherited method's module
        pass

    assert use_plans(Mine) == ["nemo.collections.asr.models.rnnt_bpe_models"]

    class Own(torch.nn.Module):
        def _setup_dataloader_from_config(self, config: Any) -> None:
            return None

    for bad, words in ((Own, "Own._setup_dataloader_from_config does not call get_lhotse_dataloader_from_config"),
                       (torch.nn.Module, "does not call"), ("EncDecRNNTBPEModel", "is not a model class")):
        with pytest.raises(DataprepError, match=words) as exc:
            use_plans(bad)  # type: ignore[arg-type]
        assert "\n" not in str(exc.value)
    with pytest.raises(DataprepError, match="name the NeMo model classes"):
        use_plans()


def _train(kind: str, corpus: SpeechCorpus, tokenizer_dir: Path, accelerator: str) -> tuple[Any, Any]:
    """The model trained ``STEPS`` steps, and its callback's ``batches``: (audio lengths, tokens) of
    each training batch the model received."""
    import lightning.pytorch as pl
    from omegaconf import OmegaConf

    class Seen(pl.Callback):  # type: ignore[misc]
        """(audio lengths, tokens) of each training batch the model received."""

        def __init__(self) -> None:
            self.batches: list[tuple[list[int], list[list[int]]]] = []

        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
            _, audio_lens, tokens, token_lens = batch
            self.batches.append((audio_lens.tolist(), [t[:n].tolist() for t, n in zip(tokens, token_lens)]))

    model_class = _classes()[kind]
    use_plans(model_class)
    cfg = OmegaConf.create(config(kind, str(tokenizer_dir), str(corpus.plan), str(corpus.manifest)))
    model = model_class(cfg=cfg)
    seen = Seen()
    trainer = pl.Trainer(max_steps=STEPS, max_epochs=-1, accelerator=accelerator, devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[seen], num_sanity_val_steps=0, use_distributed_sampler=False)
    before = [p.detach().clone() for p in model.encoder.parameters()]
    trainer.fit(model)
    assert trainer.global_step == STEPS
    assert torch.isfinite(trainer.callback_metrics["train_loss"]) and float(trainer.callback_metrics["train_loss"]) > 0
    assert any(not torch.equal(a, b.cpu()) for a, b in zip(before, model.encoder.parameters()))
    return model, seen


def _plan_batches(corpus: SpeechCorpus, model: Any) -> list[tuple[list[int], list[list[int]]]]:
    """(16 kHz sample counts, the model tokenizer's tokens) of the plan's first steps."""
    rows = {r["id"]: r for r in read_manifest(corpus.manifest).to_dicts()}
    out = []
    for pb, _ in zip(open_shard(corpus.plan, 0), range(STEPS)):
        rs = [rows[i] for i in pb.ids]
        out.append(([half_up(r["duration"], 16000) for r in rs], [model.tokenizer.text_to_ids(r["text"]) for r in rs]))
    return out


@pytest.mark.parametrize("kind", ["rnnt", "ctc", "hybrid"])
def test_a_tiny_model_trains_on_the_plan(kind: str, corpus: SpeechCorpus, tokenizer_dir: Path) -> None:
    model, seen = _train(kind, corpus, tokenizer_dir, "cpu")
    assert seen.batches == _plan_batches(corpus, model)


def test_tdt(corpus: SpeechCorpus, tokenizer_dir: Path) -> None:
    """Parakeet-TDT: a GPU trains it 2 steps; on CPU (NeMo 3.0: "TDT is not yet implemented for
    non CUDA computation") its loader is the plan's, as RNNT's."""
    if torch.cuda.is_available():
        model, seen = _train("tdt", corpus, tokenizer_dir, "gpu")
        assert seen.batches == _plan_batches(corpus, model)
        return
    from nemo.collections.asr.models import EncDecRNNTBPEModel
    from omegaconf import OmegaConf

    use_plans(EncDecRNNTBPEModel)
    model = EncDecRNNTBPEModel(cfg=OmegaConf.create(config("tdt", str(tokenizer_dir), str(corpus.plan),
                                                           str(corpus.manifest))))
    assert type(model.loss._loss).__name__ == "TDTLossNumba" and model.joint.num_extra_outputs == 5
    got = []
    for (_, audio_lens, tokens, token_lens), _ in zip(model._train_dl, range(STEPS)):
        got.append((audio_lens.tolist(), [t[:n].tolist() for t, n in zip(tokens, token_lens)]))
    assert got == _plan_batches(corpus, model)
