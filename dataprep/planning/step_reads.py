"""What one step reads from a store: byte ranges coalesced into requests, and a store model.

A row's audio is a byte range of one object: a tar member (``container``, ``member_offset``,
``member_size``) or a loose file (whole). :func:`coalesce` turns the ranges of one step into
requests: ranges of one object closer than ``max_gap`` bytes are one request, overlapping
ranges (segments of one recording) are read once. :class:`StoreModel` (latency s, bandwidth
bytes/s, request-rate limit requests/s, concurrent requests per rank) prices those requests:
time to first batch and input throughput per rank; :class:`PrefetchOptions`, how far a rank reads
ahead (:mod:`dataprep.integrations.prefetch`). Units: bytes, seconds. Pure arrays, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields, replace

import numpy as np
import numpy.typing as npt

from manifests.errors import OptionError
from manifests.options import check_int, check_number

#: Largest gap (bytes) between two ranges of one object read as one request: a tar member's
#: header and padding (512 to 1,023 bytes) and a Shar member's JSON metadata beside it fit,
#: so a step's neighbouring members are one request; an unused clip between them (tens of KB)
#: does not, which keeps bytes fetched / bytes used near 1.
DEFAULT_MAX_GAP = 4096
#: default memory budget of one rank's prefetch (bytes): 8 steps of 2-minute batches of
#: 16 kHz FLAC (about 4 MB per batch-minute) with room to spare
DEFAULT_PREFETCH_BYTES = 256 << 20
#: default requests in flight per rank: hides a 20 ms store latency behind 16 requests
DEFAULT_IO_THREADS = 16


@dataclass(frozen=True)
class PrefetchOptions:
    """``prefetch_steps``: steps read ahead (0: off); ``prefetch_bytes``: bytes held ahead at
    most (>= 1); ``io_threads``: requests in flight (>= 1)."""

    prefetch_steps: int = 0
    prefetch_bytes: int = DEFAULT_PREFETCH_BYTES
    io_threads: int = DEFAULT_IO_THREADS

    def __post_init__(self) -> None:
        check_int("prefetch_steps", self.prefetch_steps, ge=0, le=1 << 16)
        check_int("prefetch_bytes", self.prefetch_bytes, ge=1, le=2**50)
        check_int("io_threads", self.io_threads, ge=1, le=1024)

    @property
    def on(self) -> bool:
        return self.prefetch_steps > 0


@dataclass(frozen=True)
class Requests:
    """A step's requests: ``obj`` (object code), ``start`` and ``end`` (bytes, end excluded) per
    request, sorted by object then start; ``of_range``: the request each input range lies in."""

    obj: npt.NDArray[np.int64]
    start: npt.NDArray[np.int64]
    end: npt.NDArray[np.int64]
    of_range: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return int(self.obj.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes the requests fetch."""
        return int((self.end - self.start).sum())


def coalesce(obj: npt.ArrayLike, start: npt.ArrayLike, end: npt.ArrayLike,
             max_gap: int = DEFAULT_MAX_GAP) -> Requests:
    """The requests reading ranges ``[start, end)`` of objects ``obj`` (codes >= 0): ranges of
    one object that overlap or lie within ``max_gap`` bytes of the request so far join it."""
    check_int("max_gap", max_gap, ge=0, le=None)
    o, s, e = (np.asarray(a, dtype=np.int64) for a in (obj, start, end))
    n = int(o.shape[0])
    if n == 0:
        z = np.zeros(0, np.int64)
        return Requests(z, z, z, z)
    order = np.lexsort((s, o))
    os_, ss, es = o[order], s[order], e[order]
    # the end reached so far within each object: a running max that restarts per object
    # (ends shifted by the object's rank, so one object's ends never reach the next one's)
    first = np.r_[True, os_[1:] != os_[:-1]]
    shift = int(es.max()) + max_gap + 1
    rank = np.cumsum(first) - 1
    reach = np.maximum.accumulate(es + rank * shift) - rank * shift
    new = first.copy()
    new[1:] |= ss[1:] > reach[:-1] + max_gap
    req = np.cumsum(new) - 1
    starts = ss[new]
    ends = np.maximum.reduceat(es, np.flatnonzero(new))
    of_range = np.empty(n, np.int64)
    of_range[order] = req
    return Requests(os_[new], starts, ends, of_range)


@dataclass(frozen=True)
class StoreModel:
    """A store as one rank sees it: ``latency_s`` per request (s), ``bandwidth`` (bytes/s per
    rank), ``request_rate`` (requests/s per rank; None: no limit), ``concurrency`` (requests in
    flight per rank). Defaults: an S3-like store in the same region."""

    latency_s: float = 0.02
    bandwidth: float = 200e6
    request_rate: float | None = None
    concurrency: int = 16

    def __post_init__(self) -> None:
        check_number("latency_s", self.latency_s, ge=0)
        check_number("bandwidth", self.bandwidth, gt=0)
        check_number("request_rate", self.request_rate, gt=0, optional=True)
        check_int("concurrency", self.concurrency, ge=1, le=4096)

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def with_overrides(self, pairs: Iterable[str]) -> StoreModel:
        """``NAME=VALUE`` overrides (``latency_s=0.05``, ``request_rate=3500``); an
        :class:`~manifests.errors.OptionError` names a bad one."""
        out = self
        for pair in pairs:
            name, sep, value = pair.partition("=")
            name = name.strip()
            if not sep or name not in self.names():
                raise OptionError("store", f"{pair!r}: expected NAME=VALUE with NAME in {', '.join(self.names())}")
            try:
                number: float = int(value) if name == "concurrency" else float(value)
            except ValueError:
                raise OptionError("store", f"{pair!r}: {value!r} is not a number") from None
            try:
                out = replace(out, **{name: number})
            except OptionError as exc:
                raise OptionError("store", f"{pair!r}: {exc.problem}") from None
        return out

    def step_seconds(self, requests: npt.ArrayLike, nbytes: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """Seconds to read steps of ``requests`` requests and ``nbytes`` bytes each, the
        requests of a step in waves of ``concurrency`` (each wave one latency), the bytes at
        ``bandwidth``, the whole no faster than ``request_rate`` allows."""
        r = np.asarray(requests, dtype=np.float64)
        b = np.asarray(nbytes, dtype=np.float64)
        waves = np.ceil(r / self.concurrency)
        t = waves * self.latency_s + b / self.bandwidth
        if self.request_rate is not None:
            t = np.maximum(t, r / self.request_rate)
        return t  # type: ignore[no-any-return]

    def first_batch_seconds(self, requests: int, nbytes: int) -> float:
        """Time to the first batch: its step read alone (nothing prefetched yet)."""
        return float(self.step_seconds(requests, nbytes))

    def steps_per_second(self, requests: npt.ArrayLike, nbytes: npt.ArrayLike) -> float:
        """Steady input throughput (steps/s) of a rank that prefetches: the steps' requests
        pipelined ``concurrency`` at a time, so latency is paid once per ``concurrency`` requests."""
        r = float(np.sum(requests))
        b = float(np.sum(nbytes))
        n = int(np.size(requests))
        t = r / self.concurrency * self.latency_s + b / self.bandwidth
        if self.request_rate is not None:
            t = max(t, r / self.request_rate)
        return n / t if t > 0 else float("inf")
