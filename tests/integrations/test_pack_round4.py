"""``dataprep pack`` keeps what it packs (issue 44) and sizes containers as asked (issue 43), on
real audio: every layout round-trips every field of a row (a property over generated rows:
text, languages, task, corpus, custom fields); audio changed or deleted since compile, a tar
rewritten under its rows, are ``audio_changed`` rejects; a pack killed with SIGKILL and resumed
writes the same bytes as one left alone; ``--container-size`` containers hold about that size."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import soundfile
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from dataprep.integrations.pack import marker_folder, pack, rejects_path
from dataprep.testing import write_tone
from manifests.manifest_read import read_manifest
from manifests.manifest_write import write_manifest
from manifests.readers import iter_nemo_tarred, iter_source
from manifests.records import LAYOUT_KEYS
from tests.conftest import FEW_EXAMPLES

LAYOUTS = ("nemo-tarred", "shar", "webdataset")
LABELS = ("text", "lang", "source_lang", "target_lang", "task", "corpus")


@pytest.fixture(scope="module")
def tones(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("tones")
    return [write_tone(root / f"t{i}.{'flac' if i % 2 else 'wav'}", 0.3 + 0.1 * i, sample_rate=16000, seed=i)
            for i in range(4)]


def _manifest(path: Path, rows: list[dict[str, Any]]) -> Path:
    base = {"offset": 0.0, "sample_rate": 16000, "channels": 1, "num_tokens": 3, "tps": 1.0, "origin": "test"}
    df = pl.DataFrame([{**base, **r} for r in rows], infer_schema_length=None)
    write_manifest(df, path)
    return path


def _read_back(out: Path, layout: str) -> pl.DataFrame:
    """The packed copy as compile reads it (every reader row, rejects included)."""
    if layout == "nemo-tarred":
        n = len(list(out.glob("audio_*.tar")))
        frames = iter_nemo_tarred([str(out / f"manifest_{i}.json") for i in range(n)],
                                  [str(out / f"audio_{i}.tar") for i in range(n)], text_field="text", chunk_rows=100)
    elif layout == "shar":
        frames = iter_source(out, "shar")
    else:
        frames = (f for t in sorted(out.glob("shard-*.tar")) for f in iter_source(t, "webdataset"))
    return pl.concat(list(frames), how="diagonal_relaxed")


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Zs", "Zl", "Zp")), min_size=1,
                max_size=12)
_label = st.none() | st.sampled_from(["en", "de", "fr-FR", "zh"])
_value = st.none() | st.booleans() | st.integers(-10**6, 10**6) | _text | st.lists(st.integers(0, 9), max_size=3)
_row = st.fixed_dictionaries({
    "text": _text, "lang": _label, "source_lang": _label, "target_lang": _label,
    "task": st.none() | st.sampled_from(["asr", "ast"]), "corpus": st.none() | st.sampled_from(["ls", "cv", "mls"]),
    "extra": st.dictionaries(st.sampled_from(["pnc", "speaker", "decodercontext", "x_a", "x_b"]), _value, max_size=3),
})


@settings(max_examples=FEW_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(rows=st.lists(_row, min_size=1, max_size=4))
def test_every_layout_round_trips_every_field(tmp_path_factory: pytest.TempPathFactory, tones: list[Path],
                                              rows: list[dict[str, Any]]) -> None:
    root = tmp_path_factory.mktemp("roundtrip")
    for i, r in enumerate(rows):
        r["lang"] = r["lang"] or r["target_lang"] or r["source_lang"]  # as compile reads a row's language
        r["extra"] = json.dumps(r["extra"], sort_keys=True) if r["extra"] else None
        r.update(id=f"utt {i}", audio_path=str(tones[i]), duration=soundfile.info(str(tones[i])).duration)
    manifest = _manifest(root / "m.parquet", rows)
    want = {r["id"]: r for r in read_manifest(manifest).iter_rows(named=True)}
    for layout in LAYOUTS:
        out = root / layout
        pack(manifest, out, layout, num_parts=min(2, len(rows)))
        got = _read_back(out, layout)
        assert got["reason"].null_count() == got.height, (layout, got.filter(pl.col("reason").is_not_null()).rows())
        assert got.height == len(rows), layout
        for r in got.iter_rows(named=True):
            extra = json.loads(r["extra"]) if r["extra"] else {}
            src = want[extra.pop("source_id")]
            extra = {k: v for k, v in extra.items() if k not in LAYOUT_KEYS}  # the container's own: shard_id, ...
            for label in LABELS:
                assert r.get(label) == src.get(label), (layout, label, r.get(label), src.get(label))
            assert extra == (json.loads(src["extra"]) if src["extra"] else {}), (layout, extra, src["extra"])
            assert abs(r["duration"] - src["duration"]) < 1e-3


def test_audio_changed_or_deleted_since_compile_is_rejected(tmp_path: Path, tones: list[Path]) -> None:
    audio = [tmp_path / f"a{i}{t.suffix}" for i, t in enumerate(tones)]
    for a, t in zip(audio, tones):
        a.write_bytes(t.read_bytes())
    rows = [{"id": f"u{i}", "audio_path": str(a), "duration": soundfile.info(str(a)).duration, "text": "x"}
            for i, a in enumerate(audio)]
    manifest = _manifest(tmp_path / "m.parquet", rows)
    audio[0].unlink()  # deleted
    write_tone(audio[1], 0.1, sample_rate=16000, seed=9)  # shorter than its row now
    write_tone(audio[2], 0.5, sample_rate=8000, seed=9)  # another rate
    summary = pack(manifest, tmp_path / "out", "webdataset", num_parts=2)
    rej = pl.read_parquet(rejects_path(tmp_path / "out"))
    assert dict(rej.select("id", "reason").iter_rows()) == {"u0": "audio_changed", "u1": "audio_changed",
                                                            "u2": "audio_changed"}
    assert summary.rows == 1 and summary.rejected == 3


def _wds_tar(path: Path, tones: list[Path], order: list[int]) -> Path:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for i in order:
            for name, data in ((f"k{i}{tones[i].suffix}", tones[i].read_bytes()), (f"k{i}.txt", f"text {i}".encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, __import__("io").BytesIO(data))
    return path


def test_a_tar_rewritten_under_its_rows_is_rejected_not_packed(tmp_path: Path, tones: list[Path]) -> None:
    """A container row is read at the byte offset compile recorded: a tar rewritten since (other
    member order) would hand over another member's bytes; the header before it says so."""
    tar = _wds_tar(tmp_path / "src.tar", tones, [0, 1, 2, 3])
    frame = pl.concat(list(iter_source(tar, "webdataset")))
    rows = frame.with_columns(pl.lit(3, pl.Int32).alias("num_tokens"), pl.lit(1.0).alias("tps"),
                              pl.col("duration").fill_null(0.5))
    rows = rows.with_columns(pl.Series("duration", [soundfile.info(str(t)).duration for t in tones]))
    manifest = tmp_path / "m.parquet"
    write_manifest(rows.drop("reason", "detail"), manifest)
    _wds_tar(tar, tones, [1, 0, 2, 3])  # k0 and k1 swapped: k2, k3 stay where they were
    pack(manifest, tmp_path / "out", "webdataset", num_parts=1)
    rej = pl.read_parquet(rejects_path(tmp_path / "out"))
    assert sorted(rej["id"]) == ["k0", "k1"] and set(rej["reason"]) == {"audio_changed"}
    assert "the tar now holds" in rej["detail"][0]


def _pack_cmd(manifest: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "dataprep.cli", "pack", str(manifest), "-o", str(out), "--layout", "shar", *extra]


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def test_sigkill_then_resume_writes_the_bytes_of_an_uninterrupted_run(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    rows = []
    for i in range(24):  # segments of long files: each is decoded and encoded (slow enough to be killed midway)
        path = tmp_path / "audio" / f"r{i}.flac"
        path.parent.mkdir(exist_ok=True)
        soundfile.write(path, (rng.standard_normal((16000 * 20, 2)) * 0.1).astype(np.float32), 16000)
        rows.append({"id": f"u{i}", "audio_path": str(path), "offset": 1.0, "duration": 18.0, "text": "x",
                     "channels": 2})
    manifest = _manifest(tmp_path / "m.parquet", rows)
    whole = tmp_path / "whole"
    subprocess.run(_pack_cmd(manifest, whole, "--num-parts", "12"), check=True, capture_output=True)
    killed = tmp_path / "killed"
    proc = subprocess.Popen(_pack_cmd(manifest, killed, "--num-parts", "12"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list(marker_folder(killed).glob("*.done.json"))) < 3:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = len(list(marker_folder(killed).glob("*.done.json")))
    assert 3 <= done < 12, done  # killed midway
    res = subprocess.run(_pack_cmd(manifest, killed, "--num-parts", "12"), capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    assert f"{12 - done} containers written, {done} already done" in res.stdout + res.stderr
    assert _files(killed) == _files(whole)


def test_resume_after_the_audio_changed_keeps_the_first_runs_parts(tmp_path: Path, tones: list[Path]) -> None:
    """Parts are cut once, recorded, and reused by a resume: a file deleted between the runs (which
    changes the size estimate) is a reject, never a row packed twice or lost."""
    audio = [tmp_path / f"a{i}{t.suffix}" for i, t in enumerate(tones * 3)]
    for a, t in zip(audio, tones * 3):
        a.write_bytes(t.read_bytes())
    rows = [{"id": f"u{i}", "audio_path": str(a), "duration": soundfile.info(str(a)).duration, "text": "x",
             "sample_rate": None, "channels": None} for i, a in enumerate(audio)]
    manifest = _manifest(tmp_path / "m.parquet", rows)
    out = tmp_path / "out"
    size = sum(a.stat().st_size for a in audio) // 4
    first = pack(manifest, out, "webdataset", container_size=size, part_index=0, num_parts=None)
    n = first.num_parts
    audio[-1].unlink()
    rest = pack(manifest, out, "webdataset", container_size=size)
    assert rest.num_parts == n and rest.skipped == [0]
    keys = []
    for t in sorted(out.glob("*.tar")):
        with tarfile.open(t) as tf:
            keys += [m.split(".")[0] for m in tf.getnames() if m.endswith(".json")]
    rej = pl.read_parquet(rejects_path(out))
    assert sorted(keys + rej["id"].to_list()) == sorted(f"u{i}" for i in range(len(audio)))
    assert rej["reason"].to_list() == ["audio_changed"]


def test_container_size_is_met(tmp_path: Path) -> None:
    """Containers hold ``--container-size`` bytes give or take half a row at each end (their
    sizes checked as written); the last holds the rest."""
    rng = np.random.default_rng(1)
    rows = []
    for i in range(40):
        path = tmp_path / "audio" / f"r{i}.flac"
        path.parent.mkdir(exist_ok=True)
        soundfile.write(path, (rng.standard_normal(16000 * 3) * 0.1).astype(np.float32), 16000)
        rows.append({"id": f"u{i}", "audio_path": str(path), "offset": 0.5, "duration": 2.0, "text": "x"})
    manifest = _manifest(tmp_path / "m.parquet", rows)
    for layout in LAYOUTS:
        out = tmp_path / layout
        res = subprocess.run([sys.executable, "-m", "dataprep.cli", "pack", str(manifest), "-o", str(out),
                              "--layout", layout, "--container-size", "500KB"], capture_output=True, text=True,
                             check=False)
        assert res.returncode == 0, res.stderr
        tars = sorted(out.glob("*.tar"))
        sizes = [t.stat().st_size for t in tars]
        row = max(sizes) / 5  # rows are about a fifth of a container
        assert len(tars) >= 5, sizes
        for s in sizes[:-1]:
            assert abs(s - 500_000) <= row, (layout, sizes)
        assert sizes[-1] <= 500_000 + row, (layout, sizes)
