"""Lhotse recipe ingestion checks a supervision against its recording (issue 44), on files Lhotse
writes: one that lies outside its recording (or names a channel it lacks) is a reject; the
channel of a supervision on a stereo recording is the row's channel (its cut, its packed
member); the supervision's custom fields go where a cut's go, so languages, task and ``pnc``
reach the trainer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import soundfile
from typer.testing import CliRunner

from dataprep.cli import app
from dataprep.testing import WORDS, write_tone
from dataprep.tokenize import train_model
from manifests.readers import iter_source

runner = CliRunner()


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lhotse = pytest.importorskip("lhotse")
    root = tmp_path_factory.mktemp("recipe4")
    mono = write_tone(root / "audio" / "mono.flac", 3.0, sample_rate=16000, seed=0)
    t = np.arange(16000 * 3) / 16000
    soundfile.write(root / "audio" / "stereo.flac", np.stack([np.sin(2 * np.pi * 220 * t), np.sin(2 * np.pi * 330 * t)],
                                                             1) * 0.3, 16000)
    recs = [lhotse.Recording.from_file(mono, recording_id="m"),
            lhotse.Recording.from_file(root / "audio" / "stereo.flac", recording_id="s")]
    S = lhotse.SupervisionSegment
    sups = [S(id="in", recording_id="m", start=0.5, duration=1.0, text=" ".join(WORDS[:3]), language="en",
              custom={"pnc": "yes", "source_lang": "en", "target_lang": "de", "taskname": "ast"}),
            S(id="past-end", recording_id="m", start=2.5, duration=1.0, text=WORDS[3], language="en"),
            S(id="right", recording_id="s", start=0.0, duration=1.0, text=WORDS[4], channel=1),
            S(id="no-channel", recording_id="s", start=0.0, duration=1.0, text=WORDS[5], channel=5),
            S(id="both", recording_id="s", start=1.0, duration=1.0, text=WORDS[6], channel=[0, 1])]
    out = root / "manifests"
    out.mkdir()
    lhotse.RecordingSet.from_recordings(recs).to_file(out / "toy_recordings_dev.jsonl.gz")
    lhotse.SupervisionSet.from_segments(sups).to_file(out / "toy_supervisions_dev.jsonl.gz")
    return out


def test_supervision_checked_against_its_recording(recipe: Path) -> None:
    df = pl.concat(list(iter_source(recipe))).sort("id")
    got = {r["id"]: r for r in df.iter_rows(named=True)}
    assert got["past-end"]["reason"] == "segment_out_of_range"
    assert "2.5 s + 1.0 s lies outside its recording 'm' (3.0 s)" in got["past-end"]["detail"]
    assert got["no-channel"]["reason"] == "segment_out_of_range" and "channel 5" in got["no-channel"]["detail"]
    assert [got[k]["reason"] for k in ("in", "right", "both")] == [None, None, None]
    # custom fields flattened where a cut keeps them; languages and task are columns
    assert json.loads(got["in"]["extra"]) == {"pnc": "yes"}
    assert (got["in"]["lang"], got["in"]["source_lang"], got["in"]["target_lang"], got["in"]["task"]) == \
        ("en", "en", "de", "ast")
    # the channel of a supervision on a stereo recording is kept; a supervision of every channel is the file's
    assert json.loads(got["right"]["extra"]) == {"channel": 1} and got["right"]["channels"] == 1
    assert got["both"]["extra"] is None and got["both"]["channels"] == 2


def test_compiled_row_keeps_its_channel_in_cuts_and_pack(recipe: Path, tmp_path: Path) -> None:
    from dataprep.integrations.cuts import cut_for_row
    from dataprep.integrations.pack import pack
    from manifests.manifest_read import read_manifest

    spm = tmp_path / "spm.model"
    train_model([" ".join(WORDS)] * 4, spm, vocab_size=60, threads=1)
    manifest = tmp_path / "m.parquet"
    res = runner.invoke(app, ["compile", str(recipe), "--tokenizer", str(spm), "-o", str(manifest)])
    assert res.exit_code == 0, res.output
    rows = {r["id"]: r for r in read_manifest(manifest).iter_rows(named=True)}
    assert sorted(rows) == ["both", "in", "right"]
    cut = cut_for_row(rows["right"])
    assert cut.channel == 1 and cut.custom == {"num_tokens": rows["right"]["num_tokens"]}
    assert np.allclose(cut.load_audio()[0], soundfile.read(recipe.parent / "audio" / "stereo.flac")[0][:16000, 1],
                       atol=1e-4)
    inn = cut_for_row(rows["in"])
    assert inn.custom["pnc"] == "yes" and inn.custom["target_lang"] == "de" and inn.custom["taskname"] == "ast"
    assert inn.supervisions[0].language == "en"
    out = tmp_path / "packed"
    pack(manifest, out, "shar", num_parts=1)
    back = pl.concat(list(iter_source(out, "shar")))
    right = back.filter(pl.col("id") == next(k for k in back["id"] if k.startswith("right"))).row(0, named=True)
    assert right["channels"] == 1 and json.loads(right["extra"]) == {"source_id": "right"}
