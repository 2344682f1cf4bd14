"""Step index of a plan shard: open one row group's metadata, not the whole Parquet footer.

A shard's footer holds every row group's metadata (about 640 bytes each; 12,400 groups, 8 MB,
per rank of a 10^9-utterance plan) and opening the shard parses all of it (80 ms there). The
index records, per row group, its first and last step (int64) and the byte span of its metadata
inside the footer; :func:`step_footer` reads the footer's head (schema), that one span and its
tail (key-value metadata) and hands pyarrow a footer of the single group. The bytes are the
shard's own: a wrong index gives a footer that fails to parse or a group without the step
(checked), never other data. The index is recomputed from the shard (one walk of the footer's
Thrift compact bytes, about 85 us a group) and kept under the cache directory keyed by the
footer's SHA-256, which every open recomputes (``check_shard_facts``); an index that fails its
checks is logged in one line and rebuilt. Layout (int64 ``.npy``): a header (magic, version,
footer bytes, row-groups list header position, list end, groups), then per group (first step,
last step, span start, span end), positions in the footer.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from manifests.atomic_files import atomic_path
from manifests.errors import ManifestError
from manifests.hash_cache import default_cache_dir

STEP_INDEX_VERSION = 1
_MAGIC = 0x53544958  # "STIX"
_HEADER = 6
#: Thrift compact types (Parquet's footer encoding)
_STOP, _TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(13)
#: FileMetaData field of the row groups (parquet.thrift)
_ROW_GROUPS_FIELD = 4

log = logging.getLogger(__name__)


class IndexInvalid(Exception):
    """A cached step index that does not fit its shard (the reason is the message)."""


def index_file(facts: Mapping[str, Any], cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where the step index of the shard with these facts lives (by its footer's SHA-256)."""
    store = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return store / "step-index" / f"{facts['footer_sha256']}.v{STEP_INDEX_VERSION}.npy"


def step_footer(path: Path, facts: Mapping[str, Any], step: int,
                cache_dir: str | os.PathLike[str] | None = None) -> pq.FileMetaData | None:
    """The metadata of the one row group of shard ``path`` that holds ``step`` (a footer pyarrow
    reads that group with), from the step index (built on first use). ``facts``: the shard's
    :func:`~manifests.hash_cache.file_facts`, checked against ``plan.json`` by the caller. None
    when no group holds the step (the caller's whole-footer path says why)."""
    where = index_file(facts, cache_dir)
    for attempt in ("cached", "built"):
        try:
            index = _load(where, facts) if attempt == "cached" else build_step_index(path, where)
            return _group_footer(path, index, step)
        except FileNotFoundError:
            continue
        except IndexInvalid as exc:
            if attempt == "cached":
                log.warning("%s: step index of %s %s; rebuilt", where, path, exc)
                continue
            log.warning("%s: step index %s; the whole footer is read", path, exc)
    return None


def build_step_index(path: Path, where: Path | None = None) -> npt.NDArray[np.int64]:
    """The step index of shard ``path`` (see the module docstring), written to ``where`` when given."""
    footer = _footer(path)
    try:
        list_pos, spans, list_end = _row_group_spans(footer)
    except (IndexError, ValueError) as exc:
        raise IndexInvalid(f"could not be built (footer not walked: {exc})") from None
    md = pq.ParquetFile(path).metadata
    if md.num_row_groups != len(spans):
        raise IndexInvalid(f"could not be built ({len(spans)} row groups walked, the footer has {md.num_row_groups})")
    steps = np.empty((len(spans), 2), dtype=np.int64)
    col = md.schema.to_arrow_schema().get_field_index("step")
    for i in range(md.num_row_groups):
        steps[i] = _group_steps(md.row_group(i), col)
    header = np.asarray([_MAGIC, STEP_INDEX_VERSION, len(footer), list_pos, list_end, len(spans)], dtype=np.int64)
    index = np.concatenate([header, np.hstack([steps, np.asarray(spans, dtype=np.int64).reshape(-1, 2)]).ravel()])
    if where is not None:
        try:
            where.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(where, fsync=False) as tmp, open(tmp, "wb") as f:
                np.save(f, index, allow_pickle=False)
        except (OSError, ManifestError) as exc:  # a read-only cache: the index is used, not kept
            log.warning("%s: step index not kept (%s)", where, str(exc).splitlines()[0][:120])
    return index


def _group_steps(rg: pq.RowGroupMetaData, col: int) -> tuple[int, int]:
    """First and last step of a row group from its statistics (an empty group: max int64, -1)."""
    if rg.num_rows == 0:
        return int(np.iinfo(np.int64).max), -1
    st = rg.column(col).statistics
    if st is None or not st.has_min_max:
        raise IndexInvalid("could not be built (a row group has no step statistics)")
    return int(st.min), int(st.max)


def _load(where: Path, facts: Mapping[str, Any]) -> npt.NDArray[np.int64]:
    """The cached index, its header checked against the shard's footer (``FileNotFoundError``
    when there is none, :class:`IndexInvalid` when it does not fit)."""
    try:
        index = np.load(where, mmap_mode="r", allow_pickle=False)
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(where) from None
    except (OSError, ValueError) as exc:
        raise IndexInvalid(f"is unreadable ({str(exc).splitlines()[0][:80]})") from None
    if index.dtype != np.int64 or index.ndim != 1 or index.shape[0] < _HEADER:
        raise IndexInvalid("is not an int64 vector with a header")
    magic, version, footer_len, list_pos, list_end, groups = (int(x) for x in index[:_HEADER])
    if (magic, version) != (_MAGIC, STEP_INDEX_VERSION) or index.shape[0] != _HEADER + 4 * groups \
            or not 0 < list_pos < list_end <= footer_len < facts["size"]:
        raise IndexInvalid("has a header that does not fit the shard")
    return index


def _group_footer(path: Path, index: npt.NDArray[np.int64], step: int) -> pq.FileMetaData | None:
    """The single-group footer for ``step`` from ``index`` (None: no group holds it)."""
    footer_len, list_pos, list_end, groups = (int(x) for x in index[2:_HEADER])
    table = index[_HEADER:].reshape(groups, 4)
    g = int(np.searchsorted(table[:, 1], step))  # groups are in step order: the first ending at or after it
    if g >= groups or table[g, 0] > step:
        return None
    first, last, start, end = (int(x) for x in table[g])
    if not list_pos < start < end <= list_end:
        raise IndexInvalid("names a span outside the footer's row groups")
    with open(path, "rb") as fh:
        base = os.fstat(fh.fileno()).st_size - 8 - footer_len
        head = os.pread(fh.fileno(), list_pos, base)
        group = os.pread(fh.fileno(), end - start, base + start)
        tail = os.pread(fh.fileno(), footer_len - list_end, base + list_end)
    body = head + bytes([0x10 | _STRUCT]) + group + tail  # a list of one struct, then what followed the list
    try:
        md = pq.read_metadata(pa.BufferReader(b"PAR1" + body + len(body).to_bytes(4, "little") + b"PAR1"))
        col = md.schema.to_arrow_schema().get_field_index("step")
        got = _group_steps(md.row_group(0), col) if md.num_row_groups == 1 and col >= 0 else None
    except (OSError, pa.ArrowException, ValueError, IndexInvalid) as exc:
        raise IndexInvalid(f"gives a footer pyarrow refuses ({str(exc).splitlines()[0][:80]})") from None
    if got != (first, last):
        raise IndexInvalid(f"names row group {g} for steps {first}..{last}; its bytes hold {got}")
    return md


def _footer(path: Path) -> bytes:
    """The Thrift bytes of a Parquet file's footer (between the data and its length and magic)."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        tail = os.pread(fh.fileno(), 8, size - 8)
        n = int.from_bytes(tail[:4], "little")
        if size < 12 or tail[4:] != b"PAR1" or n > size - 12:
            raise IndexInvalid(f"could not be built ({path} has no Parquet footer)")
        return os.pread(fh.fileno(), n, size - 8 - n)


def _row_group_spans(b: bytes) -> tuple[int, list[tuple[int, int]], int]:
    """Where FileMetaData's row-groups list starts (its list header), each RowGroup struct's
    (start, end) and where the list ends, walking the compact protocol's top-level fields."""
    i, fid = 0, 0
    while True:
        h = b[i]
        i += 1
        if h == _STOP:
            raise ValueError("no row groups field")
        if h >> 4:
            fid += h >> 4
        else:
            z, i = _varint(b, i)
            fid = (z >> 1) ^ -(z & 1)
        if fid == _ROW_GROUPS_FIELD and h & 0x0F == _LIST:
            list_pos = i
            n, i = _list_header(b, i)
            spans = []
            for _ in range(n):
                start = i
                i = _skip(b, i, _STRUCT)
                spans.append((start, i))
            return list_pos, spans, i
        i = _skip(b, i, h & 0x0F)


def _varint(b: bytes, i: int) -> tuple[int, int]:
    out, shift = 0, 0
    while True:
        x = b[i]
        i += 1
        out |= (x & 0x7F) << shift
        if x < 0x80:
            return out, i
        shift += 7


def _list_header(b: bytes, i: int) -> tuple[int, int]:
    h = b[i]
    n = h >> 4
    return _varint(b, i + 1) if n == 15 else (n, i + 1)


def _skip(b: bytes, i: int, t: int) -> int:
    """The position after a value of compact type ``t`` starting at ``i``."""
    if t in (_TRUE, _FALSE):  # a bool field's value is in its header
        return i
    if t == _BYTE:
        return i + 1
    if t in (_I16, _I32, _I64):
        while b[i] & 0x80:
            i += 1
        return i + 1
    if t == _DOUBLE:
        return i + 8
    if t == _BINARY:
        n, i = _varint(b, i)
        return i + n
    if t in (_LIST, _SET):
        et = b[i] & 0x0F
        n, i = _list_header(b, i)
        if et in (_TRUE, _FALSE):  # a bool element is one byte
            return i + n
        for _ in range(n):
            i = _skip(b, i, et)
        return i
    if t == _MAP:
        n, i = _varint(b, i)
        if n:
            kv = b[i]
            i += 1
            for _ in range(n):
                i = _skip(b, _skip(b, i, kv >> 4), kv & 0x0F)
        return i
    if t == _STRUCT:
        while True:
            h = b[i]
            i += 1
            if h == _STOP:
                return i
            if not h >> 4:  # a long-form field id follows
                _, i = _varint(b, i)
            i = _skip(b, i, h & 0x0F)
    raise ValueError(f"unknown Thrift type {t} at byte {i}")
