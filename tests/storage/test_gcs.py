"""``gs://`` through obstore's GCS client against the loopback store: GCS's XML API, the one that
client speaks for objects, ranges, listings and multipart uploads, is S3's, so moto's server
answers it (:meth:`dataprep.testing_store.LoopbackS3.gcs_env`: a service-account key with
``gcs_base_url`` and ``disable_oauth``, as object_store's own emulator tests point it). The
same bucket is ``s3://B`` and ``gs://B``. No GCS emulator from the package registries serves
that client (``gcp-storage-emulator`` answers the JSON API only: no HEAD, listing, multipart
or DELETE on object paths)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from dataprep.testing import write_tone
from dataprep.testing_store import Rule
from manifests import storage
from tests.storage._round_trip import check_reads_writes_and_listing
from tests.training._consumer import run_cli

SECONDS = [1.0, 1.5, 0.75]


@pytest.fixture()
def gs(s3: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``gs://<this test's bucket>``: the loopback store's bucket through the GCS client."""
    for k, v in s3.gcs_env().items():
        monkeypatch.setenv(k, v)
    storage.reset_clients()
    yield "gs://" + s3.bucket.removeprefix("s3://")
    storage.reset_clients()


def test_reads_writes_and_listing_of_gs_urls(gs: str, tmp_path: Path) -> None:
    check_reads_writes_and_listing(gs, tmp_path)


def test_compile_from_and_to_gs(gs: str, s3: Any, tiny_spm: str, tmp_path: Path) -> None:
    """A manifest and its clips in ``gs://`` (headers by range reads), compiled to ``gs://``,
    nothing lost, a 503 storm retried to the same result; the same rows as from local disk."""
    rows = []
    for i, s in enumerate(SECONDS):
        wav = write_tone(tmp_path / "audio" / f"a{i}.wav", s, seed=i)
        storage.upload(wav, f"{gs}/data/audio/a{i}.wav")
        rows.append({"audio_filepath": f"audio/a{i}.wav", "text": f"clip number {i}"})
    rows.append({"audio_filepath": "audio/absent.wav", "text": "no such clip"})
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    storage.upload(tmp_path / "train.jsonl", f"{gs}/data/train.jsonl")
    out = f"{gs}/compiled/train.parquet"
    with s3.faults(Rule("503", times=2)):
        res = run_cli("compile", f"{gs}/data/train.jsonl", "--tokenizer", tiny_spm, "-o", out)
    assert res.returncode == 0, res.stderr
    kept = pl.read_parquet(io.BytesIO(storage.read_bytes(out)))
    assert kept["audio_path"].to_list() == [f"{gs}/data/audio/a{i}.wav" for i in range(3)]
    rejects = pl.read_parquet(io.BytesIO(storage.read_bytes(f"{gs}/compiled/train.rejects.parquet")))
    assert rejects["reason"].to_list() == ["missing_audio"]
    local = tmp_path / "local.parquet"
    res = run_cli("compile", str(tmp_path / "train.jsonl"), "--tokenizer", tiny_spm, "-o", str(local))
    assert res.returncode == 0, res.stderr
    cols = ["duration", "num_tokens", "text"]
    assert kept.select(cols).equals(pl.read_parquet(local).select(cols))
