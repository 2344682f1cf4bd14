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
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa

from manifests.errors import ManifestError

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


#: ASCII whitespace (what ``bytes.strip`` removes); blank-line candidates start with one.
_WS = np.array([9, 10, 11, 12, 13, 32], dtype=np.uint8)
#: What polars' ``str.strip_chars`` (Rust ``char::is_whitespace``) removes.
_UNICODE_WS = "\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"


@dataclass(frozen=True)
class LineBlock:
    """Non-blank lines of one newline-aligned block, without a Python object per line.

    ``lines`` holds each line *with* its terminator (``\\n`` or ``\\r\\n``), zero-copy over
    the block's bytes (null where the line is not valid UTF-8); ``lineno`` is 1-based;
    ``utf8_errors`` maps a row index of ``lines`` to a description of its bad byte.
    """

    lineno: npt.NDArray[np.int64]
    lines: pa.Array
    utf8_errors: dict[int, str]
    first_byte: npt.NDArray[np.uint8]

    def __len__(self) -> int:
        return len(self.lineno)

    def table(self, batch_rows: int = 8192) -> pa.Table:
        """(lineno int64, line string) as an Arrow table in record batches of ``batch_rows``
        (zero-copy slices: DuckDB scans one batch per thread task)."""
        table = pa.Table.from_arrays([pa.array(self.lineno, type=pa.int64()), self.lines], names=["lineno", "line"])
        return pa.Table.from_batches(table.to_batches(max_chunksize=batch_rows), schema=table.schema)

    def starts_with(self, byte: bytes) -> npt.NDArray[np.bool_]:
        """Whether each line's first byte is ``byte``."""
        return self.first_byte == byte[0]

    def line(self, i: int) -> str | None:
        """Row ``i`` without its line terminator (for messages; not for hot loops)."""
        v = self.lines[i].as_py()
        return None if v is None else v.rstrip("\r\n")


def _is_blank(line: bytes) -> bool:
    return not line.decode("utf-8", "replace").strip(_UNICODE_WS)


def line_block(data: bytes, first_lineno: int) -> LineBlock:
    """All non-blank lines of ``data`` (which ends with a newline) as a :class:`LineBlock`."""
    buf = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(buf == 10)
    n = len(ends)
    starts = np.empty(n, dtype=np.int64)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    bad = _bad_utf8(data, starts)
    # Blank lines carry nothing: dropped. Only lines starting with whitespace or a non-ASCII
    # byte can be blank; those few are checked one by one.
    cand = np.flatnonzero(np.isin(buf[starts], _WS) | (buf[starts] >= 0x80))
    blank = [int(i) for i in cand if int(i) not in bad and _is_blank(data[starts[i]: ends[i] + 1])]
    offsets = np.empty(n + 1, dtype=np.int32 if len(data) < 2**31 else np.int64)
    offsets[:n] = starts
    offsets[n] = len(data)
    validity = None
    if bad:
        mask = np.ones(n, dtype=bool)
        mask[list(bad)] = False
        validity = pa.py_buffer(np.packbits(mask, bitorder="little").tobytes())
    typ = pa.string() if offsets.dtype == np.int32 else pa.large_string()
    arr = pa.Array.from_buffers(typ, n, [validity, pa.py_buffer(offsets), pa.py_buffer(data)])
    lineno = np.arange(first_lineno, first_lineno + n, dtype=np.int64)
    first = buf[starts]
    if blank:
        keep = np.ones(n, dtype=bool)
        keep[blank] = False
        idx = np.flatnonzero(keep)
        arr = arr.take(pa.array(idx))
        lineno = lineno[idx]
        first = first[idx]
        pos = np.cumsum(keep) - 1
        bad = {int(pos[i]): msg for i, msg in bad.items()}
    return LineBlock(lineno=lineno, lines=arr, utf8_errors=bad, first_byte=first)


def _block_frame(data: bytes, first_lineno: int) -> pl.DataFrame:
    """All non-blank lines of ``data`` (which ends with a newline) as (lineno, line, utf8_error)."""
    block = line_block(data, first_lineno)
    n = len(block)
    errors: list[str | None] | None = None
    if block.utf8_errors:
        errors = [None] * n
        for i, msg in block.utf8_errors.items():
            errors[i] = msg
    return pl.DataFrame(
        {
            "lineno": block.lineno,
            "line": pl.from_arrow(block.lines).cast(pl.String).str.strip_chars_end("\r\n"),
            "utf8_error": pl.Series(errors, dtype=pl.String) if errors else pl.repeat(None, n, dtype=pl.String, eager=True),
        }
    )


def iter_blocks(path: Path, block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[bytes, int]]:
    """Newline-terminated blocks of ``path`` (BOM dropped, final newline added), with the
    1-based number of each block's first line."""
    lineno = 1
    carry = b""
    first = True
    with open_binary(path) as fh:
        while True:
            try:
                block = fh.read(block_bytes)
            except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
                # a cut or damaged gzip stream: one line, never a silent end (nor click's "Aborted.")
                where = f" after line {lineno - 1}" if lineno > 1 else ""
                raise ManifestError(f"{path}: truncated or corrupt gzip stream{where} ({exc}): the source is "
                                    "refused (re-copy or re-compress it)") from None
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
            yield data[:cut], lineno
            lineno += data.count(b"\n", 0, cut)
            if not block:
                return


def iter_line_blocks(path: Path, chunk_rows: int, block_bytes: int = BLOCK_BYTES) -> Iterator[LineBlock]:
    """:class:`LineBlock` s of at most ``chunk_rows`` non-blank lines each, in file order."""
    if chunk_rows < 1:
        raise ValueError("chunk_rows must be >= 1")
    for data, lineno in iter_blocks(path, block_bytes):
        blk = line_block(data, lineno)
        if len(blk) <= chunk_rows:
            if len(blk):
                yield blk
            continue
        for start in range(0, len(blk), chunk_rows):
            stop = min(start + chunk_rows, len(blk))
            yield LineBlock(lineno=blk.lineno[start:stop], lines=blk.lines.slice(start, stop - start),
                            utf8_errors={i - start: m for i, m in blk.utf8_errors.items() if start <= i < stop},
                            first_byte=blk.first_byte[start:stop])


def iter_lines(path: Path, chunk_rows: int, block_bytes: int = BLOCK_BYTES) -> Iterator[pl.DataFrame]:
    """Yield frames of at most ``chunk_rows`` non-blank lines: lineno (1-based), line, utf8_error."""
    if chunk_rows < 1:
        raise ValueError("chunk_rows must be >= 1")
    for data, lineno in iter_blocks(path, block_bytes):
        frame = _block_frame(data, lineno)
        for start in range(0, frame.height, chunk_rows):
            yield frame.slice(start, chunk_rows)
