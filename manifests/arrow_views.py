"""Zero-copy numpy views of Arrow arrays' buffers: the one place that reads them by hand.

A fixed-width array's values (:func:`values_view`, :func:`numpy_view` refusing nulls), a
string / binary array's offsets and data bytes (:func:`string_buffers`), each sliced to the
array's own rows (its ``offset`` and length), the validity bitmap (:func:`validity_bits`) and a
numeric column with its nulls filled (:func:`numeric_values`). ``pyarrow.Array.to_numpy`` and
``pyarrow.compute.fill_null`` import pandas on first use (0.8 s of CPU in a fresh process):
the commands and a trainer's start-up path read columns through these instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa


def single_chunk(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    """The array of a one-chunk column without copying (``combine_chunks`` copies even then)."""
    if isinstance(col, pa.Array):
        return col
    return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()


def values_view(arr: pa.Array, dtype: Any) -> npt.NDArray[Any]:
    """Zero-copy view, as ``dtype``, of a fixed-width array's values (a null's slot holds
    whatever bytes the writer left there)."""
    return np.frombuffer(arr.buffers()[1], dtype=dtype)[arr.offset: arr.offset + len(arr)]


def numpy_view(arr: pa.ChunkedArray | pa.Array, dtype: type[np.generic]) -> npt.NDArray[Any]:
    """Zero-copy numpy view of a null-free fixed-width array (or buffer-backed offsets)."""
    arr = single_chunk(arr)
    if arr.null_count:
        raise ValueError("numpy_view: column with nulls")
    return values_view(arr, dtype)


def numeric_values(col: pa.ChunkedArray | pa.Array, dtype: Any, fill: int | float = 0) -> npt.NDArray[Any]:
    """An integer or floating column's values as ``dtype`` (a view where nothing changes, a copy
    where the type differs or nulls are replaced by ``fill``); what ``pc.fill_null(col,
    fill).to_numpy().astype(dtype)`` gives, without importing pandas."""
    arr = single_chunk(col)
    if not (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type)):
        raise TypeError(f"numeric_values: {arr.type} is not an integer or floating type")
    null = null_mask(arr)
    out = values_view(arr, np.dtype(arr.type.to_pandas_dtype())).astype(dtype, copy=null is not None)
    if null is not None:
        out[null] = fill
    return out


def null_mask(col: pa.ChunkedArray | pa.Array) -> npt.NDArray[np.bool_] | None:
    """Where a column is null (a bool per row), or None when no row is."""
    arr = single_chunk(col)
    bits = validity_bits(arr)
    if bits is None:
        return None
    return np.unpackbits(bits, bitorder="little")[arr.offset: arr.offset + len(arr)] == 0


def validity_bits(arr: pa.Array) -> npt.NDArray[np.uint8] | None:
    """Zero-copy view of an array's validity bitmap (row ``i`` is valid when bit
    ``offset + i``, LSB first, is set), or None when no row is null."""
    validity = arr.buffers()[0]
    return None if arr.null_count == 0 or validity is None else np.frombuffer(validity, dtype=np.uint8)


def string_buffers(arr: pa.Array) -> tuple[npt.NDArray[np.int32] | npt.NDArray[np.int64], npt.NDArray[np.uint8]]:
    """Zero-copy views of a string / binary array (not a view type): its ``len + 1`` offsets
    (int32; int64 for the large types) into ``data``, the whole data buffer as uint8 (empty
    when there is none). Row ``i``'s bytes: ``data[offsets[i]:offsets[i + 1]]``."""
    _, offsets_buf, data_buf = arr.buffers()
    large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    offsets = np.frombuffer(offsets_buf, dtype=np.int64 if large else np.int32)[arr.offset: arr.offset + len(arr) + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return offsets, data
