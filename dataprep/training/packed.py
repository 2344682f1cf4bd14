"""Packed batches for a speech-LLM: one plan batch -> a :class:`PackedBatch`.

Each member's audio goes through the encoder as a padded batch of members (``features``,
``feature_lens``, as :class:`~dataprep.training.batches.Batch`); the LLM side is one token
stream with no padding: per member, its audio tokens (``ceil(frames / subsampling)`` adapter
outputs, put where ``audio_mask`` is set, members in order) then its text tokens
(``[bos] + pieces + [eos]``). ``cu_seqlens`` (S+1) bound the packed sequences and
``member_cu_seqlens`` (M+1) the members (what varlen attention takes); ``position_ids`` restart
at 0 per member; ``labels`` hold the next text token, -100 where there is no loss. The layout is
:func:`dataprep.training.packing.pack_layout`'s, computed from the tensors' real lengths; a
packed plan's own ``cu_seqlens`` (token-equivalents) is checked against them when the plan's
audio token rate is the model's (:func:`~dataprep.training.packing.check_planned`). A plan
without packing gives one member per sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from dataprep.tokenize import Tokenizers
from dataprep.training.batches import Batch, BatchBuilder, pad_stack, tokenize
from dataprep.training.features import SAMPLE_RATE, FeatureConfig, LogMel
from dataprep.training.packing import IGNORE, PackLayout, check_planned, pack_layout
from manifests.plan_files import PlanBatch


@dataclass
class PackedBatch:
    """One step's packed batch for one rank (M members in S sequences, T stream tokens).

    ``features`` (M, F, n_mels) float32, ``feature_lens`` (M,) int64: the encoder's input;
    ``input_ids``, ``labels``, ``position_ids`` (1, T) int64 and ``audio_mask`` (1, T) bool: the
    LLM's stream; ``cu_seqlens`` (S+1,) and ``member_cu_seqlens`` (M+1,) int32; ``sequence``
    (M,) int64 and ``audio_tokens`` (M,) int64 per member.
    """

    epoch: int
    step: int
    bucket: int
    ids: list[str]
    features: torch.Tensor
    feature_lens: torch.Tensor
    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    audio_mask: torch.Tensor
    cu_seqlens: torch.Tensor
    member_cu_seqlens: torch.Tensor
    sequence: torch.Tensor
    audio_tokens: torch.Tensor
    skipped: list[dict[str, str]] = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.ids)

    @property
    def num_sequences(self) -> int:
        return int(self.cu_seqlens.shape[0]) - 1

    def to(self, device: torch.device) -> PackedBatch:
        """This batch with its tensors on ``device``."""
        moved = {f: getattr(self, f).to(device) for f in _TENSORS}
        return replace(self, **moved)

    def padding_counts(self) -> tuple[int, int, int, int]:
        """(real frames, padded frames, real tokens, slots): the stream has no padding."""
        tokens = int(self.input_ids.shape[1])
        return int(self.feature_lens.sum()), self.size * int(self.features.shape[1]), tokens, tokens


_TENSORS = ("features", "feature_lens", "input_ids", "labels", "position_ids", "audio_mask", "cu_seqlens",
            "member_cu_seqlens", "sequence", "audio_tokens")


def audio_token_counts(feature_lens: torch.Tensor | npt.ArrayLike, subsampling: int) -> npt.NDArray[np.int64]:
    """Audio tokens of each member: ``ceil(frames / subsampling)`` (the encoder's output length)."""
    frames = np.asarray(feature_lens, dtype=np.int64)
    return -(-frames // subsampling)


def collate_packed(batch: Batch, sequence: npt.ArrayLike, subsampling: int,
                   planned_cu_seqlens: npt.ArrayLike | None = None, plan: str = "") -> PackedBatch:
    """Pack a padded :class:`Batch` (its members in plan order) into sequences ``sequence``
    (one index per member, see :func:`~dataprep.training.packing.check_sequence`); with
    ``planned_cu_seqlens`` the real bounds are checked against the plan's (errors name ``plan``)."""
    where = f"{plan + ': ' if plan else ''}step {batch.step}"
    text = batch.token_lens.numpy()
    layout = pack_layout(sequence, audio_token_counts(batch.feature_lens, subsampling), text, where)
    if planned_cu_seqlens is not None:
        check_planned(layout, planned_cu_seqlens, where)
    return _tensors(batch, layout)


def _tensors(batch: Batch, layout: PackLayout) -> PackedBatch:
    mask = torch.arange(batch.tokens.shape[1])[None, :] < batch.token_lens[:, None]
    flat_text = batch.tokens[mask]  # members' tokens concatenated, in order
    text_index = torch.from_numpy(layout.text_index)
    label_index = torch.from_numpy(layout.label_index)
    input_ids = torch.where(text_index >= 0, flat_text[text_index.clamp(min=0)], 0)
    labels = torch.where(label_index >= 0, flat_text[label_index.clamp(min=0)], IGNORE)
    return PackedBatch(batch.epoch, batch.step, batch.bucket, batch.ids, batch.features, batch.feature_lens,
                       input_ids[None], labels[None], torch.from_numpy(layout.position_ids)[None],
                       torch.from_numpy(layout.audio_index >= 0)[None], torch.from_numpy(layout.cu_seqlens),
                       torch.from_numpy(layout.member_cu_seqlens), torch.from_numpy(layout.sequence),
                       torch.from_numpy(layout.audio_tokens), batch.skipped)


def plan_sequences(pb: PlanBatch, kept: Sequence[str]) -> tuple[npt.NDArray[np.int64], Any]:
    """The sequence index of each kept member of ``pb`` and the plan's ``cu_seqlens`` to check
    (None when a member was skipped: the plan's bounds no longer hold). A batch of a plan
    without packing: one member per sequence."""
    seq = getattr(pb, "sequence", None)
    if seq is None:
        return np.arange(len(kept), dtype=np.int64), None
    seq = np.asarray(seq, dtype=np.int64)
    if len(kept) == len(pb.ids):
        return seq, getattr(pb, "cu_seqlens", None)
    keep = np.isin(np.asarray(pb.ids, dtype=object), np.asarray(list(kept), dtype=object))
    _, renumbered = np.unique(seq[keep], return_inverse=True)  # sequences emptied by skips close up
    return renumbered.astype(np.int64), None


class PackedCuts:
    """A Lhotse dataset: the ``CutSet`` of a step (``PlanSampler``'s: each cut's ``custom`` holds
    ``plan_step`` and, in a packed plan, ``plan_sequence``) -> a :class:`PackedBatch`, featurized
    and tokenized as :class:`PackedBatchBuilder` does, the audio as Lhotse loads it (resampled
    to 16 kHz, channels averaged). ``tokenizer``: sentencepiece specs as the builder takes."""

    def __init__(self, tokenizer: Sequence[str], subsampling: int, features: FeatureConfig | None = None) -> None:
        self.tokenizer, self.subsampling = list(tokenizer), subsampling
        self.features = features or FeatureConfig.ours()
        self._toks: Tokenizers | None = None
        self._mel: LogMel | None = None

    def __getitem__(self, cuts: Any) -> PackedBatch:
        cuts = list(cuts)
        if self._toks is None or self._mel is None:
            self._toks, self._mel = Tokenizers.from_specs(self.tokenizer), LogMel(self.features)
        ids = [c.id for c in cuts]
        waves = [torch.from_numpy(np.asarray(c.resample(SAMPLE_RATE).load_audio(), dtype=np.float32).mean(axis=0))
                 if c.duration else torch.zeros(0) for c in cuts]  # duration 0: a text-only row
        features, feature_lens = pad_stack([self._mel(w) if len(w) else torch.zeros(0, self.features.features)
                                            for w in waves], torch.float32)
        texts = [" ".join(s.text or "" for s in c.supervisions) for c in cuts]
        langs = [c.supervisions[0].language if c.supervisions else None for c in cuts]
        tokens, token_lens = pad_stack([torch.tensor(t, dtype=torch.int64) for t in tokenize(self._toks, texts, langs, ids)],
                                       torch.int64)
        step = int(cuts[0].custom["plan_step"]) if cuts and cuts[0].custom else -1
        batch = Batch(-1, step, -1, ids, features, feature_lens, tokens, token_lens)
        seq = [c.custom.get("plan_sequence", i) if c.custom else i for i, c in enumerate(cuts)]
        return collate_packed(batch, seq, self.subsampling)


class PackedBatchBuilder(BatchBuilder):
    """:class:`BatchBuilder` whose batches are :class:`PackedBatch` es for a speech-LLM whose
    encoder subsamples feature frames by ``subsampling``. ``check_rate``: the plan's
    ``cu_seqlens`` are in the model's tokens (its audio token rate is the plan's), so each
    batch's real bounds are checked against them (errors name ``plan``)."""

    def __init__(self, *args: Any, subsampling: int, check_rate: bool = False, plan: str = "", **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.subsampling = subsampling
        self.check_rate = check_rate
        self.plan = plan

    def build(self, pb: PlanBatch, held: Sequence[bytes | None] | None = None) -> PackedBatch:  # type: ignore[override]
        batch = super().build(pb, held)
        seq, planned = plan_sequences(pb, batch.ids)
        return collate_packed(batch, seq, self.subsampling, planned if self.check_rate else None, self.plan)
