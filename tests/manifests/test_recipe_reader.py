"""Lhotse recipe output (``recordings.jsonl.gz`` + ``supervisions.jsonl.gz``, as every
``lhotse prepare`` writes) read as one row per supervision, written by Lhotse on real audio."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest
import soundfile
from typer.testing import CliRunner

from dataprep.cli import app
from dataprep.testing import WORDS, write_tone
from dataprep.tokenize import train_model
from manifests.errors import DataprepError
from manifests.manifest_read import read_manifest
from manifests.readers import detect_format, iter_source

runner = CliRunner()


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lhotse = pytest.importorskip("lhotse")
    root = tmp_path_factory.mktemp("recipe")
    recs, sups = [], []
    for r in range(3):
        path = write_tone(root / "audio" / f"rec{r}.flac", 3.0 + r, sample_rate=16000, seed=r)
        rec = lhotse.Recording.from_file(path, recording_id=f"rec{r}")
        recs.append(rec)
        for k in range(2):
            sups.append(lhotse.SupervisionSegment(id=f"rec{r}-{k}", recording_id=f"rec{r}", start=1.0 * k,
                                                  duration=0.8, text=" ".join(WORDS[r + k:r + k + 3]),
                                                  language="en", speaker=f"spk{r}"))
    out = root / "manifests"
    out.mkdir()
    lhotse.RecordingSet.from_recordings(recs).to_file(out / "toy_recordings_train.jsonl.gz")
    lhotse.SupervisionSet.from_segments(sups).to_file(out / "toy_supervisions_train.jsonl.gz")
    return out


def test_one_row_per_supervision_cut_from_its_recording(recipe: Path) -> None:
    sup = recipe / "toy_supervisions_train.jsonl.gz"
    assert detect_format(recipe) == "lhotse-recipe" == detect_format(sup)
    df = pl.concat(list(iter_source(recipe)))
    assert df["id"].to_list() == [f"rec{r}-{k}" for r in range(3) for k in range(2)]
    assert df["reason"].null_count() == 6 and df["offset"].to_list() == [0.0, 1.0] * 3
    assert df["duration"].to_list() == [0.8] * 6 and df["sample_rate"].to_list() == [16000] * 6
    assert df["audio_path"][2] == str((recipe.parent / "audio" / "rec1.flac").resolve())
    assert json.loads(df["extra"][0]) == {"speaker": "spk0"}
    with pytest.raises(DataprepError, match="give it with its supervisions manifest"):
        detect_format(recipe / "toy_recordings_train.jsonl.gz")


def test_unknown_recording_is_a_reject(recipe: Path, tmp_path: Path) -> None:
    lines = gzip.open(recipe / "toy_supervisions_train.jsonl.gz", "rt").read().splitlines()
    bad = json.loads(lines[0]) | {"recording_id": "ghost"}
    sup = tmp_path / "toy_supervisions_x.jsonl.gz"
    with gzip.open(sup, "wt") as fh:
        fh.write("\n".join([json.dumps(bad), lines[1], "{not json"]) + "\n")
    (tmp_path / "toy_recordings_x.jsonl.gz").write_bytes((recipe / "toy_recordings_train.jsonl.gz").read_bytes())
    df = pl.concat(list(iter_source(sup)))
    assert df["reason"].to_list() == ["missing_field", None, "malformed_line"]
    assert df["detail"][0] == f"{sup}:1: recording 'ghost' is not in {tmp_path / 'toy_recordings_x.jsonl.gz'}"


def test_compile_both_files_as_a_user_types_them(recipe: Path, tmp_path: Path) -> None:
    model = tmp_path / "spm.model"
    train_model([" ".join(WORDS)] * 4, model, vocab_size=60, threads=1)
    out = tmp_path / "m.parquet"
    res = runner.invoke(app, ["compile", str(recipe / "toy_recordings_train.jsonl.gz"),
                              str(recipe / "toy_supervisions_train.jsonl.gz"), "--tokenizer", str(model),
                              "-o", str(out)])
    assert res.exit_code == 0, res.output
    df = read_manifest(out)
    assert df.height == 6 and df["channels"].to_list() == [1] * 6
    info = soundfile.info(df["audio_path"][0])
    assert info.samplerate == 16000
