"""The tiny NeMo model of ``tests/integrations/test_nemo_dynres.py``: a Lhotse-style audio
dataset and a Lightning module (preprocessor, SpecAugment, a 1-layer Conformer). It imports NeMo
and Lightning, so the tests import it when they run, never at collection."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lhotse.dataset.collation import collate_audio
from nemo.collections.asr.modules import ConformerEncoder, SpectrogramAugmentation

from dataprep.integrations.nemo_features import DynamicResolutionPreprocessor


class AudioOnly(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """A Lhotse-style dataset: CutSet -> dict batch of 16 kHz audio (NeMo's key names)."""

    def __getitem__(self, cuts: Any) -> dict[str, Any]:
        audio, lens = collate_audio(cuts)
        return {"audio": audio, "audio_lens": lens}


class TinyASR(pl.LightningModule):
    """Preprocessor -> SpecAugment -> 1-layer Conformer -> a frame-level loss."""

    def __init__(self, preprocessor: dict[str, Any], dynamic: dict[str, float]) -> None:
        """``preprocessor``: NeMo's preprocessor arguments (32 features); ``dynamic``: the
        dynamic-resolution rates (Hz)."""
        super().__init__()
        self.preprocessor = DynamicResolutionPreprocessor(**preprocessor, **dynamic)
        self.spec_augmentation = SpectrogramAugmentation(freq_masks=1, time_masks=2, freq_width=4, time_width=10)
        self.encoder = ConformerEncoder(feat_in=32, n_layers=1, d_model=32, n_heads=2, subsampling_factor=4,
                                        subsampling_conv_channels=8, ff_expansion_factor=2)
        self.seen: list[tuple[int, int, int, int]] = []  # (target, feature frames, max length, time width)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        feats, lens = self.preprocessor(input_signal=batch["audio"], length=batch["audio_lens"])
        width = self.spec_augmentation.spec_augment.time_width
        self.seen.append((batch["target_frames"], feats.shape[-1], int(lens.max()), width))
        feats = self.spec_augmentation(input_spec=feats, length=lens)
        enc, enc_lens = self.encoder(audio_signal=feats, length=lens)
        mask = torch.arange(enc.shape[-1])[None, :] < enc_lens[:, None]
        return (enc.square().mean(dim=1) * mask).sum() / mask.sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)
