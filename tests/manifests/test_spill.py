"""Spill files (manifests.spill): strings appended block by block read back whole and by runs,
numbers by runs and (key, string) records by ranges (and cut short), equal to slicing what was appended (hypothesis over blocks and runs); the
retained heap serves big blocks from the heap inside and maps them again outside; remove deletes
only the columns named."""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from manifests.spill import SpillFiles, retained_heap

TEXT = st.text(alphabet=st.sampled_from(["a", "é", "字", "-", "0"]), max_size=6)


@settings(max_examples=40, deadline=None)
@given(blocks=st.lists(st.lists(TEXT, max_size=8), min_size=1, max_size=4), data=st.data())
def test_strings_and_runs_read_back_what_was_appended(tmp_path_factory, blocks, data) -> None:
    root = Path(tmp_path_factory.mktemp("spill"))
    files = SpillFiles(root)
    for block in blocks:
        files.append_strings("ids", pa.array(block, pa.string()))
        files.append("n", np.arange(len(block), dtype=np.int64) + 7 * len(block))
        files.append_records("pairs", (np.arange(len(block)) + 7 * len(block)).astype(np.int32),
                             pa.array(block, pa.string()))
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
    assert files.count_records("pairs", np.int32) == (n, sum(len(x.encode()) for x in flat))
    if runs:
        a, z = int(starts[0]), int(sizes[0])
        keys, strings = files.read_record_range("pairs", np.int32, a, a + z)
        assert keys.tolist() == nums[a:a + z] and strings.to_pylist() == flat[a:a + z]
        files.cut_records("pairs", np.int32, a)  # pairs a: gone, the pairs before read as they were
        assert files.count_records("pairs", np.int32) == (a, sum(len(x.encode()) for x in flat[:a]))
        keys, strings = files.read_record_range("pairs", np.int32, 0, a)
        assert keys.tolist() == nums[:a] and strings.to_pylist() == flat[:a]


def _in_heap(a: np.ndarray) -> bool:
    """The array's buffer lies in the process's ``[heap]`` mapping (not a mapping of its own)."""
    at = a.ctypes.data
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.endswith("[heap]"):
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= at < hi:
                return True
    return False


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_retained_heap_serves_big_blocks_from_the_heap_and_maps_them_again_after() -> None:
    big = 64 << 20  # above glibc's largest mmap threshold (32 MiB)
    with retained_heap():
        inside = np.empty(big, np.uint8)
        assert _in_heap(inside)
        del inside
    after = np.empty(big, np.uint8)
    assert not _in_heap(after)


def test_remove_deletes_only_the_columns_named_open_or_closed(tmp_path: Path) -> None:
    mine = tmp_path / "spill"
    mine.mkdir()
    neighbour = tmp_path / "spill" / "user.txt"  # a file the spill did not write, beside its columns
    neighbour.write_text("keep")
    files = SpillFiles(mine)
    files.append("a", np.arange(3, dtype=np.int64))
    files.append("b", np.arange(4, dtype=np.int64))
    files.append("c", np.arange(5, dtype=np.int64))
    files.remove("a", "gone")  # "a" still open; "gone" never written
    files.close()
    assert not (mine / "a").exists()
    files.remove("b")  # closed
    assert sorted(p.name for p in mine.iterdir()) == ["c", "user.txt"]
    assert files.read("c", np.int64).tolist() == [0, 1, 2, 3, 4]
    assert neighbour.read_text() == "keep"
