"""docs/object-storage.md's shell blocks, run as written against the loopback S3 (the docs test
marks them not-run: they need this server)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from dataprep.testing import write_tone
from dataprep.testing_store import LoopbackS3
from manifests import storage
from tests.doc_blocks import REPO, page_blocks
from tests.docs_demo import serving

PAGE = REPO / "docs" / "object-storage.md"
MARK = "run by tests/storage/test_object_storage_doc.py"


def test_the_walk_through_runs_against_the_loopback_store(loopback_s3: LoopbackS3, tiny_spm: str,
                                                         tmp_path: Path) -> None:
    bucket = loopback_s3.create_bucket("demo-corpus")
    lines = []
    for i in range(8):
        wav = write_tone(tmp_path / "audio" / f"utt-{i}.wav", 1.0 + 0.5 * i, seed=i)
        storage.upload(wav, f"{bucket}/audio/{wav.name}")
        lines.append(f'{{"audio_filepath": "audio/{wav.name}", "text": "the walk through clip number {i}"}}\n')
    (tmp_path / "train.jsonl").write_text("".join(lines))
    storage.upload(tmp_path / "train.jsonl", f"{bucket}/train.jsonl")
    ws = tmp_path / "ws"
    ws.mkdir()
    shutil.copyfile(tiny_spm, ws / "spm.model")
    # each ``dataprep`` forked from a server that imported the CLI once (tests.warm_python); the
    # loopback store's AWS_* come from the session fixture's environment, as a command's own
    env = serving(tmp_path / "bin")
    blocks = [b for b in page_blocks(PAGE) if b.lang == "sh" and b.mark and MARK in b.mark]
    assert len(blocks) == 3
    for b in blocks:
        res = subprocess.run(["bash", "-euo", "pipefail", "-c", b.code], capture_output=True, text=True, env=env,
                             cwd=ws, timeout=300, check=False)
        assert res.returncode == 0, f"{b.where} failed:\n{b.code}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    names = {storage.name(u) for u, _ in storage.list_prefix(f"{bucket}/")}
    assert {"train.parquet", "kept.parquet", "packed.parquet", "plan.json", "audio_0.tar"} <= names
