"""Every documented command reads and writes store URLs (loopback S3): stats, filter,
plan-batches, simulate and pack; a pack killed while uploading leaves nothing that looks
complete, and a rerun finishes the job."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from dataprep.cli import app
from dataprep.testing import write_plan_inputs
from dataprep.testing_store import LoopbackS3
from manifests import storage
from tests.storage.test_compile_store import SECONDS, corpus  # noqa: F401 - the fixture

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]


def _run(*args: str) -> str:
    res = runner.invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return res.output


def test_stats_filter_plan_and_simulate_on_urls(s3: LoopbackS3, tmp_path: Path) -> None:
    manifest, buckets = write_plan_inputs(tmp_path, 2000, seed=0, num_buckets=5)
    b = s3.bucket
    storage.upload(manifest, f"{b}/m.parquet")
    storage.upload(buckets, f"{b}/buckets.json")
    assert "2,000" in _run("stats", f"{b}/m.parquet")
    text = _run("filter", f"{b}/m.parquet", "-o", f"{b}/kept.parquet", "--max-duration", "20")
    assert f"-> {b}/kept.parquet (and 1 beside it)" in text
    kept = pl.read_parquet(io.BytesIO(storage.read_bytes(f"{b}/kept.parquet")))
    rejected = pl.read_parquet(io.BytesIO(storage.read_bytes(f"{b}/kept.rejects.parquet")))
    assert kept.height + rejected.height == 2000 and kept["duration"].max() <= 20
    _run("plan-batches", f"{b}/kept.parquet", "-b", f"{b}/buckets.json", "-o", f"{b}/plan", "--world-size", "2")
    names = sorted(storage.name(u) for u, _ in storage.list_prefix(f"{b}/plan/"))
    assert names == ["plan.json", "rank-00000.parquet", "rank-00001.parquet"]
    _run("simulate", f"{b}/plan")
    # a replaced plan: the old rank files it no longer has are removed
    _run("plan-batches", f"{b}/kept.parquet", "-b", f"{b}/buckets.json", "-o", f"{b}/plan", "--world-size", "1")
    assert sorted(storage.name(u) for u, _ in storage.list_prefix(f"{b}/plan/")) == ["plan.json", "rank-00000.parquet"]


def test_a_missing_url_input_is_one_line(s3: LoopbackS3) -> None:
    res = runner.invoke(app, ["stats", f"{s3.bucket}/absent.parquet"])
    assert res.exit_code == 2 and res.output.strip() == f"error: {s3.bucket}/absent.parquet: no such object or folder"


def _compiled(corpus: str, s3: LoopbackS3, tiny_spm: str) -> str:  # noqa: F811
    out = f"{s3.bucket}/compiled/train.parquet"
    _run("compile", corpus, "--tokenizer", tiny_spm, "-o", out)
    return out


def test_pack_from_store_audio_to_the_store(corpus: str, s3: LoopbackS3, tiny_spm: str) -> None:  # noqa: F811
    compiled = _compiled(corpus, s3, tiny_spm)
    _run("pack", compiled, "-o", f"{s3.bucket}/packed", "--layout", "nemo-tarred")
    objects = [u for u, _ in storage.list_prefix(f"{s3.bucket}/packed/")]
    assert any(u.endswith(".tar") for u in objects) and any(u.endswith(".json") for u in objects)
    # the packed dataset compiles back from the store with the same durations
    tars = sorted(u for u in objects if u.endswith(".tar"))
    manifests_ = sorted(u for u in objects if u.endswith(".json") and "manifest" in storage.name(u))
    out = _run("compile", *manifests_, "--tarred-audio", *tars, "--tokenizer", tiny_spm,
               "-o", f"{s3.bucket}/repacked.parquet")
    assert "kept" in out
    again = pl.read_parquet(io.BytesIO(storage.read_bytes(f"{s3.bucket}/repacked.parquet")))
    assert sorted(again["duration"].to_list()) == pytest.approx(sorted(SECONDS))


def test_a_pack_killed_while_uploading_leaves_nothing_complete_and_a_rerun_finishes(
        corpus: str, s3: LoopbackS3, tiny_spm: str) -> None:  # noqa: F811
    compiled = _compiled(corpus, s3, tiny_spm)
    out = f"{s3.bucket}/killed"
    s3.fault("delay", method="PUT", path=r"/killed/.*\.tar", times=None, delay_s=30)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "dataprep.cli", "pack", compiled, "-o", out, "--layout",
                             "nemo-tarred"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while s3.state.rules[0].hits == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert s3.state.rules[0].hits, "the pack never reached its upload"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        s3.clear_faults()
    assert not [u for u, _ in storage.list_prefix(out + "/") if u.endswith(".json")]  # nothing looks complete
    _run("pack", compiled, "-o", out, "--layout", "nemo-tarred")
    names = [storage.name(u) for u, _ in storage.list_prefix(out + "/")]
    assert any(n.endswith(".tar") for n in names) and any(n.endswith(".json") for n in names)


def test_hugging_face_parquet_in_the_store_compiles_and_packs(s3: LoopbackS3, tiny_spm: str, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dataprep.testing import write_tone

    tones = [write_tone(tmp_path / f"t{i}.wav", s, seed=i) for i, s in enumerate(SECONDS)]
    audio = [{"bytes": t.read_bytes(), "path": t.name} for t in tones]
    table = pa.table({"audio": pa.array(audio, pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                      "sentence": [f"hugging face row {i}" for i in range(len(tones))]})
    pq.write_table(table, tmp_path / "train-00000.parquet", row_group_size=2)
    src = f"{s3.bucket}/hf/train-00000.parquet"
    storage.upload(tmp_path / "train-00000.parquet", src)
    _run("compile", src, "--tokenizer", tiny_spm, "-o", f"{s3.bucket}/hf.parquet")
    kept = pl.read_parquet(io.BytesIO(storage.read_bytes(f"{s3.bucket}/hf.parquet")))
    assert set(kept["container"].to_list()) == {src}  # the URL, never the local copy
    assert kept["duration"].to_list() == pytest.approx(SECONDS)
    _run("pack", f"{s3.bucket}/hf.parquet", "-o", f"{s3.bucket}/hf-packed", "--layout", "nemo-tarred")
    assert any(u.endswith(".tar") for u, _ in storage.list_prefix(f"{s3.bucket}/hf-packed/"))


def test_exports_and_the_report_written_to_urls(corpus: str, s3: LoopbackS3, tiny_spm: str,  # noqa: F811
                                               tmp_path: Path) -> None:
    """Exports and the report go to the store whole, the same bytes as written locally."""
    b = s3.bucket
    m = _compiled(corpus, s3, tiny_spm)
    _run("fit-buckets", m, "--num-buckets", "2", "--max-duration-budget", "10", "-o", f"{b}/buckets.json")
    _run("plan-batches", m, "-b", f"{b}/buckets.json", "-o", f"{b}/plan", "--world-size", "1")
    for kind in ("nemo", "lhotse"):
        _run("export", kind, f"{b}/plan", "-m", m, "-o", f"{b}/export-{kind}")
        names = {u[len(f"{b}/export-{kind}/"):] for u, _ in storage.list_prefix(f"{b}/export-{kind}/")}
        assert ("bucketing.yaml" if kind == "nemo" else "bins.json") in names, names
        local = tmp_path / f"export-{kind}"
        _run("export", kind, f"{b}/plan", "-m", m, "-o", str(local))
        assert names == {p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file()}
    _run("report", m, "--plan", f"{b}/plan", "-o", f"{b}/report.html")
    assert storage.read_bytes(f"{b}/report.html").lstrip().lower().startswith(b"<!doctype html")


def test_an_error_names_the_url_not_its_local_copy(s3: LoopbackS3, tmp_path: Path) -> None:
    manifest, buckets = write_plan_inputs(tmp_path, 50, seed=0, num_buckets=2)
    storage.upload(manifest, f"{s3.bucket}/meta.parquet")
    _run("plan-batches", f"{s3.bucket}/meta.parquet", "-b", str(buckets), "-o", str(tmp_path / "plan"), "--world-size", "1")
    res = runner.invoke(app, ["export", "nemo", str(tmp_path / "plan"), "-m", f"{s3.bucket}/meta.parquet",
                              "-o", str(tmp_path / "out")])
    assert res.exit_code == 2 and res.output.startswith(f"error: {s3.bucket}/meta.parquet: "), res.output
