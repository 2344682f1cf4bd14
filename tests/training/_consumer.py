"""A small real corpus for the consumer tests (loader, train, export), built as a user would:
real audio files (``write_tone`` plus ../shared/data/audio when present), a NeMo JSONL
source, a sentencepiece model trained on its transcripts, then ``dataprep compile``,
``dataprep fit-buckets`` and ``dataprep plan-batches`` through the CLI."""

from __future__ import annotations

import contextlib
import csv
import os
import subprocess
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile
from typer.testing import CliRunner

from dataprep.cli import app
from dataprep.testing import WORDS, write_nemo_manifest, write_tone
from dataprep.tokenize import train_model
from tests.conftest import SHARED_DATA

runner = CliRunner()


def run_cli(*args: str, cwd: str | os.PathLike[str] | None = None) -> subprocess.CompletedProcess[str]:
    """``dataprep ARGS`` in this process (typer's runner: the CLI's own parsing, output and exit
    code), in folder ``cwd``, as a finished process: ``returncode``, ``stdout``, ``stderr``."""
    with contextlib.chdir(cwd) if cwd is not None else contextlib.nullcontext():
        res = runner.invoke(app, list(args))
    stderr = res.stderr
    if res.exc_info is not None and not isinstance(res.exception, SystemExit):  # what the interpreter would print
        stderr += "".join(traceback.format_exception(*res.exc_info))
    return subprocess.CompletedProcess(["dataprep", *args], res.exit_code, res.stdout, stderr)


def invoke(*args: str) -> str:
    """Run ``dataprep ARGS``; fail the test with the output if it does not exit 0."""
    res = runner.invoke(app, list(args))
    if res.exit_code != 0:
        raise AssertionError(f"dataprep {' '.join(args)} exited {res.exit_code}:\n{res.output}\n{res.exception!r}")
    return res.output


@dataclass
class Corpus:
    root: Path
    source: Path  # NeMo JSONL
    spm: Path
    manifest: Path  # compiled, kept rows
    buckets: Path
    num_shared: int

    def plan(self, world_size: int, epochs: int = 1, seed: int = 0, carry: bool = True,
             balance: str | None = None) -> Path:
        """``plan-batches`` into a folder named by the options; ``balance`` None: the default
        (balanced steps), "0": one bucket per step."""
        out = self.root / (f"plan-w{world_size}-e{epochs}-s{seed}-{'carry' if carry else 'nocarry'}"
                           + ("" if balance is None else f"-b{balance}"))
        if not out.exists():
            invoke("plan-batches", str(self.manifest), "--buckets", str(self.buckets), "--world-size",
                   str(world_size), "--seed", str(seed), "--epochs", str(epochs), "-o", str(out),
                   "--carry" if carry else "--no-carry", *(() if balance is None else ("--balance", balance)))
        return out


def shared_audio_rows(limit: int | None = None) -> list[dict[str, object]]:
    """NeMo rows for the real recordings in ../shared/data/audio (empty when absent)."""
    listing = SHARED_DATA / "audio" / "manifest.csv"
    if not listing.exists():
        return []
    rows: list[dict[str, object]] = []
    with open(listing, encoding="utf-8") as fh:
        for rec in csv.DictReader(fh):
            path = SHARED_DATA / "audio" / rec["file"]
            if not rec["text"] or not path.exists():
                continue
            rows.append({"audio_filepath": str(path), "duration": soundfile.info(str(path)).duration,
                         "text": rec["text"], "lang": rec.get("lang") or "en"})
            if limit is not None and len(rows) >= limit:
                break
    return rows


def build_corpus(root: Path, num_tones: int = 28, shared_limit: int | None = 24, seed: int = 0,
                 max_duration_budget: float = 8.0) -> Corpus:
    """Write the corpus under ``root`` and compile, fit and size it (see the module docstring).

    Tones: 0.3-2.5 s at 8 / 16 / 22.05 / 44.1 kHz, mono and stereo, WAV and FLAC; a quarter of
    them are segments (offset + duration) of one 30 s recording.
    """
    rng = np.random.default_rng(seed)
    rows: list[dict[str, object]] = []
    long_path = write_tone(root / "audio" / "long.flac", 30.0, sample_rate=16000, seed=seed)
    rates = (8000, 16000, 22050, 44100)
    for i in range(num_tones):
        text = " ".join(rng.choice(np.array(WORDS[:60]), size=int(rng.integers(1, 7))))
        dur = float(np.round(rng.uniform(0.3, 2.5), 2))
        if i % 4 == 3:
            rows.append({"audio_filepath": str(long_path), "offset": float(i), "duration": dur,
                         "text": text, "lang": "en"})
            continue
        ext = "flac" if i % 2 else "wav"
        path = write_tone(root / "audio" / f"tone{i:03d}.{ext}", dur, sample_rate=rates[i % 4],
                          channels=1 + (i % 3 == 0), seed=seed + i)
        rows.append({"audio_filepath": str(path), "duration": soundfile.info(str(path)).duration,
                     "text": text, "lang": "en"})
    shared = shared_audio_rows(shared_limit)
    rows += shared
    source = write_nemo_manifest(root / "source.jsonl", rows)
    spm = root / "spm.model"
    train_model([str(r["text"]) for r in rows] + [" ".join(WORDS)], spm, vocab_size=100, threads=1)
    manifest = root / "kept.parquet"
    invoke("compile", str(source), "--tokenizer", str(spm), "-o", str(manifest), "--probe", "never")
    buckets = root / "buckets.json"
    invoke("fit-buckets", str(manifest), "-o", str(buckets), "--num-buckets", "3", "--num-subbuckets", "2",
           "--max-duration-budget", str(max_duration_budget))
    return Corpus(root, source, spm, manifest, buckets, len(shared))


_CACHE: dict[str, Corpus] = {}


def shared_corpus(tmp_path_factory: object) -> Corpus:
    """One corpus per test session (built on first use, reused by every consumer test)."""
    base = str(tmp_path_factory.getbasetemp())  # type: ignore[attr-defined]
    if base not in _CACHE:
        _CACHE[base] = build_corpus(tmp_path_factory.mktemp("consumer-corpus"))  # type: ignore[attr-defined]
    return _CACHE[base]
