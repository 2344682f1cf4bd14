"""A forward scan of a store object's headers (a tar's index): :func:`open_scan`.

Each read outside the window held fetches a new window sized to the strides seen between reads:
about :data:`SCAN_HEADERS` headers a request where members are small (their data comes along:
cheaper than a round trip each), the header alone (:data:`SCAN_MIN` bytes) where members lie
more than :data:`SCAN_SKIP` bytes apart. Reads are pinned to the object's ETag (bytes).
"""

from __future__ import annotations

from typing import IO, Any

from manifests import storage


class _ScanFile(storage._RangeFile):
    """The file :func:`open_scan` returns (the module docstring says how it reads)."""

    def __init__(self, path: str, info: storage.ObjectInfo) -> None:
        super().__init__(path, info)
        self.buf, self.buf_at, self.prev_end, self.moved, self.reads = b"", 0, 0, 0, 0

    def readinto(self, buf: Any) -> int:
        n = max(0, min(len(buf), self.size - self.pos))
        if n == 0:
            return 0
        if self.pos >= self.prev_end:  # forward: a jump (to the next header) or a read on from the last
            self.moved += self.pos - self.prev_end + n
            self.reads += self.pos > self.prev_end or self.reads == 0
        self.prev_end = self.pos + n
        if not (self.buf_at <= self.pos and self.pos + n <= self.buf_at + len(self.buf)):
            stride = self.moved / max(1, self.reads)
            window = SCAN_MIN if stride > SCAN_SKIP or self.reads < 2 else int(SCAN_HEADERS * stride)
            end = min(self.size, self.pos + max(n, window, SCAN_MIN))
            self.buf, self.buf_at = storage._get_span(self.path, self.pos, end, self.info), self.pos
        rel = self.pos - self.buf_at
        buf[:n] = self.buf[rel:rel + n]
        self.pos += n
        return n


#: a header scan reads at least this many bytes a request
SCAN_MIN = 64 * 1024
#: members at most this far apart are read through (their data with their headers)
SCAN_SKIP = 256 * 1024
#: headers a scan request aims to cover where members are small
SCAN_HEADERS = 64


def open_scan(path: str) -> IO[bytes]:
    """A seekable file of the URL ``path`` for a forward scan of its headers (a tar's index):
    windows sized to the members' strides (see :class:`_ScanFile`), pinned to its ETag."""
    return _ScanFile(path, storage.known_info(path))  # type: ignore[return-value]
