"""Packed batches for a speech-LLM: the layout, the collation from real rows, and no attention
leak (the tiny speech-LLM's loss on a packed batch = the sum of its members' losses alone)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dataprep.training.batches import Batch, BatchBuilder
from dataprep.training.features import FeatureConfig
from dataprep.training.packed import collate_packed
from dataprep.training.packing import IGNORE, check_planned, pack_layout
from manifests.errors import DataprepError
from manifests.plan_files import PlanShard
from oom.packed_estimate import SPEECH_LLMS, SpeechLLMShape
from oom.speech_llm import SpeechLLM, packed_loss
from tests.training._consumer import Corpus, shared_corpus

TINY = SPEECH_LLMS["tiny-speech-llm"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return shared_corpus(tmp_path_factory)


@pytest.fixture(scope="module")
def real_batch(corpus: Corpus, tmp_path_factory: pytest.TempPathFactory) -> Batch:
    """The plan's largest batch, featurized from the real audio (16 mels, the tiny model's)."""
    cache = tmp_path_factory.mktemp("cache")
    builder = BatchBuilder(corpus.manifest, [str(corpus.spm)], features=FeatureConfig.ours(TINY.n_mels),
                           cache_dir=cache)
    pb = max(PlanShard(corpus.plan(1), 0), key=lambda b: len(b.ids))
    batch = builder.build(pb)
    assert batch.size >= 4 and not batch.skipped
    return batch


def member(batch: Batch, i: int) -> Batch:
    """Member ``i`` of ``batch`` alone, unpadded."""
    f, t = int(batch.feature_lens[i]), int(batch.token_lens[i])
    return replace(batch, ids=[batch.ids[i]], features=batch.features[i:i + 1, :f], feature_lens=batch.feature_lens[i:i + 1],
                   tokens=batch.tokens[i:i + 1, :t], token_lens=batch.token_lens[i:i + 1])


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(1, 6), st.booleans()), min_size=1, max_size=12))
def test_layout_positions_restart_and_bounds_hold(members: list[tuple[int, int, bool]]) -> None:
    a = np.array([m[0] for m in members])
    t = np.array([m[1] for m in members])
    seq = np.cumsum([0] + [int(m[2]) for m in members[1:]])
    lay = pack_layout(seq, a, t)
    lengths = a + t
    assert lay.member_cu_seqlens.tolist() == [0, *np.cumsum(lengths).tolist()]
    assert lay.cu_seqlens[0] == 0 and lay.cu_seqlens[-1] == lengths.sum() == lay.position_ids.size
    assert np.diff(lay.cu_seqlens).tolist() == [int(lengths[seq == s].sum()) for s in range(seq[-1] + 1)]
    for m in range(len(members)):
        lo, hi = lay.member_cu_seqlens[m], lay.member_cu_seqlens[m + 1]
        assert lay.position_ids[lo:hi].tolist() == list(range(lengths[m]))
        assert (lay.audio_index[lo:lo + a[m]] >= 0).all() and (lay.text_index[lo + a[m]:hi] >= 0).all()
        # targets: the next text token of the same member (the first one from the last audio
        # token); none at the member's last position
        assert (lay.label_index[lo:hi] >= 0).sum() == t[m] - 1 + (a[m] > 0) and lay.label_index[hi - 1] == -1
    assert np.array_equal(np.sort(lay.text_index[lay.text_index >= 0]), np.arange(t.sum()))


def test_layout_refuses_members_out_of_order() -> None:
    with pytest.raises(DataprepError, match="sequence indices must run 0, 1"):
        pack_layout([0, 1, 0], [1, 1, 1], [2, 2, 2])
    with pytest.raises(DataprepError, match="sequence indices"):
        pack_layout([1, 1], [1, 1], [2, 2])


def test_collation_of_real_rows(real_batch: Batch) -> None:
    seq = np.repeat(np.arange(2), [2, real_batch.size - 2])
    pb = collate_packed(real_batch, seq, TINY.subsampling)
    frames = real_batch.feature_lens
    audio = -(-frames // TINY.subsampling)
    lengths = audio + real_batch.token_lens
    assert pb.cu_seqlens.dtype == torch.int32 and pb.member_cu_seqlens.dtype == torch.int32
    assert pb.cu_seqlens.tolist() == [0, int(lengths[:2].sum()), int(lengths.sum())]
    assert int(pb.audio_mask.sum()) == int(audio.sum())
    assert pb.input_ids.shape == (1, int(lengths.sum()))  # no padding in the stream
    # each member's text is its own tokens, in order, after its audio
    for i in range(real_batch.size):
        lo = int(pb.member_cu_seqlens[i]) + int(audio[i])
        hi = int(pb.member_cu_seqlens[i + 1])
        assert pb.input_ids[0, lo:hi].tolist() == real_batch.tokens[i, :real_batch.token_lens[i]].tolist()
        assert pb.position_ids[0, int(pb.member_cu_seqlens[i])] == 0
        assert pb.labels[0, lo - 1:hi - 1].tolist() == real_batch.tokens[i, :real_batch.token_lens[i]].tolist()
        assert pb.labels[0, hi - 1] == IGNORE


def test_planned_cu_seqlens_checked(real_batch: Batch) -> None:
    seq = np.zeros(real_batch.size, dtype=np.int64)
    pb = collate_packed(real_batch, seq, TINY.subsampling)
    total = int(pb.cu_seqlens[-1])
    collate_packed(real_batch, seq, TINY.subsampling, [0, total - real_batch.size])  # audio rounding: accepted
    with pytest.raises(DataprepError, match=r"step \d+: sequence 0: \d+ tokens of the model, the plan packed it as"):
        collate_packed(real_batch, seq, TINY.subsampling, [0, total + 7 * real_batch.size])
    with pytest.raises(DataprepError, match="holds 2 sequences, the batch 1"):
        check_planned(pack_layout(seq, np.ones_like(seq), np.ones_like(seq)), [0, 1, 2])


def _model(lora_rank: int = 0) -> SpeechLLM:
    torch.manual_seed(0)
    return SpeechLLM(replace(TINY, lora_rank=lora_rank)).double().eval()


def _double(pb: object) -> object:
    return replace(pb, features=pb.features.double())  # type: ignore[type-var]


def test_packed_loss_is_the_sum_of_the_members_losses(real_batch: Batch) -> None:
    """No attention leaks across members: packed into 2 sequences (and into 1), the batch's summed
    token loss equals the sum of each member's loss computed alone, in float64."""
    model = _model()
    with torch.no_grad():
        alone = [packed_loss(model, _double(collate_packed(member(real_batch, i), [0], TINY.subsampling)))
                 for i in range(real_batch.size)]
    want = sum(float(loss) for loss, _ in alone)
    tokens = sum(n for _, n in alone)
    for seq in (np.repeat(np.arange(2), [2, real_batch.size - 2]), np.zeros(real_batch.size, dtype=np.int64)):
        with torch.no_grad():
            loss, n = packed_loss(model, _double(collate_packed(real_batch, seq, TINY.subsampling)))
        assert n == tokens
        assert float(loss) == pytest.approx(want, rel=1e-12)
    # the test sees a leak: one mask over the whole sequence (no member bounds) changes the loss
    leaky = collate_packed(real_batch, np.zeros(real_batch.size, dtype=np.int64), TINY.subsampling)
    leaky = replace(leaky, member_cu_seqlens=leaky.cu_seqlens)
    with torch.no_grad():
        assert abs(float(packed_loss(model, _double(leaky))[0]) - want) > 1e-3


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_parameter_counts_match_the_torch_model(lora_rank: int) -> None:
    shape = replace(TINY, lora_rank=lora_rank)
    model = SpeechLLM(shape)
    counts = shape.param_counts()
    assert sum(p.numel() for p in model.parameters()) == counts["encoder"] + counts["llm"] + counts["lora"]
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == shape.trainable()


def test_shape_refuses_bad_sizes() -> None:
    with pytest.raises(DataprepError, match="llm_layers"):
        SpeechLLMShape("x", llm_layers=0)
