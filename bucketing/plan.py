"""The batch planner: per-epoch, rank-synchronized batch schedules from arrays.

Pure core: arrays in (bucket per manifest row, batch size per bucket, durations, tokens),
schedule arrays out; :mod:`manifests.plan_files` writes them. One epoch: each bucket's rows
are cut into batches (:func:`bucketing.batching.form_batches`, rng from ``(seed, epoch)``);
with ``balance == 0`` every step is ``W`` batches of one bucket, a bucket's tail re-split into
near-equal batches (``resplit``), else carried to a later bucket containing it, else borrowing
steps, else dropped for that epoch and listed (counted fallbacks); steps interleaved at random
or ascending. With ``balance > 0`` steps are balanced (:mod:`bucketing.balance`):
``step_bucket`` is -1 at mixed steps and ``batch_bucket`` holds each batch's bucket.

Invariants (tests check each): every allocated row exactly once per epoch (weighted: as often
as ``PlanInputs.rows`` lists it) unless in ``dropped``; every batch non-empty, at most its
bucket's batch size; equal steps on every rank, one bucket at a one-bucket step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from bucketing.balance import balance_steps, batch_extremes, layout
from bucketing.batching import Batches, form_batches, gather_segments
from bucketing.costmodel import CostModel

Interleave = Literal["random", "ascending"]


class PlanError(ValueError):
    """The inputs cannot be planned (e.g. fewer utterances than ranks)."""


@dataclass(frozen=True)
class EpochPlan:
    """One epoch's schedule, rank-major CSR.

    Batch ``g = rank * num_steps + step_in_epoch``; its manifest rows are
    ``rows[offsets[g]:offsets[g+1]]``. ``step_bucket[s]`` is the bucket every rank draws at
    step ``s`` of the epoch.
    """

    epoch: int
    world_size: int
    step_bucket: npt.NDArray[np.int32]  # (num_steps,)
    offsets: npt.NDArray[np.int64]  # (world_size * num_steps + 1,)
    rows: npt.NDArray[np.int64]  # manifest row numbers
    max_duration: npt.NDArray[np.float64]  # (world_size * num_steps,) seconds, longest in batch
    max_tokens: npt.NDArray[np.int64]  # (world_size * num_steps,) tokens, most in batch
    dropped: npt.NDArray[np.int64]  # rows not placed this epoch (degenerate inputs only)
    fallbacks: list[dict[str, int]] = field(default_factory=list)  # carried / borrowed / dropped
    resplit_buckets: int = 0  # buckets whose tail was re-split (sync kept)
    real_seconds: float = 0.0  # sum of the planned rows' durations (s)
    real_tokens: int = 0  # sum of the planned rows' tokens
    batch_bucket: npt.NDArray[np.int32] | None = None  # (world_size * num_steps,) balanced plans only
    split_batches: int = 0  # balanced: formed batches cut into pieces (the only short batches)
    unbalanced_steps: int = 0  # balanced: steps over the tolerance (counted fallbacks)

    @property
    def num_steps(self) -> int:
        return int(self.step_bucket.shape[0])

    def bucket_of_batch(self) -> npt.NDArray[np.int32]:
        """Bucket per batch (rank-major)."""
        if self.batch_bucket is not None:
            return self.batch_bucket
        return np.tile(self.step_bucket, self.world_size)

    def sizes(self) -> npt.NDArray[np.int64]:
        """Utterances per batch (rank-major)."""
        return np.diff(self.offsets)

    def rank_slice(self, rank: int) -> tuple[int, int]:
        """Half-open batch index range of ``rank``."""
        return rank * self.num_steps, (rank + 1) * self.num_steps

    @property
    def padded_seconds(self) -> float:
        """Sum over batches of batch size × longest duration (s)."""
        return float((self.sizes() * self.max_duration).sum())

    @property
    def padded_tokens(self) -> int:
        """Sum over batches of batch size × most tokens."""
        return int((self.sizes() * self.max_tokens).sum())

    @property
    def audio_padding(self) -> float:
        """``1 - real / padded`` seconds (equal to the frame ratio up to rounding)."""
        padded = self.padded_seconds
        return 1.0 - self.real_seconds / padded if padded else 0.0

    @property
    def token_padding(self) -> float:
        """``1 - real / padded`` tokens."""
        padded = self.padded_tokens
        return 1.0 - self.real_tokens / padded if padded else 0.0


@dataclass(frozen=True)
class PlanInputs:
    """Everything the planner reads, as arrays.

    ``bucket_of_row`` (-1 = not allocated, skipped); ``batch_sizes`` per bucket (>= 1);
    ``durations`` in seconds and ``num_tokens`` per row; ``max_duration`` / ``max_tokens``
    per bucket (upper bounds; ``inf`` = unbounded) decide which bucket may take another's
    leftovers (it must contain its bounds). Without bounds, buckets are taken as nested
    in index order (bucket ``b+1`` contains bucket ``b``).
    """

    bucket_of_row: npt.NDArray[np.integer]
    batch_sizes: npt.NDArray[np.integer]
    durations: npt.NDArray[np.floating]
    num_tokens: npt.NDArray[np.integer]
    max_duration: npt.NDArray[np.floating] | None = None
    max_tokens: npt.NDArray[np.floating] | None = None
    #: a weighted epoch's rows as a multiset (a row listed k times is planned k times,
    #: :mod:`bucketing.quota`); None: every allocated row once
    rows: npt.NDArray[np.integer] | None = None


def containment(max_duration: npt.NDArray[np.floating] | None, max_tokens: npt.NDArray[np.floating] | None,
                num_buckets: int) -> npt.NDArray[np.bool_]:
    """``c[a, b]``: bucket ``a``'s bounds contain bucket ``b``'s (``a != b``)."""
    if max_duration is None:
        idx = np.arange(num_buckets)
        return idx[:, None] > idx[None, :]
    d = np.asarray(max_duration, dtype=np.float64)
    t = np.full(num_buckets, np.inf) if max_tokens is None else np.asarray(max_tokens, dtype=np.float64)
    c = (d[:, None] >= d[None, :]) & (t[:, None] >= t[None, :])
    np.fill_diagonal(c, False)
    return c


def even_split(n: int, parts: int) -> npt.NDArray[np.int64]:
    """Sizes of ``parts`` contiguous pieces of ``n`` items, larger first, differing by <= 1."""
    base, extra = divmod(n, parts)
    return base + (np.arange(parts) < extra).astype(np.int64)


class Placement:
    """Batches being assembled per bucket during one epoch of identical-bucket steps, as
    (rows, sizes) pieces. Here rows are manifest row numbers and the bulk of each bucket
    stays a view into the formed batches (no copy on the hot path); a subclass may keep
    other pieces (:class:`bucketing.plan_summary.SummaryPlacement`: runs of formed batches
    known by their figures) as long as its explicit rows concatenate and slice as arrays
    (of :attr:`row_dtype`)."""

    row_dtype: np.dtype[Any] = np.dtype(np.int64)

    def __init__(self, num_buckets: int, batches: Batches | None = None) -> None:
        self.num_buckets = num_buckets
        self.batches = batches
        self._formed_sizes = None if batches is None else batches.sizes()
        self.rows: list[list[Any]] = [[] for _ in range(num_buckets)]
        self.sizes: list[list[npt.NDArray[np.int64]]] = [[] for _ in range(num_buckets)]
        self.carried: list[list[npt.NDArray[Any]]] = [[] for _ in range(num_buckets)]
        self.fallbacks: list[dict[str, int]] = []
        self.dropped: list[npt.NDArray[Any]] = []
        self.resplit = 0

    def add(self, b: int, rows: Any, sizes: npt.NDArray[np.int64]) -> None:
        self.rows[b].append(rows)
        self.sizes[b].append(sizes)

    def formed_sizes(self) -> npt.NDArray[np.int64]:
        """Sizes of the formed batches (draw order, bucket after bucket)."""
        assert self._formed_sizes is not None
        return self._formed_sizes

    def formed_rows(self, lo: int, hi: int) -> npt.NDArray[Any]:
        """The rows of formed batches ``lo:hi``, explicit."""
        assert self.batches is not None
        off = self.batches.offsets
        return self.batches.rows[off[lo]:off[hi]]

    def add_formed(self, b: int, lo: int, hi: int) -> None:
        """Place formed batches ``lo:hi`` in bucket ``b`` as they are."""
        self.add(b, self.formed_rows(lo, hi), self.formed_sizes()[lo:hi])

    def piece_rows(self, piece: Any, sizes: npt.NDArray[np.int64], lo: int, hi: int) -> npt.NDArray[Any]:
        """The rows of batches ``lo:hi`` of a placed piece (``sizes`` its batches'), explicit."""
        return piece[int(sizes[:lo].sum()):int(sizes[:hi].sum())]

    def piece_head(self, piece: Any, sizes: npt.NDArray[np.int64], k: int) -> Any:
        """The piece of a placed piece's first ``k`` batches."""
        return self.piece_rows(piece, sizes, 0, k)

    def take_last(self, b: int, W: int) -> npt.NDArray[Any] | None:
        """Remove bucket ``b``'s last ``W`` placed batches (all, if fewer) and return their
        rows in order; None when it has none."""
        if not self.sizes[b]:
            return None
        taken = []
        need = W
        while need and self.sizes[b]:
            piece, sizes = self.rows[b].pop(), self.sizes[b].pop()
            k = int(sizes.shape[0])
            m = min(k, need)
            need -= m
            if m < k:
                self.add(b, self.piece_head(piece, sizes, k - m), sizes[:k - m])
            taken.append(self.piece_rows(piece, sizes, k - m, k))
        return taken[0] if len(taken) == 1 else np.concatenate(taken[::-1])

    def steps_per_bucket(self, W: int) -> npt.NDArray[np.int64]:
        return np.array([sum(int(s.shape[0]) for s in p) // W for p in self.sizes], dtype=np.int64)


def require_one_step(bucket_of_row: npt.ArrayLike, world_size: int) -> None:
    """:class:`PlanError` unless the allocated rows (bucket >= 0) give each of ``world_size``
    ranks at least one utterance: a check callers can make before any planning work."""
    check_one_step(int((np.asarray(bucket_of_row) >= 0).sum()), world_size)


def check_one_step(allocated: int, world_size: int) -> None:
    """:func:`require_one_step` from the number of allocated rows."""
    if allocated < world_size:
        raise PlanError(f"{allocated} utterances cannot fill one step of {world_size} ranks")


def plan_epoch(inputs: PlanInputs, world_size: int, seed: int, epoch: int,
               interleave: Interleave = "random", balance: float = 0.0, cost: CostModel | None = None,
               **grouping: object) -> EpochPlan:
    """Plan one epoch (see the module docstring for the algorithm and invariants).

    Batches are formed from ``inputs`` (durations and tokens) exactly as production does;
    ``grouping`` passes :func:`bucketing.batching.form_batches`'s window / sort options.
    ``balance`` > 0: balanced steps within that relative tolerance of predicted time
    (``cost``, default :class:`CostModel`); 0: every step in one bucket.
    """
    W = int(world_size)
    if W < 1:
        raise PlanError(f"world size must be >= 1, got {world_size}")
    bucket_of_row = np.asarray(inputs.bucket_of_row)
    batch_sizes = np.asarray(inputs.batch_sizes, dtype=np.int64)
    B = int(batch_sizes.shape[0])
    if (batch_sizes < 1).any():
        raise PlanError("every bucket needs a batch size >= 1")
    require_one_step(bucket_of_row if inputs.rows is None else bucket_of_row[inputs.rows], W)
    if balance < 0:
        raise PlanError(f"balance tolerance must be >= 0, got {balance}")
    if interleave not in ("random", "ascending"):
        raise PlanError(f"unknown interleave {interleave!r} (expected 'random' or 'ascending')")
    contains = containment(inputs.max_duration, inputs.max_tokens, B)
    def formed(world: int | None) -> Batches:
        return form_batches(bucket_of_row, batch_sizes, np.random.default_rng([seed, epoch, 0]),
                            num_tokens=inputs.num_tokens, duration=inputs.durations, rows=inputs.rows,
                            world_size=world, **grouping)

    if balance > 0:
        balanced = _plan_balanced(inputs, formed(W), W, seed, epoch, interleave, balance, cost or CostModel())
        if balanced is not None:
            return balanced
    batches = formed(None)
    counts = np.bincount(batches.bucket, minlength=B)
    first_batch = np.zeros(B + 1, dtype=np.int64)
    np.cumsum(counts, out=first_batch[1:])
    placed = Placement(B, batches)
    for b in range(B):
        place_bucket(placed, b, int(first_batch[b]), int(first_batch[b + 1]), W, int(batch_sizes[b]), contains)
    seq, offsets, rows = _interleave(placed, W, seed, epoch, interleave)
    return _epoch_plan(epoch, W, seq, offsets, rows, inputs, placed)


def _plan_balanced(inputs: PlanInputs, batches: Batches, W: int, seed: int, epoch: int, interleave: Interleave,
                   tolerance: float, cost: CostModel) -> EpochPlan | None:
    """Balanced steps over the formed batches (:mod:`bucketing.balance`); None when the rows
    cannot fill whole steps that way (the caller falls back to identical-bucket steps)."""
    sizes = batches.sizes()
    longest, most_tokens = batch_extremes(batches.offsets, batches.rows, inputs.durations, inputs.num_tokens)
    times = cost.step_time(sizes, longest, most_tokens) if sizes.shape[0] else np.empty(0)
    steps = balance_steps(batches.bucket, batches.offsets, times, W, tolerance, cost.overhead, padded=sizes * longest)
    if steps is None:
        return None
    rng_steps = np.random.default_rng([seed, epoch, 1]) if interleave == "random" else None
    offsets, gather, bucket = layout(steps, W, rng_steps, np.random.default_rng([seed, epoch, 2]))
    by_step = bucket.reshape(W, steps.num_steps)
    step_bucket = np.where((by_step == by_step[:1]).all(0), by_step[0], -1)
    placed = Placement(int(np.asarray(inputs.batch_sizes).shape[0]))
    ep = _epoch_plan(epoch, W, step_bucket, offsets, batches.rows[gather], inputs, placed)
    t = cost.step_time(ep.sizes(), ep.max_duration, ep.max_tokens).reshape(W, -1)
    unbalanced = int((t.max(0) > (1 + tolerance) * t.mean(0)).sum())
    return dataclasses.replace(ep, batch_bucket=bucket, split_batches=steps.split_batches,
                               unbalanced_steps=unbalanced)


def tail_pool(sizes: npt.NDArray[np.int64], extra: int, W: int, bs: int) -> tuple[int, int] | None:
    """How a bucket's formed batches (``sizes``, in draw order) and ``extra`` rows carried into
    it fill whole steps of ``W``: ``(keep, parts)``, its first ``keep`` batches placed as formed
    and the rest pooled with the carried rows, re-split into ``parts`` (a multiple of ``W``,
    0: nothing pooled) near-equal batches of at most ``bs``; the pool is the tail with the
    fewest previous full steps that fills. None: the rows after its whole steps cannot fill a
    step (carried, borrowed or dropped)."""
    n = int(sizes.shape[0])
    f, t = divmod(n, W)
    if t == 0 and extra == 0:
        return n, 0
    tail_rows = int(sizes[f * W:].sum()) + extra
    step_rows = np.zeros(f + 1, dtype=np.int64)
    if f:
        per_step = np.add.reduceat(sizes[:f * W], np.arange(0, f * W, W))
        step_rows[1:] = np.cumsum(per_step[::-1])
    pool = tail_rows + step_rows
    j = -(-pool // (W * bs))
    ok = np.flatnonzero(j * W <= pool)
    if not ok.shape[0]:
        return None
    g = int(ok[0])
    return (f - g) * W, int(j[g]) * W


def place_bucket(placed: Placement, b: int, lo: int, hi: int, W: int, bs: int,
                 contains: npt.NDArray[np.bool_]) -> None:
    """Place bucket ``b``'s formed batches ``lo:hi`` (plus rows carried into it) as whole
    steps of ``W`` batches: as formed, tail re-split, or carried / borrowed / dropped."""
    n = hi - lo
    extra = np.concatenate(placed.carried[b]) if placed.carried[b] else np.empty(0, dtype=placed.row_dtype)
    f = n // W
    pool = tail_pool(placed.formed_sizes()[lo:hi], extra.shape[0], W, bs)
    if pool is not None:
        keep, parts = lo + pool[0], pool[1]
        if keep > lo:
            placed.add_formed(b, lo, keep)
        if parts:
            pooled = np.concatenate([placed.formed_rows(keep, hi), extra])
            placed.add(b, pooled, even_split(pooled.shape[0], parts))
            placed.resplit += 1
        return
    # Cannot fill a step: keep the full steps, move the tail (with what was carried in).
    if f:
        placed.add_formed(b, lo, lo + f * W)
    leftover = np.concatenate([placed.formed_rows(lo + f * W, hi), extra])
    later = np.flatnonzero(contains[b + 1:, b]) + b + 1
    if later.shape[0]:
        to = int(later[0])
        placed.carried[to].append(leftover)
        placed.fallbacks.append({"kind": "carried", "from": b, "to": to, "rows": int(leftover.shape[0])})
        return
    _borrow_or_drop(placed, b, leftover, W, bs, contains)


def _borrow_or_drop(placed: Placement, b: int, leftover: npt.NDArray[Any], W: int, bs: int,
                    contains: npt.NDArray[np.bool_]) -> None:
    """No bucket contains ``b``: borrow whole steps from the largest bucket it contains
    until its rows fill steps; what still cannot be placed is dropped (listed)."""
    for src in (np.flatnonzero(contains[b, :b])[::-1]):
        src = int(src)
        while (taken := placed.take_last(src, W)) is not None:
            placed.fallbacks.append({"kind": "borrowed", "from": src, "to": b, "rows": int(taken.shape[0])})
            leftover = np.concatenate([leftover, taken])
            jj = -(-leftover.shape[0] // (W * bs))
            if jj * W <= leftover.shape[0]:
                placed.add(b, leftover, even_split(leftover.shape[0], jj * W))
                return
    # Place as many whole steps as capacity allows; only fewer than W rows (or what
    # exceeds W * bs per step) are dropped, never the rows that fit.
    steps = leftover.shape[0] // W
    if steps:
        fit = min(int(leftover.shape[0]), steps * W * bs)
        placed.add(b, leftover[:fit], even_split(fit, steps * W))
        leftover = leftover[fit:]
    if leftover.shape[0]:
        placed.dropped.append(leftover)
        placed.fallbacks.append({"kind": "dropped", "from": b, "to": -1, "rows": int(leftover.shape[0])})


def interleave_order(steps_per_bucket: npt.NDArray[np.int64], W: int, seed: int, epoch: int,
                     interleave: Interleave) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The order of identical-bucket steps (random or ascending; a bucket's steps keep their
    order) and of their batches, rank-major: (bucket per step, the batch of the bucket-after-
    bucket concatenation, ``c * W + r`` for its ``c``-th step and rank ``r``, at each rank-major
    position)."""
    labels = np.repeat(np.arange(steps_per_bucket.shape[0], dtype=np.int32), steps_per_bucket)
    S = int(labels.shape[0])
    if interleave == "random":
        seq = np.random.default_rng([seed, epoch, 1]).permutation(labels)
    elif interleave == "ascending":
        seq = labels
    else:
        raise PlanError(f"unknown interleave {interleave!r} (expected 'random' or 'ascending')")
    # The c-th bucket step goes to position pos[c]; a bucket's steps keep their order.
    pos = np.argsort(seq, kind="stable")
    c_idx = np.repeat(np.arange(S, dtype=np.int64), W)
    r_idx = np.tile(np.arange(W, dtype=np.int64), S)
    order = np.empty(S * W, dtype=np.int64)
    order[r_idx * S + pos[c_idx]] = np.arange(S * W, dtype=np.int64)  # rank-major: (c, r) -> r*S + pos[c]
    return seq, order


def _interleave(placed: Placement, W: int, seed: int, epoch: int,
                interleave: Interleave) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Order the buckets' steps (random or ascending) and lay batches out rank-major:
    (bucket per step, CSR offsets, manifest rows)."""
    rows_cat = np.concatenate([r for p in placed.rows for r in p]) if any(placed.rows) else np.empty(0, np.int64)
    sizes_cat = np.concatenate([s for p in placed.sizes for s in p]) if any(placed.sizes) else np.empty(0, np.int64)
    seq, order = interleave_order(placed.steps_per_bucket(W), W, seed, epoch, interleave)
    S = int(seq.shape[0])
    off_cat = np.zeros(S * W + 1, dtype=np.int64)
    np.cumsum(sizes_cat, out=off_cat[1:])
    offsets, gather = gather_segments(off_cat, order)
    return seq, offsets, rows_cat[gather]


def _epoch_plan(epoch: int, W: int, seq: npt.NDArray[np.int64], offsets: npt.NDArray[np.int64],
                rows: npt.NDArray[np.int64], inputs: PlanInputs, placed: Placement) -> EpochPlan:
    """The epoch's plan with per-batch maxima and the real sums (one gather each)."""
    S = int(seq.shape[0])
    starts = offsets[:-1]
    dr = np.asarray(inputs.durations, dtype=np.float64)[rows]
    max_d = np.maximum.reduceat(dr, starts) if S else np.empty(0)
    real_seconds = float(np.add.reduceat(dr, starts).sum()) if S else 0.0  # batch sums, then over batches
    del dr
    tr = np.asarray(inputs.num_tokens, dtype=np.int64)[rows]
    max_t = np.maximum.reduceat(tr, starts) if S else np.empty(0, np.int64)
    real_tokens = int(tr.sum())
    del tr
    return EpochPlan(
        epoch=epoch, world_size=W, step_bucket=seq.astype(np.int32), offsets=offsets, rows=rows,
        max_duration=max_d, max_tokens=max_t,
        dropped=np.sort(np.concatenate(placed.dropped)) if placed.dropped else np.empty(0, dtype=np.int64),
        fallbacks=placed.fallbacks, resplit_buckets=placed.resplit,
        real_seconds=real_seconds, real_tokens=real_tokens,
    )
