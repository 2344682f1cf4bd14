"""Packed batches into a Hugging Face causal LM (NeMo's venv has transformers): a tiny
``LlamaForCausalLM`` from its own small config (random init, no downloaded weights) behind the
tiny speech-LLM's encoder and adapter, fed ``inputs_embeds``, the batch's ``position_ids`` and a
4D block-diagonal causal mask from ``member_cu_seqlens``; its summed loss on a packed batch of
real audio equals the sum of the members' losses alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from dataprep.training.batches import Batch
from dataprep.training.packed import PackedBatch, collate_packed
from oom.speech_llm import SpeechLLM, packed_loss, varlen_causal_mask
from tests.training.test_packed import TINY, _double, corpus, member, real_batch  # noqa: F401  (fixtures)

pytestmark = pytest.mark.nemo
transformers = pytest.importorskip("transformers", reason="transformers is not installed (NeMo's venv has it: make test-nemo)")


class HFSpeechLLM(nn.Module):
    """The tiny speech-LLM's encoder and adapter, then a transformers causal LM."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.speech, self.lm = SpeechLLM(TINY), lm

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        x = self.lm.get_input_embeddings()(batch.input_ids)
        audio = self.speech.encode(batch.features, batch.feature_lens).to(x.dtype)
        x = x.masked_scatter(batch.audio_mask[..., None], audio)
        mask = varlen_causal_mask(batch.member_cu_seqlens, x.shape[1])[None, None]
        return self.lm(inputs_embeds=x, position_ids=batch.position_ids, attention_mask=mask).logits


def test_hf_llama_packed_loss_is_the_sum_of_the_members_losses(real_batch: Batch) -> None:  # noqa: F811
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=TINY.llm_hidden, intermediate_size=TINY.llm_ffn,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                      vocab_size=TINY.vocab_size, max_position_embeddings=4096,
                                      attn_implementation="sdpa")
    model = HFSpeechLLM(transformers.LlamaForCausalLM(config)).double().eval()
    with torch.no_grad():
        alone = [packed_loss(model, _double(collate_packed(member(real_batch, i), [0], TINY.subsampling)))
                 for i in range(real_batch.size)]
        seq = np.repeat(np.arange(2), [2, real_batch.size - 2])
        loss, n = packed_loss(model, _double(collate_packed(real_batch, seq, TINY.subsampling)))
    assert n == sum(k for _, k in alone)
    assert float(loss) == pytest.approx(sum(float(x) for x, _ in alone), rel=1e-12)
