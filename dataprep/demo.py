"""``python -m dataprep.demo OUT``: generate a small real corpus and run the whole pipeline.

Needs nothing outside the package: writes a few thousand utterances of real FLAC audio
(soundfile), a NeMo JSONL manifest (some rows without durations, some as segments of longer
recordings, a handful of deliberately bad rows), then runs each ``dataprep`` command as a
user would type it, printing the command first; the last writes ``report.html`` (needs the
``report`` extra).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np

from dataprep.testing import sample_corpus, write_nemo_manifest, write_tone


def make_demo_corpus(out: Path, num_utterances: int = 2000, seed: int = 0) -> Path:
    """Write audio + ``train.jsonl`` under ``out``; return the manifest path.

    A quarter of the utterances are segments (offset, duration) of longer recordings; a
    third of the rest carry no duration (compile probes the header). Six bad rows are
    appended: malformed JSON, missing audio, empty text, zero duration, duplicate, bad bytes.
    """
    rng = np.random.default_rng(seed)
    durations, texts, _ = sample_corpus(num_utterances, seed=seed)
    audio = out / "audio"
    rows: list[dict[str, object]] = []
    seg_mask = rng.random(num_utterances) < 0.25
    seg_idx = np.flatnonzero(seg_mask)
    for rec, group in enumerate(np.array_split(seg_idx, max(1, len(seg_idx) // 20))):
        if not len(group):
            continue
        gaps = 0.3
        total = float(durations[group].sum() + gaps * len(group))
        path = write_tone(audio / f"rec{rec:04d}.flac", total, seed=seed + rec)
        offset = 0.0
        for i in group:
            rows.append({"audio_filepath": str(path.relative_to(out)), "offset": round(offset, 3),
                         "duration": float(durations[i]), "text": texts[i], "lang": "en", "speaker": int(rec)})
            offset += float(durations[i]) + gaps
    for i in np.flatnonzero(~seg_mask):
        path = write_tone(audio / f"utt{i:05d}.flac", float(durations[i]), seed=seed + 10_000 + int(i))
        row: dict[str, object] = {"audio_filepath": str(path.relative_to(out)), "text": texts[i], "lang": "en"}
        if rng.random() > 1 / 3:
            row["duration"] = float(durations[i])
        rows.append(row)
    order = rng.permutation(len(rows))
    rows = [rows[i] for i in order]
    first = rows[0]
    rows += [
        {"audio_filepath": "audio/does-not-exist.flac", "text": "missing file", "lang": "en"},
        {"audio_filepath": str(first["audio_filepath"]), "duration": 3.0, "offset": 0.0, "text": "  ", "lang": "en"},
        {"audio_filepath": "audio/zero.flac", "duration": 0.0, "text": "zero duration", "lang": "en"},
        dict(first),  # duplicate id: same audio path and offset
    ]
    manifest = write_nemo_manifest(out / "train.jsonl", rows)
    with open(manifest, "ab") as fh:
        fh.write(b'{"audio_filepath": "audio/x.flac", "duration": 1.0, "text": "unterminated\n')
        fh.write(b'{"audio_filepath": "audio/y.flac", "duration": 1.0, "text": "caf\xe9 latin-1"}\n')
    return manifest


def demo_steps(out: Path) -> list[list[str]]:
    """The commands the demo runs, in order, as a user types them: README.md's "Start here" steps
    (the same flags; ``tests/test_readme_walk.py`` holds them equal), then ``report``."""
    o = str(out)
    return [
        ["train-tokenizer", f"{o}/train.jsonl", "--vocab-size", "256", "-o", f"{o}/spm.model"],
        ["compile", f"{o}/train.jsonl", "--tokenizer", f"{o}/spm.model", "--prompt-tokens", "9",
         "-o", f"{o}/manifest.parquet", "--rejects", f"{o}/compile-rejects.parquet"],
        ["stats", f"{o}/manifest.parquet", "--json", f"{o}/stats.json", "--plots", f"{o}/plots"],
        ["filter", f"{o}/manifest.parquet", "--max-tps", "25", "-o", f"{o}/kept.parquet",
         "--rejects", f"{o}/rejects.parquet"],
        ["fit-buckets", f"{o}/kept.parquet", "--num-buckets", "30", "--num-subbuckets", "2",
         "--max-duration-budget", "600", "-o", f"{o}/buckets.json"],
        ["padding", f"{o}/kept.parquet", "--buckets", f"{o}/buckets.json", "--world-sizes", "8,32,128",
         "--json", f"{o}/padding.json", "--plots", f"{o}/plots"],
        ["plan-batches", f"{o}/kept.parquet", "--buckets", f"{o}/buckets.json", "--world-size", "4",
         "--seed", "0", "--epochs", "2", "-o", f"{o}/plan"],
        ["simulate", f"{o}/plan"],
        ["verify", f"{o}/plan", "--manifest", f"{o}/kept.parquet"],
        ["report", f"{o}/kept.parquet", "--rejects", f"{o}/compile-rejects.parquet", "--rejects",
         f"{o}/rejects.parquet", "--buckets", f"{o}/buckets.json", "--plan", f"{o}/plan", "-o", f"{o}/report.html"],
    ]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0] if args else "demo-out")
    out.mkdir(parents=True, exist_ok=True)
    print(f"# generating a demo corpus under {out}/ ...", flush=True)
    manifest = make_demo_corpus(out)
    print(f"# wrote {sum(1 for _ in open(manifest, 'rb')):,} manifest lines and "
          f"{len(list((out / 'audio').glob('*.flac'))):,} FLAC files", flush=True)
    for step in demo_steps(out):
        print(f"\n$ dataprep {shlex.join(step)}", flush=True)
        rc = subprocess.call([sys.executable, "-m", "dataprep.cli", *step])
        if rc != 0:
            print(f"# step failed with exit status {rc}", file=sys.stderr)
            return rc
    print(f"\n# open {out / 'report.html'} in a browser: the corpus, its buckets and its plan on one page")
    print(f"# the same steps by hand (README.md, Start here): cd {out}")
    print(json.dumps({"demo": str(out), "report": str(out / "report.html"), "ok": True}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
