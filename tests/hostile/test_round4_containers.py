"""Container readers check what they read against what the container declares (issue 44), on
real tars of real audio: a compressed tar is one line, tars joined end to end and extensions
that differ in case only are rejects (nothing read silently past or over), truncations cut with
real bytes are found, brace ranges are bounded."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import polars as pl
import pytest

from dataprep.testing import write_tone
from manifests.containers import expand_braces, index_tar
from manifests.errors import DataprepError
from manifests.readers import iter_nemo_tarred, iter_source


def _tar(path: Path, members: list[tuple[str, bytes]], mode: str = "w") -> Path:
    with tarfile.open(path, mode, format=tarfile.USTAR_FORMAT) as tf:  # type: ignore[call-overload]
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    root = tmp_path_factory.mktemp("clips")
    return [write_tone(root / f"c{i}.wav", 0.05 + 0.02 * i, sample_rate=8000, seed=i).read_bytes() for i in range(4)]


def _wds_members(clips: list[bytes], keys: range) -> list[tuple[str, bytes]]:
    return [m for i in keys for m in ((f"k{i}.wav", clips[i]), (f"k{i}.txt", f"text {i}".encode()))]


def _nemo(tmp_path: Path, clips: list[bytes]) -> tuple[Path, list[tuple[str, bytes]]]:
    manifest = tmp_path / "m.json"
    manifest.write_text("".join(json.dumps({"audio_filepath": f"u{i}.wav", "duration": 0.05 + 0.02 * i,
                                            "text": f"t{i}"}) + "\n" for i in range(3)))
    return manifest, [(f"u{i}.wav", clips[i]) for i in range(3)]


def _reasons(frames: object) -> dict[str, str | None]:
    return dict(pl.concat([f.select("id", "reason") for f in frames]).iter_rows())  # type: ignore[attr-defined]


@pytest.mark.parametrize("fmt", ["webdataset", "nemo"])
def test_compressed_tar_is_one_line(tmp_path: Path, clips: list[bytes], fmt: str) -> None:
    if fmt == "webdataset":
        tar = _tar(tmp_path / "w.tar", _wds_members(clips, range(3)), "w:gz")
        run = lambda: list(iter_source(tar, "webdataset"))
    else:
        manifest, members = _nemo(tmp_path, clips)
        tar = _tar(tmp_path / "audio_0.tar", members, "w:gz")
        run = lambda: list(iter_nemo_tarred([str(manifest)], [str(tar)], text_field="text", chunk_rows=10))
    with pytest.raises(DataprepError, match=r"^\S*audio_0.tar: a gzip-compressed tar: .*decompress it first|"
                                            r"^\S*w.tar: a gzip-compressed tar: .*decompress it first") as err:
        run()
    assert "\n" not in str(err.value)


def test_tars_joined_end_to_end_are_a_reject_not_a_silent_loss(tmp_path: Path, clips: list[bytes]) -> None:
    first = _tar(tmp_path / "a.tar", _wds_members(clips, range(1))).read_bytes()
    second = _tar(tmp_path / "b.tar", _wds_members(clips, range(1, 3))).read_bytes()
    (tmp_path / "joined.tar").write_bytes(first + second)
    got = _reasons(iter_source(tmp_path / "joined.tar", "webdataset"))
    assert got == {"k0": None, "joined.tar": "trailing_data"}
    assert index_tar(tmp_path / "a.tar").trailing is None  # the end padding of one tar is zeros
    manifest, members = _nemo(tmp_path, clips)
    joined = tmp_path / "audio_0.tar"
    joined.write_bytes(_tar(tmp_path / "n1.tar", members[:2]).read_bytes()
                       + _tar(tmp_path / "n2.tar", members[2:]).read_bytes())
    got = _reasons(iter_nemo_tarred([str(manifest)], [str(joined)], text_field="text", chunk_rows=10))
    assert got == {"u0.wav": None, "u1.wav": None, "u2.wav": "missing_member", "audio_0.tar": "trailing_data"}


def test_extension_twice_in_another_case_is_a_duplicate_member(tmp_path: Path, clips: list[bytes]) -> None:
    tar = _tar(tmp_path / "w.tar", [("a.wav", clips[0]), ("a.WAV", clips[1]), ("a.txt", b"a"),
                                    ("b.wav", clips[1]), ("b.txt", b"b"), ("b.TXT", b"B"),
                                    ("c.wav", clips[2]), ("c.txt", b"c")])
    assert _reasons(iter_source(tar, "webdataset")) == {"a": "duplicate_member", "b": "duplicate_member", "c": None}


def _set_size(data: bytearray, header: int, size: int) -> None:
    """Write ``size`` into the tar header at byte ``header`` and fix its checksum."""
    data[header + 124:header + 136] = b"%011o\0" % size
    block = data[header:header + 512]
    block[148:156] = b" " * 8
    data[header + 148:header + 156] = b"%06o\0 " % sum(block)


@pytest.mark.parametrize("fmt", ["webdataset", "nemo"])
def test_declared_size_past_the_file_and_byte_cuts_are_found(tmp_path: Path, clips: list[bytes], fmt: str) -> None:
    manifest, members = _nemo(tmp_path, clips)
    members = _wds_members(clips, range(3)) if fmt == "webdataset" else members
    full = _tar(tmp_path / "full.tar", members).read_bytes()
    with tarfile.open(tmp_path / "full.tar") as tf:
        last = next(m for m in tf.getmembers() if m.name.endswith("2.wav"))
    first_id, last_id = ("k0", "k2") if fmt == "webdataset" else ("u0.wav", "u2.wav")
    cases = {"inflated": None, "in_data": last.offset_data + 10, "in_header": last.offset + 100,
             "at_header": last.offset}
    for name, cut in cases.items():
        data = bytearray(full)
        if cut is None:
            _set_size(data, last.offset, 10**9)  # declares far more bytes than the file holds
        tar = tmp_path / f"{name}.tar"
        tar.write_bytes(bytes(data if cut is None else data[:cut]))
        frames = (iter_source(tar, "webdataset") if fmt == "webdataset"
                  else iter_nemo_tarred([str(manifest)], [str(tar)], text_field="text", chunk_rows=10))
        got = _reasons(frames)
        assert got[tar.name] == "truncated_container", (name, got)
        # the cut member is a reject (or, for WebDataset, gone with the tail the container row names)
        assert got.get(last_id, "truncated_container") != None, (name, got)
        assert got[first_id] is None, (name, got)  # a whole member before the cut is kept


def test_brace_ranges_are_bounded_before_expansion() -> None:
    for pattern in ("a_{0..999999999}.tar", "a__OP_0..99999999999999999999_CL_.tar", "a_{0..99}" * 4 + ".tar"):
        with pytest.raises(DataprepError, match="names more than 1048576 paths") as err:
            expand_braces(pattern)
        assert "\n" not in str(err.value)
