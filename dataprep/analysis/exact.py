"""Exact statistics over blocks of float64 values, in memory bounded by groups, not rows.

Pure NumPy, no I/O. Every result is independent of how the values are split into blocks:

- :class:`ExactSums`: per-group sums, correctly rounded (equal to ``math.fsum``): mantissas
  added exactly per (group, binary exponent); infinities and NaN counted apart (a NaN, or both
  infinities, make the sum NaN). Memory: 2 x 2,100 int64 per group.
- :class:`OrderSelector`: the k-th smallest values of each group, exactly, over a few passes
  (radix selection on order-preserving 64-bit keys, 16 bits a pass). Memory: 65,536 counts per
  group, 65,536 counts, minima and maxima per bin being refined, at most ``budget`` values.
- :func:`numpy_percentiles` and :func:`polars_quantile`: ``numpy.percentile`` (linear) and
  polars' ``quantile(interpolation="linear")`` / ``median()`` from their order statistics, bit
  for bit (:func:`numpy_ranks` and :func:`polars_ranks` say which ranks to select).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# ----------------------------------------------------------------------------- exact sums

#: frexp exponents of finite float64 values (-1073 .. 1024), shifted to start at 0
_NEXP = 2100
_EOFF = 1075
#: bits of the low part of a 53-bit mantissa (the high part keeps the sign)
_LO_BITS = 26
#: rows per bincount: partial sums of the parts stay below 2**53, so float64 adds them exactly
_CHUNK = 1 << 24


def _grow(a: IntArray, rows: int) -> IntArray:
    """``a`` with at least ``rows`` rows along axis 0 (new rows zero)."""
    if a.shape[0] >= rows:
        return a
    out = np.zeros((rows, *a.shape[1:]), dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


@dataclass(frozen=True)
class FloatParts:
    """Float64 values split exactly: ``value = (hi * 2**26 + lo) * 2**(exp - 1128)``
    (``hi``, ``lo`` integers held in float64, ``|hi| <= 2**27``, ``0 <= lo < 2**26``); ``special``
    marks the values whose parts are zero because they are not finite (0 finite, 1 +inf, 2 -inf,
    3 NaN)."""

    hi: FloatArray
    lo: FloatArray
    exp: IntArray
    special: npt.NDArray[np.int8]


def split_floats(values: npt.ArrayLike) -> FloatParts:
    """:class:`FloatParts` of ``values`` (computed once, shared by every grouping of a block)."""
    v = np.asarray(values, dtype=np.float64)
    special = np.zeros(v.shape[0], np.int8)
    fin = np.isfinite(v)
    if not fin.all():
        special[~fin] = np.where(np.isnan(v[~fin]), 3, np.where(v[~fin] > 0, 1, 2))
        v = np.where(fin, v, 0.0)
    m, e = np.frexp(v)
    hi = np.floor(m * 2.0**27)  # exact: m has 53 significant bits
    lo = m * 2.0**53 - hi * 2.0**26
    return FloatParts(hi, lo, e.astype(np.int64) + _EOFF, special)


class ExactSums:
    """Correctly rounded sums of float64 values per group (groups 0..G-1, growing as seen)."""

    def __init__(self, groups: int = 1) -> None:
        self._hi = np.zeros((groups, _NEXP), np.int64)
        self._lo = np.zeros((groups, _NEXP), np.int64)
        self._special = np.zeros((groups, 4), np.int64)  # finite, +inf, -inf, NaN counts

    @property
    def groups(self) -> int:
        return int(self._hi.shape[0])

    def add(self, values: npt.ArrayLike | FloatParts, groups: npt.ArrayLike | None = None) -> None:
        """Add ``values`` (or their :func:`split_floats`) to their groups (``groups``: int
        codes >= 0; None: all in group 0)."""
        parts = values if isinstance(values, FloatParts) else split_floats(values)
        n = parts.hi.shape[0]
        if not n:
            return
        g = None if groups is None else np.asarray(groups, dtype=np.int64)
        need = 1 if g is None else int(g.max()) + 1
        if need > self.groups:
            self._hi, self._lo, self._special = (_grow(a, need) for a in (self._hi, self._lo, self._special))
        size = self.groups * _NEXP
        idx = parts.exp if g is None else g * _NEXP + parts.exp
        for a in range(0, n, _CHUNK):
            s = slice(a, a + _CHUNK)
            self._hi.reshape(-1)[:] += np.bincount(idx[s], weights=parts.hi[s], minlength=size).astype(np.int64)
            self._lo.reshape(-1)[:] += np.bincount(idx[s], weights=parts.lo[s], minlength=size).astype(np.int64)
        sidx = parts.special.astype(np.int64) if g is None else g * 4 + parts.special
        self._special.reshape(-1)[:] += np.bincount(sidx, minlength=self._special.size)

    def total(self, groups: int | Iterable[int] = 0, *, finite_only: bool = False) -> float:
        """The sum of a group (or of several together), correctly rounded; ``finite_only``
        leaves out infinities and NaN."""
        sel = [g for g in ([groups] if isinstance(groups, (int, np.integer)) else groups) if g < self.groups]
        if not sel:
            return 0.0
        _, pinf, ninf, nan = (int(x) for x in self._special[sel].sum(axis=0))
        if not finite_only:
            if nan or (pinf and ninf):
                return math.nan
            if pinf or ninf:
                return math.inf if pinf else -math.inf
        hi, lo = self._hi[sel].sum(axis=0), self._lo[sel].sum(axis=0)
        nz = np.flatnonzero(hi | lo)
        if not nz.size:
            return 0.0
        base = int(nz[0])
        units = sum(((int(hi[j]) << _LO_BITS) + int(lo[j])) << (int(j) - base) for j in nz)
        scale = base - _EOFF - 53  # the value is units * 2**scale
        try:
            return float(units << scale) if scale >= 0 else units / (1 << -scale)  # int / int rounds correctly
        except OverflowError:
            return math.inf if units > 0 else -math.inf

    def count(self, groups: int | Iterable[int] = 0) -> int:
        """Values added to a group (or to several), NaN and infinities included."""
        sel = [g for g in ([groups] if isinstance(groups, (int, np.integer)) else groups) if g < self.groups]
        return int(self._special[sel].sum()) if sel else 0


# ----------------------------------------------------------------------------- order statistics

_U48 = np.uint64(48)
#: bits resolved per pass, and bins per histogram
DIGIT_BITS = 16
_BINS = 1 << DIGIT_BITS
#: values an :class:`OrderSelector` collects per pass at most (8 bytes each: 8 MiB). The
#: bins holding a column's quantiles hold about a tenth of its values each (16 bits: 4 of the
#: mantissa), so a larger budget only grows with the corpus: 16M (128 MiB) cost ``stats``
#: about 9 bytes a row up to 15M rows (synthetic 2M / 10M / 20M rows: 0.43 / 0.53 / 0.62 GiB,
#: 0.32 / 0.36 / 0.37 with this budget and 256K-row blocks; ``benchmarks/bench_stream.py``).
#: Bins beyond it are counted, and their windows resolve the ranks in the same pass up to
#: about 10M rows (20M: one more pass for one rank of ``duration``).
SELECT_BUDGET = 1 << 20


_MAG = np.int64(0x7FFF_FFFF_FFFF_FFFF)
_MIN = np.int64(-(1 << 63))


def float_keys(x: npt.ArrayLike) -> npt.NDArray[np.uint64]:
    """Order-preserving uint64 keys of float64 values (no NaN): ``a < b`` iff ``key(a) < key(b)``;
    -0.0 gets the key of 0.0."""
    i = (np.asarray(x, dtype=np.float64) + 0.0).view(np.int64)
    return (i ^ ((i >> 63) & _MAG) ^ _MIN).view(np.uint64)


def key_floats(k: npt.ArrayLike) -> FloatArray:
    """The float64 values of :func:`float_keys` keys."""
    i = np.asarray(k, dtype=np.uint64).view(np.int64) ^ _MIN
    return (i ^ ((i >> 63) & _MAG)).view(np.float64)


@dataclass
class _Cell:
    """Values of group ``group`` whose key's top ``16 * level`` bits are ``prefix``; ``want``:
    (rank inside the cell, rank inside the group) of the order statistics it holds."""

    group: int
    level: int
    prefix: int
    count: int
    want: list[tuple[int, int]] = field(default_factory=list)
    collect: bool = False
    root: int = -1
    hist: IntArray | None = None
    #: a counted cell's smallest and largest key per bin of its next digit
    low: npt.NDArray[np.uint64] | None = None
    high: npt.NDArray[np.uint64] | None = None
    #: a counted cell's windows (inclusive ranges of its next digit) whose values it collects
    #: too, at most ``cap`` of them (:meth:`OrderSelector._plan`); ``held`` so far
    windows: list[tuple[int, int]] = field(default_factory=list)
    cap: int = 0
    held: int = 0


class OrderSelector:
    """Exact order statistics of float64 values (no NaN) per group, over repeated passes.

    Protocol: pass 1 :meth:`add` every value and :meth:`end_pass`; :meth:`counts` then gives
    the values per group and :meth:`request` the wanted ranks (0-based, per group); while
    :attr:`pending`, :meth:`add` the SAME values again (any block split, any order) and
    :meth:`end_pass`; then :meth:`value` gives each wanted order statistic. Two passes while
    the bins holding the wanted ranks fit in ``budget`` values; a bin holding more is counted
    by its next 16 bits instead, and that pass resolves what it can (:meth:`_counted`); a
    rank it cannot takes one more pass per 16 bits (at most four passes after the first).
    Deterministic: the result is the sorted values' element, whatever the passes.
    """

    def __init__(self, budget: int = SELECT_BUDGET) -> None:
        self.budget = max(1, int(budget))
        self._hist1 = np.zeros((1, _BINS), np.int64)
        self._pass = 0
        self._cells: list[_Cell] = []
        self._values: dict[tuple[int, int], float] = {}
        self._table: npt.NDArray[np.int32] = np.empty(0, np.int32)
        self._root_collect: npt.NDArray[np.int32] = np.empty(0, np.int32)
        self._deep: list[int] = []
        self._parts: list[list[npt.NDArray[np.uint64]]] = []  # per active cell: its collected keys
        self.passes = 0

    @property
    def pending(self) -> bool:
        """Another pass over the values is needed."""
        return self._pass == 0 or bool(self._cells)

    def add(self, values: npt.ArrayLike, groups: npt.ArrayLike | None = None) -> None:
        """One block of the current pass (``groups``: int codes >= 0; None: all in group 0)."""
        self.add_keys(float_keys(values), groups)

    def add_keys(self, keys: npt.NDArray[np.uint64], groups: npt.ArrayLike | None = None) -> None:
        """:meth:`add` of values given by their :func:`float_keys` (computed once per block)."""
        if not keys.size or (self._pass and not self._cells):
            return
        top = (keys >> _U48).view(np.int64)
        g = None if groups is None else np.asarray(groups, dtype=np.int64)
        flat = top if g is None else g * _BINS + top
        if self._pass == 0:
            self._hist1 = _grow(self._hist1, 1 if g is None else int(g.max()) + 1)
            _count_into(self._hist1.reshape(-1), flat)
            return
        try:
            r = self._table[flat]
        except IndexError:
            raise ValueError("OrderSelector: a later pass holds a group the first pass did not") from None
        m = r >= 0
        k, r = keys[m], r[m]
        c = self._root_collect[r]
        sel = c >= 0
        if sel.any():
            cs, ks = c[sel], k[sel]
            if cs.shape[0] > 1 and (cs != cs[0]).any():  # split by cell (a 16-bit radix sort)
                order = np.argsort(cs.astype(np.int16) if len(self._cells) < 1 << 15 else cs, kind="stable")
                cs, ks = cs[order], ks[order]
            cut = np.flatnonzero(cs[1:] != cs[:-1]) + 1
            for ci, part in zip(cs[np.concatenate(([0], cut))].tolist(), np.split(ks, cut)):
                self._parts[ci].append(part)
        for ci in self._deep:
            cell = self._cells[ci]
            mm = r == cell.root
            if cell.level > 1:
                mm &= (k >> np.uint64(64 - DIGIT_BITS * cell.level)) == np.uint64(cell.prefix)
            kk = k[mm]
            if cell.collect:
                self._parts[ci].append(kk)
            else:
                digit = ((kk >> np.uint64(64 - DIGIT_BITS * (cell.level + 1))) & np.uint64(_BINS - 1)).astype(np.int64)
                assert cell.hist is not None
                _count_into(cell.hist, digit)
                assert cell.low is not None and cell.high is not None
                np.minimum.at(cell.low, digit, kk)
                np.maximum.at(cell.high, digit, kk)
                if cell.windows:
                    got = kk[_in_windows(digit, cell.windows)]
                    cell.held += got.shape[0]
                    if cell.held > cell.cap:  # more than guessed: give the windows up (a next pass refines)
                        cell.windows, self._parts[ci] = [], []
                    elif got.size:
                        self._parts[ci].append(got)

    def counts(self) -> IntArray:
        """Values per group (after the first pass)."""
        return self._hist1.sum(axis=1)

    def request(self, wanted: Mapping[int, Iterable[int]]) -> None:
        """The ranks to select per group (after the first pass; each ``0 <= rank < count``)."""
        if self._pass != 1 or self._cells:
            raise ValueError("OrderSelector.request: call once, after the first pass")
        counts = self.counts()
        cells: list[_Cell] = []
        for g, ranks in wanted.items():
            ranks = sorted(set(int(x) for x in ranks))
            if not ranks:
                continue
            if g >= counts.shape[0] or ranks[0] < 0 or ranks[-1] >= counts[g]:
                raise ValueError(f"OrderSelector.request: rank out of range for group {g}")
            cells += _children(g, 0, 0, self._hist1[g], [(x, x) for x in ranks])
        self._plan(cells)

    def end_pass(self) -> None:
        """Close the current pass: resolve what it collected and refine what it counted."""
        self.passes += 1
        if self._pass == 0:
            self._pass = 1
            return
        children: list[_Cell] = []
        for ci, cell in enumerate(self._cells):
            if cell.collect:
                parts, self._parts[ci] = self._parts[ci], []
                vals = np.concatenate(parts) if parts else np.empty(0, np.uint64)
                del parts
                if vals.shape[0] != cell.count:
                    raise ValueError("OrderSelector: a pass saw different values than the first one")
                local = sorted({w[0] for w in cell.want})
                vals.partition(local)
                for lr, gr in cell.want:
                    self._values[(cell.group, gr)] = float(key_floats(vals[lr]))
                del vals
            else:
                assert cell.hist is not None
                if int(cell.hist.sum()) != cell.count:
                    raise ValueError("OrderSelector: a pass saw different values than the first one")
                children += _children(cell.group, cell.level, cell.prefix, cell.hist, self._counted(ci, cell))
        self._plan(children)

    def _counted(self, ci: int, cell: _Cell) -> list[tuple[int, int]]:
        """Resolve what a counted cell tells at once: the smallest and largest value of each bin
        of its next digit (so every rank of a bin holding one value repeated, as an integer
        column's bins do), and the ranks in a window it collected; the wanted ranks left, to
        refine by that digit in another pass."""
        parts, self._parts[ci] = self._parts[ci], []
        assert cell.hist is not None
        cum = np.cumsum(cell.hist)
        vals = np.concatenate(parts) if parts else np.empty(0, np.uint64)
        del parts
        shift = np.uint64(64 - DIGIT_BITS * (cell.level + 1))
        left = []
        assert cell.low is not None and cell.high is not None
        for lr, gr in cell.want:
            b = int(np.searchsorted(cum, lr, side="right"))
            at = lr - (int(cum[b - 1]) if b else 0)  # rank inside the bin
            win = next((w for w in cell.windows if w[0] <= b <= w[1]), None)
            if at == 0 or cell.low[b] == cell.high[b]:
                key = int(cell.low[b])
            elif at == int(cell.hist[b]) - 1:
                key = int(cell.high[b])
            elif win is not None:
                d = ((vals >> shift) & np.uint64(_BINS - 1)).astype(np.int64)
                inside = vals[(d >= win[0]) & (d <= win[1])]
                before = int(cum[win[0] - 1]) if win[0] else 0
                if inside.shape[0] != int(cum[win[1]]) - before:
                    raise ValueError("OrderSelector: a pass saw different values than the first one")
                inside.partition(lr - before)
                key = int(inside[lr - before])
            else:
                left.append((lr, gr))
                continue
            self._values[(cell.group, gr)] = float(key_floats(np.uint64(key)))
        return left

    def value(self, group: int, rank: int) -> float:
        """The ``rank``-th smallest value of ``group`` (0-based), once no pass is pending."""
        return self._values[(group, rank)]

    def _plan(self, cells: list[_Cell]) -> None:
        """Merge cells of the same bin, resolve the fully known ones, and choose per cell:
        collect its values next pass (smallest first, within the budget) or count its next digit."""
        merged: dict[tuple[int, int, int], _Cell] = {}
        for c in cells:
            key = (c.group, c.level, c.prefix)
            if key in merged:
                merged[key].want += c.want
            else:
                merged[key] = c
        active = []
        for c in merged.values():
            if c.level * DIGIT_BITS == 64:  # every bit known: all its values are this one
                for _, gr in c.want:
                    self._values[(c.group, gr)] = float(key_floats(np.uint64(c.prefix)))
            else:
                active.append(c)
        left = self.budget
        for c in sorted(active, key=lambda c: (c.count, c.group, c.level, c.prefix)):
            c.collect = c.count <= left
            if c.collect:
                left -= c.count
            else:
                c.hist = np.zeros(_BINS, np.int64)
                c.low, c.high = np.full(_BINS, np.iinfo(np.uint64).max, np.uint64), np.zeros(_BINS, np.uint64)
        counted = [c for c in active if not c.collect]
        for c in counted:  # the budget left: windows where each counted cell's ranks likely fall
            slope = 0.0
            if c.level == 1:  # the neighbours' counts: the density's slope across the cell
                h, b = self._hist1[c.group], c.prefix
                slope = (float(h[b + 1]) if b + 1 < _BINS else 0.0) / 2 - (float(h[b - 1]) if b else 0.0) / 2
            _plan_windows(c, left // len(counted), slope)
        self._cells = active
        groups = max((c.group for c in active), default=-1) + 1
        self._table = np.full(max(groups, self._hist1.shape[0]) * _BINS, -1, np.int32)
        roots: dict[tuple[int, int], int] = {}
        for c in active:
            top = c.prefix >> (DIGIT_BITS * (c.level - 1))
            c.root = roots.setdefault((c.group, top), len(roots))
            self._table[c.group * _BINS + top] = c.root
        self._root_collect = np.full(max(len(roots), 1), -1, np.int32)
        self._deep = []
        for ci, c in enumerate(active):
            if c.level == 1 and c.collect:
                self._root_collect[c.root] = ci
            else:
                self._deep.append(ci)
        self._parts = [[] for _ in active]


def _plan_windows(cell: _Cell, share: int, slope: float = 0.0) -> None:
    """Windows of the next digit around each wanted rank of a counted ``cell`` (but its first
    and last, which its smallest and largest value give), placed where the rank falls if the
    values' density is linear over the cell (``slope``: its change across the cell, in values
    per cell width; 0: even) and holding about 70% of ``share`` values together, so that the
    pass counting the digit also collects the ranks unless the values bunch (at most
    ``share`` values: beyond, the windows are given up and a next pass refines)."""
    ranks = sorted({lr for lr, _ in cell.want if 0 < lr < cell.count - 1})
    half = share * 7 * _BINS // (20 * max(len(ranks), 1) * cell.count)  # digits each side of a rank
    if not ranks or half < 1:
        return
    windows: list[tuple[int, int]] = []
    n = float(cell.count)
    s = max(-2 * n, min(2 * n, slope))  # a density n + s (x - 1/2) >= 0 over x in [0, 1]
    for lr in ranks:
        if abs(s) < 1e-9 * n:
            x = lr / n
        else:  # n x + s (x^2 - x) / 2 = lr
            bq = n - s / 2
            x = (-bq + math.sqrt(max(bq * bq + 2 * s * lr, 0.0))) / s
        at = min(_BINS - 1, max(0, int(x * _BINS)))
        lo, hi = max(0, at - half), min(_BINS - 1, at + half)
        if windows and lo <= windows[-1][1] + 1:
            windows[-1] = (windows[-1][0], hi)
        else:
            windows.append((lo, hi))
    cell.windows, cell.cap = windows, share


def _in_windows(digit: IntArray, windows: list[tuple[int, int]]) -> npt.NDArray[np.bool_]:
    """Where ``digit`` falls in one of the (inclusive) ``windows``."""
    inside = (digit >= windows[0][0]) & (digit <= windows[0][1])
    for lo, hi in windows[1:]:
        inside |= (digit >= lo) & (digit <= hi)
    return inside


def _count_into(hist: IntArray, idx: IntArray) -> None:
    """``hist[i] += 1`` for each ``i`` in ``idx`` (a bincount, or for a few values scattered adds)."""
    if idx.shape[0] * 16 < hist.shape[0]:
        np.add.at(hist, idx, 1)
    else:
        hist += np.bincount(idx, minlength=hist.shape[0])


def _children(group: int, level: int, prefix: int, hist: IntArray,
              want: list[tuple[int, int]]) -> list[_Cell]:
    """The bins of ``hist`` (the next digit's counts inside a cell) holding the wanted ranks."""
    cum = np.cumsum(hist)
    out = []
    for lr, gr in want:
        b = int(np.searchsorted(cum, lr, side="right"))
        before = int(cum[b - 1]) if b else 0
        out.append(_Cell(group, level + 1, (prefix << DIGIT_BITS) | b, int(hist[b]), [(lr - before, gr)]))
    return out


# ----------------------------------------------------------------------------- interpolation


def numpy_ranks(n: int, percents: Iterable[float]) -> list[tuple[int, int, float]]:
    """Per level (percent): the two ranks ``numpy.percentile(..., method="linear")`` reads
    in ``n`` sorted values and its interpolation weight, computed as numpy computes them."""
    q = np.true_divide(np.asarray(list(percents), dtype=np.float64), 100)
    virtual = (n - 1) * q
    prev = np.floor(virtual)
    nxt = prev + 1
    above = virtual >= n - 1
    prev[above] = -1
    nxt[above] = -1
    gamma = virtual - prev
    return [(int(p) % n, int(x) % n, float(g)) for p, x, g in zip(prev, nxt, gamma)]


def numpy_percentiles(values: Iterable[tuple[float, float, float]]) -> list[float]:
    """numpy's ``_lerp`` of (value at the lower rank, value at the upper rank, weight)."""
    v = list(values)
    if not v:
        return []
    a, b, t = (np.array(x, dtype=np.float64) for x in zip(*v))
    with np.errstate(invalid="ignore"):
        diff = b - a
        out = a + diff * t
        np.subtract(b, diff * (1 - t), out=out, where=t >= 0.5)
    return [float(x) for x in out]


def polars_ranks(nonnull: int, nulls: int, q: float) -> tuple[int, int, float]:
    """The ranks (among the ``nonnull`` sorted values) polars' linear quantile ``q`` reads,
    and its fractional index; polars sorts the ``nulls`` first, hence their offset."""
    float_idx = (float(nonnull) - 1.0) * q + float(nulls)
    lo, hi = math.floor(float_idx), math.ceil(float_idx)
    return lo - nulls, hi - nulls, float_idx


def polars_quantile(lower: float, upper: float, ranks: tuple[int, int, float]) -> float:
    """polars' linear interpolation between the values at the two ranks of :func:`polars_ranks`."""
    lo, hi, float_idx = ranks
    if lo == hi or lower == upper:
        return lower
    return (float_idx - float(math.floor(float_idx))) * (upper - lower) + lower
