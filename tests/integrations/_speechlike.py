"""A small corpus of speech-like audio at 8 / 16 / 22.05 / 44.1 / 48 kHz, broadband to each
file's Nyquist (the top mel bins are where resamplers differ), built as a user would: files
written with soundfile, a NeMo JSONL source, ``dataprep compile``, ``fit-buckets`` and
``plan-batches``. Shared by the resampling and the NeMo model tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile

from dataprep.testing import write_nemo_manifest
from dataprep.tokenize import train_model
from tests.conftest import SHARED_DATA
from tests.training._consumer import invoke

RATES = (8000, 16000, 22050, 44100, 48000)
#: real clips of ../shared/data/audio at rates other than 16 kHz (used when present)
SHARED_CLIPS = {8000: "fsdd/0_jackson_0.wav", 22050: "lhotse_LJ002-0020.wav", 44100: "sr_english.wav",
                48000: "sr_chinese.flac"}


def speechlike(seconds: float, sample_rate: int, seed: int) -> np.ndarray:
    """A voiced source (harmonics of a wobbling 90-160 Hz pitch up to Nyquist, gated into
    syllables) plus fricative noise bursts: float32 in [-0.5, 0.5]."""
    rng = np.random.default_rng(seed)
    n = round(seconds * sample_rate)
    t = np.arange(n) / sample_rate
    f0 = rng.uniform(90, 160) * (1 + 0.08 * np.sin(2 * np.pi * rng.uniform(2, 5) * t))
    phase = 2 * np.pi * np.cumsum(f0) / sample_rate
    k = np.arange(1, int(sample_rate / 2 / f0.max()) + 1)
    voiced = (np.sin(phase[:, None] * k[None, :]) / k[None, :] ** 0.7).sum(axis=1)
    syllables = np.clip(np.sin(2 * np.pi * rng.uniform(3, 5) * t + rng.uniform(0, 6.3)), 0, None)
    bursts = (np.sin(2 * np.pi * rng.uniform(1, 2) * t + rng.uniform(0, 6.3)) > 0.7).astype(np.float64)
    sig = 0.08 * voiced * syllables + 0.05 * rng.standard_normal(n) * bursts
    return (0.5 * sig / np.abs(sig).max()).astype(np.float32)


def real_transcripts(limit: int = 600) -> list[str]:
    """Transcripts of LibriSpeech dev-clean from ../shared/data (empty where it is absent)."""
    import csv

    path = SHARED_DATA / "librispeech.dev-clean.csv"
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as fh:
        return [row["text"].lower() for _, row in zip(range(limit), csv.DictReader(fh))]


@dataclass
class SpeechCorpus:
    root: Path
    manifest: Path
    spm: Path
    plan: Path
    rows: list[dict[str, object]]


def build(root: Path, *, vocab_size: int = 128, max_duration_budget: float = 3.0) -> SpeechCorpus:
    """Per rate: a whole 1.1-1.6 s file and a 0.83 s segment of a 3 s file (offsets on odd 10 ms:
    a half-sample tie at 22.05 kHz); the real clips of :data:`SHARED_CLIPS` when present. The
    tokenizer is trained on real transcripts (LibriSpeech dev-clean) where present."""
    texts = real_transcripts()
    words = " ".join(texts).split() or ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "zero"]
    rows: list[dict[str, object]] = []
    for i, sr in enumerate(RATES):
        whole = root / "audio" / f"whole-{sr}.flac"
        long = root / "audio" / f"long-{sr}.wav"
        whole.parent.mkdir(parents=True, exist_ok=True)
        soundfile.write(whole, speechlike(1.1 + 0.1 * i, sr, seed=i), sr, subtype="PCM_16")
        soundfile.write(long, speechlike(3.0, sr, seed=10 + i), sr, subtype="PCM_16")
        rows.append({"audio_filepath": str(whole), "duration": soundfile.info(str(whole)).duration,
                     "text": " ".join(words[7 * i: 7 * i + 3])})
        rows.append({"audio_filepath": str(long), "offset": 0.37 + 0.02 * i, "duration": 0.83,
                     "text": " ".join(words[7 * i + 40: 7 * i + 42])})
    for sr, name in SHARED_CLIPS.items():
        path = SHARED_DATA / "audio" / name
        if path.exists():
            rows.append({"audio_filepath": str(path), "duration": soundfile.info(str(path)).duration,
                         "text": " ".join(words[100 + sr % 97: 103 + sr % 97])})
    for r in rows:
        r["lang"] = "en"
    source = write_nemo_manifest(root / "source.jsonl", rows)
    spm = root / "spm.model"
    train_model(texts + [str(r["text"]) for r in rows], spm, vocab_size=vocab_size, threads=1)
    manifest, buckets, plan = root / "kept.parquet", root / "buckets.json", root / "plan"
    invoke("compile", str(source), "--tokenizer", str(spm), "-o", str(manifest), "--probe", "never")
    invoke("fit-buckets", str(manifest), "-o", str(buckets), "--num-buckets", "2", "--num-subbuckets", "1",
           "--max-duration-budget", str(max_duration_budget))
    invoke("plan-batches", str(manifest), "--buckets", str(buckets), "--world-size", "1", "-o", str(plan))
    return SpeechCorpus(root, manifest, spm, plan, rows)


_CACHE: dict[str, SpeechCorpus] = {}


def speech_corpus(tmp_path_factory: object) -> SpeechCorpus:
    """One :func:`build` corpus per test session."""
    base = str(tmp_path_factory.getbasetemp())  # type: ignore[attr-defined]
    if base not in _CACHE:
        _CACHE[base] = build(tmp_path_factory.mktemp("speechlike"))  # type: ignore[attr-defined]
    return _CACHE[base]
