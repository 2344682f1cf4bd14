"""Header probing on real audio files: ../shared/data/audio and files written here."""

from __future__ import annotations

import polars as pl
import pytest

from dataprep.compile.probe import probe_headers
from dataprep.testing import write_tone
from tests.conftest import shared_file


def test_real_headers_match_reference_within_1ms() -> None:
    ref = pl.read_csv(shared_file("audio/manifest.csv"))
    folder = shared_file("audio")
    paths = [str(folder / f) for f in ref["file"]]
    got = probe_headers(paths, threads=4)
    assert got["probe_reason"].null_count() == got.height, got.filter(pl.col("probe_reason").is_not_null())
    assert got["audio_path"].to_list() == paths
    diff = (got["file_duration"] - ref["duration"]).abs()
    assert diff.max() < 1e-3
    assert (got["sample_rate"] == ref["sample_rate"]).all()
    assert (got["channels"] == ref["channels"]).all()
    # the MP3's header says 2.380 s though it decodes to 2.376 s (encoder padding): we store
    # the header's figure, as documented in dataprep.compile.probe
    mp3 = got.filter(pl.col("audio_path").str.ends_with(".mp3"))
    assert mp3.height == 1 and mp3["file_duration"][0] == pytest.approx(2.380, abs=1e-3)


@pytest.mark.parametrize("suffix,subtype,rate,channels", [(".wav", "PCM_16", 16000, 1), (".flac", "PCM_24", 44100, 2),
                                                          (".wav", "FLOAT", 8000, 1)])
def test_generated_files(tmp_path, suffix, subtype, rate, channels) -> None:
    path = write_tone(tmp_path / f"a{suffix}", 1.2345, sample_rate=rate, channels=channels, subtype=subtype)
    got = probe_headers([str(path)], threads=1).row(0, named=True)
    assert got["file_duration"] == pytest.approx(round(1.2345 * rate) / rate)
    assert (got["sample_rate"], got["channels"]) == (rate, channels)


def test_missing_and_corrupt_files_are_named(tmp_path) -> None:
    corrupt = tmp_path / "corrupt.wav"
    corrupt.write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunkjunkjunk")
    empty = tmp_path / "empty.flac"
    empty.write_bytes(b"")
    missing = tmp_path / "missing.wav"
    got = probe_headers([str(corrupt), str(missing), str(empty)], threads=2)
    reasons = got["probe_reason"].to_list()
    assert reasons == ["unreadable_audio", "missing_audio", "unreadable_audio"]
    for detail, path in zip(got["probe_detail"], [corrupt, missing, empty]):
        assert detail.startswith(str(path)) and "\n" not in detail


def test_thread_count_does_not_change_result(tmp_path) -> None:
    paths = [str(write_tone(tmp_path / f"{i}.wav", 0.1 + i / 100)) for i in range(30)]
    assert probe_headers(paths, threads=1).equals(probe_headers(paths, threads=7))
