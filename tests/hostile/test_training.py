"""Training on hostile inputs: crafted, corrupt or foreign checkpoints (no code runs from a
file), a checkpoint directory that holds a run, a tokenizer other than the manifest's, and a
tiny clip left alone in its batch by --skip-bad-audio."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from dataprep.testing import WORDS, write_nemo_manifest, write_tone
from dataprep.tokenize import train_model
from manifests.buckets_file import Bucket, BucketSpec, write_buckets
from tests.hostile.conftest import refused, train_args
from tests.training._consumer import Corpus, invoke


class _Touch:
    """Unpickling this calls ``Path.touch(marker)``: code run from a file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204
        return (Path.touch, (self.marker,))


def _ckpt_copy(trained: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "ck"
    shutil.copytree(trained, dst)
    return dst


def test_crafted_checkpoint_runs_no_code(corpus: Corpus, plan: Path, trained: Path, tmp_path: Path) -> None:
    ck = _ckpt_copy(trained, tmp_path)
    marker = tmp_path / "pwned"
    real = torch.load(ck / "last.pt", weights_only=True)
    torch.save({**real, "payload": _Touch(marker)}, ck / "last.pt")
    refused(*train_args(corpus, plan, ck, "--resume"), match=("last.pt", "not a readable checkpoint"))
    assert not marker.exists()


@pytest.mark.parametrize("damage,problem", [
    (lambda p, real: p.write_bytes(b"\x80\x04garbage" * 50), "not a readable checkpoint"),
    (lambda p, real: p.write_bytes(p.read_bytes()[:300]), "not a readable checkpoint"),
    (lambda p, real: p.write_bytes(b""), "not a readable checkpoint"),
    (lambda p, real: torch.save([1, 2, 3], p), "expected a checkpoint dict"),
    (lambda p, real: torch.save({k: v for k, v in real.items() if k != "next_step"}, p), "next_step: missing"),
    (lambda p, real: torch.save({**real, "next_step": "2"}, p), "next_step: expected int"),
    (lambda p, real: torch.save({**real, "next_step": True}, p), "next_step: expected int"),
    (lambda p, real: torch.save({**real, "next_step": -1}, p), "next_step: must be >= 0"),
    (lambda p, real: torch.save({**real, "next_step": 10**6}, p), "past the plan's"),
    (lambda p, real: torch.save({**real, "plan_hash": "0" * 64}, p), "another plan"),
    (lambda p, real: torch.save({**real, "model": {"w": 3}}, p), "model: expected a state dict"),
    (lambda p, real: torch.save({**real, "model": {"w": torch.zeros(2)}}, p), "does not fit"),
    (lambda p, real: p.unlink(), "no checkpoint to resume from"),
])
def test_damaged_checkpoint(corpus: Corpus, plan: Path, trained: Path, tmp_path: Path, damage, problem: str) -> None:
    ck = _ckpt_copy(trained, tmp_path)
    real = torch.load(ck / "last.pt", weights_only=True)
    damage(ck / "last.pt", real)
    refused(*train_args(corpus, plan, ck, "--resume"), match=problem)


def test_checkpoint_dir_holding_a_run(corpus: Corpus, plan: Path, trained: Path, tmp_path: Path) -> None:
    ck = _ckpt_copy(trained, tmp_path)
    before = {p.name: p.read_bytes() for p in ck.iterdir()}
    refused(*train_args(corpus, plan, ck, "--steps", "1"), match=("holds a training run", "--resume", "--overwrite"))
    assert {p.name: p.read_bytes() for p in ck.iterdir()} == before
    refused(*train_args(corpus, plan, ck, "--resume", "--overwrite"), match="exclude each other")
    (ck / "notes.txt").write_text("mine")
    invoke(*train_args(corpus, plan, ck, "--steps", "1", "--overwrite"))
    log = [json.loads(x) for x in (ck / "log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in log] == [0]  # the old run's lines are gone, not mixed in
    assert torch.load(ck / "last.pt", weights_only=True)["next_step"] == 1
    assert (ck / "notes.txt").read_text() == "mine"  # what the tool did not write is kept
    f = tmp_path / "file"
    f.write_text("x")
    refused(*train_args(corpus, plan, f), match="not a directory")


def test_other_tokenizer_is_refused_unless_allowed(corpus: Corpus, plan: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.model"
    train_model([" ".join(WORDS[i:i + 9]) for i in range(0, 300, 3)], other, vocab_size=90, threads=1)
    args = ["train", str(plan), "--manifest", str(corpus.manifest), "--tokenizer", str(other), "--checkpoint-dir",
            str(tmp_path / "ck"), "--cache-dir", str(corpus.root / "cache"), "--quiet", "--steps", "1",
            "--device", "cpu"]
    refused(*args, match=("provenance.tokenizers", "--allow-other-tokenizer"))
    assert not (tmp_path / "ck" / "last.pt").exists()
    invoke(*args, "--allow-other-tokenizer")
    assert (tmp_path / "ck" / "last.pt").exists()


def test_tiny_clip_alone_in_its_batch_with_skip_bad_audio(tmp_path: Path) -> None:
    tiny = write_tone(tmp_path / "tiny.wav", 0.03)  # 3 feature frames: 1 encoder frame after 8x subsampling
    src = write_nemo_manifest(tmp_path / "s.jsonl", [
        {"audio_filepath": str(tiny), "duration": 0.03, "text": "the"},
        {"audio_filepath": str(tmp_path / "gone.wav"), "duration": 0.04, "text": "of"},
    ])
    spm = tmp_path / "spm.model"
    train_model([" ".join(WORDS[i:i + 9]) for i in range(0, 300, 3)], spm, vocab_size=90, threads=1)
    m = tmp_path / "m.parquet"
    invoke("compile", str(src), "--tokenizer", str(spm), "-o", str(m))
    b = tmp_path / "b.json"
    write_buckets(BucketSpec((Bucket(index=0, max_duration=1.0, batch_size=2),)), b)
    plan = tmp_path / "plan"
    invoke("plan-batches", str(m), "--buckets", str(b), "--world-size", "1", "-o", str(plan))
    ck = tmp_path / "ck"
    invoke("train", str(plan), "--manifest", str(m), "--tokenizer", str(spm), "--checkpoint-dir", str(ck),
           "--cache-dir", str(tmp_path / "cache"), "--quiet", "--device", "cpu", "--skip-bad-audio")
    skipped = [json.loads(x) for x in (ck / "skipped-rank-00000.jsonl").read_text().splitlines()]
    assert [s["id"] for s in skipped] == [str(tmp_path / "gone.wav")]
    log = [json.loads(x) for x in (ck / "log.jsonl").read_text().splitlines()]
    assert len(log) == 1 and log[0]["utterances"] == 1 and log[0]["loss"] is not None
