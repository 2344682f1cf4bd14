"""Packed sequences: whole utterances filling sequences of at most ``N`` token-equivalents.

A row's size in one currency: te = ceil(duration_s x audio_token_rate) + num_tokens
(:func:`token_equivalents`; the rate is audio tokens per second: 12.5 = one 80 ms encoder
frame). :func:`pack_rows` packs speech rows per bucket (similar audio lengths, so the encoder
side stays dense), then fills the sequences' gaps with text-only rows (duration 0: no audio),
then packs the text rows left among themselves. Packing runs in rounds, vectorized: each round
gives every open sequence (largest gap first) the largest unused row that still fits
(:func:`_fill_round`); when no row fits any gap, the largest rows left open new sequences, as
many as their total needs. A decreasing first-fit in NumPy: no loop over rows.
Invariants: each row in exactly one sequence; a sequence's te <= ``N``; members of a
sequence contiguous in :attr:`Packing.members`; the same inputs and ``seed`` give the same
sequences. Rows over ``N`` are never passed in (the caller rejects them, with their reason).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

#: Default audio tokens per second of audio: one token per 80 ms encoder frame (FastConformer's 8x
#: subsampling of 10 ms frames), as a speech-LLM's adapter hands them to the LLM.
DEFAULT_AUDIO_TOKEN_RATE = 12.5


def token_equivalents(duration_s: npt.ArrayLike, num_tokens: npt.ArrayLike,
                      audio_token_rate: float) -> npt.NDArray[np.int64]:
    """ceil(duration_s x audio_token_rate) + num_tokens per row, int64 (the product rounded to
    1e-6 first, so 0.08 s x 12.5 is exactly one token, not two)."""
    audio = np.ceil(np.round(np.asarray(duration_s, dtype=np.float64) * float(audio_token_rate), 6))
    return audio.astype(np.int64) + np.asarray(num_tokens, dtype=np.int64)


@dataclass(frozen=True)
class Packing:
    """Sequences as CSR over row indices: sequence ``s`` holds rows
    ``members[offsets[s]:offsets[s + 1]]`` (indices into the arrays given to :func:`pack_rows`),
    of ``te[s]`` token-equivalents, in bucket ``bucket[s]`` (-1: text rows only)."""

    members: npt.NDArray[np.int64]
    offsets: npt.NDArray[np.int64]
    te: npt.NDArray[np.int64]
    bucket: npt.NDArray[np.int32]

    @property
    def num_sequences(self) -> int:
        return int(self.te.shape[0])


def _fill_round(gaps: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """One round: per gap, the index of a distinct size (``sizes`` descending) that fits it
    (the largest unused that does, gaps served largest first), or -1."""
    order = np.argsort(-gaps, kind="stable")
    g = gaps[order]
    first = np.searchsorted(-sizes, -g, side="left")  # first size <= the gap (sizes descending)
    k = np.arange(g.shape[0], dtype=np.int64)
    pick = np.maximum.accumulate(first - k) + k  # distinct, each still <= its gap
    out = np.full(gaps.shape[0], -1, dtype=np.int64)
    ok = pick < sizes.shape[0]
    out[order[ok]] = pick[ok]
    return out


def _fill(gaps: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64]
          ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Rounds of :func:`_fill_round` until no size fits a gap: (size index, gap index) of every
    size placed (``sizes`` descending; ``gaps`` updated in place)."""
    left = np.arange(sizes.shape[0], dtype=np.int64)  # indices of sizes not placed, descending sizes
    placed_i, placed_g = [], []
    while left.shape[0] and gaps.shape[0]:
        pick = _fill_round(gaps, sizes[left])
        hit = np.flatnonzero(pick >= 0)
        if not hit.shape[0]:
            break
        chosen = left[pick[hit]]
        gaps[hit] -= sizes[chosen]
        placed_i.append(chosen)
        placed_g.append(hit)
        keep = np.ones(left.shape[0], dtype=bool)
        keep[pick[hit]] = False
        left = left[keep]
    if not placed_i:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return np.concatenate(placed_i), np.concatenate(placed_g)


def pack_sizes(sizes: npt.NDArray[np.int64], cap: int) -> npt.NDArray[np.int64]:
    """Sequence number (0, 1, ...) of each size (all in 1..``cap``) packed into sequences of at
    most ``cap``: decreasing first-fit in rounds (the module docstring). Ties keep the given
    order (shuffle the rows first for a random packing)."""
    n = int(sizes.shape[0])
    seq = np.full(n, -1, dtype=np.int64)
    order = np.argsort(-sizes, kind="stable")
    desc = sizes[order]
    left = np.arange(n, dtype=np.int64)  # positions in ``desc`` not yet placed
    opened = 0
    while left.shape[0]:
        rest = desc[left]
        new = max(1, -(-int(rest.sum()) // cap))  # as many sequences as the total needs, at least
        new = min(new, rest.shape[0])
        seeds = left[:new]
        seq[order[seeds]] = opened + np.arange(new)
        gaps = cap - desc[seeds]
        left = left[new:]
        i, g = _fill(gaps, desc[left])
        seq[order[left[i]]] = opened + g
        keep = np.ones(left.shape[0], dtype=bool)
        keep[i] = False
        left = left[keep]
        opened += new
    return seq


def pack_rows(te: npt.NDArray[np.int64], bucket: npt.NDArray[np.integer], cap: int, *,
              text: npt.NDArray[np.bool_] | None = None, seed: int = 0) -> Packing:
    """Pack rows of ``te`` token-equivalents (each <= ``cap``) in their ``bucket`` (rows with
    ``text`` True, duration 0, are fillers: the gaps of every bucket's sequences first, then
    sequences of their own, bucket -1). ``seed`` shuffles ties. See the module docstring."""
    te = np.asarray(te, dtype=np.int64)
    bucket = np.asarray(bucket, dtype=np.int64)
    n = te.shape[0]
    text = np.zeros(n, dtype=bool) if text is None else np.asarray(text, dtype=bool)
    if n and (te.max() > cap or te.min() < 0):
        raise ValueError(f"pack_rows: sizes must be 0..{cap}")
    shuffle = np.random.default_rng([seed, 4]).permutation(n)
    speech = shuffle[~text[shuffle]]
    speech = speech[np.argsort(bucket[speech], kind="stable")]  # by bucket, shuffled inside
    seq = np.full(n, -1, dtype=np.int64)
    seq_bucket: list[npt.NDArray[np.int64]] = []
    cut = np.searchsorted(bucket[speech], np.unique(bucket[speech]), side="left").tolist() + [speech.shape[0]]
    opened = 0
    for lo, hi in zip(cut[:-1], cut[1:]):  # one pass per bucket, vectorized inside
        rows = speech[lo:hi]
        s = pack_sizes(te[rows], cap)
        seq[rows] = opened + s
        k = int(s.max()) + 1
        seq_bucket.append(np.full(k, bucket[rows[0]], dtype=np.int64))
        opened += k
    fill = shuffle[text[shuffle]]
    if fill.shape[0]:
        fill = fill[np.argsort(-te[fill], kind="stable")]
        gaps = cap - np.bincount(seq[seq >= 0], weights=te[seq >= 0], minlength=opened).astype(np.int64)
        i, g = _fill(gaps, te[fill])
        seq[fill[i]] = g
        rest = np.ones(fill.shape[0], dtype=bool)
        rest[i] = False
        fill = fill[rest]
        if fill.shape[0]:
            s = pack_sizes(te[fill], cap)
            seq[fill] = opened + s
            k = int(s.max()) + 1
            seq_bucket.append(np.full(k, -1, dtype=np.int64))
            opened += k
    members = np.argsort(seq, kind="stable")
    counts = np.bincount(seq, minlength=opened)
    offsets = np.zeros(opened + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    seq_te = np.bincount(seq, weights=te, minlength=opened).astype(np.int64)
    sb = np.concatenate(seq_bucket) if seq_bucket else np.empty(0, np.int64)
    return Packing(members.astype(np.int64), offsets, seq_te, sb.astype(np.int32))


def slot_use(packing: Packing, cap: int) -> float:
    """Share of the sequences' ``cap`` slots their members fill (1 - padding of te)."""
    return float(packing.te.sum()) / (packing.num_sequences * cap) if packing.num_sequences else 1.0
