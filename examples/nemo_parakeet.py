"""NeMo Parakeet (RNNT, TDT), CTC and hybrid models: train on the plan with NeMo's own model code and dataset.

    python examples/nemo_parakeet.py PLAN_DIR MANIFEST SPM_MODEL

In your training script, one call before the model is built makes the model class's
``_setup_dataloader_from_config`` read the plan for any ``*_ds`` config that has ``plan_dir``
(configs without it, e.g. validation sets, go to NeMo's own loader), plus two config keys:

    model.train_ds.use_lhotse=true model.train_ds.plan_dir=plan/ model.train_ds.manifest=kept.parquet
"""
import json
import sys
from types import SimpleNamespace

from nemo.collections.asr.models import EncDecCTCModelBPE, EncDecHybridRNNTCTCBPEModel, EncDecRNNTBPEModel
from nemo.collections.common.tokenizers.sentencepiece_tokenizer import SentencePieceTokenizer

from dataprep.integrations.nemo_models import use_plans
from manifests.plan_meta import read_plan_meta

use_plans(EncDecRNNTBPEModel, EncDecCTCModelBPE, EncDecHybridRNNTCTCBPEModel)  # the one call

# What setup_training_data now builds, shown without a model: each class's own method runs with
# the attributes it reads (rank, world size, tokenizer); a TDT model is an EncDecRNNTBPEModel.
plan_dir, manifest, spm_model = sys.argv[1:4]
tokenizer = SentencePieceTokenizer(spm_model)
model = SimpleNamespace(global_rank=0, world_size=read_plan_meta(plan_dir).world_size, tokenizer=tokenizer)
train_ds = {"use_lhotse": True, "plan_dir": plan_dir, "manifest": manifest, "sample_rate": 16000,
            "channel_selector": 0, "num_workers": 2}
for cls in (EncDecRNNTBPEModel, EncDecCTCModelBPE, EncDecHybridRNNTCTCBPEModel):
    loader = cls._setup_dataloader_from_config(model, train_ds)
    for audio, audio_lens, tokens, token_lens in loader:  # NeMo's LhotseSpeechToTextBpeDataset batches
        print(json.dumps([tokenizer.ids_to_text(t[:n].tolist()) for t, n in zip(tokens, token_lens)]))
