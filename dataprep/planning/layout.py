"""An epoch laid out from a spilled corpus (:class:`EpochLayout`): each bucket's rows ordered
into batches in parts of whole windows (:meth:`bucketing.bucket_order.BucketGrouping.order_chunks`,
the rng draws of :func:`bucketing.plan.plan_epoch` in its order), laid out with their ids in
the epoch's position columns, per-batch figures taken on the way; then balanced steps
(:func:`balanced_or_none`: :func:`bucketing.balance.balance_steps`, ``layout_order``,
``group_order``) or one bucket per step (:func:`plan_epoch_identical_spilled`,
:mod:`bucketing.plan_summary`) from the per-batch figures alone. Memory: the bucket being
ordered plus per-batch arrays (:func:`.spill.planning_bytes`). Reports that need a plan's
figures, not its shards, use :func:`plan_epoch_figures`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from bucketing.balance import BalancedSteps, balance_steps, layout_order
from bucketing.batching import Cut, cut_batches, even_batch_counts, even_batch_starts, gather_segments, run_positions
from bucketing.bucket_order import BucketGrouping
from bucketing.costmodel import CostModel
from bucketing.padding import group_padding
from bucketing.fit import Grid
from bucketing.groups import group_order, regroup
from bucketing.plan import EpochPlan, Interleave, check_one_step
from bucketing.plan_summary import ROW_DTYPE, BatchSources, FormedBatches, plan_identical_layout
from bucketing.quota import window_order
from bucketing.speeds import RankSpeeds, slot_shares, speed_batches, speed_rank_order, speed_steps
from dataprep.planning.draw import EpochDraw, drawn_entries
from dataprep.planning.spill import SpilledCorpus
from manifests.errors import DataprepError
from manifests.spill import SpillFiles, record_dtype

#: Rows of a bucket ordered at once (:meth:`bucketing.bucket_order.BucketGrouping.order_chunks`,
#: rounded to whole windows): sort keys and 2D candidates of a part, about 150 bytes a row.
ORDER_ROWS = 1 << 19


@dataclass(frozen=True)
class EpochLayout:
    """One out-of-core epoch: the plan's per-batch figures (``ep``, whose ``rows`` is empty)
    and where each rank-major batch's rows lie in the epoch's position files."""

    ep: EpochPlan
    start: npt.NDArray[np.int64]  # first position of each rank-major batch
    size: npt.NDArray[np.int64]
    groups: npt.NDArray[np.int64] | None = None  # weighted: bucketing.padding.group_padding per corpus
    #: one bucket per step: (CSR offsets, positions) of the batches whose ``start`` is -1
    explicit: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] | None = None
    #: weight windows: each window's largest gap from the target shares (bucketing.quota.window_deviation)
    windows: npt.NDArray[np.float64] | None = None


@dataclass(frozen=True)
class _Formed:
    """An epoch's batches formed from the spill files (cut order, :class:`bucketing.batching.Cut`)
    and their figures: longest, sums of durations, most tokens, sums of tokens."""

    cut: Cut
    max_d: npt.NDArray[np.float64]
    sum_d: npt.NDArray[np.float64]
    max_t: npt.NDArray[np.int64]
    sum_t: npt.NDArray[np.int64]
    counts: npt.NDArray[np.int64]  # entries per bucket
    groups: npt.NDArray[np.int64] | None = None  # weighted: bucketing.padding.group_padding per corpus
    klass: npt.NDArray[np.int64] | None = None  # rank speeds: each batch's speed class (cut order)
    mix: npt.NDArray[np.int32] | None = None  # weight windows: (batches, corpora) utterances (cut order)


#: What an out-of-core plan measures per batch beside its figures (dynamic resolution:
#: :meth:`dataprep.planning.epochs.DynResTotals.add_batches`): durations (s) in CSR offsets,
#: each batch's longest and bucket, and +1 to add them or -1 to take them away.
BatchMeasure = Callable[[npt.NDArray[np.float64], npt.NDArray[np.int64], npt.NDArray[np.float64],
                         npt.NDArray[np.int64], int], None]


def _form_spilled(corpus: SpilledCorpus, bs: npt.NDArray[np.int64], W: int | None, rng: np.random.Generator,
                  final: bool, draw: EpochDraw | None = None, measure: BatchMeasure | None = None,
                  speeds: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]] | None = None,
                  mix: bool = False) -> _Formed:
    """Each bucket's rows ordered into batches and laid out in the epoch's position files
    (rows beside ids, or rows alone when the corpus has no ids), the figures of each batch
    taken on the way; batches then drawn (:func:`bucketing.batching.cut_batches`). ``W``:
    near-equal batches filling whole steps (balanced); None: full batches and a short last
    one (:func:`bucketing.batching.form_batches` with no world size). ``draw``: a weighted
    epoch's entries instead of every row once, and the per-corpus totals of its batches.
    ``measure``: called on each part's formed batches. ``speeds``: rank speeds'
    :func:`bucketing.speeds.speed_batches` (batches per bucket, sizes, classes) instead of
    near-equal batches. ``mix``: count each batch's utterances per corpus (a weighted epoch)."""
    files = corpus.files
    files.remove("pos.rec", "pos.data", "pos.rows")
    if draw is None:
        grouping = BucketGrouping("both").with_totals(corpus.total_d, corpus.total_t)
        counts = corpus.counts
    else:
        grouping = BucketGrouping("both").with_totals(draw.total_d, draw.total_t)
        counts = draw.counts
    _reserve_positions(corpus, files, int(counts.sum()))
    C = draw.num_corpora if draw is not None and corpus.has_codes else 0
    groups = np.zeros((5, C), np.int64) if C else None
    if speeds is not None:
        nb, speed_sizes = speeds[0], speeds[1]
        starts_in_bucket = np.cumsum(speed_sizes) - speed_sizes - np.repeat(np.cumsum(counts) - counts, nb)
    elif W is not None:
        nb = even_batch_counts(counts, bs, W)  # near-equal batches filling whole steps (as plan_epoch)
        starts_in_bucket = even_batch_starts(counts, nb)  # a bucket's k-th batch starts at k q + min(k, r)
    else:
        nb = -(-counts // bs)
        starts_in_bucket = (np.arange(int(nb.sum())) - np.repeat(np.cumsum(nb) - nb, nb)) * np.repeat(bs, nb)
    # per batch (cut order: bucket after bucket): longest, most tokens, sums, filled while each bucket is ordered
    n_cut = int(nb.sum())
    mixes = np.zeros((n_cut, C), np.int32) if mix and groups is not None else None
    mx_d, sm_d = np.empty(n_cut), np.empty(n_cut)
    mx_t, sm_t = np.empty(n_cut, np.int64), np.empty(n_cut, np.int64)
    at = 0
    for k in np.flatnonzero(counts):
        cnt, size = int(counts[k]), int(bs[k])
        first = starts_in_bucket[at:at + int(nb[k])]  # the bucket's batch starts (as cut_batches)
        d, t = corpus.column(int(k), "d", np.float64), corpus.column(int(k), "t", np.int32)
        entries = None if draw is None else drawn_entries(corpus, int(k))
        if entries is not None:
            d, t = d[entries], t[entries]
        c = None if entries is None or groups is None else corpus.column(int(k), "c", np.int32)[entries]
        parts = []
        pos = 0
        if corpus.blocks is None:
            chunks = grouping.order_chunks(cnt, size, rng, d, t, ORDER_ROWS, batches=None if W is None else int(nb[k]))
        else:  # one part: the bucket in blocks of containers
            rows_k = corpus.column(int(k), "rows", corpus.row_dtype)
            chunks = iter([corpus.blocks.order(rows_k if entries is None else rows_k[entries], d, rng)])
        for p in chunks:
            dk, tk32 = d[p], t[p]
            tk = tk32.astype(np.int64)
            loc = first[np.searchsorted(first, pos):np.searchsorted(first, pos + p.shape[0])] - pos
            sl = slice(at, at + loc.shape[0])
            mx_d[sl], sm_d[sl] = np.maximum.reduceat(dk, loc), np.add.reduceat(dk, loc)
            mx_t[sl], sm_t[sl] = np.maximum.reduceat(tk, loc), np.add.reduceat(tk, loc)
            if groups is not None and c is not None:
                groups += group_padding(np.arange(p.shape[0]), np.diff(np.append(loc, p.shape[0])), mx_d[sl],
                                        mx_t[sl], dk, tk, c[p], C)
            if measure is not None:
                measure(dk, np.append(loc, p.shape[0]), mx_d[sl], np.full(loc.shape[0], k, np.int64), 1)
            if mixes is not None and c is not None:
                bi = np.repeat(np.arange(loc.shape[0]), np.diff(np.append(loc, p.shape[0])))
                mixes[sl] = np.bincount(bi * C + c[p], minlength=loc.shape[0] * C).reshape(-1, C)
            pos += p.shape[0]
            at += loc.shape[0]
            parts.append(p)
        del d, t, c
        p = parts[0] if len(parts) == 1 else np.concatenate(parts)
        del parts
        if entries is not None:
            p = entries[p]  # positions into the bucket's columns
        del entries
        rows = corpus.column(int(k), "rows", corpus.row_dtype)
        if not corpus.has_ids:
            files.append("pos.rows", rows[p])
            continue
        # each row beside its id: a batch is two reads, not three
        # (the ids first: the gather runs to its end, its scratch file removed)
        for ids, a in zip(corpus.ids_in_parts(int(k), p, ORDER_ROWS, drop=final), range(0, cnt, ORDER_ROWS)):
            files.append_records("pos", rows[p[a:a + ORDER_ROWS]], ids)
        del rows, p
    files.close()
    if speeds is not None:  # as cut_batches with batch counts: each bucket's batches drawn at random
        bb = np.repeat(np.arange(nb.shape[0], dtype=np.int64), nb)
        starts = (np.cumsum(counts) - counts)[bb] + starts_in_bucket
        perm = np.lexsort((rng.random(bb.shape[0]), bb))
        cut = Cut(starts, speeds[1], perm, bb[perm].astype(np.int32))
        return _Formed(cut, mx_d, sm_d, mx_t, sm_t, counts, groups, speeds[2], mixes)
    cut = cut_batches(counts, bs, rng, batch_counts=None if W is None else nb)
    return _Formed(cut, mx_d, sm_d, mx_t, sm_t, counts, groups, mix=mixes)


def _reserve_positions(corpus: SpilledCorpus, files: SpillFiles, entries: int) -> None:
    """In memory, room for the epoch's position columns of ``entries`` rows in one buffer each
    (no copy when they are read whole): the records exactly, the id bytes at the spill's mean
    length plus a tenth (a column that outgrows its room goes on in chunks)."""
    if not files.in_memory:
        return
    key = np.dtype(corpus.row_dtype)
    if not corpus.has_ids:
        files.reserve("pos.rows", entries * key.itemsize)
        return
    files.reserve("pos.rec", (entries + 1) * record_dtype(key).itemsize)
    live = np.flatnonzero(corpus.counts).tolist()
    ids = sum(files.count_strings(f"b{k}.ids") for k in live)
    data = sum(files.read(f"b{k}.ids.off", np.int64)[-1:].sum() for k in live)
    files.reserve("pos.data", int(entries * data / max(ids, 1) * 1.1) + (1 << 16))


def _position_rows(corpus: SpilledCorpus, starts: npt.NDArray[np.int64],
                   sizes: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The rows at positions ``starts[i] : starts[i] + sizes[i]`` of the epoch's position files."""
    files = corpus.files
    if corpus.has_ids:
        rows = files.read_runs("pos.rec", record_dtype(np.dtype(corpus.row_dtype)), starts, sizes)["key"]
    else:
        rows = files.read_runs("pos.rows", corpus.row_dtype, starts, sizes)
    return rows.astype(np.int64)


def balanced_or_none(corpus: SpilledCorpus, bs: npt.NDArray[np.int64], W: int, seed: int, epoch: int, *,
                     interleave: str, tolerance: float, cost: CostModel, group: int,
                     final: bool = False, draw: EpochDraw | None = None,
                     measure: BatchMeasure | None = None, speeds: RankSpeeds | None = None,
                     full_cost: npt.NDArray[np.float64] | None = None,
                     window: int | None = None) -> EpochLayout | None:
    """:func:`bucketing.plan.plan_epoch` (balanced) then
    :func:`bucketing.groups.regroup`, from the spill files and per-batch arrays; None where the
    rows cannot fill whole balanced steps (the caller lays the epoch out one bucket per step).
    ``final``: no later epoch reads the ids, so a spill on disk removes each bucket's id files
    once laid out (the page cache they held is reused for the position files instead of fresh
    memory; a spill in memory keeps them); such an epoch that cannot be balanced is a one-line
    error. ``draw``: a weighted epoch (:func:`draw_epoch`), planned over its entries; the
    layout then carries the per-corpus totals (:attr:`EpochLayout.groups`). ``measure``:
    called on the epoch's batches as laid out (formed ones, then the pieces steps cut: the
    formed batch taken away, each piece added). ``speeds``: ranks of different speeds
    (:mod:`bucketing.speeds`): batches sized by each rank's speed, a step's batches dealt by
    predicted time ÷ speed; ``full_cost``: each bucket's full batch's predicted time (s), which
    sizes a slow rank's batch so its time, overhead included, scales with its speed. ``window``:
    a weighted epoch's steps ordered so every ``window`` consecutive ones hold each corpus
    near its share of the epoch (:func:`bucketing.quota.window_order`; the gaps in
    :attr:`EpochLayout.windows`)."""
    drop = final and corpus.memory is None
    lay = _balanced_spilled(corpus, bs, W, seed, epoch, interleave=interleave, tolerance=tolerance, cost=cost,
                            group=group, final=drop, draw=draw, measure=measure, speeds=speeds,
                            full_cost=full_cost, window=window)
    if lay is None and drop:
        raise DataprepError(f"the rows cannot fill whole balanced steps of {W} ranks out of core "
                            "(fewer utterances than steps x ranks); plan with a larger --memory-limit")
    return lay


class _Stash:
    """Per-batch arrays set aside on disk (:class:`manifests.spill.SpillFiles` ``{prefix}{name}``
    under ``root``) while others need the memory."""

    def __init__(self, files: SpillFiles, prefix: str) -> None:
        self.files, self.prefix = files, prefix
        self.kinds: dict[str, np.dtype[Any]] = {}

    def put(self, **arrays: npt.NDArray[Any]) -> None:
        for name, a in arrays.items():
            self.kinds[name] = a.dtype
            self.files.append(self.prefix + name, a)
        self.files.close()

    def take(self, *names: str) -> list[npt.NDArray[Any]]:
        """The arrays ``names``, read back; their files removed."""
        out = [self.files.read(self.prefix + n, self.kinds[n]) for n in names]
        self.files.remove(*(self.prefix + n for n in names))
        for n in names:
            del self.kinds[n]
        return out

    def drop(self) -> None:
        self.files.remove(*(self.prefix + n for n in self.kinds))
        self.kinds.clear()


def _balanced_spilled(corpus: SpilledCorpus, bs: npt.NDArray[np.int64], W: int, seed: int, epoch: int, *,
                      interleave: str, tolerance: float, cost: CostModel, group: int,
                      final: bool = False, draw: EpochDraw | None = None,
                      measure: BatchMeasure | None = None, speeds: RankSpeeds | None = None,
                      full_cost: npt.NDArray[np.float64] | None = None,
                      window: int | None = None) -> EpochLayout | None:
    """:func:`balanced_or_none` (``final``: remove each bucket's ids once laid out)."""
    counts = corpus.counts if draw is None else draw.counts
    if int(counts.sum()) < W:
        raise DataprepError(f"{int(counts.sum())} utterances cannot fill one step of {W} ranks")
    rng = np.random.default_rng([seed, epoch, 0])
    sized = None if speeds is None else speed_batches(
        counts, bs, speeds, None if full_cost is None else slot_shares(speeds, full_cost, cost.overhead))
    if speeds is not None and sized is None:
        return None
    # per batch, each stage's arrays are freed once the next has what it needs (at a billion
    # rows an epoch has ~20M batches: every 8-byte array held is ~160 MB)
    formed = _form_spilled(corpus, bs, W, rng, final, draw, measure, sized, mix=window is not None)
    del sized
    groups, bucket, perm = formed.groups, formed.cut.bucket, formed.cut.perm
    klass = None if formed.klass is None else formed.klass[perm]
    mix = None if formed.mix is None else formed.mix[perm]
    sizes, start = formed.cut.sizes[perm], formed.cut.starts[perm]
    mx_d, mx_t, sm_d, sm_t = formed.max_d[perm], formed.max_t[perm], formed.sum_d[perm], formed.sum_t[perm]
    del formed, perm
    off = np.zeros(sizes.shape[0] + 1, dtype=np.int64)
    np.cumsum(sizes, out=off[1:])
    times, padded = cost.step_time(sizes, mx_d, mx_t), sizes * mx_d
    # what the steps are laid out by is in memory; the rest waits on disk (40 bytes a batch)
    stash = _Stash(corpus.files, "layout.")
    stash.put(start=start, mx_d=mx_d, mx_t=mx_t, sm_d=sm_d, sm_t=sm_t)
    del start, mx_d, mx_t, sm_d, sm_t
    if speeds is None or klass is None:
        steps = balance_steps(bucket, off, times, W, tolerance, cost.overhead, padded=padded)
    else:
        seg_step, S = speed_steps(klass, times, speeds)
        steps = BalancedSteps(off, seg_step, bucket.astype(np.int32), S, 0)
    del times, padded
    if steps is None:
        stash.drop()
        return None
    start, mx_d, mx_t, sm_d, sm_t = stash.take("start", "mx_d", "mx_t", "sm_d", "sm_t")
    seg_size = np.diff(steps.seg_offsets)
    if seg_size.shape[0] == sizes.shape[0]:  # no batch cut into pieces: the segments are the batches
        parent = None
        seg_start, s_mx_d, s_mx_t, s_sm_d, s_sm_t = start, mx_d, mx_t, sm_d, sm_t
        pieces = np.empty(0, np.int64)
    else:
        seg_lo = steps.seg_offsets[:-1]
        parent = np.searchsorted(off, seg_lo, side="right") - 1
        seg_start = start[parent] + (seg_lo - off[parent])
        s_mx_d, s_mx_t, s_sm_d, s_sm_t = mx_d[parent], mx_t[parent], sm_d[parent], sm_t[parent]
        pieces = np.flatnonzero(seg_size != sizes[parent])
        mix = None if mix is None else mix[parent]
        del seg_lo
    del start, sm_d, sm_t, off, sizes
    split: dict[int, list[npt.NDArray[np.float64]]] = {}  # formed batch -> its pieces' durations
    if pieces.shape[0]:
        for i in pieces:  # the few batches cut into pieces (at most one step's worth)
            piece_rows = _position_rows(corpus, seg_start[i:i + 1], seg_size[i:i + 1])
            dk, tk32, *ck = corpus.lookup_columns(int(steps.seg_bucket[i]), piece_rows,
                                                  ("d", "t", "c") if groups is not None else ("d", "t"))
            tk = tk32.astype(np.int64)
            if mix is not None:
                mix[i] = np.bincount(ck[0], minlength=mix.shape[1])
            s_mx_d[i], s_mx_t[i] = dk.max(), tk.max()
            s_sm_d[i], s_sm_t[i] = np.add.reduceat(dk, [0])[0], tk.sum()
            if groups is not None:  # the piece's rows pad to its own longest, not the formed batch's
                one, C = np.arange(dk.shape[0]), groups.shape[1]
                groups += group_padding(one, seg_size[i:i + 1], s_mx_d[i:i + 1], s_mx_t[i:i + 1], dk, tk, ck[0], C)
                groups -= group_padding(one, seg_size[i:i + 1], mx_d[parent[i]:parent[i] + 1],
                                        mx_t[parent[i]:parent[i] + 1], dk, tk, ck[0], C)
            if measure is not None:
                one_batch = np.array([0, dk.shape[0]])
                measure(dk, one_batch, s_mx_d[i:i + 1], steps.seg_bucket[i:i + 1].astype(np.int64), 1)
                split.setdefault(int(parent[i]), []).append(dk)
    for j, parts in split.items():  # each formed batch cut into pieces, as it was measured: taken away
        dk = np.concatenate(parts)
        measure(dk, np.array([0, dk.shape[0]]), mx_d[j:j + 1], bucket[j:j + 1].astype(np.int64), -1)  # type: ignore[misc]
    del mx_d, mx_t, bucket, parent
    pos = windows = None
    if mix is not None:  # weight windows: the steps' order by their corpus mix
        step_mix = np.stack([np.bincount(steps.seg_step, weights=mix[:, j], minlength=steps.num_steps)
                             for j in range(mix.shape[1])], axis=1).astype(np.int64)
        pos, windows = window_order(step_mix, step_mix.sum(0) / max(int(step_mix.sum()), 1), int(window or 1),
                                    np.random.default_rng([seed, epoch, 3]))
        del step_mix, mix
    rng_steps = np.random.default_rng([seed, epoch, 1]) if interleave == "random" else None
    rng_ranks = np.random.default_rng([seed, epoch, 2])
    order = layout_order(steps, W, rng_steps, rng_ranks, None if speeds is None or klass is None else
                         speed_rank_order(steps.seg_step, klass, speeds, steps.num_steps, rng_ranks), pos)
    del klass
    # rank-major batches
    real_seconds, real_tokens = float(s_sm_d[order].sum()), int(s_sm_t.sum())
    del s_sm_d, s_sm_t
    f_start, f_size = seg_start[order], seg_size[order]
    del seg_start, seg_size
    f_bucket = steps.seg_bucket[order]
    f_mx_d, f_mx_t = s_mx_d[order], s_mx_t[order]
    del s_mx_d, s_mx_t, order
    t = cost.step_time(f_size, f_mx_d, f_mx_t).reshape(W, -1)  # counted before sync groups reorder steps
    if speeds is not None:
        t /= speeds.rank_speed()[:, None]  # each rank's time at its speed
    unbalanced = int((t.max(0) > (1 + tolerance) * t.mean(0)).sum())
    del t
    regroup = group_order(W, steps.num_steps, group, seed, epoch)
    if regroup is not None:
        f_start, f_size, f_bucket = f_start[regroup], f_size[regroup], f_bucket[regroup]
        f_mx_d, f_mx_t = f_mx_d[regroup], f_mx_t[regroup]
    offsets = np.zeros(f_size.shape[0] + 1, dtype=np.int64)
    np.cumsum(f_size, out=offsets[1:])
    by_step = f_bucket.reshape(W, steps.num_steps)
    step_bucket = np.where((by_step == by_step[:1]).all(0), by_step[0], -1).astype(np.int32)
    ep = EpochPlan(epoch=epoch, world_size=W, step_bucket=step_bucket, offsets=offsets,
                   rows=np.empty(0, np.int64), max_duration=f_mx_d, max_tokens=f_mx_t,
                   dropped=np.empty(0, np.int64), real_seconds=real_seconds, real_tokens=real_tokens,
                   batch_bucket=f_bucket.astype(np.int32), split_batches=steps.split_batches,
                   unbalanced_steps=unbalanced)
    return EpochLayout(ep, f_start, f_size, groups, windows=windows)


def plan_epoch_figures(corpus: SpilledCorpus, grid: Grid, bs: npt.NDArray[np.int64], W: int, seed: int, epoch: int,
                       *, tolerance: float, cost: CostModel, interleave: Interleave = "random") -> EpochPlan:
    """:func:`bucketing.plan.plan_epoch` of a spilled corpus (``grid`` its buckets), per-batch
    figures only: its :class:`~bucketing.plan.EpochPlan` without rows, for reports (no shards,
    position files of rows alone when the corpus has no ids). ``tolerance`` > 0: balanced
    steps, falling back as in memory to one bucket per step where the rows cannot fill whole
    balanced steps; 0: one bucket per step (:func:`bucketing.plan_summary.plan_identical_summaries`,
    which reads the rows of the few pooled, carried or borrowed tails back)."""
    check_one_step(int(corpus.counts.sum()), W)
    if tolerance > 0:
        lay = _balanced_spilled(corpus, bs, W, seed, epoch, interleave=interleave, tolerance=tolerance, cost=cost,
                                group=W)
        if lay is not None:
            return lay.ep
    return _identical_spilled(corpus, grid, bs, W, seed, epoch, interleave=interleave, final=False)[0]


def _identical_spilled(corpus: SpilledCorpus, grid: Grid, bs: npt.NDArray[np.int64], W: int, seed: int, epoch: int,
                       *, interleave: Interleave, final: bool, draw: EpochDraw | None = None,
                       measure: BatchMeasure | None = None
                       ) -> tuple[EpochPlan, BatchSources, npt.NDArray[np.int64], npt.NDArray[np.int64] | None]:
    """One bucket per step (``balance`` 0) from the spill files: the plan without rows, where
    each batch's rows are, the formed batches' first positions (draw order) and, weighted,
    the per-corpus totals. ``draw``: the epoch's entries (:class:`EpochDraw`) instead of every
    row once; ``measure``: called on the plan's batches (formed ones as they are formed; a
    formed batch whose rows went into tails taken away, each tail batch added)."""
    formed = _form_spilled(corpus, bs, None, np.random.default_rng([seed, epoch, 0]), final=final, draw=draw,
                           measure=measure)
    cut = formed.cut
    perm = cut.perm
    starts, sizes = cut.starts[perm], cut.sizes[perm]
    batches = FormedBatches(cut.bucket, sizes, formed.max_d[perm], formed.max_t[perm], formed.sum_d[perm],
                            formed.sum_t[perm])

    def read_rows(lo: int, hi: int) -> npt.NDArray[Any]:  # formed batches lo:hi, all of one bucket
        rows = _position_rows(corpus, starts[lo:hi], sizes[lo:hi])
        out = np.empty(rows.shape[0], ROW_DTYPE)
        out["row"] = rows
        got = corpus.lookup_columns(int(cut.bucket[lo]), rows, ("d", "t", "c") if corpus.has_codes else ("d", "t"))
        out["d"], out["t"] = got[0], got[1]
        out["c"] = got[2] if corpus.has_codes else 0
        out["pos"] = run_positions(starts[lo:hi], sizes[lo:hi])
        return out

    ep, sources = plan_identical_layout(batches, bs, W, seed, epoch, read_rows, max_duration=grid.max_duration,
                                        max_tokens=corpus.max_tokens.astype(np.float64), interleave=interleave)
    groups = formed.groups
    if groups is not None or measure is not None:  # formed batches not laid out whole: their tails instead
        used = np.zeros(sizes.shape[0], dtype=bool)
        used[sources.formed[sources.formed >= 0]] = True
        for j in np.flatnonzero(~used).tolist():
            got = read_rows(j, j + 1)
            _measure_batches(got, np.array([0, got.shape[0]]), batches.max_duration[j:j + 1],
                             batches.max_tokens[j:j + 1], cut.bucket[j:j + 1], -1, groups, measure)
        tails = np.flatnonzero(sources.formed < 0)
        off, gather = gather_segments(sources.off, tails)
        _measure_batches(sources.records[gather], off, ep.max_duration[tails], ep.max_tokens[tails],
                         ep.bucket_of_batch()[tails], 1, groups, measure)
    return ep, sources, starts, groups


def _measure_batches(records: npt.NDArray[Any], off: npt.NDArray[np.int64], longest: npt.NDArray[np.float64],
                     most: npt.NDArray[np.int64], bucket: npt.NDArray[np.integer], sign: int,
                     groups: npt.NDArray[np.int64] | None, measure: BatchMeasure | None) -> None:
    """Add (``sign`` 1) or take away (-1) batches of :data:`~bucketing.plan_summary.ROW_DTYPE`
    records in CSR ``off`` to the per-corpus ``groups`` and ``measure``."""
    if off.shape[0] < 2:
        return
    d, t = np.ascontiguousarray(records["d"]), np.ascontiguousarray(records["t"])
    if groups is not None:
        got = group_padding(np.arange(d.shape[0]), np.diff(off), longest, most, d, t, records["c"], groups.shape[1])
        groups += sign * got
    if measure is not None:
        measure(d, off, longest, np.asarray(bucket, dtype=np.int64), sign)


def plan_epoch_identical_spilled(corpus: SpilledCorpus, grid: Grid, bs: npt.NDArray[np.int64], W: int, seed: int,
                                 epoch: int, *, interleave: Interleave, group: int, final: bool = False,
                                 draw: EpochDraw | None = None, measure: BatchMeasure | None = None) -> EpochLayout:
    """:func:`bucketing.plan.plan_epoch` with ``balance`` 0 then
    :func:`bucketing.groups.regroup`, for shards: each batch a run of the position files or,
    for the few tails pooled, carried or borrowed, its rows' positions
    (:attr:`EpochLayout.explicit`)."""
    check_one_step(int((corpus.counts if draw is None else draw.counts).sum()), W)
    ep, sources, starts, groups = _identical_spilled(corpus, grid, bs, W, seed, epoch, interleave=interleave,
                                                     final=final, draw=draw, measure=measure)
    order = group_order(W, ep.num_steps, group, seed, epoch)
    if order is not None:
        ep, sources = regroup(ep, group, seed), sources.take(order)
    start = np.where(sources.formed >= 0, starts[np.maximum(sources.formed, 0)], -1)
    return EpochLayout(ep, start, ep.sizes(), groups, explicit=(sources.off, sources.pos))
