"""Packed sequences, the pure part: where each member's audio and text land in one token stream.

A packed batch holds S sequences; each sequence holds whole members (utterances), its members
contiguous and in plan order. In the LLM's stream member ``m`` is ``a[m]`` audio tokens (the
adapter's outputs) then ``t[m]`` text tokens; the stream is the members one after another, with
no padding (varlen attention). ``cu_seqlens`` (S+1, from 0) bounds the sequences,
``member_cu_seqlens`` (M+1) the members: attention never crosses a member (block-diagonal
causal), and ``position_ids`` restart at 0 at each member. The loss targets are the text tokens
after the first: position ``p`` predicts the token at ``p + 1`` when that is a text token of the
same member (the last audio token predicts the first text token).

Units: tokens of the model (audio tokens = feature frames / the encoder's subsampling, rounded
up). Numpy only, vectorized; torch tensors are made from it in :mod:`dataprep.training.packed`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from manifests.errors import DataprepError

#: target id the loss ignores (torch's cross_entropy default)
IGNORE = -100

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True)
class PackLayout:
    """Where each position of the stream comes from (T positions, M members, S sequences).

    ``sequence`` (M,) sequence of each member; ``audio_tokens`` / ``text_tokens`` (M,) its
    lengths; ``cu_seqlens`` (S+1,) int32; ``member_cu_seqlens`` (M+1,) int32;
    ``position_ids`` (T,) restart at 0 per member; ``member_of`` (T,) member of each position;
    ``audio_index`` (T,) index into the members' audio tokens concatenated (-1 at text),
    ``text_index`` (T,) into their text tokens concatenated (-1 at audio); ``label_index`` (T,)
    index into the text tokens of the position's target (-1: no loss there).
    """

    sequence: I64
    audio_tokens: I64
    text_tokens: I64
    cu_seqlens: npt.NDArray[np.int32]
    member_cu_seqlens: npt.NDArray[np.int32]
    position_ids: I64
    member_of: I64
    audio_index: I64
    text_index: I64
    label_index: I64

    @property
    def num_sequences(self) -> int:
        return int(self.cu_seqlens.shape[0]) - 1

    @property
    def total(self) -> int:
        return int(self.cu_seqlens[-1])


def check_sequence(sequence: npt.ArrayLike, where: str = "batch") -> I64:
    """``sequence`` as int64 after checking it numbers sequences 0, 1, ... with each
    sequence's members contiguous (non-decreasing, steps of 0 or 1, from 0)."""
    seq = np.asarray(sequence, dtype=np.int64)
    if seq.ndim != 1:
        raise DataprepError(f"{where}: sequence: expected one index per member")
    if seq.size and (seq[0] != 0 or np.any((np.diff(seq) != 0) & (np.diff(seq) != 1))):
        raise DataprepError(f"{where}: sequence: members' sequence indices must run 0, 1, ... with each "
                            f"sequence's members contiguous (got {seq[:12].tolist()}...)")
    return seq


def pack_layout(sequence: npt.ArrayLike, audio_tokens: npt.ArrayLike, text_tokens: npt.ArrayLike,
                where: str = "batch") -> PackLayout:
    """The layout of a packed batch whose member ``m`` is in sequence ``sequence[m]`` and has
    ``audio_tokens[m]`` audio and ``text_tokens[m]`` text tokens (see the module docstring)."""
    seq = check_sequence(sequence, where)
    a = np.asarray(audio_tokens, dtype=np.int64)
    t = np.asarray(text_tokens, dtype=np.int64)
    if a.shape != seq.shape or t.shape != seq.shape:
        raise DataprepError(f"{where}: {seq.size} members but {a.size} audio and {t.size} text lengths")
    if np.any(a < 0) or np.any(t < 1):
        raise DataprepError(f"{where}: a member has negative audio or no text tokens")
    lengths = a + t
    member_cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    total = int(member_cu[-1])
    if total >= 2**31:
        raise DataprepError(f"{where}: {total} tokens in one batch: more than int32 cu_seqlens hold")
    firsts = np.flatnonzero(np.diff(seq, prepend=-1) != 0)
    cu = np.concatenate([member_cu[firsts], [total]])
    member_of = np.repeat(np.arange(seq.size, dtype=np.int64), lengths)
    pos = np.arange(total, dtype=np.int64) - member_cu[member_of]
    a_of = a[member_of]
    is_audio = pos < a_of
    audio_cu = np.concatenate([[0], np.cumsum(a)])
    text_cu = np.concatenate([[0], np.cumsum(t)])
    audio_index = np.where(is_audio, audio_cu[member_of] + pos, -1)
    text_index = np.where(is_audio, -1, text_cu[member_of] + pos - a_of)
    nxt = pos + 1  # the target is the next position's token when it is text of the same member
    has_target = (nxt < lengths[member_of]) & (nxt >= a_of)
    label_index = np.where(has_target, text_cu[member_of] + nxt - a_of, -1)
    return PackLayout(seq, a, t, cu.astype(np.int32), member_cu.astype(np.int32), pos, member_of,
                      audio_index, text_index, label_index)


def check_planned(layout: PackLayout, planned: npt.ArrayLike, where: str = "batch") -> None:
    """Compare the real sequence bounds with the plan's (``cu_seqlens`` in token-equivalents,
    made with the model's audio token rate): one error line at the first sequence whose real
    length differs by more than one audio token per member (rounding of the audio length)."""
    plan = np.asarray(planned, dtype=np.int64)
    if plan.shape != layout.cu_seqlens.shape:
        raise DataprepError(f"{where}: the plan's cu_seqlens holds {plan.size - 1} sequences, the batch "
                            f"{layout.num_sequences}")
    real = np.diff(layout.cu_seqlens.astype(np.int64))
    want = np.diff(plan)
    members = np.bincount(layout.sequence, minlength=real.size)
    bad = np.flatnonzero(np.abs(real - want) > members)
    if bad.size:
        s = int(bad[0])
        raise DataprepError(
            f"{where}: sequence {s}: {int(real[s])} tokens of the model, the plan packed it as {int(want[s])} "
            f"token-equivalents ({int(members[s])} members); plan and model disagree: the model's text is "
            f"[bos] + pieces + [eos] (compile with --prompt-tokens 2), its audio rate the plan's")
