"""NeMo Canary: train on the plan with NeMo's own model code, dataset and prompt format.

    python examples/nemo_canary.py PLAN_DIR MANIFEST SPM_MODEL

In your training script, one line before the model is built makes Canary's
``_setup_dataloader_from_config`` read the plan for any ``*_ds`` config that has ``plan_dir``
(``get_plan_dataloader`` has the signature of NeMo's ``get_lhotse_dataloader_from_config`` and
hands it the configs without ``plan_dir``, e.g. validation sets), plus two config keys:

    model.train_ds.plan_dir=plan/ model.train_ds.manifest=kept.parquet
"""
import json
import sys
import tempfile
from types import SimpleNamespace

import nemo.collections.asr.models.aed_multitask_models as aed
import pyarrow.parquet as pq
from nemo.collections.common.prompts import Canary2PromptFormatter
from nemo.collections.common.tokenizers.canary_tokenizer import CanaryTokenizer
from nemo.collections.common.tokenizers.sentencepiece_tokenizer import SentencePieceTokenizer

from dataprep.integrations.nemo import get_plan_dataloader

aed.get_lhotse_dataloader_from_config = get_plan_dataloader  # the one line

# What EncDecMultiTaskModel.setup_training_data now builds, shown without a checkpoint: the model's
# own method runs with the attributes it reads and a Canary tokenizer made from SPM_MODEL.
plan_dir, manifest, spm_model = sys.argv[1:4]
langs = sorted(set(pq.read_table(manifest, columns=["target_lang"]).column(0).drop_null().to_pylist()))
special = CanaryTokenizer.build_special_tokenizer(
    ["<|startofcontext|>", "<|emo:undefined|>", "<|noitn|>", "<|notimestamp|>", "<|nodiarize|>",
     *[f"<|{x}|>" for x in langs]], tempfile.mkdtemp())
tokenizer = CanaryTokenizer({"spl_tokens": special, **{x: SentencePieceTokenizer(spm_model) for x in langs}})
model = SimpleNamespace(global_rank=0, world_size=2, tokenizer=tokenizer, prompt=Canary2PromptFormatter(tokenizer),
                        timestamps_asr_model=None)
train_ds = {"use_lhotse": True, "plan_dir": plan_dir, "manifest": manifest, "sample_rate": 16000,
            "channel_selector": 0, "num_workers": 2}
loader = aed.EncDecMultiTaskModel._setup_dataloader_from_config(model, train_ds)
for batch in loader:  # PromptedAudioToTextMiniBatch: audio, prompted transcripts, cuts
    print(json.dumps([c.id for c in batch.cuts]))
