"""Test and demo factories shipped with the package: tiny real audio files and synthetic
corpora with realistic duration and tokens-per-second distributions.

Durations follow a log-normal fitted loosely to read speech (median ~6 s, 0.5-35 s);
speaking rate ~2.6 words/s with per-speaker spread; a small share of outliers (long text
on short clips) so TPS filters have something to remove.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import polars as pl
import soundfile

#: a plain English word list for synthetic transcripts (common words, no punctuation)
WORDS: tuple[str, ...] = tuple(
    """the of and to in is was that for it with as his on be at by had are but from or have an
    they which one you were her all she there would their we him been has when who will more no
    if out so said what up its about into than them can only other new some could time these two
    may then do first any my now such like our over man me even most made after also did many
    before must through back years where much your way well down should because each just those
    people how too little state good very make world still own see men work long get here between
    both life being under never day same another know while last might us great old year off come
    since against go came right used take three states himself few house use during without again
    place american around however home small found thought went say part once general high upon
    school every does got united left number course war until always away something fact though
    water less public put think almost hand enough far took head yet government system better set
    told nothing night end why called didn't eyes find going look asked later knew point next
    program city business give group toward young days let room president side social given
    present several order national possible rather second face per among form important often
    things looked early white case john become large big need four within felt along children saw
    best church ever least power development light thing seemed family interest want members mind
    country area others done turned although open god service certain kind problem began different
    door thus help sense means whole matter perhaps itself york times law human line above name
    example action company hands local show whether five history gave today either act feet across
    taken past quite anything seen having death experience body word half really week field car
    words already themselves information tell together college shall money period held keep sure
    probably free seems real behind cannot miss political air question making office brought whose
    special heard major problems ago became federal moment study available known result street
    economic boy position reason change south board individual job society areas west close turn
    love community true court force full seem am wife age policy voice stood""".split()
)


def write_tone(
    path: str | os.PathLike[str],
    seconds: float,
    sample_rate: int = 16000,
    channels: int = 1,
    subtype: str | None = None,
    seed: int = 0,
) -> Path:
    """Write a real audio file (format from the suffix) of ``seconds`` with tone bursts.

    Mostly digital silence with short quiet tones, so FLAC compresses it to a few KB/s.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    n = max(1, int(round(seconds * sample_rate)))
    rng = np.random.default_rng(seed)
    t = np.arange(n) / sample_rate
    on = np.flatnonzero(np.sin(2 * np.pi * 0.7 * t + rng.uniform(0, 6.28)) > 0.6)  # the tones' samples
    sig = np.zeros(n, np.float32)
    sig[on] = np.float32(0.05) * np.sin(2 * np.pi * rng.uniform(150, 400) * t[on])
    data = np.repeat(sig[:, None], channels, axis=1) if channels > 1 else sig
    soundfile.write(p, data, sample_rate, subtype=subtype)
    return p


def sample_corpus(
    num_utterances: int, seed: int = 0, outlier_share: float = 0.01
) -> tuple[npt.NDArray[np.float64], list[str], npt.NDArray[np.int64]]:
    """Durations (s, rounded to 10 ms), transcripts and speaker ids of a synthetic corpus."""
    rng = np.random.default_rng(seed)
    dur = np.clip(rng.lognormal(mean=np.log(6.0), sigma=0.6, size=num_utterances), 0.5, 35.0).round(2)
    speakers = rng.integers(0, max(1, num_utterances // 40), size=num_utterances)
    rate = rng.normal(2.6, 0.35, size=max(1, num_utterances // 40))[speakers].clip(1.2, 4.0)  # words/s
    nwords = np.maximum(1, np.round(dur * rate * rng.normal(1.0, 0.08, size=num_utterances))).astype(int)
    outliers = rng.random(num_utterances) < outlier_share
    nwords[outliers] = np.maximum(nwords[outliers], np.round(dur[outliers] * 16).astype(int))
    vocab = np.array(WORDS)
    word_idx = rng.zipf(1.3, size=int(nwords.sum())) % len(vocab)
    words = vocab[word_idx]
    bounds = np.concatenate([[0], np.cumsum(nwords)])
    texts = [" ".join(words[bounds[i]: bounds[i + 1]]) for i in range(num_utterances)]
    return dur, texts, speakers


def write_nemo_manifest(path: str | os.PathLike[str], rows: Sequence[dict[str, object]]) -> Path:
    """Write rows as a NeMo JSONL manifest (one JSON object per line)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return p


def synthetic_manifest(
    num_utterances: int,
    *,
    seed: int = 0,
    outlier_share: float = 0.01,
    vocab_size: int = 256,
    prompt_tokens: int = 9,
) -> pl.DataFrame:
    """A compiled-manifest frame of :func:`sample_corpus`: ``num_tokens`` from a real
    sentencepiece model trained (in memory) on the corpus's own transcripts, plus
    ``prompt_tokens``; ``tps`` = num_tokens / duration. No audio files are written."""
    import io

    import sentencepiece as spm

    dur, texts, _ = sample_corpus(num_utterances, seed=seed, outlier_share=outlier_share)
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=buf, vocab_size=vocab_size, num_threads=2, minloglevel=2
    )
    sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    tokens = np.fromiter(map(len, sp.encode(texts)), dtype=np.int64, count=len(texts)) + prompt_tokens
    n = len(texts)
    return pl.DataFrame({
        "id": [f"gen-{i:05d}" for i in range(n)], "audio_path": [f"a/{i}.flac" for i in range(n)],
        "duration": dur, "text": texts, "lang": "en", "num_tokens": tokens, "tps": tokens / dur,
        "origin": [f"gen.jsonl:{i + 1}" for i in range(n)],
    })


def write_plan_inputs(
    folder: str | os.PathLike[str],
    num_utterances: int,
    *,
    seed: int,
    num_buckets: int,
    num_subbuckets: int = 2,
    budget: float = 120.0,
    ids: Sequence[str] | None = None,
    corpora: int = 0,
) -> tuple[Path, Path]:
    """``kept.parquet`` (log-normal durations in s, 2-4 tokens/s + 9 prompt tokens) and a
    fitted ``buckets.json`` (padded-budget batch sizes for ``budget`` s) in ``folder``:
    the two inputs of ``plan-batches``, without audio. Returns their paths. ``corpora`` > 0:
    a ``corpus`` column too, rows drawn among ``c0``, ``c1``, ... with unequal shares (for
    weighted plans, ``PlanOptions(weights=...)``)."""
    from bucketing.budget import budget_source, padded_budget_batch_sizes
    from bucketing.fit import grid_to_buckets
    from bucketing.fit_passes import fit_buckets
    from manifests.buckets_file import BucketSpec, write_buckets
    from manifests.manifest_write import write_manifest

    folder = Path(folder)
    rng = np.random.default_rng(seed)
    d = rng.lognormal(1.6, 0.6, num_utterances)
    tok = (d * rng.uniform(2, 4, num_utterances)).astype(np.int64) + 9
    names = list(ids) if ids is not None else [f"u{i:05d}" for i in range(num_utterances)]
    columns = {"id": names, "duration": d, "num_tokens": tok}
    if corpora > 0:
        share = rng.uniform(0.2, 1.0, corpora)
        columns["corpus"] = [f"c{c}" for c in rng.choice(corpora, num_utterances, p=share / share.sum())]
    write_manifest(pl.DataFrame(columns), folder / "kept.parquet")
    fit = fit_buckets(d, tok, num_buckets, num_subbuckets)
    bs = padded_budget_batch_sizes(fit.grid.max_duration, max_duration_budget=budget)
    write_buckets(BucketSpec(grid_to_buckets(fit.grid, bs), budget_source(max_duration_budget=budget)),
                  folder / "buckets.json")
    return folder / "kept.parquet", folder / "buckets.json"
