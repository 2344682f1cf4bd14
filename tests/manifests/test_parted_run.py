"""PartedRun: markers of a split job, resume after an interruption, mixed runs refused, old markers read,
and the one place the split's numbers are checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from manifests.content_hash import file_sha256
from manifests.errors import DataprepError
from manifests.parted_run import PartedRun, check_split, read_marker

FP = {"tool": "t", "inputs": "abc", "num_shards": 3}


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / name
    p.write_text(text)
    return p


def test_an_interrupted_run_resumes_only_the_unfinished_parts(tmp_path: Path) -> None:
    run = PartedRun(tmp_path, FP, 3)
    run.check_folder()  # empty folder: nothing to refuse
    done = []
    for i in range(3):
        f = _write(tmp_path, f"data-{i}.txt", f"rows of part {i}")
        if i == 1:
            continue  # killed before its marker: files written, no marker
        run.mark_done(i, [f], rows=i)
        done.append(i)
    again = PartedRun(tmp_path, FP, 3)
    again.check_folder()
    todo = [i for i in range(3) if not again.is_done(i, [tmp_path / f"data-{i}.txt"])]
    assert todo == [1]
    with pytest.raises(DataprepError, match="1 of 3 parts not done: 1"):
        PartedRun.complete(tmp_path)
    again.mark_done(1, [tmp_path / "data-1.txt"], rows=1)
    markers = PartedRun.complete(tmp_path)
    assert [m["part_index"] for m in markers] == [0, 1, 2] and [m["rows"] for m in markers] == [0, 1, 2]
    # a file changed after its marker: the part is redone, and the set is not complete
    (tmp_path / "data-2.txt").write_text("damaged")
    assert not again.is_done(2, [tmp_path / "data-2.txt"])
    with pytest.raises(DataprepError, match="data-2.txt: missing or changed since its part finished"):
        PartedRun.complete(tmp_path)
    # a file the marker does not record is not done either
    assert not again.is_done(0, [tmp_path / "data-0.txt", tmp_path / "data-1.txt"])


def test_a_run_with_another_fingerprint_is_refused(tmp_path: Path) -> None:
    f = _write(tmp_path, "a.txt", "x")
    PartedRun(tmp_path, FP, 3).mark_done(0, [f])
    other = PartedRun(tmp_path, {**FP, "inputs": "def"}, 3)
    with pytest.raises(DataprepError, match=r"written by a different run \(inputs changed\)"):
        other.check_folder()
    assert not other.is_done(0, [f])
    # markers of two runs in one folder are a mixed set
    g = _write(tmp_path, "b.txt", "y")
    other.mark_done(1, [g])
    with pytest.raises(DataprepError, match="parts from different runs .*inputs differ"):
        PartedRun.complete(tmp_path)


def test_markers_written_before_the_rename_are_read(tmp_path: Path) -> None:
    """Compile's old keys (``shard_index`` / ``num_shards``) and pack's old file names (``shard-*``)."""
    run = PartedRun(tmp_path / "markers", FP, 2, files_folder=tmp_path)
    files = [_write(tmp_path, f"c{i}.tar", f"container {i}") for i in range(2)]
    for i, f in enumerate(files):
        old = {"version": 1, "shard_index": i, "num_shards": 2, "fingerprint_id": run.fingerprint_id,
               "fingerprint": FP, "rows": 5, "files": {f.name: file_sha256(f)}}
        _write(tmp_path / "markers", f"shard-{i:05d}-of-00002.done.json", json.dumps(old))
    run.check_folder()
    assert run.is_done(0, [files[0]]) and run.is_done(1, [files[1]])
    assert [m["part_index"] for m in PartedRun.complete(run.folder, files_folder=tmp_path)] == [0, 1]
    # redoing a part replaces its old-named marker by a new one (never two markers for one part)
    run.forget(1)
    run.mark_done(1, [files[1]], rows=5)
    names = sorted(p.name for p in run.folder.iterdir())
    assert names == ["part-00001-of-00002.done.json", "shard-00000-of-00002.done.json"]
    assert read_marker(run.folder / names[0])["num_parts"] == 2


@pytest.mark.parametrize("text", ["{", "[]", json.dumps({"version": 2}),
                                  json.dumps({"version": 1, "part_index": "0", "num_parts": 2,
                                              "fingerprint_id": "x", "files": {}}),
                                  json.dumps({"version": 1, "part_index": True, "num_parts": 2,
                                              "fingerprint_id": "x", "files": {}})])
def test_a_marker_that_is_not_ours_is_one_line(tmp_path: Path, text: str) -> None:
    p = _write(tmp_path, "part-00000-of-00002.done.json", text)
    with pytest.raises(DataprepError, match="not a part completion marker") as err:
        read_marker(p)
    assert "\n" not in str(err.value)


def test_split_checks_name_the_flag() -> None:
    check_split(4, 3, workers=2)
    check_split(None, None)
    for args, kw, msg in [((0, None), {}, "--num-parts: must be >= 1, got 0"),
                          ((4, 4), {}, r"--part-index 4 is not in \[0, 4\)"),
                          ((None, -1), {}, "--part-index: must be >= 0, got -1"),
                          ((None, None), {"workers": 0}, "--workers: must be >= 1, got 0"),
                          ((7, None), {"max_parts": 5, "max_what": "the number of rows"},
                           r"--num-parts: must be <= the number of rows \(5\), got 7"),
                          ((2.0, None), {}, "--num-parts: must be an integer, got 2.0"),
                          ((True, None), {}, "--num-parts: must be an integer, got True")]:
        with pytest.raises(DataprepError, match=msg):
            check_split(*args, **kw)
    with pytest.raises(DataprepError, match="--num-parts: must be >= 1, got 0"):
        PartedRun(".", FP, 0)
    with pytest.raises(DataprepError, match=r"--part-index 2 is not in \[0, 2\)"):
        PartedRun(".", FP, 2).marker_path(2)
