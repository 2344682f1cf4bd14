"""Spill files (manifests.spill): strings appended block by block read back whole and by runs,
numbers by runs, equal to slicing what was appended (hypothesis over blocks and runs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from manifests.spill import SpillFiles

TEXT = st.text(alphabet=st.sampled_from(["a", "é", "字", "-", "0"]), max_size=6)


@settings(max_examples=40, deadline=None)
@given(blocks=st.lists(st.lists(TEXT, max_size=8), min_size=1, max_size=4), data=st.data())
def test_strings_and_runs_read_back_what_was_appended(tmp_path_factory, blocks, data) -> None:
    root = Path(tmp_path_factory.mktemp("spill"))
    files = SpillFiles(root)
    for block in blocks:
        files.append_strings("ids", pa.array(block, pa.string()))
        files.append("n", np.arange(len(block), dtype=np.int64) + 7 * len(block))
    files.close()
    flat = [s for b in blocks for s in b]
    nums = [int(x) for b in blocks for x in np.arange(len(b)) + 7 * len(b)]
    assert files.read_strings("ids").to_pylist() == flat
    n = len(flat)
    runs = data.draw(st.lists(st.tuples(st.integers(0, n), st.integers(0, n)), max_size=6))
    starts = np.array([min(a, b) for a, b in runs], dtype=np.int64)
    sizes = np.array([abs(a - b) for a, b in runs], dtype=np.int64)
    assert files.read_string_runs("ids", starts, sizes).to_pylist() == [
        flat[i] for a, z in zip(starts, sizes) for i in range(a, a + z)]
    if n:
        assert files.read_runs("n", np.int64, starts, sizes).tolist() == [
            nums[i] for a, z in zip(starts, sizes) for i in range(a, a + z)]
