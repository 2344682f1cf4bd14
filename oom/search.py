"""Bisection for the largest batch size that fits, per bucket. Pure: no torch, no device.

A *probe* is any callable ``batch_size -> ProbeResult``; the CUDA runner, the estimate
and tests' fakes are all probes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ProbeResult:
    """Outcome of one training step at one batch size."""

    fits: bool
    peak_bytes: int | None = None  # peak allocated bytes of the step (None if unknown / OOM)
    step_seconds: float | None = None  # wall time of one step (None if not measured)
    oom: bool = False  # the step ran out of memory (as opposed to exceeding the budget)


Probe = Callable[[int], ProbeResult]


@dataclass(frozen=True)
class SearchResult:
    """The largest batch that fit (0 = not even one) and every probe made, in order."""

    batch_size: int
    probes: tuple[tuple[int, ProbeResult], ...] = field(default_factory=tuple)

    @property
    def best(self) -> ProbeResult | None:
        for b, r in self.probes:
            if b == self.batch_size and r.fits:
                return r
        return None


def find_max_batch(probe: Probe, start: int = 1, tolerance: float = 0.05, max_batch: int = 1 << 16) -> SearchResult:
    """Largest ``b`` in [1, max_batch] with ``probe(b).fits``, assuming fitting is monotone.

    Grows ``start`` by doubling until the first failure (or shrinks by halving until the
    first fit), then bisects until the gap between the largest fit ``lo`` and the smallest
    failure ``hi`` is at most ``max(1, floor(tolerance * lo))``. Invariant of the result:
    ``probe(result).fits`` and ``probe(hi)`` failed with ``hi - result <= max(1, tol * result)``
    (or ``result == max_batch``). Each batch size is probed at most once.
    """
    seen: dict[int, ProbeResult] = {}
    order: list[tuple[int, ProbeResult]] = []

    def fits(b: int) -> bool:
        if b not in seen:
            seen[b] = probe(b)
            order.append((b, seen[b]))
        return seen[b].fits

    b = min(max(1, start), max_batch)
    if fits(b):
        lo, hi = b, None
        while hi is None and lo < max_batch:
            nxt = min(lo * 2, max_batch)
            if fits(nxt):
                lo = nxt
            else:
                hi = nxt
        if hi is None:
            return SearchResult(lo, tuple(order))
    else:
        hi, lo = b, 0
        while hi > 1:
            nxt = hi // 2
            if fits(nxt):
                lo = nxt
                break
            hi = nxt
        if lo == 0:
            return SearchResult(0, tuple(order))
    while hi - lo > max(1, int(tolerance * lo)):
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return SearchResult(lo, tuple(order))


def search_order(shapes: Sequence[tuple[float, float]]) -> list[int]:
    """Bucket indices, largest first: descending (duration, tokens), ties by index."""
    return sorted(range(len(shapes)), key=lambda i: (-shapes[i][0], -shapes[i][1], i))


def enforce_monotone(shapes: Sequence[tuple[float, float]], sizes: Sequence[int]) -> list[int]:
    """Lower each bucket's batch size to the smallest among the buckets it contains
    (``d' <= d`` and ``t' <= t``), so sizes never increase as buckets grow in both
    dimensions. Never raises a size."""
    out = list(sizes)
    for i, (d, t) in enumerate(shapes):
        for j, (d2, t2) in enumerate(shapes):
            if d2 <= d and t2 <= t:
                out[i] = min(out[i], sizes[j])
    return out


def search_buckets(
    shapes: Sequence[tuple[float, float]],
    probe_for: Callable[[int], Probe],
    tolerance: float = 0.05,
    max_batch: int = 1 << 16,
    start: int = 1,
    on_done: Callable[[int, SearchResult], None] | None = None,
) -> tuple[list[int], list[SearchResult]]:
    """Search every bucket, largest first, each starting from the previous bucket's result.

    ``shapes[i]`` = (max_duration s, max_tokens) of bucket ``i``; ``probe_for(i)`` is its
    probe. Returns the monotone batch sizes (see :func:`enforce_monotone`) and the raw
    per-bucket results, both indexed by bucket.
    """
    results: list[SearchResult | None] = [None] * len(shapes)
    for i in search_order(shapes):
        res = find_max_batch(probe_for(i), start=max(1, start), tolerance=tolerance, max_batch=max_batch)
        results[i] = res
        start = res.batch_size
        if on_done is not None:
            on_done(i, res)
    final = [r for r in results if r is not None]
    return enforce_monotone(shapes, [r.batch_size for r in final]), final
