"""Zero-copy numpy views of Arrow arrays.

``pyarrow.Array.to_numpy`` imports pandas on its first call (half a second of a fresh
process); readers on a trainer's start-up path use these views instead.
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


def numpy_view(arr: pa.ChunkedArray | pa.Array, dtype: type[np.generic]) -> npt.NDArray[Any]:
    """Zero-copy numpy view of a null-free fixed-width array (or buffer-backed offsets)."""
    arr = single_chunk(arr)
    if arr.null_count:
        raise ValueError("numpy_view: column with nulls")
    return np.frombuffer(arr.buffers()[1], dtype=dtype)[arr.offset: arr.offset + len(arr)]
