"""Readers of audio in containers on real tars and real audio: NeMo tarred, Lhotse Shar (written
by Lhotse itself), WebDataset, Hugging Face Parquet; every bad case a reject with its reason,
and members/rows in = rows out."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile

from dataprep.testing import write_tone
from manifests.containers import RangeFile, expand_braces, index_tar, read_range
from manifests.readers import detect_format, iter_nemo_tarred, iter_source
from manifests.schema import FULL_REJECTS_POLARS_SCHEMA


def _add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tf.addfile(info, io.BytesIO(data))


def _rows(frames: object) -> pl.DataFrame:
    frames = list(frames)  # type: ignore[call-overload]
    for f in frames:
        assert {k: v for k, v in f.schema.items() if k in FULL_REJECTS_POLARS_SCHEMA} == FULL_REJECTS_POLARS_SCHEMA
    return pl.concat([f.select(list(FULL_REJECTS_POLARS_SCHEMA)) for f in frames])


@pytest.fixture(scope="module")
def tones(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("tones")
    return [write_tone(root / f"u{i}.flac", 0.5 + 0.25 * i, sample_rate=16000, seed=i) for i in range(6)]


def test_expand_braces_as_nemo() -> None:
    assert expand_braces("manifest__OP_0..2_CL_.json") == ["manifest_0.json", "manifest_1.json", "manifest_2.json"]
    assert expand_braces("a_{08..10}.tar") == ["a_08.tar", "a_09.tar", "a_10.tar"]
    assert expand_braces("{x,y}/b_{0..1}") == ["x/b_0", "x/b_1", "y/b_0", "y/b_1"]
    assert expand_braces("plain.json") == ["plain.json"]


def test_tar_index_and_ranged_reads_match_the_members(tmp_path: Path, tones: list[Path]) -> None:
    tar = tmp_path / "a.tar"
    with tarfile.open(tar, "w") as tf:
        for t in tones[:3]:
            tf.add(t, arcname=t.name)
    idx = index_tar(tar)
    assert idx.names == [t.name for t in tones[:3]] and not idx.truncated and idx.problem is None
    import os

    fd = os.open(tar, os.O_RDONLY)
    try:
        for t, off, size in zip(tones, idx.offsets, idx.sizes):
            assert read_range(fd, off, size) == t.read_bytes()
            assert soundfile.info(RangeFile(fd, off, size)).frames == soundfile.info(str(t)).frames
    finally:
        os.close(fd)
    # cut the tar inside the last member's data
    data = tar.read_bytes()
    (tmp_path / "cut.tar").write_bytes(data[: idx.offsets[2] + idx.sizes[2] // 2])
    cut = index_tar(tmp_path / "cut.tar")
    assert cut.truncated == {tones[2].name}


def test_webdataset_keys_and_bad_keys(tmp_path: Path, tones: list[Path]) -> None:
    tar = tmp_path / "shard-000000.tar"
    with tarfile.open(tar, "w") as tf:
        _add(tf, "k0.flac", tones[0].read_bytes())
        _add(tf, "k0.json", json.dumps({"text": "zero", "lang": "en", "speaker": "s1"}).encode())
        _add(tf, "k1.flac", tones[1].read_bytes())
        _add(tf, "k1.txt", b"one")
        _add(tf, "k2.flac", tones[2].read_bytes())  # audio, no text
        _add(tf, "k3.txt", b"text without audio")
        _add(tf, "dir/k4.wav", b"RIFF")  # a key with a folder
        _add(tf, "dir/k4.json", b"{not json")
        _add(tf, "k5.json", json.dumps({"text": "five", "duration": 1.5}).encode())
        _add(tf, "k5.flac", tones[5].read_bytes())
    # a truncated last member: the tar is cut inside k6.flac's data
    with tarfile.open(tar, "a") as tf:
        _add(tf, "k6.txt", b"six")
        _add(tf, "k6.flac", tones[4].read_bytes())
    raw = tar.read_bytes()
    idx = index_tar(tar)
    tar.write_bytes(raw[: idx.offsets[-1] + 100])
    assert detect_format(tar) == "webdataset"
    df = _rows(iter_source(tar))
    got = dict(zip(df["id"], df["reason"]))
    assert got == {"k0": None, "k1": None, "k2": "missing_field", "k3": "missing_audio", "dir/k4": "malformed_line",
                   "k5": None, "k6": "truncated_member", "shard-000000.tar": "truncated_container"}
    ok = df.filter(pl.col("reason").is_null()).sort("id")
    assert ok["text"].to_list() == ["zero", "one", "five"]
    assert ok.filter(pl.col("id") == "k5")["duration"].item() == 1.5
    assert json.loads(ok.filter(pl.col("id") == "k0")["extra"].item()) == {"speaker": "s1"}
    assert df.filter(pl.col("id") == "k2")["detail"].item().startswith(f"{tar}:k2.flac: ")
    # addressing: the bytes at (container, offset, size) are the member's
    k1 = df.filter(pl.col("id") == "k1").row(0, named=True)
    assert k1["container"] == str(tar.resolve()) and k1["audio_path"] == f"{tar.resolve()}:k1.flac"
    with open(tar, "rb") as fh:
        fh.seek(k1["member_offset"])
        assert fh.read(k1["member_size"]) == tones[1].read_bytes()


def _nemo_tarred(root: Path, tones: list[Path]) -> tuple[list[str], list[str]]:
    manifests, tars = [], []
    for s in range(3):
        tar, man = root / f"audio_{s}.tar", root / f"manifest_{s}.json"
        with tarfile.open(tar, "w") as tf:
            for i in (2 * s, 2 * s + 1):
                _add(tf, f"utt{i}.flac", tones[i].read_bytes())
            if s == 2:
                _add(tf, "stray.flac", tones[0].read_bytes())  # in the tar, in no manifest
        lines = [{"audio_filepath": f"utt{i}.flac", "duration": soundfile.info(str(tones[i])).duration,
                  "text": f"t{i}", "shard_id": s} for i in (2 * s, 2 * s + 1)]
        if s == 0:
            lines.append({"audio_filepath": "ghost.flac", "duration": 1.0, "text": "named, absent", "shard_id": 0})
        man.write_text("".join(json.dumps(x) + "\n" for x in lines))
        manifests.append(str(man))
        tars.append(str(tar))
    return manifests, tars


def test_nemo_tarred_matches_members_by_shard_and_name(tmp_path: Path, tones: list[Path]) -> None:
    manifests, tars = _nemo_tarred(tmp_path, tones)
    Path(tars[1]).unlink()  # a missing shard: its manifest's rows are rejected
    df = _rows(iter_nemo_tarred(manifests, tars, text_field="text", chunk_rows=2))
    lines = sum(len(Path(m).read_text().splitlines()) for m in manifests)
    assert df.height == lines + 1  # + the stray member
    reasons = dict(zip(df["id"], df["reason"]))
    assert reasons == {"utt0.flac": None, "utt1.flac": None, "ghost.flac": "missing_member",
                       "utt2.flac": "missing_shard", "utt3.flac": "missing_shard",
                       "utt4.flac": None, "utt5.flac": None, "stray.flac": "unlisted_member"}
    stray = df.filter(pl.col("id") == "stray.flac").row(0, named=True)
    assert stray["origin"] == f"{tars[2]}:stray.flac"
    u4 = df.filter(pl.col("id") == "utt4.flac").row(0, named=True)
    assert u4["container"] == str(Path(tars[2]).resolve()) and u4["origin"] == f"{manifests[2]}:1"
    with open(tars[2], "rb") as fh:
        fh.seek(u4["member_offset"])
        assert fh.read(u4["member_size"]) == tones[4].read_bytes()


def test_shar_written_by_lhotse(tmp_path: Path, tones: list[Path]) -> None:
    lhotse = pytest.importorskip("lhotse")
    cuts = []
    for i, t in enumerate(tones[:4]):
        rec = lhotse.Recording.from_file(t, recording_id=f"rec{i}")
        cuts.append(lhotse.MonoCut(id=f"cut{i}", start=0, duration=rec.duration, channel=0, recording=rec,
                                   supervisions=[lhotse.SupervisionSegment(id=f"s{i}", recording_id=f"rec{i}", start=0,
                                                                           duration=rec.duration, text=f"word {i}",
                                                                           language="en")]))
    shar = tmp_path / "shar"
    shar.mkdir()
    lhotse.CutSet.from_cuts(cuts).to_shar(shar, fields={"recording": "flac"}, shard_size=2)
    assert detect_format(shar) == "shar"
    df = _rows(iter_source(shar))
    assert df["reason"].to_list() == [None] * 4 and df["text"].to_list() == [f"word {i}" for i in range(4)]
    assert df["duration"].to_list() == [soundfile.info(str(t)).duration for t in tones[:4]]
    (shar / "recording.000001.tar").unlink()
    df = _rows(iter_source(shar))
    assert df["reason"].to_list() == [None, None, "missing_shard", "missing_shard"]


def test_hf_parquet_audio_struct(tmp_path: Path, tones: list[Path]) -> None:
    audio = [{"bytes": t.read_bytes(), "path": t.name} for t in tones[:4]] + [{"bytes": None, "path": "gone.flac"}]
    table = pa.table({"audio": pa.array(audio, pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                      "sentence": [f"s{i}" for i in range(5)], "client": ["c"] * 5})
    path = tmp_path / "train-00000.parquet"
    pq.write_table(table, path, row_group_size=2)
    assert detect_format(path) == "hf-parquet"
    frames = list(iter_source(path))
    df = _rows(frames)
    assert df["reason"].to_list() == [None] * 4 + ["missing_audio"]
    assert df["detail"][4] == f"{path}:5: audio struct has null bytes"
    assert df["id"].to_list() == [t.name for t in tones[:4]] + ["gone.flac"]
    assert df["row_group"].to_list() == [0, 0, 1, 1, 2] and df["group_row"].to_list() == [0, 1, 0, 1, 0]
    assert json.loads(df["extra"][0]) == {"audio_path": tones[0].name, "client": "c"}
    blobs = pl.concat([f.select("__audio_bytes") for f in frames])["__audio_bytes"].to_list()
    assert blobs[:4] == [t.read_bytes() for t in tones[:4]] and blobs[4] is None
