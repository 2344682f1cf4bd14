"""Training on hostile inputs: crafted, corrupt or foreign checkpoints (no code runs from a
file), a checkpoint directory that holds a run, a tokenizer other than the manifest's, and a
tiny clip left alone in its batch by --skip-bad-audio."""

from __future__ import annotations

import json
import shutil
import struct
import zipfile
from pathlib import Path

import pytest
import torch

from dataprep.testing import WORDS, write_nemo_manifest, write_tone
from dataprep.tokenize import train_model
from dataprep.training.checkpoint import HASH_FIELD, load_checkpoint, save_checkpoint
from manifests.buckets_file import Bucket, BucketSpec, write_buckets
from manifests.errors import DataprepError
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


def _sealed(p: Path, fields: dict) -> None:
    """Write ``fields`` as this tool does (with their content hash): the field checks behind it run."""
    save_checkpoint(p, {k: v for k, v in fields.items() if k != HASH_FIELD})


@pytest.mark.parametrize("damage,problem", [
    (lambda p, real: p.write_bytes(b"\x80\x04garbage" * 50), "not a readable checkpoint"),
    (lambda p, real: p.write_bytes(p.read_bytes()[:300]), "not a readable checkpoint"),
    (lambda p, real: p.write_bytes(b""), "not a readable checkpoint"),
    (lambda p, real: torch.save([1, 2, 3], p), "expected a checkpoint dict"),
    # edited without its hash (by hand, or by an older version of the tool)
    (lambda p, real: torch.save({k: v for k, v in real.items() if k != HASH_FIELD}, p), "content_sha256: missing"),
    (lambda p, real: torch.save({**real, "next_step": 1}, p), "do not match the stored hash"),
    (lambda p, real: torch.save({**real, "model": {k: v + 1 for k, v in real["model"].items()}}, p),
     "do not match the stored hash"),
    (lambda p, real: torch.save({**real, HASH_FIELD: "0" * 64}, p), "do not match the stored hash"),
    (lambda p, real: torch.save({**real, "extra": torch.float32}, p), "not a checkpoint this tool wrote"),
    # sealed with a valid hash: the field checks still refuse
    (lambda p, real: _sealed(p, {k: v for k, v in real.items() if k != "next_step"}), "next_step: missing"),
    (lambda p, real: _sealed(p, {**real, "next_step": "2"}), "next_step: expected int"),
    (lambda p, real: _sealed(p, {**real, "next_step": True}), "next_step: expected int"),
    (lambda p, real: _sealed(p, {**real, "next_step": -1}), "next_step: -1 is outside the plan's steps"),
    (lambda p, real: _sealed(p, {**real, "next_step": 10**6}), "next_step: 1000000 is outside the plan's steps"),
    (lambda p, real: _sealed(p, {**real, "next_step": 10**600}), "next_step: (an integer of about 601 digits) is outside"),
    (lambda p, real: torch.save({**real, "next_step": 10**5000}, p), "not a readable checkpoint"),
    (lambda p, real: (p.unlink(), p.mkdir()), "is a directory, not a checkpoint file"),
    (lambda p, real: _sealed(p, {**real, "plan_hash": "0" * 64}), "another plan"),
    (lambda p, real: _sealed(p, {**real, "model": {"w": 3}}), "model: expected a state dict"),
    (lambda p, real: _sealed(p, {**real, "model": {"w": torch.zeros(2)}}), "does not fit"),
    (lambda p, real: p.unlink(), "no checkpoint to resume from"),
])
def test_damaged_checkpoint(corpus: Corpus, plan: Path, trained: Path, tmp_path: Path, damage, problem: str) -> None:
    ck = _ckpt_copy(trained, tmp_path)
    real = torch.load(ck / "last.pt", weights_only=True)
    damage(ck / "last.pt", real)
    refused(*train_args(corpus, plan, ck, "--resume"), match=("last.pt", problem))


def _tensor_data_spans(path: Path) -> list[tuple[str, int, int]]:
    """(member, start, end) byte offsets in ``path`` of each tensor's raw data (torch.save writes
    a zip whose ``data/N`` members are stored uncompressed)."""
    raw = path.read_bytes()
    spans = []
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            if "/data/" in info.filename and info.file_size:
                assert info.compress_type == zipfile.ZIP_STORED
                name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26:info.header_offset + 30])
                start = info.header_offset + 30 + name_len + extra_len
                spans.append((info.filename, start, start + info.file_size))
    return spans


def test_every_byte_flipped_inside_a_tensor_is_refused(tmp_path: Path) -> None:
    """A small checkpoint (model, AdamW state, fields) written as the loop writes it: each byte of
    every tensor's data flipped in turn loads nowhere; :func:`load_checkpoint` says which file."""
    model = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 5)).sum().backward()
    opt.step()
    good = tmp_path / "good.pt"
    save_checkpoint(good, {"next_step": 3, "model": model.state_dict(), "optimizer": opt.state_dict(),
                           "plan_hash": "ab" * 32, "config": {"lr": 1e-3, "seed": 0}})
    assert load_checkpoint(good)["next_step"] == 3
    raw = good.read_bytes()
    spans = _tensor_data_spans(good)
    positions = [i for _, a, b in spans for i in range(a, b)]
    assert len(spans) >= 8 and len(positions) >= 300  # weights, biases, exp_avg, exp_avg_sq, steps
    bad = tmp_path / "last.pt"
    for i in positions:
        flipped = bytearray(raw)
        flipped[i] ^= 0xFF
        bad.write_bytes(flipped)
        with pytest.raises(DataprepError) as exc:
            load_checkpoint(bad)
        assert str(exc.value).startswith(f"{bad}: ") and "\n" not in str(exc.value), (i, str(exc.value))


def test_flipped_bytes_in_a_trained_checkpoint_make_resume_refuse(corpus: Corpus, plan: Path, trained: Path,
                                                                   tmp_path: Path) -> None:
    """``dataprep train --resume`` on the real run's ``last.pt`` with a byte flipped inside a tensor
    refuses with one line; 64 more positions spread over all the tensors' data go through
    :func:`load_checkpoint` (what ``--resume`` calls; the small checkpoint above gets every byte)."""
    ck = _ckpt_copy(trained, tmp_path)
    raw = (ck / "last.pt").read_bytes()
    positions = [i for _, a, b in _tensor_data_spans(ck / "last.pt") for i in range(a, b)]
    i = positions[len(positions) // 2]
    (ck / "last.pt").write_bytes(raw[:i] + bytes([raw[i] ^ 0x01]) + raw[i + 1:])
    refused(*train_args(corpus, plan, ck, "--resume"), match=("last.pt", "do not match the stored hash"))
    for i in [positions[0], positions[-1], *positions[:: max(1, len(positions) // 62)]]:
        (ck / "last.pt").write_bytes(raw[:i] + bytes([raw[i] ^ 0x80]) + raw[i + 1:])
        with pytest.raises(DataprepError, match="last.pt: content_sha256: "):
            load_checkpoint(ck / "last.pt")


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
