"""Weighted epochs over many corpora: NeMo's blend probabilities, exact per-epoch quotas, and
which rows fill them. Pure arrays, no I/O.

Probabilities (:func:`blend_probabilities`), as NeMo's ``input_cfg`` computes them
(``nemo/collections/common/data/lhotse/cutset.py``): at each list of the blend tree the
weights ``w`` become ``w^T / sum(w^T)`` with that list's temperature ``T`` (1 when none); a
list without weights mixes its items equally (Lhotse's ``mux`` default); a corpus's
probability ``p_c`` is the product down its path. They are shares of *utterances*.

Quotas (:func:`quotas`): ``q_c = round(p_c * N)`` (halves up) utterances of corpus ``c`` per
epoch, ``N`` the epoch size (default: the rows that can be planned; :func:`epoch_size_for_hours`
turns hours into ``N`` with each corpus's mean duration).

Rows (:class:`QuotaSampler`): with ``n_c`` rows, ``q_c = f * n_c + r`` (``0 <= r < n_c``):
every row is taken ``f`` times and ``r`` more rows are drawn from the corpus's *stream*, an
endless sequence of random permutations of its rows. Invariants (tests check each):

- every epoch holds exactly ``q_c`` rows of corpus ``c``, each row ``f`` or ``f + 1`` times;
- an under-sampled corpus (``q_c < n_c``) gives every row once before any row twice, across
  epochs: the stream's permutations are cut where an epoch ends, and the permutation an
  epoch enters puts the rows the epoch already took last (no row twice in one epoch);
- the rows depend only on (corpus rows, quotas, seed, epoch): deterministic, replayable.

Work per epoch: vectorized over rows; a Python loop over corpora only (tens, not millions).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt


class QuotaError(ValueError):
    """A blend or weights that cannot give quotas (unknown corpus, bad weight, ...)."""


def reweight(weights: Sequence[float], temperature: float) -> npt.NDArray[np.float64]:
    """NeMo's ``temperature_reweighting``: ``w^T / sum(w^T)`` (weights > 0)."""
    w = np.asarray(weights, dtype=np.float64)
    if w.size == 0 or not (w > 0).all() or not np.isfinite(w).all():
        raise QuotaError(f"weights must be finite and > 0, got {w.tolist()}")
    if not (temperature >= 0 and np.isfinite(temperature)):
        raise QuotaError(f"temperature must be finite and >= 0, got {temperature}")
    wt = w ** float(temperature)
    return wt / wt.sum()


def _level(temps: Any, depth: int) -> float:
    if temps is None:
        return 1.0
    if isinstance(temps, (list, tuple)):
        return float(temps[depth]) if depth < len(temps) else 1.0
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
    return np.floor(p * int(epoch_size) + 0.5).astype(np.int64)


def epoch_size_for_hours(probabilities: npt.ArrayLike, mean_seconds: npt.ArrayLike, hours: float) -> int:
    """The ``N`` whose quotas hold about ``hours`` of audio: ``hours * 3600 / sum(p_c * mean_c)``."""
    per_utt = float(np.dot(np.asarray(probabilities, np.float64), np.asarray(mean_seconds, np.float64)))
    if not (hours > 0 and per_utt > 0):
        raise QuotaError(f"epoch hours must be > 0, got {hours}")
    return max(1, int(round(hours * 3600.0 / per_utt)))


@dataclass
class _Stream:
    """One corpus's endless sequence of permutations of its rows (positions into its members)."""

    n: int
    perm: npt.NDArray[np.int32] = field(default_factory=lambda: np.empty(0, np.int32))
    pos: int = 0
    cycle: int = -1

    def take(self, r: int, rng_key: Sequence[int]) -> npt.NDArray[np.int32]:
        """The next ``r`` (< n) positions; a new permutation puts this epoch's rows last."""
        if r == 0:
            return np.empty(0, np.int32)
        if self.pos + r <= self.perm.shape[0]:
            out = self.perm[self.pos:self.pos + r]
            self.pos += r
            return out
        tail = self.perm[self.pos:]
        self.cycle += 1
        nxt = np.random.default_rng([*rng_key, self.cycle]).permutation(self.n).astype(np.int32)  # kept: 4 B a row
        if tail.shape[0]:
            taken = np.zeros(self.n, dtype=bool)
            taken[tail] = True
            late = taken[nxt]
            nxt = np.concatenate([nxt[~late], nxt[late]])
        m = r - tail.shape[0]
        self.perm, self.pos = nxt, m
        return np.concatenate([tail, nxt[:m]])


class QuotaSampler:
    """The rows of each epoch of a weighted plan (module docstring).

    ``corpus_of_row``: corpus index per manifest row (-1 = never planned, e.g. in no bucket);
    ``quota``: utterances per corpus per epoch. :meth:`epoch` must be called for epochs in
    order (each continues the streams); :meth:`replay` jumps to an epoch.
    """

    def __init__(self, corpus_of_row: npt.ArrayLike, quota: npt.ArrayLike, seed: int) -> None:
        codes = np.asarray(corpus_of_row)
        self.quota = np.asarray(quota, dtype=np.int64)
        C = self.quota.shape[0]
        if (self.quota < 0).any():
            raise QuotaError("quotas must be >= 0")
        # rows as int32 while they fit (half the memory of the epoch's multiset), else int64
        row_type = np.int32 if codes.shape[0] < 2**31 else np.int64
        if C <= 256:  # one pass per corpus: no N-sized int64 temporaries
            parts = [np.flatnonzero(codes == c).astype(row_type) for c in range(C)]
            order = np.concatenate(parts) if parts else np.empty(0, row_type)
            self.sizes = np.asarray([p.shape[0] for p in parts], dtype=np.int64)
            del parts
        else:
            eligible = np.flatnonzero(codes >= 0).astype(row_type)
            order = eligible[np.argsort(codes[eligible], kind="stable")]
            self.sizes = np.bincount(codes[eligible], minlength=C).astype(np.int64)
            del eligible
        if int(self.sizes.sum()) != int((codes >= 0).sum()):
            raise QuotaError(f"a row's corpus index is >= the {C} quotas")
        empty = np.flatnonzero((self.sizes == 0) & (self.quota > 0))
        if empty.shape[0]:
            raise QuotaError(f"corpus #{int(empty[0])} has a quota of {int(self.quota[empty[0]])} but no rows to plan")
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)])
        self.members = order  # rows of corpus c: members[starts[c]:starts[c+1]], ascending
        self.full = np.where(self.sizes > 0, self.quota // np.maximum(self.sizes, 1), 0)
        self.rest = self.quota - self.full * self.sizes
        self.seed = int(seed)
        self._streams = [_Stream(int(n)) for n in self.sizes]
        self._next = 0

    @property
    def repeats(self) -> list[tuple[int, int]]:
        """(fewest, most) times a row of each corpus is taken per epoch."""
        return [(int(f), int(f) + (1 if r else 0)) for f, r in zip(self.full, self.rest)]

    def epoch(self, e: int) -> npt.NDArray[np.integer]:
        """Manifest rows of epoch ``e`` (the next epoch), a multiset of ``sum(quota)`` rows
        (int32 below 2**31 manifest rows): the full copies in row order, then each corpus's
        drawn rows in stream order."""
        if e != self._next:
            raise ValueError(f"epochs must be drawn in order: expected {self._next}, got {e}")
        self._next += 1
        drawn = [self.members[self.starts[c] + s.take(int(self.rest[c]), (self.seed, 0x5EED, c))]
                 for c, s in enumerate(self._streams)]
        full = [np.repeat(self.members[self.starts[c]:self.starts[c + 1]], int(f))
                for c, f in enumerate(self.full) if f]  # per corpus: no N-sized repeat counts
        return np.concatenate([*full, *drawn]) if full or drawn else self.members[:0]

    def replay(self, e: int) -> None:
        """Advance the streams to just before epoch ``e`` (a re-plan starting there)."""
        while self._next < e:
            self.epoch(self._next)
