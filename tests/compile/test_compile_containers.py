"""Compile over containers: headers read in place, corrupt / truncated members rejected under
``--probe always``, nothing lost, container columns and schema version 2, parted = single."""

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

from dataprep.compile import CompileOptions, compile
from dataprep.testing import write_tone
from dataprep.tokenize import train_model
from manifests.manifest_read import read_manifest, read_metadata
from manifests.schema import CONTAINER_COLUMNS, MANIFEST_COLUMNS


def _add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tf.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path], Path]:
    root = tmp_path_factory.mktemp("cc")
    tones = [write_tone(root / f"t{i}.{'flac' if i % 2 else 'wav'}", 0.4 + 0.3 * i, sample_rate=(16000, 22050)[i % 2],
                        seed=i) for i in range(8)]
    spm = root / "spm.model"
    train_model(["alpha beta gamma delta epsilon zeta eta theta"] * 20, spm, vocab_size=20, threads=1)
    return root, tones, spm


def _wds(root: Path, tones: list[Path]) -> Path:
    tar = root / "shard-000000.tar"
    with tarfile.open(tar, "w") as tf:
        for i, t in enumerate(tones):
            ext = t.suffix[1:]
            data = t.read_bytes() if i != 3 else b"\x00garbage, not audio" * 50  # corrupt member
            _add(tf, f"k{i}.{ext}", data)
            meta = {"text": "alpha beta", "lang": "en"}
            if i == 5:
                meta["duration"] = 0.1  # the header says otherwise
            _add(tf, f"k{i}.json", json.dumps(meta).encode())
    return tar


def test_webdataset_probe_always(inputs: tuple[Path, list[Path], Path], tmp_path: Path) -> None:
    _, tones, spm = inputs
    tar = _wds(tmp_path, tones)
    out = tmp_path / "m.parquet"
    summary = compile([tar], [str(spm)], out, opts=CompileOptions(probe="always", probe_threads=2))
    m = read_manifest(out)
    rejects = pl.read_parquet(tmp_path / "m.rejects.parquet")
    assert summary.rows_in == len(tones) == m.height + rejects.height
    assert dict(zip(rejects["id"], rejects["reason"])) == {"k3": "unreadable_audio", "k5": "duration_mismatch"}
    assert rejects.filter(pl.col("id") == "k3")["detail"].item().startswith(f"{tar}:k3.flac: ")
    assert tuple(m.columns) == MANIFEST_COLUMNS + CONTAINER_COLUMNS
    assert read_metadata(out)["schema_version"] == 2
    expected = {f"k{i}": soundfile.info(str(t)).duration for i, t in enumerate(tones) if i not in (3, 5)}
    assert dict(zip(m["id"], m["duration"])) == pytest.approx(expected)
    assert m["sample_rate"].to_list() == [soundfile.info(str(tones[i])).samplerate for i in (0, 1, 2, 4, 6, 7)]


def test_webdataset_auto_trusts_the_source_and_probes_only_where_missing(
        inputs: tuple[Path, list[Path], Path], tmp_path: Path) -> None:
    _, tones, spm = inputs
    tar = _wds(tmp_path, tones)
    out = tmp_path / "m.parquet"
    compile([tar], [str(spm)], out, opts=CompileOptions(probe="auto", probe_threads=1))
    m = read_manifest(out)
    # k5 keeps its source duration (0.1 s); the corrupt k3 has none, so its header is read and fails
    assert m.filter(pl.col("id") == "k5")["duration"].item() == 0.1
    assert pl.read_parquet(tmp_path / "m.rejects.parquet")["reason"].to_list() == ["unreadable_audio"]


def test_hf_parquet_durations_from_the_bytes_and_parted_equals_single(
        inputs: tuple[Path, list[Path], Path], tmp_path: Path) -> None:
    _, tones, spm = inputs
    audio = [{"bytes": t.read_bytes(), "path": t.name} for t in tones] + [{"bytes": None, "path": "gone.wav"}]
    pq.write_table(pa.table({"audio": pa.array(audio, pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                             "transcription": ["gamma delta"] * len(audio)}), tmp_path / "hf.parquet", row_group_size=3)
    single, parted = tmp_path / "single.parquet", tmp_path / "parted.parquet"
    s = compile([tmp_path / "hf.parquet"], [str(spm)], single, opts=CompileOptions(probe_threads=1))
    compile([tmp_path / "hf.parquet"], [str(spm)], parted, opts=CompileOptions(probe_threads=1), num_parts=3)
    assert s.rows_in == len(audio) and s.rows_kept == len(tones) and s.reasons == {"missing_audio": 1}
    assert single.read_bytes() == parted.read_bytes()
    m = read_manifest(single)
    assert m["duration"].to_list() == pytest.approx([soundfile.info(str(t)).duration for t in tones])
    assert m["row_group"].to_list() == [i // 3 for i in range(len(tones))]
