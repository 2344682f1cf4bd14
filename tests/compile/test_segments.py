"""Segments that start at 0 are segments: every probe mode keeps them, from every source form.

A row whose source gives an offset (NeMo's ``offset`` key, 0 included), a Kaldi ``segments``
line or a Lhotse supervision is a segment of its file: the header bounds it (offset + duration
<= the file's length), it is never compared with the whole file's length. Real audio
(soundfile), compiled through the CLI as a user runs it.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dataprep.cli import app
from dataprep.testing import sample_corpus, write_nemo_manifest, write_tone
from dataprep.tokenize import train_model
from manifests.manifest_read import read_manifest
from manifests.records import recording_dict

runner = CliRunner()

LONG = 10.0  # s, the recording the segments are cut from


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("spm") / "tiny.model"
    train_model(sample_corpus(500)[1], path, vocab_size=120)
    return path


def _nemo(root: Path) -> Path:
    long = write_tone(root / "audio" / "long.flac", LONG)
    write_tone(root / "audio" / "whole.flac", 2.0)
    write_tone(root / "audio" / "other.flac", 2.0)
    return write_nemo_manifest(root / "train.jsonl", [
        {"audio_filepath": str(long), "offset": 0, "duration": 3.0, "text": "first segment"},
        {"audio_filepath": str(long), "offset": 3.5, "duration": 2.0, "text": "second segment"},
        {"audio_filepath": "audio/whole.flac", "duration": 2.0, "text": "a whole file"},
        {"audio_filepath": "audio/other.flac", "duration": 1.0, "text": "a whole file misdescribed"},
    ])


def _kaldi(root: Path) -> Path:
    long = write_tone(root / "audio" / "long.wav", LONG)
    d = root / "kaldi"
    d.mkdir()
    (d / "wav.scp").write_text(f"rec1 {long}\n")
    (d / "segments").write_text("u1 rec1 0 3.0\nu2 rec1 3.5 5.5\n")
    (d / "text").write_text("u1 first segment\nu2 second segment\n")
    return d


def _lhotse(root: Path) -> Path:
    long = write_tone(root / "audio" / "long.flac", LONG)
    rec = recording_dict("rec1", source_type="file", source=str(long), sampling_rate=16000,
                         num_samples=int(LONG * 16000), duration=LONG, channels=1)
    sups = [{"id": "u1", "recording_id": "rec1", "start": 0.0, "duration": 3.0, "channel": 0,
             "text": "first segment", "language": "en"},
            {"id": "u2", "recording_id": "rec1", "start": 3.5, "duration": 2.0, "channel": 0,
             "text": "second segment", "language": "en"}]
    d = root / "recipe"
    d.mkdir()
    with gzip.open(d / "toy_recordings_train.jsonl.gz", "wt") as fh:
        fh.write(json.dumps(rec) + "\n")
    with gzip.open(d / "toy_supervisions_train.jsonl.gz", "wt") as fh:
        fh.writelines(json.dumps(s) + "\n" for s in sups)
    return d


@pytest.mark.parametrize("probe", ["auto", "always", "never"])
@pytest.mark.parametrize("form", ["nemo", "kaldi", "lhotse"])
def test_a_segment_at_offset_0_is_kept_by_every_probe_mode(tmp_path: Path, spm_model: Path, form: str,
                                                            probe: str) -> None:
    src = {"nemo": _nemo, "kaldi": _kaldi, "lhotse": _lhotse}[form](tmp_path)
    out, rej = tmp_path / "m.parquet", tmp_path / "r.parquet"
    res = runner.invoke(app, ["compile", str(src), "--tokenizer", str(spm_model), "--probe", probe,
                              "-o", str(out), "--rejects", str(rej)])
    assert res.exit_code == 0, res.output
    m, r = read_manifest(out), read_manifest(rej, allow_rejects=True)
    segs = m.filter(m["text"].str.ends_with("segment"))
    assert segs["offset"].to_list() == [0.0, 3.5] and segs["duration"].to_list() == [3.0, 2.0]
    if form == "nemo":  # whole files: equal to the header with --probe always, else taken as written
        assert "a whole file" in m["text"].to_list()
        if probe == "always":
            assert r["reason"].to_list() == ["duration_mismatch"]
            assert "manifest says 1.0 s, audio header says 2.0 s" in r["detail"][0]
        else:
            assert r.height == 0 and m.height == 4
    else:
        assert r.height == 0 and m.height == 2


def test_a_segment_at_0_past_the_end_is_out_of_range_not_a_mismatch(tmp_path: Path, spm_model: Path) -> None:
    long = write_tone(tmp_path / "audio" / "long.flac", 4.0)
    src = write_nemo_manifest(tmp_path / "t.jsonl", [
        {"audio_filepath": str(long), "offset": 0, "duration": 6.0, "text": "longer than its file"}])
    for probe in ("auto", "always"):
        rej = tmp_path / f"r-{probe}.parquet"
        res = runner.invoke(app, ["compile", str(src), "--tokenizer", str(spm_model), "--probe", probe,
                                  "-o", str(tmp_path / f"m-{probe}.parquet"), "--rejects", str(rej)])
        assert res.exit_code == 0, res.output
        r = read_manifest(rej, allow_rejects=True)
        if probe == "always":
            assert r["reason"].to_list() == ["segment_out_of_range"]
            assert "segment 0.0+6.0 s exceeds the audio (4.0 s)" in r["detail"][0]
        else:  # auto reads no header for a row with a duration
            assert r.height == 0
