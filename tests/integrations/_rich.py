"""A small real-audio corpus with every kind of row the integrations must carry: mono and
stereo files at several rates, segments of long mono and stereo recordings, real speech from
../shared/data/audio when present, and NeMo/Canary fields (``source_lang``, ``target_lang``,
``taskname``, ``pnc``, a ``speaker`` field, a ``decodercontext`` on some rows). Compiled with
``--prompt-format canary2 --probe always``, fitted (3 x 2 buckets) and planned for 2 ranks,
all through the CLI."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile

from dataprep.testing import WORDS, write_nemo_manifest, write_tone
from dataprep.tokenize import train_model
from tests.training._consumer import invoke, shared_audio_rows


@dataclass
class Rich:
    root: Path
    source: Path
    spm: Path
    manifest: Path
    buckets: Path
    plan: Path  # 2 ranks, 2 epochs


def build_rich(root: Path, shared_limit: int = 8) -> Rich:
    rng = np.random.default_rng(7)
    long_mono = write_tone(root / "audio" / "long-mono.flac", 20.0, sample_rate=16000, seed=1)
    long_stereo = write_tone(root / "audio" / "long-stereo.wav", 12.0, sample_rate=22050, channels=2, seed=2)
    rows: list[dict[str, object]] = []
    for i in range(18):
        text = " ".join(rng.choice(np.array(WORDS[:60]), size=int(rng.integers(1, 8))))
        dur = float(np.round(rng.uniform(0.4, 2.2), 2))
        if i % 6 == 4:
            row: dict[str, object] = {"audio_filepath": str(long_mono), "offset": float(i), "duration": dur}
        elif i % 6 == 5:
            row = {"audio_filepath": str(long_stereo), "offset": float(i % 10), "duration": dur}
        else:
            rate, ch = ((16000, 1), (44100, 2), (8000, 1), (22050, 1))[i % 4]
            path = write_tone(root / "audio" / f"t{i:02d}.{'flac' if i % 2 else 'wav'}", dur, sample_rate=rate,
                              channels=ch, seed=10 + i)
            row = {"audio_filepath": str(path), "duration": soundfile.info(str(path)).duration}
        row.update(text=text, source_lang="en", target_lang="en", taskname="asr", pnc="yes" if i % 3 else "no",
                   speaker=f"spk{i % 4}")
        if i % 5 == 0:
            row["decodercontext"] = "the previous words"
        rows.append(row)
    for r in shared_audio_rows(shared_limit):
        rows.append({**r, "source_lang": r["lang"], "target_lang": r["lang"], "taskname": "asr", "pnc": "yes",
                     "speaker": "real"})
    for r in rows:
        r.pop("lang", None)
    source = write_nemo_manifest(root / "source.jsonl", rows)
    spm = root / "spm.model"
    train_model([str(r["text"]) for r in rows] + [" ".join(WORDS)], spm, vocab_size=100, threads=1)
    manifest = root / "kept.parquet"
    invoke("compile", str(source), "--tokenizer", str(spm), "-o", str(manifest), "--probe", "always",
           "--prompt-format", "canary2")
    buckets = root / "buckets.json"
    invoke("fit-buckets", str(manifest), "-o", str(buckets), "--num-buckets", "3", "--num-subbuckets", "2",
           "--max-duration-budget", "6")
    plan = root / "plan"
    invoke("plan-batches", str(manifest), "--buckets", str(buckets), "--world-size", "2", "--seed", "0",
           "--epochs", "2", "-o", str(plan))
    return Rich(root, source, spm, manifest, buckets, plan)


_CACHE: dict[str, Rich] = {}


def rich_corpus(tmp_path_factory: object) -> Rich:
    """One rich corpus per test session."""
    base = str(tmp_path_factory.getbasetemp())  # type: ignore[attr-defined]
    if base not in _CACHE:
        _CACHE[base] = build_rich(tmp_path_factory.mktemp("rich-corpus"))  # type: ignore[attr-defined]
    return _CACHE[base]
