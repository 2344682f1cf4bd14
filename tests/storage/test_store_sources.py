"""Sources read from the loopback S3 as a user names them: a WebDataset tar (read in place), a
Kaldi data folder, a Lhotse recipe (its folder or its supervisions file) and an ``input_cfg``
YAML at a URL (its relative entries resolved against the URL's folder)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest

from dataprep.testing_store import LoopbackS3
from manifests import storage
from tests.storage.test_compile_store import SECONDS, _lines, _put, _run, _tar, _wavs


def _audio(s3: LoopbackS3, tmp_path: Path, folder: str) -> list[str]:
    return [_put(s3, f"{folder}/audio/a{i}.wav", data) for i, data in enumerate(_wavs(tmp_path)[:3])]


def test_a_webdataset_tar_in_the_store(s3: LoopbackS3, tiny_spm: str, tmp_path: Path) -> None:
    wavs = _wavs(tmp_path)
    members: dict[str, bytes] = {}
    for i in range(3):
        members[f"k{i}.wav"] = wavs[i]
        members[f"k{i}.txt" if i != 1 else f"k{i}.json"] = (
            f"web clip {i}".encode() if i != 1 else json.dumps({"text": "web clip 1", "lang": "en"}).encode())
    url = _put(s3, "wds/shard-0.tar", _tar(members))
    out = tmp_path / "m.parquet"
    _run("compile", url, "--tokenizer", tiny_spm, "-o", str(out))
    kept = pl.read_parquet(out)
    assert kept["text"].to_list() == [f"web clip {i}" for i in range(3)]
    assert set(kept["container"].to_list()) == {url}
    assert kept["duration"].to_list() == pytest.approx(SECONDS[:3])


def test_a_kaldi_folder_in_the_store(s3: LoopbackS3, tiny_spm: str, tmp_path: Path) -> None:
    _audio(s3, tmp_path, "kaldi")
    _put(s3, "kaldi/wav.scp", "".join(f"u{i} audio/a{i}.wav\n" for i in range(3)).encode())
    _put(s3, "kaldi/text", "".join(f"u{i} kaldi clip {i}\n" for i in range(3)).encode())
    out = tmp_path / "m.parquet"
    _run("compile", f"{s3.bucket}/kaldi/", "--tokenizer", tiny_spm, "-o", str(out))
    kept = pl.read_parquet(out)
    assert kept["audio_path"].to_list() == [f"{s3.bucket}/kaldi/audio/a{i}.wav" for i in range(3)]
    assert kept["duration"].to_list() == pytest.approx(SECONDS[:3])
    assert all(o.startswith(f"{s3.bucket}/kaldi/") for o in kept["origin"].to_list())


@pytest.mark.parametrize("given", ["folder", "supervisions file"])
def test_a_lhotse_recipe_in_the_store(s3: LoopbackS3, tiny_spm: str, tmp_path: Path, given: str) -> None:
    _audio(s3, tmp_path, "recipe")
    recs = [{"id": f"r{i}", "sources": [{"type": "file", "channels": [0], "source": f"audio/a{i}.wav"}],
             "sampling_rate": 16000, "num_samples": int(SECONDS[i] * 16000), "duration": SECONDS[i]}
            for i in range(3)]
    sups = [{"id": f"s{i}", "recording_id": f"r{i}", "start": 0.0, "duration": SECONDS[i], "channel": 0,
             "text": f"recipe clip {i}", "language": "en"} for i in range(3)]
    _put(s3, "recipe/demo_recordings_dev.jsonl.gz", gzip.compress(_lines(recs)))
    sup_url = _put(s3, "recipe/demo_supervisions_dev.jsonl.gz", gzip.compress(_lines(sups)))
    out = tmp_path / "m.parquet"
    _run("compile", f"{s3.bucket}/recipe" if given == "folder" else sup_url, "--tokenizer", tiny_spm, "-o", str(out))
    kept = pl.read_parquet(out)
    assert kept["id"].to_list() == ["s0", "s1", "s2"]
    assert kept["audio_path"].to_list() == [f"{s3.bucket}/recipe/audio/a{i}.wav" for i in range(3)]


def test_an_input_cfg_yaml_in_the_store(s3: LoopbackS3, tiny_spm: str, tmp_path: Path) -> None:
    _audio(s3, tmp_path, "blend")
    _put(s3, "blend/train.jsonl", _lines([{"audio_filepath": f"audio/a{i}.wav", "text": f"blend clip {i}"}
                                          for i in range(3)]))
    cfg = _put(s3, "blend/input_cfg.yaml", b"- type: nemo\n  manifest_filepath: train.jsonl\n  weight: 1.0\n")
    out = tmp_path / "m.parquet"
    _run("compile", cfg, "--tokenizer", tiny_spm, "-o", str(out))
    kept = pl.read_parquet(out)
    assert kept["audio_path"].to_list() == [f"{s3.bucket}/blend/audio/a{i}.wav" for i in range(3)]
    assert kept["duration"].to_list() == pytest.approx(SECONDS[:3])


def test_a_missing_yaml_in_the_store_is_one_line(s3: LoopbackS3, tiny_spm: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from dataprep.cli import app
    res = CliRunner().invoke(app, ["compile", f"{s3.bucket}/nowhere/input_cfg.yaml", "--tokenizer", tiny_spm,
                                   "-o", str(tmp_path / "m.parquet")])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert res.output.strip().splitlines()[-1].startswith(f"error: {s3.bucket}/nowhere/input_cfg.yaml")
    assert storage.is_url(f"{s3.bucket}/x")
