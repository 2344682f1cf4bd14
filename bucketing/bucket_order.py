"""The order of one bucket's rows before they are cut into batches: shuffled windows of
batches, rows grouped inside each window by duration, tokens or both (:class:`BucketGrouping`,
its default window and audio weight), evened out so near-equal batches pad alike. Used by
:func:`bucketing.batching.form_batches` (the padding report and the planner form batches the
same way) and by the planner's bucket-by-bucket ordering. Units: seconds, tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt


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


def _bits(x: int) -> int:
    """Bits that hold the non-negative integer ``x`` (at least 1)."""
    return max(1, int(x).bit_length())


def _sort_in_windows(key: npt.NDArray[Any], kbits: int, span: int) -> npt.NDArray[np.int64]:
    """Permutation sorting every window (run of ``span`` positions; the last may be short)
    by ``key`` (``0 <= key < 2**kbits``), ties by position; windows stay in place.

    The windows form a (windows × span) array of packed ``(key, column)`` words (32 bits
    when they fit, else 64) sorted along rows, the short last window padded with words that
    sort last: one ``np.sort`` for all windows, a fraction of a global sort's time.
    """
    n = key.shape[0]
    nw = -(-n // span)
    pbits = _bits(span - 1)
    if kbits + pbits > 63:  # no packed word holds it: a stable sort by (window, key)
        return np.lexsort((key, np.arange(n) // span)).astype(np.int64)
    dt = np.uint32 if kbits + pbits <= 31 else np.uint64
    buf = np.empty(nw * span, dtype=dt)
    buf[:n] = key
    buf[n:] = (1 << kbits) - 1  # with columns >= every real one in the last window: sorts last
    grid = buf.reshape(nw, span)
    grid <<= dt(pbits)
    grid |= np.arange(span, dtype=dt)
    grid.sort(axis=1)
    grid &= dt((1 << pbits) - 1)
    out = grid.astype(np.int64)
    out += (np.arange(nw, dtype=np.int64) * span)[:, None]
    return out.reshape(-1)[:n]


#: Bits of the quantized duration key of the in-window sort, over each bucket's range:
#: durations closer than a step (15 us in a 1 s wide bucket) tie and break at random.
_DURATION_BITS = 16


def _quantize(values: npt.NDArray[Any], bits: int = _DURATION_BITS,
              bounds: tuple[Any, Any] | None = None) -> tuple[npt.NDArray[np.int64], int]:
    """An order-preserving non-negative integer key of ``values`` and its bit width.

    Integers: the value minus the minimum (exact). Floats: ``bits``-bit steps over their
    range (values closer than a step tie; ties break at random upstream). ``bounds``: the
    (minimum, maximum) to use instead of ``values``' own (a part of a larger set).
    """
    lo, hi = (values.min(), values.max()) if bounds is None else bounds
    if np.issubdtype(values.dtype, np.integer):
        return values.astype(np.int64) - int(lo), _bits(int(hi) - int(lo))
    if not hi > lo:
        return np.zeros(values.shape[0], dtype=np.int64), 1
    q = (values - lo) * (((1 << bits) - 1) / float(hi - lo))
    np.floor(q, out=q)
    np.clip(q, 0, (1 << bits) - 1, out=q)
    return q.astype(np.int64), bits


def _range_of(values: npt.NDArray[Any], p: npt.NDArray[Any], block: int) -> tuple[Any, Any]:
    """(min, max) of ``values[p]``, gathered ``block`` positions at a time (no whole copy);
    ``p`` a permutation of all of ``values``' positions needs no gather."""
    if p.shape[0] == values.shape[0]:
        return values.min(), values.max()
    lo = hi = values[p[0]]
    for a in range(0, p.shape[0], max(block, 1)):
        v = values[p[a:a + block]]
        lo, hi = min(lo, v.min()), max(hi, v.max())
    return lo, hi


def _group_2d(d: npt.NDArray[np.float64], t: npt.NDArray[np.int64], size: int, window: int,
              groups: int | None, audio_weight: float, total_d: float, total_t: float,
              peel: bool, t_bounds: tuple[int, int] | None = None) -> tuple[npt.NDArray[np.int64] | None, float]:
    """Order one bucket's duration-sorted windows so batches are similar in duration and tokens.

    ``d`` (s) and ``t`` (tokens) are the bucket's rows, each window of ``window * size``
    rows sorted by duration. Returns a permutation that stays inside windows (None = keep)
    and the cost it adds.

    A window of m batches is cut into g runs of whole batches, each run sorted by tokens.
    g = 1 is a token sort, g = m a duration sort, g ~ sqrt(m) a 2D grid. Unless ``groups``
    fixes g, each window takes, of these three, the one with the least cost. Vectorized over
    the bucket's windows: per candidate one row-wise sort of the (windows × span) grid by
    (run, tokens), its cost per window one ``np.maximum.reduceat`` over batches and one
    ``np.add.reduceat`` over windows, the choice one ``np.where``. ``peel`` (a bucket of
    2 .. ``window`` batches, one window) also tries box peeling (:func:`_peel`). Cost of a
    window: the padding it adds to the epoch's audio ratio times ``audio_weight`` plus what
    it adds to the token ratio (padded − real, over the epoch's real seconds ``total_d`` /
    tokens ``total_t``), so choices add up to the epoch's figures. Windows are independent:
    whole windows of a bucket, with ``t_bounds`` its tokens' (min, max), give the same order
    (see :meth:`BucketGrouping.order_chunks`).
    """
    n = d.shape[0]
    span = size * window
    starts = np.arange(0, n, size)
    sizes = np.diff(np.append(starts, n)).astype(np.float64)
    nb = starts.shape[0]
    wbatch = np.arange(0, nb, window)  # first batch of each window
    m = np.diff(np.append(wbatch, nb))  # batches per window
    real_d = np.add.reduceat(d, starts[wbatch])
    real_t = np.add.reduceat(t, starts[wbatch]).astype(np.float64)
    t_key, t_bits = _quantize(t, bounds=t_bounds)

    def cost_of(dd: npt.NDArray[np.float64], tt: npt.NDArray[np.int64], cut: npt.NDArray[np.int64],
                nbs: npt.NDArray[np.float64], at: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        pad_d = np.add.reduceat(nbs * np.maximum.reduceat(dd, cut), at)
        pad_t = np.add.reduceat(nbs * np.maximum.reduceat(tt, cut), at)
        # padding this window adds to the epoch's two ratios, audio weighted (see form_batches)
        return audio_weight * (pad_d - real_d) / total_d + (pad_t - real_t) / total_t

    if groups:
        cands = [np.minimum(m, groups)]
    else:
        cands = [np.ones_like(m), np.maximum(1, np.rint(np.sqrt(m)).astype(np.int64)), m]
    best: npt.NDArray[np.int64] | None = None
    best_cost = np.full(m.shape[0], np.inf)
    for g in cands:
        if (g == m).all():
            perm = None  # runs of one batch: sorting inside a batch changes no batch
            cost = cost_of(d, t, starts, sizes, wbatch)
        else:
            # key (run in window, tokens); full windows share one run length, the last may not
            run_len = size * -(-m // g)
            key = t_key.copy()
            full = n // span
            if full:
                key[:full * span].reshape(full, span)[:] |= (np.arange(span) // run_len[0] << t_bits)[None, :]
            if full * span < n:
                key[full * span:] |= np.arange(n - full * span) // run_len[-1] << t_bits
            perm = _sort_in_windows(key, _bits(window - 1) + t_bits, span)
            del key
            cost = cost_of(d[perm], t[perm], starts, sizes, wbatch)
        better = cost < best_cost - 1e-12
        if better.all():
            best = perm
        elif better.any():
            cur = np.arange(n, dtype=np.int64) if best is None else best
            new = np.arange(n, dtype=np.int64) if perm is None else perm
            best = np.where(np.repeat(better, span)[:n], new, cur)
        best_cost = np.where(better, cost, best_cost)
    if peel and not groups:
        # a sort-based order has little room in one small window, so also try peeling boxes
        # (see _peel) at three aspect ratios around the one the cost implies, short batch
        # first or last; keep what costs least
        lam0 = audio_weight * total_t / total_d  # tokens per second of the cost
        seg = np.arange(n, dtype=np.int64) if best is None else best
        dd, tt = d[seg], t[seg]
        at = np.zeros(1, dtype=np.int64)
        for f in (0.5, 1.0, 2.0):
            for short_first in (False, True):
                o = _peel(dd, tt, size, lam0 * f, short_first)
                cost_k = cost_of(dd[o], tt[o], starts, sizes, at)
                if cost_k[0] < best_cost[0] - 1e-12:
                    best_cost = cost_k
                    best = seg[o]
    return best, float(best_cost.sum())


@dataclass(frozen=True)
class BucketGrouping:
    """How one bucket's rows are ordered into batches (see :func:`form_batches`): the resolved
    sort key, window, groups and audio weight, with the epoch's real totals (``both`` only)."""

    sort_by: str
    window: int = DEFAULT_WINDOW
    groups: int | None = None
    audio_weight: float = DEFAULT_AUDIO_WEIGHT
    total_d: float = 1.0
    total_t: float = 1.0

    @property
    def both(self) -> bool:
        return self.window > 1 and self.sort_by == "both"

    def with_totals(self, total_d: float, total_t: float) -> BucketGrouping:
        return BucketGrouping(self.sort_by, self.window, self.groups, self.audio_weight, total_d, total_t)

    def grouped(self, has_duration: bool, has_tokens: bool) -> bool:
        """Rows are sorted in windows (the key exists)."""
        key = {"both": has_duration, "duration": has_duration, "tokens": has_tokens, "none": False}[self.sort_by]
        return self.window > 1 and key

    def order(self, cnt: int, size: int, rng: np.random.Generator, d: npt.NDArray[np.float64] | None,
              t: npt.NDArray[Any] | None, *, batches: int | None = None) -> npt.NDArray[np.int64]:
        """Positions of one bucket's ``cnt`` rows (ascending row order in, ``d`` / ``t`` theirs)
        in batch order: a shuffle by ``rng``, then sorted in windows (and grouped in 2D).
        ``batches``: see :meth:`order_chunks`."""
        parts = list(self.order_chunks(cnt, size, rng, d, t, max(cnt, 1), batches=batches))
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def order_chunks(self, cnt: int, size: int, rng: np.random.Generator, d: npt.NDArray[np.float64] | None,
                     t: npt.NDArray[Any] | None, chunk_rows: int, *,
                     batches: int | None = None) -> Iterator[npt.NDArray[Any]]:
        """:meth:`order` in consecutive parts of whole windows (about ``chunk_rows`` positions
        each, int32 while ``cnt`` fits): the same positions, but only the shuffle (4 bytes
        per row) and one part's sort keys and candidates exist at once. The rng draws the
        whole shuffle first, as :meth:`order` does, so later draws are the same too. Every
        part starts and ends at a batch boundary.

        ``batches``: the rows will be cut into that many near-equal batches (``r = cnt mod
        batches`` of ``q + 1 = cnt // batches + 1`` rows first, then ``q``; :func:`cut_batches`).
        Where the last batch would be empty otherwise (``0 < batches - r <= q``), the rows are
        grouped as batches of ``q + 1`` (the last one short) and evened out by :func:`_even_out`
        (the ordered positions, 4 bytes a row, and one part's prices at once); else the ``r``
        batches of ``q + 1`` and the others are grouped apart."""
        p = np.arange(cnt, dtype=np.int32 if cnt < 2**31 else np.int64)
        rng.shuffle(p)  # the draws of rng.permutation(cnt)
        if not self.grouped(d is not None, t is not None):
            yield p
            return
        if batches is None:
            yield from self._arrange_chunks(p, size, d, t, chunk_rows)
            return
        q, r = divmod(cnt, batches)
        if r == 0:
            yield from self._arrange_chunks(p, q, d, t, chunk_rows)
        elif batches - r <= q:
            ordered = np.empty_like(p)
            at = 0
            for part in self._arrange_chunks(p, q + 1, d, t, chunk_rows):
                ordered[at:at + part.shape[0]] = part
                at += part.shape[0]
            del p
            yield from _even_out(ordered, self._prices(d, t), batches, q, r, chunk_rows)
        else:
            head = r * (q + 1)
            yield from self._arrange_chunks(p[:head], q + 1, d, t, chunk_rows)
            yield from self._arrange_chunks(p[head:], q, d, t, chunk_rows)

    def _prices(self, d: npt.NDArray[np.float64] | None, t: npt.NDArray[Any] | None) -> Prices:
        """What :func:`_even_out` weighs rows by: the grouping's audio-weighted shares of
        duration and tokens (``both``), else the sort key and nothing."""
        if self.both and d is not None and t is not None:
            d_all, t_all, w = np.asarray(d), np.asarray(t), self.audio_weight
            return lambda x: (w * d_all[x] / self.total_d, t_all[x] / self.total_t)
        key = np.asarray(d if d is not None else t)
        return lambda x: (key[x].astype(np.float64), np.zeros(x.shape[0]))

    def _arrange_chunks(self, p: npt.NDArray[Any], size: int, d: npt.NDArray[np.float64] | None,
                        t: npt.NDArray[Any] | None, chunk_rows: int) -> Iterator[npt.NDArray[Any]]:
        """Shuffled positions ``p`` sorted in windows of ``size * window`` (and grouped in 2D),
        in parts of whole windows; keys are quantized over ``p``'s range, so the parts are the
        whole's. A short last window rides with a full one."""
        n = p.shape[0]
        if n == 0:
            return
        primary = np.asarray({"both": d, "duration": d, "tokens": t}[self.sort_by])
        span = size * self.window
        step = span * max(1, chunk_rows // span)
        cuts = list(range(0, n, step)) + [n]
        if len(cuts) > 2 and n - cuts[-2] < span:  # a short last window alone: join the part before
            del cuts[-2]
        p_bounds = _range_of(primary, p, step)
        t_bounds = None
        if self.both:
            assert t is not None
            lo, hi = _range_of(np.asarray(t), p, step)
            t_bounds = (int(lo), int(hi))
        for a, b in zip(cuts[:-1], cuts[1:]):
            yield self._order_part(p[a:b], size, primary, p_bounds, t, t_bounds, peel=size < n <= span)

    def _order_part(self, p: npt.NDArray[Any], size: int, primary: npt.NDArray[Any], p_bounds: tuple[Any, Any],
                    t: npt.NDArray[Any] | None, t_bounds: tuple[int, int] | None, peel: bool) -> npt.NDArray[Any]:
        """Whole windows of shuffled positions ``p`` sorted in windows (and grouped in 2D)."""
        # windows are runs of window * batch_size shuffled rows: sort each by the key,
        # ties in shuffled order (random)
        vals = primary[p]
        key, kbits = _quantize(vals, bounds=p_bounds)
        o = _sort_in_windows(key, kbits, size * self.window)
        del key
        p = p[o]
        if self.both:
            assert t is not None
            perm, _ = _group_2d(vals[o], np.asarray(t[p], dtype=np.int64), size, int(self.window), self.groups,
                                float(self.audio_weight), self.total_d, self.total_t, peel=peel, t_bounds=t_bounds)
            if perm is not None:
                p = p[perm]
        return p


#: Positions' prices of length in two units (:meth:`BucketGrouping._prices`): a function of
#: positions into a bucket's rows to their (audio, token) prices, float64.
Prices = Callable[[npt.NDArray[Any]], tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]]


def _even_out(ordered: npt.NDArray[Any], prices: Prices, batches: int, q: int, r: int,
              chunk_rows: int) -> Iterator[npt.NDArray[Any]]:
    """Even a grouped order ``ordered`` (positions) of ``batches - 1`` blocks of ``q + 1`` and a
    short last block (``q + 1 - (batches - r)`` rows, ``0 < batches - r <= q``) into ``r``
    batches of ``q + 1`` then ``batches - r`` of ``q``: ``batches - r - 1`` blocks each give the
    short block one row. ``prices``: each row's length in two units whose sum prices padding.
    Each block offers the row that grows the short block's box (longest of each unit) least,
    the longest such row when several fit (the donor gets tighter); the blocks whose offer grows
    it least give. Yields the positions batch after batch, in parts of whole batches: the
    blocks that keep ``q + 1``, the givers less their row, the short block with the given rows.
    Memory: per block three numbers, and one part (about ``chunk_rows`` rows) of prices."""
    cnt = ordered.shape[0]
    full, size = batches - 1, q + 1
    d_last, t_last = prices(ordered[full * size:])
    d_top, t_top = d_last.max(), t_last.max()
    per = max(1, chunk_rows // size)  # blocks per part
    spans = [(b0, min(full, b0 + per)) for b0 in range(0, full, per)]
    offer, offer_grow, offer_len = np.empty(full, np.int64), np.empty(full), np.empty(full)
    for b0, b1 in spans:
        dd, tt = prices(ordered[b0 * size:b1 * size])
        grow = np.maximum(dd - d_top, 0.0) + np.maximum(tt - t_top, 0.0)
        length = dd + tt
        o = _block_offers(grow, length, b1 - b0, size)
        offer[b0:b1], offer_grow[b0:b1], offer_len[b0:b1] = o + b0 * size, grow[o], length[o]
    givers = np.lexsort((np.arange(full), -offer_len, offer_grow))[:batches - r - 1]
    gives = np.zeros(full, dtype=bool)
    gives[givers] = True
    within = np.arange(size, dtype=np.int64)
    for b0, b1 in spans:  # the blocks that keep their q + 1 rows
        kept = b0 + np.flatnonzero(~gives[b0:b1])
        if kept.shape[0]:
            yield ordered[(kept[:, None] * size + within).ravel()]
    for b0, b1 in spans:  # the givers, less the row each gives
        giving = b0 + np.flatnonzero(gives[b0:b1])
        if giving.shape[0]:
            pos = (giving[:, None] * size + within).ravel()
            yield ordered[pos[pos != np.repeat(offer[giving], size)]]
    yield ordered[np.concatenate([np.arange(full * size, cnt, dtype=np.int64), np.sort(offer[givers])])]


def _block_offers(grow: npt.NDArray[np.float64], length: npt.NDArray[np.float64], blocks: int,
                  size: int) -> npt.NDArray[np.int64]:
    """Each of the first ``blocks`` blocks of ``size`` positions: its position of least
    ``grow``, then of greatest ``length``, then the first (what a lexsort by block, grow and
    ``-length`` puts first), by per-block reductions instead of a sort."""
    if blocks <= 0:
        return np.empty(0, dtype=np.int64)
    n = blocks * size
    starts = np.arange(blocks, dtype=np.int64) * size
    g, s = grow[:n], length[:n]
    best = g == np.repeat(np.minimum.reduceat(g, starts), size)
    s = np.where(best, s, -np.inf)
    best &= s == np.repeat(np.maximum.reduceat(s, starts), size)
    idx = np.flatnonzero(best)
    return idx[np.searchsorted(idx // size, np.arange(blocks, dtype=np.int64))]


def resolve_sort(sort_by: str, has_tokens: bool, has_duration: bool) -> str:
    """The sort key actually used: ``auto`` is ``both`` when both keys exist, else tokens;
    a key that is missing falls back to the other."""
    if sort_by not in ("auto", "both", "tokens", "duration", "none"):
        raise ValueError(f"sort_by must be auto, both, tokens, duration or none, not {sort_by!r}")
    if sort_by == "auto":
        sort_by = "both" if has_tokens and has_duration else "tokens"
    if sort_by == "both" and not (has_tokens and has_duration):
        sort_by = "duration" if has_duration else "tokens"
    return sort_by
