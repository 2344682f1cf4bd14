"""bucketing.packing: token-equivalents and the packing of rows into sequences of at most N."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bucketing.packing import pack_rows, pack_sizes, slot_use, token_equivalents


def test_token_equivalents_round_the_audio_up_and_add_the_tokens() -> None:
    got = token_equivalents([0.08, 0.081, 0.0, 1.0], [3, 3, 7, 0], 12.5)
    assert got.tolist() == [1 + 3, 2 + 3, 7, 13]
    assert got.dtype == np.int64


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 60), st.integers(0, 3), st.booleans()), min_size=1, max_size=120),
       st.integers(60, 200), st.integers(0, 5))
def test_every_row_is_in_one_sequence_within_n(rows: list[tuple[int, int, bool]], cap: int, seed: int) -> None:
    te = np.array([r[0] for r in rows], dtype=np.int64)
    bucket = np.array([r[1] for r in rows])
    text = np.array([r[2] for r in rows])
    p = pack_rows(te, bucket, cap, text=text, seed=seed)
    assert sorted(p.members.tolist()) == list(range(len(rows)))  # each row exactly once
    seq = np.repeat(np.arange(p.num_sequences), np.diff(p.offsets))
    assert (np.bincount(seq, weights=te[p.members], minlength=p.num_sequences) == p.te).all()
    assert (p.te <= cap).all() and (p.te > 0).all()
    for s in range(p.num_sequences):  # a sequence's audio comes from one bucket; text-only ones have bucket -1
        m = p.members[p.offsets[s]:p.offsets[s + 1]]
        speech = m[~text[m]]
        assert (bucket[speech] == p.bucket[s]).all() if speech.shape[0] else p.bucket[s] == -1
    again = pack_rows(te, bucket, cap, text=text, seed=seed)
    assert (again.members == p.members).all() and (again.offsets == p.offsets).all()


def test_packing_of_equal_sizes_is_optimal() -> None:
    seq = pack_sizes(np.full(100, 10, dtype=np.int64), 35)
    assert np.bincount(seq).tolist() == [3] * 33 + [1]


def test_text_rows_fill_the_gaps_of_speech_sequences() -> None:
    rng = np.random.default_rng(0)
    speech = rng.integers(180, 220, 20000)
    texts = rng.integers(5, 300, 8000)
    te = np.concatenate([speech, texts])
    bucket = np.concatenate([rng.integers(0, 4, 20000), np.full(8000, -1)])
    text = np.arange(28000) >= 20000
    alone = pack_rows(speech, bucket[:20000], 2048)
    blended = pack_rows(te, bucket, 2048, text=text)
    assert slot_use(blended, 2048) >= 0.98 and slot_use(blended, 2048) > slot_use(alone, 2048) + 0.005


def test_a_row_over_n_is_refused() -> None:
    with pytest.raises(ValueError, match="0..10"):
        pack_rows(np.array([11]), np.array([0]), 10)
