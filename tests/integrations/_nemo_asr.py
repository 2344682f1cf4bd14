"""Tiny NeMo ASR model configs for tests marked ``nemo``: Parakeet-style RNNT and TDT
(``EncDecRNNTBPEModel``), CTC (``EncDecCTCBPEModel``) and hybrid RNNT+CTC
(``EncDecHybridRNNTCTCBPEModel``), each a one-layer 32-wide FastConformer with 32 mels, its
``train_ds`` pointing at a plan. No weights are downloaded: the models are built from these
configs and a sentencepiece ``tokenizer.model`` in ``tokenizer_dir``."""

from __future__ import annotations

from typing import Any

D = 32
#: TDT's token durations (frames), as Parakeet-TDT's config lists them
TDT_DURATIONS = [0, 1, 2, 3, 4]


def _common(tokenizer_dir: str, plan: str, manifest: str) -> dict[str, Any]:
    return {
        "sample_rate": 16000,
        "tokenizer": {"dir": tokenizer_dir, "type": "bpe"},
        "preprocessor": {"_target_": "nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor",
                         "sample_rate": 16000, "normalize": "per_feature", "window_size": 0.025,
                         "window_stride": 0.01, "features": D, "n_fft": 512, "dither": 0.0, "pad_to": 0},
        "encoder": {"_target_": "nemo.collections.asr.modules.ConformerEncoder", "feat_in": D, "feat_out": -1,
                    "n_layers": 1, "d_model": D, "subsampling": "dw_striding", "subsampling_factor": 4,
                    "subsampling_conv_channels": 8, "ff_expansion_factor": 2, "self_attention_model": "rel_pos",
                    "n_heads": 2, "conv_kernel_size": 9, "dropout": 0.0, "dropout_pre_encoder": 0.0,
                    "dropout_emb": 0.0, "dropout_att": 0.0},
        "train_ds": {"use_lhotse": True, "plan_dir": plan, "manifest": manifest, "sample_rate": 16000,
                     "num_workers": 0, "shuffle": True},
        "optim": {"name": "adamw", "lr": 1e-3},
    }


def _transducer(tdt: bool) -> dict[str, Any]:
    joint: dict[str, Any] = {"_target_": "nemo.collections.asr.modules.RNNTJoint", "log_softmax": None,
                             "preserve_memory": False, "fuse_loss_wer": True, "fused_batch_size": 4,
                             "jointnet": {"joint_hidden": D, "activation": "relu", "dropout": 0.0}}
    decoding: dict[str, Any] = {"strategy": "greedy_batch", "greedy": {"max_symbols": 5}}
    loss: dict[str, Any] = {"loss_name": "default"}  # NeMo's numba kernels (CPU too)
    if tdt:
        joint["num_extra_outputs"] = len(TDT_DURATIONS)
        decoding.update(model_type="tdt", durations=TDT_DURATIONS)
        loss = {"loss_name": "tdt", "tdt_kwargs": {"durations": TDT_DURATIONS, "sigma": 0.02, "omega": 0.1}}
    return {"model_defaults": {"enc_hidden": D, "pred_hidden": D, **({"tdt_durations": TDT_DURATIONS} if tdt else {})},
            "decoder": {"_target_": "nemo.collections.asr.modules.RNNTDecoder", "normalization_mode": None,
                        "random_state_sampling": False, "blank_as_pad": True,
                        "prednet": {"pred_hidden": D, "pred_rnn_layers": 1, "t_max": None, "dropout": 0.0}},
            "joint": joint, "decoding": decoding, "loss": loss}


def _ctc_decoder() -> dict[str, Any]:
    return {"_target_": "nemo.collections.asr.modules.ConvASRDecoder", "feat_in": None, "num_classes": -1,
            "vocabulary": []}


def config(kind: str, tokenizer_dir: str, plan: str, manifest: str) -> dict[str, Any]:
    """The model config of ``kind`` (``rnnt``, ``tdt``, ``ctc`` or ``hybrid``)."""
    cfg = _common(tokenizer_dir, plan, manifest)
    if kind == "ctc":
        return {**cfg, "decoder": _ctc_decoder(), "decoding": {"strategy": "greedy_batch"}}
    cfg.update(_transducer(kind == "tdt"))
    if kind == "hybrid":
        cfg["aux_ctc"] = {"ctc_loss_weight": 0.3, "use_cer": False, "ctc_reduction": "mean_batch",
                          "decoder": _ctc_decoder(), "decoding": {"strategy": "greedy_batch"}}
    return cfg
