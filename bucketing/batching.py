"""Forming batches inside buckets: which utterances train together.

Shared by the padding report (which predicts what training sees) and the planner (which
writes it), so both form batches the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class Batches:
    """Batches in CSR layout.

    ``rows[offsets[i]:offsets[i+1]]`` are the manifest row numbers of batch ``i``, which
    belongs to bucket ``bucket[i]``. Batches are grouped by bucket (ascending) and, inside a
    bucket, in the order training should draw them.
    """

    bucket: npt.NDArray[np.int32]  # (num_batches,)
    offsets: npt.NDArray[np.int64]  # (num_batches + 1,), offsets[0] == 0
    rows: npt.NDArray[np.int64]  # (num_rows,)

    @property
    def num_batches(self) -> int:
        return int(self.bucket.shape[0])

    def sizes(self) -> npt.NDArray[np.int64]:
        """Utterances per batch."""
        return np.diff(self.offsets)


#: Default in-bucket grouping: shuffled windows of this many batches, grouped by duration and
#: tokens inside (``sort_by="auto"``). Measured with benchmarks/bench_buckets.py: on
#: LibriSpeech train-clean-100 padding falls from 3.1% audio / 15.6% tokens (plain shuffle)
#: to 1.5% / 2.4% at 16 and barely moves beyond; a window bounds how far apart two rows that
#: share a batch were in the shuffle, so smaller windows keep epochs more different.
DEFAULT_WINDOW = 16
DEFAULT_SORT_BY = "auto"
#: Grouping cost: a point of audio padding weighs as much as this many points of token
#: padding. Audio padding costs the encoder (the bulk of an encoder-decoder step) and the
#: project's targets say the same (<= 2% audio, <= 10% tokens: a ratio of 5).
DEFAULT_AUDIO_WEIGHT = 5.0


def _segments(order_rows: npt.NDArray[np.int64], offsets: npt.NDArray[np.int64],
              perm: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Rows and offsets of the CSR batches taken in the order ``perm``."""
    sizes = np.diff(offsets)[perm]
    new_off = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    src = np.repeat(offsets[:-1][perm] - new_off[:-1], sizes) + np.arange(int(new_off[-1]))
    return order_rows[src], new_off


#: Prefix lengths a box search tries per step (see ``_peel``): finer costs more, gains nothing
#: measurable (1024 vs 32 on Common Voice: same padding to 0.02 points).
_BOX_CANDIDATES = 64


def _peel(d: npt.NDArray[np.float64], t: npt.NDArray[np.int64], size: int, lam: float,
          short_first: bool) -> npt.NDArray[np.int64]:
    """Order one small bucket's rows by peeling boxes: batches tight in duration *and* tokens.

    ``d`` (s) and ``t`` (tokens) are the bucket's rows in shuffled order; ``size`` its batch
    size. Greedy from the bottom: each step takes, from the rows left, the cheapest box
    (``lam * d_max + t_max``, ``lam`` in tokens per second) holding one batch, and in it the
    rows nearest the box's corner (so smaller rows stay for later boxes); what is left at the
    end is the top batch. ``short_first`` peels the short batch (if any) first instead of
    leaving it to the top. Returns positions into ``d``, batch after batch, the short batch
    last (as ``form_batches`` lays batches out). Loops over batches, not rows; each step is a
    histogram over (prefix, token rank) cells, the prefixes taken on at most
    ``_BOX_CANDIDATES`` cut points of the duration order.
    """
    n = d.shape[0]
    order = np.argsort(d, kind="stable")  # stable on shuffled rows: random tie-break
    d_o = d[order]
    values, t_o = np.unique(t[order], return_inverse=True)  # token ranks: cells <= rows
    t_o = t_o.reshape(-1).astype(np.int64)
    span = int(values.shape[0])
    alive = np.ones(n, dtype=bool)
    short = n % size
    steps = [short] + [size] * (n // size - 1) if short_first and short else [size] * ((n - 1) // size)
    taken: list[npt.NDArray[np.int64]] = []
    for s in steps:
        pos = np.flatnonzero(alive)
        na = pos.shape[0]
        if na - s < _BOX_CANDIDATES:
            ks = np.arange(s - 1, na, dtype=np.int64)
        else:  # strictly increasing, first s - 1, last na - 1
            ks = s - 1 + (np.arange(_BOX_CANDIDATES, dtype=np.int64) * (na - s)) // (_BOX_CANDIDATES - 1)
        seg = np.searchsorted(ks, np.arange(na), side="left")
        hist = np.bincount(seg * span + t_o[pos], minlength=ks.shape[0] * span).reshape(ks.shape[0], span)
        hist = hist.cumsum(axis=0).cumsum(axis=1)  # rows of prefix k with tokens <= v
        tc = np.argmax(hist >= s, axis=1)  # every prefix holds >= s rows
        k = int(np.argmin(lam * d_o[pos[ks]] + values[tc]))
        inside = pos[: ks[k] + 1]
        inside = inside[t_o[inside] <= tc[k]]
        corner = np.maximum(d_o[inside] / max(d_o[pos[ks[k]]], 1e-300),
                            values[t_o[inside]] / max(float(values[tc[k]]), 1e-300))
        pick = inside[np.argsort(-corner, kind="stable")[:s]]
        alive[pick] = False
        taken.append(pick)
    top = np.flatnonzero(alive)
    if short_first and short:
        parts = taken[1:] + [top, taken[0]]
    else:
        parts = taken + [top]
    return order[np.concatenate(parts)] if parts else order


def _group_2d(rows: npt.NDArray[np.int64], b: npt.NDArray[np.int64], pos: npt.NDArray[np.int64],
              win: npt.NDArray[np.int64], span: npt.NDArray[np.int64], counts: npt.NDArray[np.int64],
              batch_sizes: npt.NDArray[np.int64], d: npt.NDArray[np.float64], t: npt.NDArray[Any],
              groups: int | None, audio_weight: float, window: int) -> npt.NDArray[np.int64]:
    """Order duration-sorted windows so batches are similar in duration and in tokens.

    A window of m batches is cut into g runs of whole batches, each run sorted by tokens.
    g = 1 is a token sort, g = m a duration sort, g ~ sqrt(m) a 2D grid. Unless ``groups``
    fixes g, each window takes, of these three, the one with the least cost, computed for
    all windows at once; a bucket small enough to be one window also tries box peeling
    (:func:`_peel`). Cost of a window: the padding it adds to the epoch's audio ratio times
    ``audio_weight`` plus what it adds to the token ratio (padded − real, over the epoch's
    real seconds / tokens), so choices add up to the epoch's figures.
    """
    bs_row = batch_sizes[b]
    in_win = np.minimum(span, counts[b] - win * span)
    m = -(-in_win // bs_row)
    if groups:
        cands = [np.minimum(m, groups)]
    else:
        cands = [np.ones_like(m), np.maximum(1, np.rint(np.sqrt(m)).astype(np.int64)), m]
    batch_id = np.cumsum(np.append(True, (b[1:] != b[:-1]) | (pos[1:] // bs_row[1:] != pos[:-1] // bs_row[:-1]))) - 1
    starts = np.flatnonzero(np.append(True, batch_id[1:] != batch_id[:-1]))
    sizes = np.diff(np.append(starts, rows.shape[0])).astype(np.float64)
    win_id = np.cumsum(np.append(True, (b[1:] != b[:-1]) | (win[1:] != win[:-1]))) - 1
    wob = win_id[starts]  # window of each batch
    nwin = int(win_id[-1]) + 1
    real_d = np.bincount(win_id, weights=d[rows], minlength=nwin)
    real_t = np.bincount(win_id, weights=t[rows].astype(np.float64), minlength=nwin)
    total_d = max(float(real_d.sum()), 1e-300)
    total_t = max(float(real_t.sum()), 1e-300)
    best_rows = rows
    best_cost = np.full(nwin, np.inf)
    for g in cands:
        run = (pos - win * span) // (bs_row * -(-m // g))
        cand = rows[np.lexsort((t[rows], run, win, b))]
        pad_d = np.bincount(wob, weights=sizes * np.maximum.reduceat(d[cand], starts), minlength=nwin)
        pad_t = np.bincount(wob, weights=sizes * np.maximum.reduceat(t[cand], starts), minlength=nwin)
        # padding this window adds to the epoch's two ratios, audio weighted (see form_batches)
        cost = audio_weight * (pad_d - real_d) / total_d + (pad_t - real_t) / total_t
        better = cost < best_cost - 1e-12
        best_cost = np.where(better, cost, best_cost)
        best_rows = np.where(better[win_id], cand, best_rows)
    # Small buckets (one window holds the whole bucket, >= 2 batches): a sort-based order
    # has little room there, so also try peeling boxes (see _peel) at three aspect ratios
    # around the one the cost implies, short batch first or last; keep what costs least.
    whole = np.flatnonzero((counts <= batch_sizes * window) & (counts > batch_sizes))
    if not groups and whole.shape[0]:
        lam0 = audio_weight * total_t / total_d  # tokens per second of the cost
        bstart = np.concatenate([[0], np.cumsum(counts)[:-1]])
        for k in whole:  # loop over buckets
            lo, hi = int(bstart[k]), int(bstart[k] + counts[k])
            w = int(win_id[lo])
            seg_rows = best_rows[lo:hi].copy()
            dd, tt = d[seg_rows], np.asarray(t[seg_rows], dtype=np.int64)
            size = int(batch_sizes[k])
            cut = np.arange(0, hi - lo, size)
            nb = np.diff(np.append(cut, hi - lo)).astype(np.float64)
            for f in (0.5, 1.0, 2.0):
                for short_first in (False, True):
                    o = _peel(dd, tt, size, lam0 * f, short_first)
                    cost = (audio_weight * ((nb * np.maximum.reduceat(dd[o], cut)).sum() - real_d[w]) / total_d
                            + ((nb * np.maximum.reduceat(tt[o], cut)).sum() - real_t[w]) / total_t)
                    if cost < best_cost[w] - 1e-12:
                        best_cost[w] = cost
                        best_rows[lo:hi] = seg_rows[o]
    return best_rows


def form_batches(
    bucket_of_row: npt.NDArray[np.integer],
    batch_sizes: npt.NDArray[np.integer],
    rng: np.random.Generator,
    num_tokens: npt.NDArray[np.integer] | None = None,
    *,
    duration: npt.NDArray[np.floating] | None = None,
    window: int = DEFAULT_WINDOW,
    sort_by: str = DEFAULT_SORT_BY,
    groups: int | None = None,
    audio_weight: float = DEFAULT_AUDIO_WEIGHT,
) -> Batches:
    """Group each bucket's rows into batches of its batch size.

    Each bucket's rows are shuffled; then, when ``window > 1`` and the sort key is given,
    consecutive runs of ``window * batch_size`` shuffled rows are sorted by the key
    (``sort_by="tokens"`` uses ``num_tokens``, ``"duration"`` uses ``duration``, random
    tie-break) so a batch holds similar lengths, and the full batches of a bucket are drawn
    in a random order. ``window <= 1``, ``sort_by="none"`` or a missing key = plain shuffle.
    ``sort_by="both"`` (the default when both keys are given) groups by duration and tokens,
    choosing per window the order with the least cost (``audio_weight`` × the audio padding
    it adds + the token padding it adds, as shares of the epoch's real audio and tokens); a
    bucket of at most ``window`` batches also tries box peeling, which fits small buckets
    (a few batches) much better than any sort. There the batches' composition varies across
    epochs only through ties, as with any whole-bucket sort; their order is still random.

    Parameters
    ----------
    bucket_of_row: bucket index per manifest row (``-1`` = not allocated, skipped).
    batch_sizes: utterances per batch, per bucket (>= 1).
    rng: the only source of randomness; equal seeds give equal batches.
    num_tokens: tokens per row (incl. prompt), the default sort key.
    duration: seconds per row, the key for ``sort_by="duration"``.
    audio_weight: see above (>= 0).

    Invariant: every allocated row is in exactly one batch; no batch exceeds its bucket's
    batch size; only a bucket's last batch may be smaller.
    """
    if sort_by not in ("auto", "both", "tokens", "duration", "none"):
        raise ValueError(f"sort_by must be auto, both, tokens, duration or none, not {sort_by!r}")
    if sort_by == "auto":
        sort_by = "both" if num_tokens is not None and duration is not None else "tokens"
    if sort_by == "both" and (num_tokens is None or duration is None):
        sort_by = "tokens" if duration is None else "duration"
    bucket_of_row = np.asarray(bucket_of_row)
    batch_sizes = np.asarray(batch_sizes, dtype=np.int64)
    rows = np.flatnonzero(bucket_of_row >= 0).astype(np.int64)
    keys = rng.random(rows.shape[0])
    order = np.lexsort((keys, bucket_of_row[rows]))
    rows = rows[order]
    b = bucket_of_row[rows].astype(np.int64)
    counts = np.bincount(b, minlength=batch_sizes.shape[0])
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    pos_in_bucket = np.arange(rows.shape[0]) - starts[b]
    primary = {"both": duration, "duration": duration, "tokens": num_tokens, "none": None}[sort_by]
    grouped = window > 1 and primary is not None and rows.shape[0] > 0
    if grouped:
        span = batch_sizes[b] * window  # rows per window
        win = pos_in_bucket // span
        # rows are shuffled already: stable sorts by (bucket, window, key) break ties randomly,
        # and positions in the bucket stay aligned because windows do not move
        order = np.lexsort((np.asarray(primary)[rows], win, b))
        rows = rows[order]
        if sort_by == "both":
            rows = _group_2d(rows, b, pos_in_bucket, win, span, counts, batch_sizes,
                             np.asarray(duration, dtype=np.float64), np.asarray(num_tokens), groups,
                             float(audio_weight), int(window))
    batch_in_bucket = pos_in_bucket // batch_sizes[b]
    new_batch = np.ones(rows.shape[0], dtype=bool)
    if rows.shape[0] > 1:
        new_batch[1:] = (b[1:] != b[:-1]) | (batch_in_bucket[1:] != batch_in_bucket[:-1])
    first = np.flatnonzero(new_batch)
    offsets = np.append(first, rows.shape[0]).astype(np.int64)
    bb = b[first]
    if grouped and first.shape[0] > 1:
        # draw full batches in random order inside each bucket; a short batch stays last
        short = np.diff(offsets) < batch_sizes[bb]
        bkey = np.where(short, 2.0, rng.random(first.shape[0]))
        perm = np.lexsort((bkey, bb))
        rows, offsets = _segments(rows, offsets, perm)
        bb = bb[perm]
    return Batches(bucket=bb.astype(np.int32), offsets=offsets, rows=rows)


def form_batches_cumulative(
    bucket_of_row: npt.NDArray[np.integer],
    duration: npt.NDArray[np.floating],
    budget: float,
    rng: np.random.Generator,
) -> Batches:
    """The cumulative-duration heuristic (Lhotse ``max_duration``, Canary-1B's 360 s).

    Each bucket's rows are shuffled and taken greedily while the sum of their real durations
    (s) stays <= ``budget`` (a single longer row forms a batch alone). Loops over batches,
    not rows.
    """
    bucket_of_row = np.asarray(bucket_of_row)
    d_all = np.asarray(duration, dtype=np.float64)
    rows = np.flatnonzero(bucket_of_row >= 0).astype(np.int64)
    order = np.lexsort((rng.random(rows.shape[0]), bucket_of_row[rows]))
    rows = rows[order]
    b = bucket_of_row[rows].astype(np.int64)
    n = rows.shape[0]
    cum = np.concatenate([[0.0], np.cumsum(d_all[rows])])
    bucket_end = np.append(np.flatnonzero(b[1:] != b[:-1]) + 1, n)
    firsts: list[int] = []
    s = 0
    e_idx = 0
    while s < n:
        while bucket_end[e_idx] <= s:
            e_idx += 1
        end = int(np.searchsorted(cum, cum[s] + budget * (1 + 1e-12), side="right")) - 1
        end = min(max(end, s + 1), int(bucket_end[e_idx]))
        firsts.append(s)
        s = end
    first = np.asarray(firsts, dtype=np.int64)
    offsets = np.append(first, n).astype(np.int64)
    return Batches(bucket=b[first].astype(np.int32) if n else np.zeros(0, np.int32), offsets=offsets, rows=rows)
