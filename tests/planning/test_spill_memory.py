"""manifests.spill.SpillFiles holds its columns in memory (``memory``) with the same results as
on disk: every read of numbers, strings and records, cuts, removal; nothing under ``root``."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from manifests.spill import SpillFiles, sorted_runs


def _fill(files: SpillFiles, blocks: list[list[str]]) -> None:
    for i, block in enumerate(blocks):
        n = len(block)
        files.append("x", np.arange(n, dtype=np.float64) * (i + 1) + 0.5)
        files.append_strings("s", pa.array(block, pa.string()))
        files.append_records("r", np.arange(n, dtype=np.int32) + 100 * i, pa.array(block, pa.string()))
    files.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blocks=st.lists(st.lists(st.text(max_size=6), max_size=7), min_size=1, max_size=5), data=st.data())
def test_memory_columns_read_as_files_do(tmp_path: Path, blocks: list[list[str]], data: st.DataObject) -> None:
    root = Path(tempfile.mkdtemp(dir=tmp_path))  # a fresh folder per example
    disk, mem = SpillFiles(root), SpillFiles(tmp_path / "nowhere", {})
    _fill(disk, blocks)
    _fill(mem, blocks)
    assert not (tmp_path / "nowhere").exists()
    n = sum(len(b) for b in blocks)
    for f in (disk, mem):
        assert f.count_strings("s") == n and f.count_records("r", np.int32)[0] == n
    assert np.array_equal(disk.read("x", np.float64), mem.read("x", np.float64))
    assert np.array_equal(disk.map("x", np.float64), mem.map("x", np.float64))
    assert disk.read_strings("s").equals(mem.read_strings("s"))
    assert disk.count_records("r", np.int32) == mem.count_records("r", np.int32)
    if n:
        a = data.draw(st.integers(0, n - 1))
        b = data.draw(st.integers(a, n))
        assert np.array_equal(disk.read_range("x", np.float64, a, b), mem.read_range("x", np.float64, a, b))
        kd, sd = disk.read_record_range("r", np.int32, a, b)
        km, sm = mem.read_record_range("r", np.int32, a, b)
        assert np.array_equal(kd, km) and sd.equals(sm)
        starts = np.asarray(data.draw(st.lists(st.integers(0, n - 1), max_size=5)), dtype=np.int64)
        sizes = np.asarray([data.draw(st.integers(0, n - s)) for s in starts.tolist()], dtype=np.int64)
        assert np.array_equal(disk.read_runs("x", np.float64, starts, sizes), mem.read_runs("x", np.float64, starts, sizes))
        assert disk.read_string_runs("s", starts, sizes).equals(mem.read_string_runs("s", starts, sizes))
        disk.cut_records("r", np.int32, a)
        mem.cut_records("r", np.int32, a)
        assert disk.count_records("r", np.int32) == mem.count_records("r", np.int32)
        kd, sd = disk.read_record_range("r", np.int32, 0, a)
        km, sm = mem.read_record_range("r", np.int32, 0, a)
        assert np.array_equal(kd, km) and sd.equals(sm)
    assert [r.tolist() for r in sorted_runs(disk, "x", n, 3)] == [r.tolist() for r in sorted_runs(mem, "x", n, 3)]
    for f in (disk, mem):
        f.remove("x")
        assert f.read("x", np.float64).shape == (0,)


def test_a_whole_column_in_memory_is_read_only_and_a_new_append_starts_afresh(tmp_path: Path) -> None:
    mem = SpillFiles(tmp_path, {})
    values = np.arange(4.0)
    mem.append("x", values)
    values[:] = -1  # the caller's array is copied
    got = mem.read("x", np.float64)
    assert got.tolist() == [0.0, 1.0, 2.0, 3.0] and not got.flags.writeable
    mem.close()
    SpillFiles(tmp_path, mem.memory).append("x", np.arange(2.0))  # another object: as a file opened "wb"
    assert mem.read("x", np.float64).tolist() == [0.0, 1.0]
    assert mem.written_bytes() == 16 and not list(tmp_path.iterdir())


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(0, 40), max_size=6), room=st.integers(0, 200))
def test_a_reserved_column_reads_as_chunks_do(sizes: list[int], room: int) -> None:
    plain, reserved = SpillFiles(Path("/nowhere"), {}), SpillFiles(Path("/nowhere"), {})
    reserved.reserve("x", room)
    for i, n in enumerate(sizes):
        a = np.arange(n, dtype=np.int32) + 100 * i
        plain.append("x", a)
        reserved.append("x", a)
        a[:] = -1  # the caller's array reused: the column kept its values
    plain.close()
    reserved.close()
    assert reserved.read("x", np.int32).tolist() == plain.read("x", np.int32).tolist()
    if 4 * sum(sizes) <= room:  # it fits its room: one chunk, read whole without a join
        assert len(reserved.memory["x"]) <= 1  # type: ignore[index]
    reserved.remove("x")
    assert not reserved.memory
