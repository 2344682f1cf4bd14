"""manifests.audio on real audio: a row's samples from a loose WAV / FLAC, a tar member (byte range)
and a Hugging Face Parquet row equal soundfile's decode of the loose file (mono mix, one channel,
every channel, segments, resampling); failures are one line naming the utterance and file."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile
import soxr

from manifests.audio import AudioError, AudioReader, load_audio, not_regular
from manifests.containers import index_tar

RATE = 22050


@pytest.fixture(scope="module")
def audio(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Stereo WAV and FLAC (3 s of noise, two different channels), a mono WAV; the same files as tar
    members and as rows of a two-row-group Hugging Face Parquet."""
    root = tmp_path_factory.mktemp("audio")
    rng = np.random.default_rng(7)
    stereo = (rng.uniform(-0.5, 0.5, (3 * RATE, 2)) * [1.0, 0.3]).astype(np.float32)
    files = {"st.wav": (stereo, "PCM_16"), "st.flac": (stereo, "PCM_24"), "mono.wav": (stereo[:, :1], "PCM_16")}
    for name, (x, subtype) in files.items():
        soundfile.write(root / name, x, RATE, subtype=subtype)
    tar = root / "a.tar"
    with tarfile.open(tar, "w") as tf:
        for name in files:
            tf.add(root / name, arcname=f"dir/{name}")
    idx = index_tar(tar)
    members = {n.split("/")[-1]: (o, s) for n, o, s in zip(idx.names, idx.offsets, idx.sizes)}
    par = root / "hf.parquet"
    table = pa.table({"audio": pa.array([{"bytes": (root / n).read_bytes(), "path": n} for n in files],
                                        pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                      "text": list(files)})
    pq.write_table(table, par, row_group_size=2)
    where = {n: (i // 2, i % 2) for i, n in enumerate(files)}
    return {"root": root, "tar": str(tar), "members": members, "parquet": str(par), "rows": where, "names": list(files)}


def _rows(audio: dict, name: str, offset: float, duration: float | None) -> list[dict]:
    """The same utterance as a loose file, a tar member and a Parquet row."""
    base = {"id": name, "offset": offset, "duration": duration}
    o, s = audio["members"][name]
    g, r = audio["rows"][name]
    return [{**base, "audio_path": str(audio["root"] / name), "container": None},
            {**base, "audio_path": f"{audio['tar']}:dir/{name}", "container": audio["tar"], "member_offset": o,
             "member_size": s},
            {**base, "audio_path": f"{audio['parquet']}:{g}", "container": audio["parquet"], "row_group": g,
             "group_row": r}]


@pytest.mark.parametrize("name", ["st.wav", "st.flac", "mono.wav"])
@pytest.mark.parametrize("offset,duration", [(0.0, None), (0.0, 3.0), (1.25, 0.5), (2.0, 1.0)])
def test_every_address_decodes_as_soundfile_decodes_the_loose_file(audio: dict, name: str, offset: float,
                                                                    duration: float | None) -> None:
    ref, sr = soundfile.read(audio["root"] / name, dtype="float32", always_2d=True)
    start = int(round(offset * sr))
    ref = ref[start:] if duration is None else ref[start:start + int(round(duration * sr))]
    reader = AudioReader()
    try:
        for row in _rows(audio, name, offset, duration):
            assert np.array_equal(reader.samples(row, channel="all"), ref), row["audio_path"]
            assert np.array_equal(reader.samples(row, channel=0), ref[:, 0])
            mixed = reader.samples(row)
            assert mixed.dtype == np.float32 and mixed.ndim == 1
            assert np.array_equal(mixed, ref.mean(axis=1) if ref.shape[1] > 1 else ref[:, 0])
            if ref.shape[1] > 1:
                assert np.array_equal(reader.samples(row, channel=1), ref[:, 1])
                assert not np.array_equal(ref[:, 0], ref[:, 1])
            with pytest.raises(AudioError, match=r"has \d channel\(s\), channel 2 asked for"):
                reader.samples(row, channel=2)
            resampled = reader.samples(row, 16000)
            want = soxr.resample(ref.mean(axis=1), sr, 16000, quality="HQ").astype(np.float32)
            assert np.array_equal(resampled, want)
            # whole file bytes: the loose file's, or its member's (identical bytes)
            assert reader.file_bytes(row) == (audio["root"] / name).read_bytes()
    finally:
        reader.close()


def test_integer_samples_keep_the_file_values(audio: dict) -> None:
    ref, _ = soundfile.read(audio["root"] / "st.wav", dtype="int16", always_2d=True)
    row = _rows(audio, "st.wav", 0.5, 1.0)[1]
    got = AudioReader().samples(row, channel="all", dtype="int16")
    assert got.dtype == np.int16 and np.array_equal(got, ref[int(0.5 * RATE):int(1.5 * RATE)])
    with pytest.raises(AudioError, match="resampling needs float32"):
        AudioReader().samples(row, 16000, dtype="int16")


def test_failures_name_the_utterance_and_file(audio: dict, tmp_path: Path) -> None:
    reader = AudioReader()
    loose, member, parquet = _rows(audio, "st.wav", 0.0, 2.0)
    cases = [
        ({**loose, "audio_path": str(tmp_path / "gone.wav")}, "audio file not found"),
        ({**loose, "offset": 9.0}, "offset 9.000 s is past the end"),
        ({**loose, "duration": 5.0}, r"manifest says 5.000 s \(truncated file\?\)"),
        ({**member, "member_size": member["member_size"] + 10 ** 6}, "is cut short"),
        ({**member, "container": str(tmp_path / "gone.tar")}, "container not found"),
        ({**parquet, "group_row": 5}, "no audio bytes at row group"),
        ({**parquet, "row_group": 9}, "cannot read row group 9"),
        ({**member, "member_offset": member["member_offset"] + 512}, "cannot decode audio"),
    ]
    for row, msg in cases:
        with pytest.raises(AudioError, match=msg) as err:
            reader.samples(row)
        text = str(err.value)
        assert "'st.wav'" in text and "\n" not in text
    fifo = tmp_path / "pipe.wav"
    os.mkfifo(fifo)
    assert not_regular(str(fifo)) == "is a FIFO, not a regular audio file"
    with pytest.raises(AudioError, match="is a FIFO"):  # never opened: it would block
        load_audio("u", str(fifo), 0.0, 1.0)
    with pytest.raises(AudioError, match="is a FIFO"):
        reader.file_bytes({"id": "u", "audio_path": str(fifo), "container": None})
    with pytest.raises(AudioError, match="is a FIFO"):
        reader.member("u", str(fifo), 0, 10)
    assert not_regular(str(tmp_path)) == "is a directory, not a regular audio file"
    assert not_regular(str(tmp_path / "gone")) is None
    reader.close()
