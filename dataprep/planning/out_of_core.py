"""Out-of-core planning: the same plan as :func:`dataprep.planning.build.build_plan` in memory
bounded by the largest bucket, not by the corpus.

1. One pass over the manifest in blocks of :data:`bucketing.batching.TOTALS_BLOCK` rows:
   allocate each block (:func:`bucketing.allocate.allocate` is row-wise), append every row's
   (row, duration, tokens) to its bucket's spill files and its id to a row-ordered id store.
2. Carry bucket tails bucket after bucket (:func:`bucketing.allocate.tail_moves`): one bucket
   and the few rows carried into it in memory.
3. Per epoch: each bucket's rows are ordered into batches
   (:class:`bucketing.batching.BucketGrouping`, the same rng draws in the same order) and
   appended to the epoch's position files; batches are cut and drawn per batch
   (:func:`bucketing.batching.cut_batches`); balanced steps are laid out from per-batch
   summaries (size, longest, most tokens, sums): :func:`bucketing.balance.balance_steps`,
   :func:`bucketing.balance.layout_order`, :func:`bucketing.groups.group_order`.
4. Shards are streamed rank by rank in parts of whole row groups: the rows of each part are
   read from the position files, their ids from the id store.

Memory: one bucket's rows (:data:`BUCKET_BYTES_PER_ROW` each) plus per-batch arrays
(:data:`BATCH_BYTES`) plus one part of a shard; the spill files take about 45 bytes per row
on disk (twice during an epoch). Balanced plans only (``balance > 0``) without dynamic
resolution; the plan equals the in-memory one (tests compare the shards byte for byte).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from bucketing.allocate import allocate, tail_moves
from bucketing.balance import balance_steps, layout_order
from bucketing.batching import TOTALS_BLOCK, BucketGrouping, block_totals, cut_batches, even_batch_counts
from bucketing.costmodel import CostModel
from bucketing.fit import Grid
from bucketing.groups import group_order
from bucketing.plan import EpochPlan
from manifests.errors import DataprepError, ManifestError
from manifests.io import iter_manifest
from manifests.plan_files import PlanWriter, shard_table
from manifests.spill import SpillFiles, default_memory_limit

#: Bytes of memory per row of the bucket being ordered (row, duration, tokens, the shuffle,
#: keys, the window grids, the gathered copies), measured with benchmarks/bench_plan.py.
BUCKET_BYTES_PER_ROW = 160
#: Bytes of memory per batch of an epoch (formed batches, segments, the layout, the totals).
BATCH_BYTES = 200
#: Bytes of memory per row that planning in memory takes (columns, ids, the epoch's arrays).
IN_MEMORY_BYTES_PER_ROW = 100
#: Rows of a shard written at once (rounded to whole row groups): each part maps the position
#: and id files only while it gathers, touching at most a few pages per row.
PART_ROWS = 1 << 16


@dataclass
class SpilledCorpus:
    """What the pass over the manifest leaves: per-bucket spill files, the id store, and the
    allocation's figures (the same as :class:`bucketing.allocate.Assignment`'s)."""

    root: Path
    num_rows: int = 0
    counts: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    dropped: dict[str, list[npt.NDArray[np.int64]]] = field(default_factory=dict)
    moved: int = 0
    raised: int = 0
    max_tokens: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    carried: int = 0
    total_d: float = 0.0
    total_t: float = 0.0

    @property
    def files(self) -> SpillFiles:
        return SpillFiles(self.root)

    def allocation_entry(self, strict: bool, carry: bool) -> dict[str, object]:
        """``plan.json``'s ``allocation`` (as :func:`dataprep.planning.build._plan_meta` writes it)."""
        return {
            "strict": strict,
            "allocated_rows": int(self.counts.sum()),
            "left_out": {k: np.concatenate(v).tolist() for k, v in sorted(self.dropped.items())},
            "moved_to_longer_bin": self.moved,
            "carried_tails": self.carried,
            "carry": carry,
            "raised_max_tokens_rows": self.raised,
        }

    def ids(self, rows: npt.NDArray[np.int64]) -> pa.Array:
        """The manifest ids of ``rows`` (any order, repeats allowed), as a string array."""
        off = SpillFiles(self.root).map("ids.off", np.int64)
        data = SpillFiles(self.root).map("ids.data", np.uint8)
        a, b = off[rows], off[rows + 1]
        lens = b - a
        new_off = np.zeros(rows.shape[0] + 1, dtype=np.int64)
        np.cumsum(lens, out=new_off[1:])
        idx = np.repeat(a - new_off[:-1], lens) + np.arange(int(new_off[-1]), dtype=np.int64)
        buf = np.asarray(data[idx]) if idx.shape[0] else np.empty(0, np.uint8)
        arr = pa.LargeStringArray.from_buffers(rows.shape[0], pa.py_buffer(new_off), pa.py_buffer(buf))
        return arr.cast(pa.string())


def spill_manifest(manifest: str | os.PathLike[str], grid: Grid, batch_sizes: npt.NDArray[np.int64], root: Path, *,
                   strict: bool, carry: bool, memory_limit: int) -> SpilledCorpus:
    """Steps 1 and 2 of the module docstring: allocate in blocks, spill by bucket, carry tails.
    A one-line error when one bucket cannot be planned within ``memory_limit`` bytes."""
    B = grid.num_buckets
    out = SpilledCorpus(root, counts=np.zeros(B, np.int64), max_tokens=grid.max_tokens.astype(np.int64).copy())
    files = SpillFiles(root)
    id_bytes = 0
    files.append("ids.off", np.zeros(1, np.int64))
    base = 0
    for table in iter_manifest(manifest, ["id", "duration", "num_tokens"], TOTALS_BLOCK):
        d = table.column("duration").to_numpy().astype(np.float64, copy=False)
        t = pc.fill_null(table.column("num_tokens"), 0).to_numpy().astype(np.int64)
        ids = table.column("id").cast(pa.large_string()).combine_chunks()
        ioff = np.frombuffer(ids.buffers()[1], dtype=np.int64)[ids.offset:ids.offset + len(ids) + 1]
        files.append("ids.data", np.frombuffer(ids.buffers()[2], dtype=np.uint8)[ioff[0]:ioff[-1]])
        files.append("ids.off", ioff[1:] - ioff[0] + id_bytes)
        id_bytes += int(ioff[-1] - ioff[0])
        alloc = allocate(d, t, grid, strict=strict)
        x, y = block_totals(d, t, alloc.bucket >= 0)
        out.total_d, out.total_t = out.total_d + x, out.total_t + y
        for reason, rows in alloc.dropped.items():
            out.dropped.setdefault(reason, []).append(rows + base)
        out.moved += alloc.moved
        out.raised += alloc.raised
        if alloc.max_tokens is not None:
            out.max_tokens = np.maximum(out.max_tokens, alloc.max_tokens)
        rows = np.flatnonzero(alloc.bucket >= 0)
        b = alloc.bucket[rows]
        order = np.argsort(b.astype(np.int16) if B < 2**15 - 1 else b, kind="stable")
        rows, b = rows[order], b[order]
        cut = np.searchsorted(b, np.arange(B + 1))
        for k in np.flatnonzero(np.diff(cut)):
            r = rows[cut[k]:cut[k + 1]]
            files.append(f"b{k}.rows", r + base)
            files.append(f"b{k}.d", d[r])
            files.append(f"b{k}.t", t[r])
        out.counts += np.diff(cut)
        base += table.num_rows
    files.close()
    out.num_rows = base
    if base == 0:
        raise ManifestError(f"{manifest}: the manifest has no rows")
    out.total_d, out.total_t = max(out.total_d, 1e-300), max(out.total_t, 1e-300)
    _check_bucket_fits(manifest, out.counts, batch_sizes, memory_limit)
    if carry and not strict:
        _carry(out, grid, batch_sizes)
    _check_bucket_fits(manifest, out.counts, batch_sizes, memory_limit)
    return out


def _check_bucket_fits(manifest: str | os.PathLike[str], counts: npt.NDArray[np.int64], bs: npt.NDArray[np.int64],
                       memory_limit: int) -> None:
    """A one-line error unless the largest bucket and the epoch's batches fit ``memory_limit``."""
    k = int(np.argmax(counts))
    need = int(counts[k]) * BUCKET_BYTES_PER_ROW + int((-(-counts // bs)).sum() + 1) * BATCH_BYTES
    if need > memory_limit:
        raise DataprepError(f"{manifest}: --memory-limit: bucket {k} holds {int(counts[k])} rows and needs about "
                            f"{need / 2**30:.2f} GiB to plan, more than the limit {memory_limit / 2**30:.2f} GiB; "
                            "raise --memory-limit or use more buckets")


def _carry(out: SpilledCorpus, grid: Grid, bs: npt.NDArray[np.int64]) -> None:
    """Carry bucket tails as :func:`bucketing.allocate.carry_tails` does, one bucket in memory."""
    B = grid.num_buckets
    files = SpillFiles(out.root)
    incoming: list[list[tuple[npt.NDArray[np.int64], ...]]] = [[] for _ in range(B)]
    for k in range(B):
        own = [files.read(f"b{k}.rows", np.int64), files.read(f"b{k}.d", np.float64), files.read(f"b{k}.t", np.int64)]
        parts = [(*own, np.full(own[0].shape[0], k, np.int64))] + incoming[k]
        rows, d, t, origin = (np.concatenate([p[i] for p in parts]) for i in range(4))
        pick, target = tail_moves(rows, t, d, k, bs, out.max_tokens, grid.duration_bin)
        keep = np.ones(rows.shape[0], dtype=bool)
        for j in np.unique(target[target >= 0]):
            sel = pick[target == j]
            incoming[int(j)].append((rows[sel], d[sel], t[sel], origin[sel]))
            keep[sel] = False
        o = np.argsort(rows[keep], kind="stable")
        rows, d, t, origin = rows[keep][o], d[keep][o], t[keep][o], origin[keep][o]
        out.carried += int((origin != k).sum())
        out.counts[k] = rows.shape[0]
        for name, v in (("rows", rows), ("d", d), ("t", t)):
            files.append(f"b{k}.{name}", v)  # rewritten: the bucket's members, ascending rows
        files.close()
        incoming[k] = []


@dataclass(frozen=True)
class EpochLayout:
    """One out-of-core epoch: the plan's per-batch figures (``ep``, whose ``rows`` is empty)
    and where each rank-major batch's rows lie in the epoch's position files."""

    ep: EpochPlan
    start: npt.NDArray[np.int64]  # first position of each rank-major batch
    size: npt.NDArray[np.int64]


def plan_epoch_spilled(corpus: SpilledCorpus, bs: npt.NDArray[np.int64], W: int, seed: int, epoch: int, *,
                       interleave: str, tolerance: float, cost: CostModel, group: int) -> EpochLayout:
    """Step 3 of the module docstring: :func:`bucketing.plan.plan_epoch` (balanced) then
    :func:`bucketing.groups.regroup`, from the spill files and per-batch arrays."""
    files = SpillFiles(corpus.root)
    for name in ("pos.rows", "pos.d", "pos.t"):
        (corpus.root / name).unlink(missing_ok=True)
    rng = np.random.default_rng([seed, epoch, 0])
    grouping = BucketGrouping("both").with_totals(corpus.total_d, corpus.total_t)
    counts = corpus.counts
    if int(counts.sum()) < W:
        raise DataprepError(f"{int(counts.sum())} utterances cannot fill one step of {W} ranks")
    nb = even_batch_counts(counts, bs, W)  # near-equal batches filling whole steps (as plan_epoch)
    for k in np.flatnonzero(counts):
        rows, d, t = files.read(f"b{k}.rows", np.int64), files.read(f"b{k}.d", np.float64), files.read(f"b{k}.t", np.int64)
        p = grouping.order(int(counts[k]), int(bs[k]), rng, d, t, batches=int(nb[k]))
        files.append("pos.rows", rows[p])
        files.append("pos.d", d[p])
        files.append("pos.t", t[p])
        del rows, d, t, p
    files.close()
    cut = cut_batches(counts, bs, rng, batch_counts=nb)
    # per batch (cut order): longest, most tokens, sums; a bucket at a time
    n_cut = cut.starts.shape[0]
    mx_d, sm_d = np.empty(n_cut), np.empty(n_cut)
    mx_t, sm_t = np.empty(n_cut, np.int64), np.empty(n_cut, np.int64)
    first = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=first[1:])
    lo_b = np.searchsorted(cut.starts, first[:-1])
    hi_b = np.searchsorted(cut.starts, first[1:])
    for k in np.flatnonzero(counts):
        a, b = int(first[k]), int(first[k + 1])
        loc = cut.starts[lo_b[k]:hi_b[k]] - a
        dk, tk = files.read_range("pos.d", np.float64, a, b), files.read_range("pos.t", np.int64, a, b)
        mx_d[lo_b[k]:hi_b[k]] = np.maximum.reduceat(dk, loc)
        sm_d[lo_b[k]:hi_b[k]] = np.add.reduceat(dk, loc)
        mx_t[lo_b[k]:hi_b[k]] = np.maximum.reduceat(tk, loc)
        sm_t[lo_b[k]:hi_b[k]] = np.add.reduceat(tk, loc)
    perm = cut.perm
    sizes, start = cut.sizes[perm], cut.starts[perm]
    mx_d, mx_t, sm_d, sm_t = mx_d[perm], mx_t[perm], sm_d[perm], sm_t[perm]
    off = np.zeros(sizes.shape[0] + 1, dtype=np.int64)
    np.cumsum(sizes, out=off[1:])
    times = cost.step_time(sizes, mx_d, mx_t)
    steps = balance_steps(cut.bucket, off, times, W, tolerance, cost.overhead, padded=sizes * mx_d)
    if steps is None:
        raise DataprepError(f"the rows cannot fill whole balanced steps of {W} ranks out of core "
                            "(fewer utterances than steps x ranks); plan with a larger --memory-limit")
    rng_steps = np.random.default_rng([seed, epoch, 1]) if interleave == "random" else None
    order = layout_order(steps, W, rng_steps, np.random.default_rng([seed, epoch, 2]))
    seg_lo = steps.seg_offsets[:-1]
    seg_size = np.diff(steps.seg_offsets)
    parent = np.searchsorted(off, seg_lo, side="right") - 1
    seg_start = start[parent] + (seg_lo - off[parent])
    s_mx_d, s_mx_t, s_sm_d, s_sm_t = mx_d[parent], mx_t[parent], sm_d[parent], sm_t[parent]
    pieces = np.flatnonzero(seg_size != sizes[parent])
    if pieces.shape[0]:
        for i in pieces:  # the few batches cut into pieces (at most one step's worth)
            a, b = int(seg_start[i]), int(seg_start[i] + seg_size[i])
            dk, tk = files.read_range("pos.d", np.float64, a, b), files.read_range("pos.t", np.int64, a, b)
            s_mx_d[i], s_mx_t[i] = dk.max(), tk.max()
            s_sm_d[i], s_sm_t[i] = np.add.reduceat(dk, [0])[0], tk.sum()
    # rank-major batches
    f_start, f_size = seg_start[order], seg_size[order]
    f_bucket = steps.seg_bucket[order]
    f_mx_d, f_mx_t = s_mx_d[order], s_mx_t[order]
    real_seconds, real_tokens = float(s_sm_d[order].sum()), int(s_sm_t.sum())
    t = cost.step_time(f_size, f_mx_d, f_mx_t).reshape(W, -1)  # counted before sync groups reorder steps
    unbalanced = int((t.max(0) > (1 + tolerance) * t.mean(0)).sum())
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
    return EpochLayout(ep, f_start, f_size)


def write_epoch_spilled(writer: PlanWriter, layout: EpochLayout, corpus: SpilledCorpus, first_step: int,
                        row_group_steps: int, tick: Callable[[int], object]) -> None:
    """Step 4 of the module docstring: each rank's shard in parts of whole row groups."""
    ep = layout.ep
    S = ep.num_steps
    mean = max(1, int(layout.size.sum()) // max(1, layout.size.shape[0]))
    part = row_group_steps * max(1, PART_ROWS // (row_group_steps * mean))
    bucket = ep.bucket_of_batch()
    for r in range(ep.world_size):
        for c in range(0, S, part):
            lo, hi = r * S + c, r * S + min(S, c + part)
            size = layout.size[lo:hi]
            off = np.zeros(hi - lo + 1, dtype=np.int64)
            np.cumsum(size, out=off[1:])
            idx = np.repeat(layout.start[lo:hi] - off[:-1], size) + np.arange(int(off[-1]), dtype=np.int64)
            pos_rows = SpillFiles(corpus.root).map("pos.rows", np.int64)
            rows = np.asarray(pos_rows[idx])
            del pos_rows
            table = shard_table(epoch=ep.epoch, first_step=first_step + c, bucket=bucket[lo:hi], offsets=off,
                                rows=rows, ids=corpus.ids(rows), max_duration=ep.max_duration[lo:hi],
                                max_tokens=ep.max_tokens[lo:hi], step_in_epoch=c)
            writer.write(r, table)
        tick(r)


def spill_dir(out_dir: str | os.PathLike[str]) -> Path:
    """A fresh spill directory next to ``out_dir`` (same disk); the caller removes it."""
    parent = Path(out_dir).resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{Path(out_dir).name}.spill-", dir=parent))


def remove_spill(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)


__all__ = ["EpochLayout", "SpilledCorpus", "default_memory_limit", "plan_epoch_spilled", "remove_spill",
           "spill_dir", "spill_manifest", "write_epoch_spilled"]
