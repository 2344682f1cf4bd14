"""Containers, every member accounted for, and compressed sources cut short (issue 24, classes
1 and 2), on real tars of real audio: every member and key of a container ends in the manifest
or in the rejects with its reason; a cut gzip source is one line. A hypothesis property cuts a
small WebDataset tar at every kind of byte position."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import polars as pl
import pytest
import soundfile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataprep.testing import write_tone
from manifests.containers import index_tar
from manifests.errors import DataprepError
from manifests.readers import iter_nemo_tarred, iter_source
from tests.hostile.conftest import refused
from tests.training._consumer import Corpus


def _add(tf: tarfile.TarFile, name: str, data: bytes | None, link: str = "") -> None:
    info = tarfile.TarInfo(name)
    if data is None:  # a symbolic link
        info.type, info.linkname = tarfile.SYMTYPE, link or "elsewhere.wav"
        tf.addfile(info)
        return
    info.size = len(data)
    tf.addfile(info, io.BytesIO(data))


def _tar(path: Path, members: list[tuple[str, bytes | None]]) -> Path:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members:
            _add(tf, name, data)
    return path


def _rows(frames: object) -> pl.DataFrame:
    return pl.concat([f.select("id", "reason", "detail", "text", "member_size") for f in frames])  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    root = tmp_path_factory.mktemp("clips")
    return [write_tone(root / f"c{i}.wav", 0.05 + 0.02 * i, sample_rate=8000, seed=i).read_bytes() for i in range(4)]


def _wds(path: Path, clips: list[bytes], keys: int = 3) -> Path:
    return _tar(path, [m for i in range(keys) for m in ((f"k{i}.wav", clips[i]), (f"k{i}.txt", f"text {i}".encode()))])


# --- WebDataset -------------------------------------------------------------------------------

def test_wds_cut_inside_a_header_or_at_a_boundary(tmp_path: Path, clips: list[bytes]) -> None:
    full = _wds(tmp_path / "full.tar", clips)
    data = full.read_bytes()
    with tarfile.open(full) as tf:
        k2 = next(m for m in tf.getmembers() if m.name == "k2.wav").offset
    for name, cut in (("header.tar", k2 + 100), ("boundary.tar", k2)):
        (tmp_path / name).write_bytes(data[:cut])
        got = dict(_rows(iter_source(tmp_path / name, "webdataset")).select("id", "reason").iter_rows())
        # k1 may have lost later members: rejected; k2 is past the cut: the container row says so
        assert got == {"k0": None, "k1": "truncated_container", name: "truncated_container"}, (name, got)


def test_wds_repeated_key_duplicate_member_two_audios_and_links(tmp_path: Path, clips: list[bytes]) -> None:
    tar = _tar(tmp_path / "w.tar", [
        ("a.wav", clips[0]), ("a.txt", b"a"), ("b.wav", clips[1]), ("b.txt", b"b"), ("a.json", b'{"text": "again"}'),
        ("c.wav", clips[2]), ("c.wav", clips[3]), ("c.txt", b"c"),  # a member name twice
        ("d.wav", clips[0]), ("d.flac", clips[1]), ("d.txt", b"d"),  # two audio members
        ("e.wav", None), ("e.txt", b"e"),  # its audio is a link
        ("f.wav", None),  # only a link
        ("g.wav", clips[2]), ("g.txt", b"g"),
    ])
    df = _rows(iter_source(tar, "webdataset"))
    got = dict(df.select("id", "reason").iter_rows())
    assert got == {"a": "duplicate_key", "b": None, "c": "duplicate_member", "d": "duplicate_member",
                   "e": "not_a_file", "f": "not_a_file", "g": None}
    assert df.height == len(got)  # one row per key, every key once
    assert df.filter(pl.col("id") == "g")["text"].item() == "g"


def test_wds_cut_tar_through_compile_keeps_the_complete_keys(corpus: Corpus, tmp_path: Path, clips: list[bytes]) -> None:
    from tests.training._consumer import invoke

    data = _wds(tmp_path / "full.tar", clips, keys=4).read_bytes()
    with tarfile.open(tmp_path / "full.tar") as tf:
        cut = next(m for m in tf.getmembers() if m.name == "k3.wav").offset + 7
    (tmp_path / "cut.tar").write_bytes(data[:cut])
    invoke("compile", str(tmp_path / "cut.tar"), "--tokenizer", str(corpus.spm), "-o", str(tmp_path / "m.parquet"))
    kept = pl.read_parquet(tmp_path / "m.parquet")
    rej = pl.read_parquet(tmp_path / "m.rejects.parquet")
    assert sorted(kept["id"]) == ["k0", "k1"]
    assert dict(rej.select("id", "reason").iter_rows()) == {"k2": "truncated_container", "cut.tar": "truncated_container"}


def _members_of(data: bytes) -> list[tuple[str, int, int, int]]:
    """(name, header offset, data offset, size) of each member of a tar's bytes."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        return [(m.name, m.offset, m.offset_data, m.size) for m in tf.getmembers()]


@pytest.fixture(scope="module")
def small_wds(tmp_path_factory: pytest.TempPathFactory, clips: list[bytes]) -> bytes:
    return _wds(tmp_path_factory.mktemp("wds") / "s.tar", clips).read_bytes()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frac=st.floats(min_value=0, max_value=1, exclude_max=True), near=st.integers(-3, 3))
def test_every_truncation_point_keeps_or_rejects_each_key(tmp_path_factory: pytest.TempPathFactory,
                                                          small_wds: bytes, frac: float, near: int) -> None:
    """Cut the tar anywhere (near member boundaries too): each key is kept intact or rejected,
    and a key that vanished is accounted for by a ``truncated_container`` row."""
    members = _members_of(small_wds)
    points = sorted({0, len(small_wds)} | {m[1] for m in members} | {m[2] + m[3] for m in members})
    cut = int(frac * len(small_wds)) if near == 0 else max(0, points[int(frac * len(points))] + near * 171)
    cut = min(cut, len(small_wds) - 1)
    path = tmp_path_factory.mktemp("cut") / "t.tar"
    path.write_bytes(small_wds[:cut])
    try:
        df = _rows(iter_source(path, "webdataset"))
    except DataprepError as exc:  # not even one header: the whole source is refused in one line
        assert cut < 512 and "\n" not in str(exc)
        return
    end_of_members = max(m[2] + (m[3] + 511) // 512 * 512 for m in members)
    reasons = dict(df.select("id", "reason").iter_rows())
    assert df["id"].n_unique() == df.height
    if cut < end_of_members + 512:  # anything after the last member's data lost: said so
        assert "t.tar" in reasons and reasons["t.tar"] == "truncated_container", (cut, reasons)
    keys = {f"k{i}" for i in range(3)}
    for key in keys - set(reasons):
        assert reasons.get("t.tar") == "truncated_container", (cut, reasons)
    for key in keys & set(reasons):
        if reasons[key] is None:  # kept: whole and correct
            i = int(key[1])
            wav = next(m for m in members if m[0] == f"{key}.wav")
            txt = next(m for m in members if m[0] == f"{key}.txt")
            assert max(wav[2] + wav[3], txt[2] + txt[3]) <= cut
            row = df.filter(pl.col("id") == key).row(0, named=True)
            assert row["text"] == f"text {i}" and row["member_size"] == wav[3]


# --- NeMo tarred and Shar ---------------------------------------------------------------------

def _nemo(root: Path, members: list[tuple[str, bytes | None]], lines: list[str]) -> tuple[list[str], list[str]]:
    tar = _tar(root / "audio_0.tar", members)
    man = root / "manifest_0.json"
    man.write_text("".join(json.dumps({"audio_filepath": a, "duration": 0.05, "text": a, "shard_id": 0}) + "\n"
                           for a in lines))
    return [str(man)], [str(tar)]


def test_nemo_member_is_the_exact_name_never_the_stem(tmp_path: Path, clips: list[bytes]) -> None:
    mans, tars = _nemo(tmp_path, [("a.flac", clips[0]), ("a.wav", clips[1]), ("b.flac", clips[2])], ["a.wav", "b.wav"])
    df = pl.concat(list(iter_nemo_tarred(mans, tars, text_field="text", chunk_rows=10)))
    got = dict(df.select("id", "reason").iter_rows())
    assert got == {"a.wav": None, "b.wav": "missing_member", "a.flac": "unlisted_member", "b.flac": "unlisted_member"}
    a = df.filter(pl.col("id") == "a.wav").row(0, named=True)
    with open(tars[0], "rb") as fh:
        fh.seek(a["member_offset"])
        assert fh.read(a["member_size"]) == clips[1]  # a.wav's bytes, not a.flac's


def test_nemo_duplicate_member_link_and_cut_tar(tmp_path: Path, clips: list[bytes]) -> None:
    mans, tars = _nemo(tmp_path, [("a.wav", clips[0]), ("a.wav", clips[1]), ("l.wav", None), ("b.wav", clips[2]),
                                  ("c.wav", clips[3])], ["a.wav", "b.wav", "c.wav", "l.wav"])
    data = Path(tars[0]).read_bytes()
    cut = next(m for m in _members_of(data) if m[0] == "c.wav")[1]  # at c.wav's header: c is lost
    Path(tars[0]).write_bytes(data[:cut])
    df = pl.concat(list(iter_nemo_tarred(mans, tars, text_field="text", chunk_rows=10)))
    rows = sorted(df.select("origin", "reason").rows())
    assert [r for _, r in rows].count("duplicate_member") == 1
    got = {(o.rsplit("/", 1)[-1], r) for o, r in rows}
    assert got == {("manifest_0.json:1", "duplicate_member"), ("manifest_0.json:2", None),
                   ("manifest_0.json:3", "missing_member"), ("manifest_0.json:4", "missing_member"),
                   ("audio_0.tar:l.wav", "not_a_file"), ("audio_0.tar", "truncated_container")}


def test_shar_recording_tar_without_its_cuts_file(tmp_path: Path, clips: list[bytes]) -> None:
    lhotse = pytest.importorskip("lhotse")
    cuts = []
    for i, raw in enumerate(clips):
        path = tmp_path / f"r{i}.wav"
        path.write_bytes(raw)
        rec = lhotse.Recording.from_file(path, recording_id=f"rec{i}")
        cuts.append(lhotse.MonoCut(id=f"cut{i}", start=0, duration=rec.duration, channel=0, recording=rec,
                                   supervisions=[lhotse.SupervisionSegment(id=f"s{i}", recording_id=f"rec{i}", start=0,
                                                                           duration=rec.duration, text=f"w {i}")]))
    shar = tmp_path / "shar"
    shar.mkdir()
    lhotse.CutSet.from_cuts(cuts).to_shar(shar, fields={"recording": "wav"}, shard_size=2)
    next(shar.glob("cuts.000001.jsonl*")).unlink()
    got = dict(pl.concat(list(iter_source(shar))).select("id", "reason").iter_rows())
    assert got == {"cut0": None, "cut1": None, "cut2.wav": "unlisted_member", "cut3.wav": "unlisted_member"}
    # a cut-off cuts file: one line, not "Aborted."
    first = next(shar.glob("cuts.000000.jsonl*"))
    raw = gzip.compress(first.read_bytes() if first.suffix != ".gz" else gzip.decompress(first.read_bytes()))
    first.unlink()
    (shar / "cuts.000000.jsonl.gz").write_bytes(raw[: len(raw) - 9])
    with pytest.raises(DataprepError, match="truncated or corrupt gzip stream"):
        list(iter_source(shar))


# --- compressed sources -----------------------------------------------------------------------

@pytest.mark.parametrize("name,fmt,cut", [("m.jsonl.gz", "nemo", 0.5), ("m.json.gz", "nemo", 0.97),
                                          ("m.json.gz", "auto", 0.97), ("cuts.jsonl.gz", "lhotse", 0.6),
                                          ("garbled.jsonl.gz", "nemo", -1)])
def test_cut_gzip_source_is_one_line(corpus: Corpus, tmp_path: Path, name: str, fmt: str, cut: float) -> None:
    text = corpus.source.read_bytes() * 40
    if fmt == "lhotse":
        rows = [json.loads(x) for x in corpus.source.read_text().splitlines()]
        text = "".join(json.dumps({"id": f"c{i}", "type": "MonoCut", "start": 0, "duration": r["duration"],
                                   "channel": 0, "supervisions": [{"id": f"s{i}", "recording_id": f"r{i}", "start": 0,
                                                                   "duration": r["duration"], "text": r["text"]}],
                                   "recording": {"id": f"r{i}", "sources": [{"type": "file", "channels": [0],
                                                                              "source": r["audio_filepath"]}],
                                                 "sampling_rate": 16000, "num_samples": 16000, "duration": 1.0}})
                       + "\n" for i, r in enumerate(rows * 40)).encode()
    z = gzip.compress(text)
    src = tmp_path / name
    src.write_bytes(z[: int(len(z) * cut)] if cut > 0 else z[:30] + bytes(60) + z[90:])
    args = ["compile", src, "--tokenizer", corpus.spm, "-o", tmp_path / "o.parquet"]
    line = refused(*args, *(["--format", fmt] if fmt != "auto" else []), match=str(src))
    assert "gzip" in line or "cannot tell the source format" in line
    assert not (tmp_path / "o.parquet").exists()


def test_index_reports_links_and_missing_end_block(tmp_path: Path, clips: list[bytes]) -> None:
    tar = _tar(tmp_path / "x.tar", [("a.wav", clips[0]), ("l.wav", None)])
    idx = index_tar(tar)
    assert idx.names == ["a.wav"] and idx.others == [(1, "l.wav", "symlink")] and idx.problem is None
    (tmp_path / "y.tar").write_bytes(tar.read_bytes()[:1024 + 512 * ((len(clips[0]) + 511) // 512) - 512 * 0])
    assert index_tar(tmp_path / "y.tar").problem is not None
    assert soundfile.info(io.BytesIO(clips[0])).frames > 0
