"""Plausibility in compile: absurd durations, truncated audio under --probe always, audio
paths that are not regular files (a FIFO must not hang compile)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import soundfile

from dataprep.testing import write_nemo_manifest, write_tone
from manifests.manifest_read import read_manifest
from tests.hostile.conftest import refused
from tests.training._consumer import Corpus, invoke

REPO = Path(__file__).resolve().parents[2]


def _compile(corpus: Corpus, src: Path, out: Path, *extra: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    invoke("compile", str(src), "--tokenizer", str(corpus.spm), "-o", str(out), *extra)
    return read_manifest(out), read_manifest(out.with_name(out.stem + ".rejects.parquet"), allow_rejects=True)


def test_implausible_durations_are_rejected(corpus: Corpus, tmp_path: Path) -> None:
    a, b, c = (write_tone(tmp_path / f"{n}.wav", 1.0) for n in "abc")
    src = write_nemo_manifest(tmp_path / "s.jsonl", [
        {"audio_filepath": str(a), "duration": 1.0, "text": "fine"},
        {"audio_filepath": str(b), "duration": 1e12, "text": "a typo"},
        {"audio_filepath": str(c), "duration": 7 * 3600.0, "text": "seven hours"},
    ])
    m, r = _compile(corpus, src, tmp_path / "m.parquet")  # --probe auto: no header is read for these
    assert m["duration"].to_list() == [1.0]
    assert r["reason"].to_list() == ["implausible_duration", "implausible_duration"]
    assert "exceeds --max-plausible-duration 21600 s" in r["detail"][0]
    m, r = _compile(corpus, src, tmp_path / "m2.parquet", "--max-plausible-duration", "30000")
    assert m["duration"].to_list() == [1.0, 7 * 3600.0] and r.height == 1


def test_truncated_audio_under_probe_always(corpus: Corpus, tmp_path: Path) -> None:
    rows = []
    for ext in ("flac", "wav"):
        full = write_tone(tmp_path / f"full.{ext}", 3.0)
        cut = tmp_path / f"cut.{ext}"
        raw = full.read_bytes()
        cut.write_bytes(raw[: len(raw) // 2])  # the header still promises 3 s
        assert soundfile.info(str(cut)).frames in (0, 48000) or ext == "wav"
        rows += [{"audio_filepath": str(full), "text": "whole"}, {"audio_filepath": str(cut), "text": "cut"}]
    src = write_nemo_manifest(tmp_path / "s.jsonl", rows)
    m, r = _compile(corpus, src, tmp_path / "m.parquet", "--probe", "always")
    assert sorted(m["audio_path"].to_list()) == sorted(str(tmp_path / f"full.{e}") for e in ("flac", "wav"))
    assert m["duration"].to_list() == [3.0, 3.0]
    assert r["reason"].to_list() == ["truncated_audio", "truncated_audio"]  # the documented reason, for both
    assert sorted(Path(a).name for a in r["audio_path"].to_list()) == ["cut.flac", "cut.wav"]
    assert all("truncated file" in d or "cannot be decoded" in d for d in r["detail"].to_list()), r["detail"]


def test_fifo_and_directory_as_audio_do_not_hang(corpus: Corpus, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.wav"
    os.mkfifo(fifo)
    (tmp_path / "dir.wav").mkdir()
    ok = write_tone(tmp_path / "ok.wav", 1.0)
    src = write_nemo_manifest(tmp_path / "s.jsonl", [
        {"audio_filepath": str(fifo), "text": "a pipe"},
        {"audio_filepath": str(tmp_path / "dir.wav"), "text": "a folder"},
        {"audio_filepath": str(ok), "text": "fine"},
    ])
    out = tmp_path / "m.parquet"
    for probe in ("auto", "always"):
        res = subprocess.run([sys.executable, "-m", "dataprep.cli", "compile", str(src), "--tokenizer", str(corpus.spm),
                              "-o", str(out), "--probe", probe], capture_output=True, text=True, timeout=120,
                             cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert res.returncode == 0, res.stderr
        r = read_manifest(out.with_name("m.rejects.parquet"), allow_rejects=True)
        assert r["reason"].to_list() == ["unreadable_audio", "unreadable_audio"]
        assert "is a FIFO" in r["detail"][0] and "is a directory" in r["detail"][1]
        assert read_manifest(out)["audio_path"].to_list() == [str(ok)]


def test_strict_stops_at_the_first_implausible_row(corpus: Corpus, tmp_path: Path) -> None:
    ok = write_tone(tmp_path / "a.wav", 1.0)
    src = write_nemo_manifest(tmp_path / "s.jsonl", [{"audio_filepath": str(ok), "duration": 1e9, "text": "x"}])
    refused("compile", src, "--tokenizer", corpus.spm, "-o", tmp_path / "m.parquet", "--strict",
            match=("s.jsonl:1", "max-plausible-duration"))
    assert not (tmp_path / "m.parquet").exists()
