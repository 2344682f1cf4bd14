"""Bucket tails carried on a spilled corpus (:func:`carry_spilled`), as
:func:`bucketing.allocate.carry_tails` carries them in memory: from each bucket's tail
candidates and the rows carried into it, never a whole bucket (half a batch per bucket in
memory). The spilled columns stay as they are; the moves are kept as edits of them
(:attr:`SpilledCorpus.removed`, :attr:`SpilledCorpus.extra`)."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from bucketing.allocate import tail_moves
from bucketing.fit import Grid
from dataprep.planning.spill import Carried, SpilledCorpus, check_bucket_fits

def carry_spilled(corpus: SpilledCorpus, grid: Grid, batch_sizes: npt.NDArray[np.int64],
                  manifest: str | os.PathLike[str], memory_limit: int) -> SpilledCorpus:
    """``corpus`` (spilled from ``manifest`` without carrying) with bucket tails carried: the
    same spill files, edits of its own (``corpus`` stays as it is); the one-line error of
    :func:`spill_manifest` when a bucket grown by them cannot be planned within ``memory_limit``."""
    out = dataclasses.replace(corpus, counts=corpus.counts.copy(), removed={}, extra={}, carried=0)
    _carry(out, grid, batch_sizes)
    check_bucket_fits(manifest, out.counts, batch_sizes, memory_limit)
    return out


def _carry(out: SpilledCorpus, grid: Grid, bs: npt.NDArray[np.int64]) -> None:
    """Carry bucket tails as :func:`bucketing.allocate.carry_tails` does, from each bucket's
    tail candidates (:attr:`SpilledCorpus.candidates`) and the rows carried into it, never its
    whole rows: half a batch per bucket in memory. The spill files stay; the moves are kept as
    edits (:attr:`SpilledCorpus.removed` / :attr:`SpilledCorpus.extra`): no bucket is sorted or
    rewritten (where carried rows go among a bucket's own is a binary search of its rows file)."""
    B = grid.num_buckets
    files = out.files
    dbin = grid.duration_bin
    incoming: list[list[Carried]] = [[] for _ in range(B)]
    for k in range(B):
        n_own = int(out.counts[k])
        cand_rows, cand_t, cand_d, cand_pos = out.candidates[k]
        n_c = cand_rows.shape[0]
        inc = incoming[k]
        inc_rows = np.concatenate([c.rows for c in inc]) if inc else np.empty(0, np.int64)
        inc_d = np.concatenate([c.d for c in inc]) if inc else np.empty(0, np.float64)
        inc_t = np.concatenate([c.t for c in inc]) if inc else np.empty(0, np.int32)
        inc_ids = pa.concat_arrays([c.ids for c in inc]) if inc else pa.array([], pa.string())
        inc_c = (np.concatenate([c.c for c in inc]) if inc else np.empty(0, np.int32)) if out.has_codes else None
        inc_i = (np.concatenate([c.i for c in inc]) if inc else np.empty(0, out.row_dtype)) if out.has_index else None
        rows = np.concatenate([cand_rows, inc_rows])
        t = np.concatenate([cand_t, inc_t])
        d = np.concatenate([cand_d, inc_d])
        pick, target = tail_moves(rows, t, d, k, bs, out.max_tokens, dbin, size=n_own + inc_rows.shape[0])
        go = target >= 0
        pick, target = pick[go], target[go]
        own_local, inc_pick = pick[pick < n_c], pick[pick >= n_c] - n_c
        own_pick = cand_pos[own_local]  # positions among the bucket's own rows
        if pick.shape[0]:
            one = np.ones(own_pick.shape[0], dtype=np.int64)
            pick_d = np.concatenate([cand_d[own_local], inc_d[inc_pick]])
            pick_ids = pa.concat_arrays([files.read_string_runs(f"b{k}.ids", own_pick, one),
                                         inc_ids.take(pa.array(inc_pick)).cast(pa.string())]) if out.has_ids else None
            pick_c = None if inc_c is None else np.concatenate([files.read_runs(f"b{k}.c", np.int32, own_pick, one),
                                                                inc_c[inc_pick]])
            pick_i = None if inc_i is None else np.concatenate([files.read_runs(f"b{k}.i", out.row_dtype, own_pick,
                                                                                one), inc_i[inc_pick]])
            at = np.concatenate([own_local, inc_pick + n_c])
            pick_rows, pick_t = rows[at], t[at]
            tgt = np.concatenate([target[pick < n_c], target[pick >= n_c]])
            for j in np.unique(tgt):
                sel = np.flatnonzero(tgt == j)
                incoming[int(j)].append(Carried(pick_rows[sel], pick_d[sel], pick_t[sel],
                                                 pa.array([], pa.string()) if pick_ids is None
                                                 else pick_ids.take(pa.array(sel)), np.empty(0, np.int64),
                                                 None if pick_c is None else pick_c[sel],
                                                 None if pick_i is None else pick_i[sel]))
        del rows, t, d
        if own_pick.shape[0]:
            out.removed[k] = np.sort(own_pick)
        stay = np.ones(inc_rows.shape[0], dtype=bool)
        stay[inc_pick] = False
        if stay.any():
            o = np.argsort(inc_rows[stay], kind="stable")
            keep_rows = inc_rows[stay][o]
            # among the kept own rows: own rows below each (a binary search of the ascending
            # rows file, a few pages) less the removed ones among them
            below = np.searchsorted(files.map(f"b{k}.rows", out.row_dtype), keep_rows.astype(out.row_dtype))
            if k in out.removed:
                below = below - np.searchsorted(out.removed[k], below)
            out.extra[k] = Carried(keep_rows, inc_d[stay][o], inc_t[stay][o],
                                    inc_ids.filter(pa.array(stay)).take(pa.array(o)).cast(pa.string())
                                    if out.has_ids else pa.array([], pa.string()),
                                    below.astype(np.int64), None if inc_c is None else inc_c[stay][o],
                                    None if inc_i is None else inc_i[stay][o])
        out.carried += int(stay.sum())
        out.counts[k] = n_own - own_pick.shape[0] + int(stay.sum())
        incoming[k] = []
