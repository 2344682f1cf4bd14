"""Newline-aligned byte blocks of a text file as Arrow/Polars string columns, zero-copy.

A file (plain or gzip) is read in blocks of ``block_bytes``; each block is cut at its last
newline, lines are found with numpy and wrapped as one Arrow string array without a Python
object per line. Invariants: line numbers are 1-based and count every line of the file
(blank ones included); a UTF-8 BOM at the start is dropped; CRLF endings are stripped; a
last line without a newline is still a line; lines that are not valid UTF-8 come back with
``line`` null and ``utf8_error`` set. Blank (whitespace-only) lines are dropped.
"""

from __future__ import annotations

import codecs
import gzip
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np
import polars as pl
import pyarrow as pa

BLOCK_BYTES = 16 << 20
_BOM = b"\xef\xbb\xbf"


def open_binary(path: Path) -> BinaryIO:
    """Open ``path`` for reading bytes, transparently gunzipping (by magic bytes)."""
    with open(path, "rb") as fh:
        magic = fh.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def _bad_utf8(data: bytes, starts: np.ndarray) -> dict[int, str]:
    """Index of each line holding invalid UTF-8 -> a short description (only bad lines loop)."""
    bad: dict[int, str] = {}
    mv = memoryview(data)
    pos = 0
    while pos < len(data):
        try:
            codecs.utf_8_decode(mv[pos:], "strict", True)
            break
        except UnicodeDecodeError as exc:
            at = pos + exc.start
            i = int(np.searchsorted(starts, at, side="right")) - 1
            bad[i] = f"invalid UTF-8 byte 0x{data[at]:02x} at column {at - int(starts[i]) + 1}"
            pos = int(starts[i + 1]) if i + 1 < len(starts) else len(data)
    return bad


def _block_frame(data: bytes, first_lineno: int) -> pl.DataFrame:
    """All lines of ``data`` (which ends with a newline) as (lineno, line, utf8_error)."""
    buf = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(buf == 10)
    n = len(ends)
    starts = np.empty(n, dtype=np.int64)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    offsets = np.empty(n + 1, dtype=np.int32 if len(data) < 2**31 else np.int64)
    offsets[:n] = starts
    offsets[n] = len(data)
    bad = _bad_utf8(data, starts)
    validity = None
    if bad:
        mask = np.ones(n, dtype=bool)
        mask[list(bad)] = False
        validity = pa.py_buffer(np.packbits(mask, bitorder="little").tobytes())
    typ = pa.string() if offsets.dtype == np.int32 else pa.large_string()
    arr = pa.Array.from_buffers(typ, n, [validity, pa.py_buffer(offsets), pa.py_buffer(data)])
    errors: list[str | None] | None = None
    if bad:
        errors = [None] * n
        for i, msg in bad.items():
            errors[i] = msg
    frame = pl.DataFrame(
        {
            "lineno": pl.int_range(first_lineno, first_lineno + n, dtype=pl.Int64, eager=True),
            "line": pl.from_arrow(arr).cast(pl.String).str.strip_chars_end("\r\n"),
            "utf8_error": pl.Series(errors, dtype=pl.String) if errors else pl.repeat(None, n, dtype=pl.String, eager=True),
        }
    )
    # Blank lines carry nothing: dropped (documented); undecodable lines are kept.
    return frame.filter(pl.col("line").is_null() | (pl.col("line").str.strip_chars() != ""))


def iter_lines(path: Path, chunk_rows: int, block_bytes: int = BLOCK_BYTES) -> Iterator[pl.DataFrame]:
    """Yield frames of at most ``chunk_rows`` non-blank lines: lineno (1-based), line, utf8_error."""
    if chunk_rows < 1:
        raise ValueError("chunk_rows must be >= 1")
    lineno = 1
    carry = b""
    first = True
    with open_binary(path) as fh:
        while True:
            block = fh.read(block_bytes)
            data = carry + block if carry else block
            if first and data:
                if len(data) < 3 and block:
                    carry = data
                    continue
                if data.startswith(_BOM):
                    data = data[3:]
                first = False
            if not block:
                if not data:
                    return
                if not data.endswith(b"\n"):
                    data += b"\n"
                cut = len(data)
            else:
                cut = data.rfind(b"\n") + 1
                if cut == 0:
                    carry = data
                    continue
            carry = data[cut:]
            frame = _block_frame(data[:cut], lineno)
            lineno += data.count(b"\n", 0, cut)
            for start in range(0, frame.height, chunk_rows):
                yield frame.slice(start, chunk_rows)
            if not block:
                return
