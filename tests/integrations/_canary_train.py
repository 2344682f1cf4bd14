"""Train a tiny NeMo Canary (``EncDecMultiTaskModel``, canary2 prompt) on a plan with Lightning.

    python -m tests.integrations._canary_train PLAN MANIFEST SPM WORKDIR MAX_STEPS [STEP_LOG_DIR]

Prints one JSON line per training step (``{"step": i, "ids": [...]}``) from the batches the model
received. ``MAX_STEPS`` -1 means NeMo's usual ``max_epochs: -1`` with no step limit: the run ends
when the plan does (``fit()`` returns; one line, :func:`dataprep.integrations.lhotse.plan_end_line`).
With ``STEP_LOG_DIR``, :class:`dataprep.integrations.lightning.StepTimeLog` writes the step log
there. Test helper of ``tests/integrations/test_nemo_packed.py`` and ``test_lightning_steps.py``
(run in a subprocess: it exits like a trainer)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path


def config(plan: str, manifest: str, spl_dir: str, lang_dirs: dict[str, str]) -> dict:
    d = 32
    return {
        "sample_rate": 16000, "prompt_format": "canary2",
        "tokenizer": {"dir": None, "type": "agg",
                      "custom_tokenizer": {"_target_": "nemo.collections.common.tokenizers.canary_tokenizer.CanaryTokenizer"},
                      "langs": {"spl_tokens": {"dir": spl_dir, "type": "bpe"},
                                                             **{k: {"dir": v, "type": "bpe"} for k, v in lang_dirs.items()}}},
        "model_defaults": {"asr_enc_hidden": d, "lm_enc_hidden": d, "lm_dec_hidden": d},
        "preprocessor": {"_target_": "nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor",
                         "sample_rate": 16000, "normalize": "per_feature", "window_size": 0.025, "window_stride": 0.01,
                         "features": 32, "n_fft": 512, "dither": 0.0, "pad_to": 0},
        "encoder": {"_target_": "nemo.collections.asr.modules.ConformerEncoder", "feat_in": 32, "feat_out": -1,
                    "n_layers": 1, "d_model": d, "subsampling": "dw_striding", "subsampling_factor": 8,
                    "subsampling_conv_channels": 8, "ff_expansion_factor": 2, "self_attention_model": "rel_pos",
                    "n_heads": 2, "conv_kernel_size": 9, "dropout": 0.0, "dropout_pre_encoder": 0.0,
                    "dropout_emb": 0.0, "dropout_att": 0.0},
        "transf_decoder": {"_target_": "nemo.collections.asr.modules.transformer.get_nemo_transformer",
                           "model_name": None, "pretrained": False, "encoder": None, "pre_ln_final_layer_norm": True,
                           "config_dict": {"max_sequence_length": 512, "num_token_types": 0, "embedding_dropout": 0.0,
                                           "learn_positional_encodings": False, "hidden_size": d, "inner_size": 2 * d,
                                           "num_layers": 1, "num_attention_heads": 2, "ffn_dropout": 0.0,
                                           "attn_score_dropout": 0.0, "attn_layer_dropout": 0.0, "hidden_act": "relu",
                                           "pre_ln": True, "vocab_size": None}},
        "head": {"_target_": "nemo.collections.asr.parts.submodules.token_classifier.TokenClassifier",
                 "num_layers": 1, "activation": "relu", "log_softmax": True, "hidden_size": d, "num_classes": None,
                 "dropout": 0.0, "use_transformer_init": True},
        "decoding": {"strategy": "beam", "beam": {"beam_size": 1, "len_pen": 0.0, "max_generation_delta": 5}},
        "loss": {"_target_": "nemo.collections.common.losses.smoothed_cross_entropy.SmoothedCrossEntropyLoss",
                 "label_smoothing": 0.0},
        "train_ds": {"use_lhotse": True, "plan_dir": plan, "manifest": manifest, "sample_rate": 16000,
                     "channel_selector": 0, "num_workers": 0},
        "optim": {"name": "adamw", "lr": 1e-3},
    }


def _vocab_files(folder: Path) -> None:
    """``vocab.txt`` and ``tokenizer.vocab`` beside ``tokenizer.model``, as NeMo's tokenizer setup reads them."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    (folder / "tokenizer.vocab").write_text("".join(f"{p}\t{sp.get_score(i)}\n" for i, p in enumerate(pieces)),
                                            encoding="utf-8")
    (folder / "vocab.txt").write_text("".join(f"{p}\n" for p in pieces if not sp.is_control(pieces.index(p))),
                                      encoding="utf-8")


def main(plan: str, manifest: str, spm: str, work: str, max_steps: int, step_log: str | None = None) -> None:
    import lightning.pytorch as pl
    import nemo.collections.asr.models.aed_multitask_models as aed
    import pyarrow.parquet as pq
    from nemo.collections.common.tokenizers.canary_tokenizer import CanaryTokenizer
    from omegaconf import OmegaConf

    from dataprep.integrations.lightning import StepTimeLog
    from dataprep.integrations.nemo import get_plan_dataloader

    aed.get_lhotse_dataloader_from_config = get_plan_dataloader  # the one line of examples/nemo_canary.py
    root = Path(work)
    t = pq.read_table(manifest, columns=["source_lang", "target_lang"])
    langs = sorted({x for c in t.columns for x in c.to_pylist() if x})
    spl = root / "spl"
    CanaryTokenizer.build_special_tokenizer(
        ["<|startofcontext|>", "<|emo:undefined|>", "<|transcribe|>", "<|translate|>", "<|itn|>", "<|noitn|>",
         "<|timestamp|>", "<|notimestamp|>", "<|diarize|>", "<|nodiarize|>", *[f"<|{x}|>" for x in langs]], spl)
    dirs = {}
    for x in langs:
        (root / x).mkdir(parents=True, exist_ok=True)
        shutil.copy(spm, root / x / "tokenizer.model")
        _vocab_files(root / x)
        dirs[x] = str(root / x)
    model = aed.EncDecMultiTaskModel(cfg=OmegaConf.create(config(plan, manifest, str(spl), dirs)))

    class Ids(pl.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):  # noqa: ANN001
            print(json.dumps({"step": trainer.global_step, "ids": [c.id for c in batch.cuts]}), flush=True)

    trainer = pl.Trainer(max_steps=max_steps, max_epochs=-1, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[Ids(), *([StepTimeLog(step_log)] if step_log else [])], num_sanity_val_steps=0,
                         use_distributed_sampler=False)
    trainer.fit(model)


if __name__ == "__main__":
    main(*sys.argv[1:5], int(sys.argv[5]), *sys.argv[6:7])
