"""Weighted epochs over many corpora: NeMo's blend probabilities, exact per-epoch quotas, and
which rows fill them. Pure arrays, no I/O.

:func:`blend_probabilities`: as NeMo's ``input_cfg`` (each list of the blend tree turns its
weights into ``w^T / sum(w^T)``; no weights: equal shares), a corpus's ``p_c`` the product down
its path, a share of utterances. :func:`quotas`: ``q_c = round(p_c * N)`` (halves up) per epoch.
:class:`QuotaSampler`: with ``n_c`` rows and ``q_c = f * n_c + r``, every row is taken ``f``
times and ``r`` more come from the corpus's :class:`CorpusStream` of keyed permutations.

Invariants (tests check each): exactly ``q_c`` rows of corpus ``c`` per epoch, each ``f`` or
``f + 1`` times; an under-sampled corpus gives every row once before any row twice, across
epochs; whether a row is drawn depends only on (corpus, index in it, corpus size, quota,
seed, epoch), computed block by block (:class:`Shuffle` maps an index without a table).
Vectorized over rows; Python loops over corpora and their stream's cycles only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt


class QuotaError(ValueError):
    """A blend or weights that cannot give quotas (unknown corpus, bad weight, ...)."""


#: Most utterances one epoch may hold (its rows are drawn into int64 arrays): 2**40, far past any
#: corpus; a weighted plan's epoch is bounded by its rows too (``dataprep.planning.weights``).
MAX_EPOCH_SIZE = 2**40


def reweight(weights: Sequence[float], temperature: float) -> npt.NDArray[np.float64]:
    """NeMo's ``temperature_reweighting``: ``w^T / sum(w^T)`` (weights > 0)."""
    w = np.asarray(weights, dtype=np.float64)
    if w.size == 0 or not (w > 0).all() or not np.isfinite(w).all():
        raise QuotaError(f"weights must be finite and > 0, got {w.tolist()}")
    if not (temperature >= 0 and np.isfinite(temperature)):
        raise QuotaError(f"temperature must be finite and >= 0, got {temperature}")
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        wt = w ** float(temperature)
        total = wt.sum()
        if not (np.isfinite(total) and total > 0):  # w^T overflows (or all underflow): the same
            wt = np.exp(float(temperature) * (np.log(w) - np.log(w).max()))  # ratios, scaled by max^T
            total = wt.sum()
        p = wt / total
    if not np.isfinite(p).all():
        raise QuotaError(f"weights {w.tolist()} at temperature {temperature:g} give no finite probabilities")
    return p


def _level(temps: Any, depth: int) -> float:
    if isinstance(temps, (list, tuple)):
        temps = temps[depth] if depth < len(temps) else None
    if temps is None:
        return 1.0
    if isinstance(temps, bool) or not isinstance(temps, (int, float)):
        raise QuotaError(f"temperature must be a number, got {temps!r}")
    return float(temps)


def blend_probabilities(tree: Mapping[str, Any], temperature: float | None = None) -> dict[str, float]:
    """Probability per corpus of a blend tree (``{"temperature", "children": [{"weight",
    "corpus"} | {"weight", "temperature"?, "children"}]}``), in tree order.

    A node's ``temperature`` (scalar, or one per level from that node down) applies to its
    children's weights; ``temperature`` given here replaces every level's.
    """
    out: dict[str, float] = {}

    def walk(node: Mapping[str, Any], p: float, temps: Any, depth: int) -> None:
        children = node.get("children") or []
        if not children:
            raise QuotaError("a group of the blend has no items")
        if node.get("temperature") is not None:
            temps, depth = node["temperature"], 0
        t = temperature if temperature is not None else _level(temps, depth)
        weights = [c.get("weight") for c in children]
        if all(w is None for w in weights):
            probs = np.full(len(children), 1.0 / len(children))
        elif any(w is None for w in weights):
            raise QuotaError("every item of a weighted list needs a weight")
        else:
            probs = reweight(weights, t)
        for child, pc in zip(children, probs):
            if "children" in child:
                walk(child, p * float(pc), temps, depth + 1)
            else:
                name = str(child["corpus"])
                if name in out:
                    raise QuotaError(f"corpus {name!r} appears twice in the blend")
                out[name] = p * float(pc)

    walk(tree, 1.0, None, 0)
    return out


def flat_tree(weights: Mapping[str, float], temperature: float | None) -> dict[str, Any]:
    """The blend tree of ``--weights CORPUS=W ... [--temperature T]`` (one level)."""
    return {"temperature": temperature, "children": [{"weight": float(w), "corpus": c} for c, w in weights.items()]}


def is_weighted(tree: Mapping[str, Any]) -> bool:
    """Whether any item of the tree has a weight (an unweighted blend plans every row once)."""
    return any(c.get("weight") is not None or ("children" in c and is_weighted(c)) for c in tree.get("children", []))


def quotas(probabilities: npt.ArrayLike, epoch_size: int) -> npt.NDArray[np.int64]:
    """``round(p_c * N)``, halves rounded up (exact in float64 for any realistic ``N``)."""
    p = np.asarray(probabilities, dtype=np.float64)
    if epoch_size < 1:
        raise QuotaError(f"epoch size must be >= 1 utterance, got {epoch_size}")
    if epoch_size > MAX_EPOCH_SIZE:
        raise QuotaError(f"epoch size must be <= {MAX_EPOCH_SIZE} utterances, got {epoch_size}")
    if not (np.isfinite(p).all() and (p >= 0).all() and p.sum() <= 1 + 1e-9):
        raise QuotaError(f"probabilities must be finite, >= 0 and sum to at most 1, got {p.tolist()}")
    return np.floor(p * int(epoch_size) + 0.5).astype(np.int64)


def epoch_size_for_hours(probabilities: npt.ArrayLike, mean_seconds: npt.ArrayLike, hours: float) -> int:
    """The ``N`` whose quotas hold about ``hours`` of audio: ``hours * 3600 / sum(p_c * mean_c)``."""
    per_utt = float(np.dot(np.asarray(probabilities, np.float64), np.asarray(mean_seconds, np.float64)))
    if not (hours > 0 and math.isfinite(hours) and per_utt > 0 and math.isfinite(per_utt)):
        raise QuotaError(f"epoch hours must be finite and > 0, got {hours}")
    n = hours * 3600.0 / per_utt
    if not n <= MAX_EPOCH_SIZE:
        raise QuotaError(f"{hours:g} hours of {per_utt:g} s utterances is {n:.3g} utterances per epoch, "
                         f"more than {MAX_EPOCH_SIZE}")
    return max(1, int(round(n)))


#: Rounds of :class:`Shuffle` (each xors one half of the word with a keyed hash of the other).
SHUFFLE_ROUNDS = 4
#: Rows whose positions are computed at once (bounds the uint64 temporaries: ~100 bytes a row).
POSITION_BLOCK = 1 << 20
#: Indices of :class:`Shuffle` mapped at once (their uint64 temporaries stay in cache).
SHUFFLE_BLOCK = 1 << 16
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


class Shuffle:
    """A keyed pseudo-random permutation of ``range(m)`` that maps any index on its own, in
    either direction, without an ``m``-sized table: an unbalanced Feistel network over the
    smallest power of two >= ``m`` (:data:`SHUFFLE_ROUNDS` rounds of a splitmix64 hash),
    cycle-walked back into ``range(m)`` (fewer than two walks per index on average).
    ``key``: integers (a :class:`numpy.random.SeedSequence` entropy); equal keys give equal
    permutations on every machine."""

    def __init__(self, m: int, key: Sequence[int]) -> None:
        self.m = int(m)
        self._m = np.uint64(self.m)
        bits = max(2, (self.m - 1).bit_length())
        self.lo_bits = bits // 2
        self.hi_bits = bits - self.lo_bits
        self.lo_mask = np.uint64((1 << self.lo_bits) - 1)
        self.hi_mask = np.uint64((1 << self.hi_bits) - 1)
        self.keys = np.random.default_rng(list(key)).integers(0, 2**63, SHUFFLE_ROUNDS, dtype=np.uint64)

    def _hash(self, x: npt.NDArray[np.uint64], k: int) -> npt.NDArray[np.uint64]:
        z = (x + self.keys[k]) * _M1
        z ^= z >> np.uint64(31)
        z *= _M2
        return z ^ (z >> np.uint64(29))

    def _rounds(self, x: npt.NDArray[np.uint64], order: range) -> npt.NDArray[np.uint64]:
        lo, hi = x & self.lo_mask, x >> np.uint64(self.lo_bits)
        for k in order:  # even rounds change the low half, odd rounds the high half
            if k % 2 == 0:
                lo ^= self._hash(hi, k) & self.lo_mask
            else:
                hi ^= self._hash(lo, k) & self.hi_mask
        return (hi << np.uint64(self.lo_bits)) | lo

    def _walk(self, x: npt.ArrayLike, order: range) -> npt.NDArray[np.int64]:
        x = np.asarray(x, dtype=np.uint64)
        result = np.empty(x.shape[0], dtype=np.int64)
        for a in range(0, x.shape[0], SHUFFLE_BLOCK):  # blocks that stay in cache: ~8x faster
            y = self._rounds(x[a:a + SHUFFLE_BLOCK], order)
            out = np.flatnonzero(y >= self._m)
            while out.shape[0]:  # cycle-walking: the permutation of range(2**bits) restricted to range(m)
                y[out] = self._rounds(y[out], order)
                out = out[y[out] >= self._m]
            result[a:a + SHUFFLE_BLOCK] = y
        return result

    def forward(self, x: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """The permutation's values at indices ``x`` (each in ``range(m)``)."""
        return self._walk(x, range(SHUFFLE_ROUNDS))

    def inverse(self, y: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """The indices whose values are ``y``: ``inverse(forward(x)) == x``."""
        return self._walk(y, range(SHUFFLE_ROUNDS - 1, -1, -1))


@dataclass(frozen=True)
class CorpusStream:
    """One corpus's endless stream of its ``n`` rows (indices 0..n-1 in manifest order), ``r``
    drawn per epoch: epoch ``e`` takes stream positions ``[e r, (e + 1) r)``, cycle ``k`` holds
    positions ``[k n, (k + 1) n)``, a permutation of the rows.

    Cycle 0 is a :class:`Shuffle` of the rows. Cycle ``k`` re-shuffles cycle ``k - 1``'s
    positions in two parts: where an epoch runs across the cycles' boundary, taking cycle
    ``k - 1``'s positions from ``t`` on, cycle ``k`` puts the rows at positions ``< t`` first
    (shuffled among themselves) and that epoch's rows (positions ``>= t``) last, so no epoch
    takes a row twice (``r < n``) and every row is taken once before any twice. A row's
    position is computed from its index alone (:meth:`positions`): no per-row state, any epoch
    in any order, ``k`` cycles cost ``k + 1`` inverse shuffles a row."""

    n: int
    r: int
    key: tuple[int, ...]

    def _split(self, k: int) -> int:
        """Where in cycle ``k - 1`` the epoch that runs into cycle ``k`` began (``n``: none runs
        across, an epoch begins where the cycle does)."""
        e = k * self.n // self.r
        start = e * self.r
        return self.n if start == k * self.n else start - (k - 1) * self.n

    def positions(self, rows: npt.NDArray[np.int64], cycle: int) -> npt.NDArray[np.int64]:
        """Positions in cycle ``cycle`` of the rows ``rows`` (indices in ``range(n)``)."""
        p = Shuffle(self.n, (*self.key, 0, 0)).inverse(rows)
        for k in range(1, cycle + 1):
            p = self._next_cycle(p, k)
        return p

    def _next_cycle(self, p: npt.NDArray[np.int64], k: int) -> npt.NDArray[np.int64]:
        """Positions in cycle ``k`` of the rows at positions ``p`` of cycle ``k - 1``."""
        return self._across(p, k, inverse=True)

    def _across(self, p: npt.NDArray[np.int64], k: int, inverse: bool) -> npt.NDArray[np.int64]:
        """Cycle ``k``'s re-shuffle of cycle ``k - 1``'s positions: the head (positions < the
        split) and the tail shuffled apart; ``inverse``: from cycle ``k - 1`` to ``k``, else back."""
        t = self._split(k)
        head = p < t
        out = np.empty_like(p)
        shuffles = (Shuffle(t, (*self.key, k, 0)), Shuffle(self.n - t, (*self.key, k, 1)))
        out[head] = shuffles[0].inverse(p[head]) if inverse else shuffles[0].forward(p[head])
        if t < self.n:
            tail = p[~head] - t
            out[~head] = t + (shuffles[1].inverse(tail) if inverse else shuffles[1].forward(tail))
        return out

    def row_at(self, p: npt.NDArray[np.int64], cycle: int) -> npt.NDArray[np.int64]:
        """The rows at positions ``p`` of cycle ``cycle`` (the inverse of :meth:`positions`)."""
        for k in range(cycle, 0, -1):
            p = self._across(p, k, inverse=False)
        return Shuffle(self.n, (*self.key, 0, 0)).forward(p)

    def drawn_rows(self, epoch: int) -> npt.NDArray[np.int64]:
        """The ``r`` rows drawn in ``epoch`` (indices, stream order): :meth:`row_at` of the
        epoch's positions, work per drawn row, not per row of the corpus."""
        lo, hi = epoch * self.r, (epoch + 1) * self.r
        k = lo // self.n if self.n else 0
        parts = [self.row_at(np.arange(lo - k * self.n, min(hi - k * self.n, self.n), dtype=np.int64), k)]
        if self.r and hi > (k + 1) * self.n:  # the epoch runs into the next cycle
            parts.append(self.row_at(np.arange(hi - (k + 1) * self.n, dtype=np.int64), k + 1))
        return np.concatenate(parts)

    def drawn(self, rows: npt.NDArray[np.int64], epoch: int) -> npt.NDArray[np.bool_]:
        """Whether each of ``rows`` is drawn in ``epoch`` (``r`` of the ``n`` rows are)."""
        if self.r == 0:
            return np.zeros(rows.shape[0], dtype=bool)
        lo, hi = epoch * self.r, (epoch + 1) * self.r
        k = lo // self.n
        p = self.positions(rows, k)
        got = (p >= lo - k * self.n) & (p < min(hi - k * self.n, self.n))
        if hi > (k + 1) * self.n:  # the epoch runs into the next cycle
            got |= self._next_cycle(p, k + 1) < hi - (k + 1) * self.n
        return got


def group_rows(codes: npt.NDArray[np.integer], num_groups: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Rows grouped by code (a stable sort: ascending inside each group; a radix sort below
    32768 groups) and each group's bounds in that order (``bounds[c]:bounds[c + 1]``; rows of
    code -1 come first, before ``bounds[0]``)."""
    small = codes.astype(np.int16, copy=False) if num_groups < 2**15 else codes
    order = np.argsort(small, kind="stable")
    bounds = np.searchsorted(small[order], np.arange(num_groups + 1))
    return order.astype(np.int32, copy=False) if codes.shape[0] < 2**31 else order, bounds


def corpus_indices(codes: npt.NDArray[np.integer], start: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Each row's index among its corpus's rows (manifest order), the corpora's first indices
    being ``start`` (per corpus; advanced in place by the rows counted): call it block after
    block of a manifest. Rows with code -1 get -1. One sort of the codes, not a pass per corpus."""
    C = start.shape[0]
    order, bounds = group_rows(np.asarray(codes), C)
    counts = np.diff(bounds)
    out = np.full(codes.shape[0], -1, dtype=np.int64)
    at = order[bounds[0]:]
    out[at] = np.arange(at.shape[0]) - np.repeat(bounds[:-1] - bounds[0] - start, counts)
    start += counts
    return out


class QuotaSampler:
    """How many times each row is taken in each epoch of a weighted plan (module docstring).

    ``sizes``: rows per corpus; ``quota``: utterances per corpus per epoch. A row (its corpus
    code and index in its corpus) is taken ``full[c]`` times plus once when its corpus's
    :class:`CorpusStream` draws it: :meth:`times` is a pure function of (row, epoch), so a
    corpus too large for memory is drawn block by block, and any epoch can be drawn first.
    """

    def __init__(self, sizes: npt.ArrayLike, quota: npt.ArrayLike, seed: int) -> None:
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.quota = np.asarray(quota, dtype=np.int64)
        if self.sizes.shape != self.quota.shape:
            raise QuotaError(f"{self.sizes.shape[0]} corpus sizes for {self.quota.shape[0]} quotas")
        if (self.quota < 0).any() or (self.sizes < 0).any():
            raise QuotaError("quotas and corpus sizes must be >= 0")
        empty = np.flatnonzero((self.sizes == 0) & (self.quota > 0))
        if empty.shape[0]:
            raise QuotaError(f"corpus #{int(empty[0])} has a quota of {int(self.quota[empty[0]])} but no rows to plan")
        self.full = np.where(self.sizes > 0, self.quota // np.maximum(self.sizes, 1), 0)
        self.rest = self.quota - self.full * self.sizes
        self.seed = int(seed)
        self.streams = [CorpusStream(int(n), int(r), (self.seed, 0x5EED, c))
                        for c, (n, r) in enumerate(zip(self.sizes, self.rest))]

    @property
    def repeats(self) -> list[tuple[int, int]]:
        """(fewest, most) times a row of each corpus is taken per epoch."""
        return [(int(f), int(f) + (1 if r else 0)) for f, r in zip(self.full, self.rest)]

    @property
    def most(self) -> int:
        """The most times any row is taken in an epoch."""
        return max([m for _, m in self.repeats], default=0)

    def times(self, codes: npt.NDArray[np.integer], index: npt.NDArray[np.integer], epoch: int
              ) -> npt.NDArray[np.int64]:
        """Times each row (corpus ``codes``, ``index`` in its corpus; code -1: never) is taken
        in ``epoch``. Vectorized per corpus, in blocks of :data:`POSITION_BLOCK` rows."""
        if epoch < 0:
            raise QuotaError(f"epoch must be >= 0, got {epoch}")
        codes, index = np.asarray(codes), np.asarray(index)
        out = np.zeros(codes.shape[0], dtype=np.int64)
        order, bounds = group_rows(codes, self.sizes.shape[0])
        for c in np.flatnonzero(np.diff(bounds)).tolist():
            at = order[bounds[c]:bounds[c + 1]]
            out[at] = self.full[c]
            for a in range(0, at.shape[0], POSITION_BLOCK):
                sel = at[a:a + POSITION_BLOCK]
                out[sel] += self.streams[c].drawn(index[sel].astype(np.int64), epoch)
        return out

    def epoch_rows(self, groups: tuple[npt.NDArray[np.integer], npt.NDArray[np.int64]], epoch: int
                   ) -> npt.NDArray[np.integer]:
        """Manifest rows of ``epoch`` as a multiset of ``sum(quota)`` rows, ascending (a row
        taken k times listed k times in a run; int32 below 2**31 rows). ``groups``: the
        manifest's rows grouped by corpus code (:func:`group_rows` of the codes, -1 for rows
        never planned; computed once for every epoch). Work: each drawn row's place in its
        stream (:meth:`CorpusStream.drawn_rows`), then one pass over the rows."""
        if epoch < 0:
            raise QuotaError(f"epoch must be >= 0, got {epoch}")
        order, bounds = groups  # a corpus's rows ascending: its index order
        if not np.array_equal(np.diff(bounds), self.sizes):
            raise QuotaError(f"the codes give {np.diff(bounds).tolist()} rows per corpus, not {self.sizes.tolist()}")
        taken = np.zeros(order.shape[0], dtype=np.int64)  # intp: np.repeat converts no counts
        for c in np.flatnonzero(self.sizes).tolist():
            members = order[bounds[c]:bounds[c + 1]]
            taken[members] = self.full[c]
            taken[members[self.streams[c].drawn_rows(epoch)]] += 1
        return np.repeat(np.arange(order.shape[0], dtype=order.dtype), taken)


#: Mix levels per over-represented corpus that :func:`window_order` tries (the order whose
#: worst window is closest to the target is kept)
WINDOW_LEVELS = (1, 2, 4, 8, 16)


def window_deviation(counts: npt.NDArray[np.integer], target: npt.NDArray[np.float64], window: int
                     ) -> npt.NDArray[np.float64]:
    """Per window of ``window`` consecutive steps (rows of ``counts``: utterances per corpus
    per step, in step order; the whole run where it is shorter), the largest absolute gap
    between a corpus's share of the window's utterances and its ``target`` share."""
    S = counts.shape[0]
    K = min(int(window), S)
    cs = np.zeros((S + 1, counts.shape[1]), dtype=np.int64)
    np.cumsum(counts, axis=0, out=cs[1:])
    win = cs[K:] - cs[:-K]
    share = win / np.maximum(win.sum(1, keepdims=True), 1)
    return np.abs(share - np.asarray(target, dtype=np.float64)[None, :]).max(1)


def window_order(counts: npt.NDArray[np.integer], target: npt.NDArray[np.float64], window: int,
                 rng: np.random.Generator) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """An order of the steps (``counts``: utterances per corpus per step) in which every
    ``window`` consecutive steps hold each corpus near its ``target`` share: (position of each
    step, every window's :func:`window_deviation` in that order). Steps are grouped by the corpus they
    hold most above its target and by how far (``levels`` quantiles of that gap), each group
    shuffled, and the groups interleaved evenly (a group of m steps has its j-th at about
    ``(j + u) / m`` of the run, ``u`` drawn per group), so every stretch of the run holds each
    group, and so each mix, in its share of the run. Of :data:`WINDOW_LEVELS`, the order with
    the smallest worst window is kept. Vectorized; deterministic for a given ``rng``."""
    S = int(counts.shape[0])
    if S == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    c = np.asarray(counts, dtype=np.float64)
    gap = c / np.maximum(c.sum(1, keepdims=True), 1) - np.asarray(target, dtype=np.float64)[None, :]
    over = np.argmax(gap, axis=1)
    size = gap[np.arange(S), over]
    noise, offsets = rng.random(S), rng.random(S + 1)
    best: tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]] | None = None
    for levels in WINDOW_LEVELS:
        # level: quantile of the gap among the steps over-representing the same corpus
        by = np.lexsort((np.arange(S), size, over))
        first = np.searchsorted(over[by], over[by], side="left")
        n_same = np.bincount(over, minlength=c.shape[1])[over[by]]
        level = np.empty(S, dtype=np.int64)
        level[by] = (np.arange(S) - first) * levels // np.maximum(n_same, 1)
        group = over * levels + level
        in_group = np.lexsort((noise, group))  # each group shuffled
        g_sorted = group[in_group]
        g_first = np.searchsorted(g_sorted, g_sorted, side="left")
        m = np.bincount(group)[g_sorted]
        ideal = (np.arange(S) - g_first + offsets[g_sorted % (S + 1)]) / m
        order = in_group[np.lexsort((g_sorted, ideal))]
        dev = window_deviation(c[order].astype(np.int64), target, window)
        if best is None or float(dev.max()) < float(best[1].max()) - 1e-12:
            pos = np.empty(S, dtype=np.int64)
            pos[order] = np.arange(S)
            best = (pos, dev)
    assert best is not None
    return best
