"""Tokenizers.count on real sentencepiece models trained here on sample_corpus transcripts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
import sentencepiece as spm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataprep.testing import sample_corpus
from dataprep.tokenize import Tokenizers, train_model


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("spm")
    _, texts, _ = sample_corpus(3000, seed=1)
    a, b = tmp / "a.model", tmp / "b.model"
    train_model(texts, a, vocab_size=200)
    train_model([t.upper() for t in texts], b, vocab_size=150)
    return {"a": a, "b": b}


def _expected(texts, langs, by_lang: dict[str, Path]) -> list[int]:
    procs = {k: spm.SentencePieceProcessor(model_file=str(v)) for k, v in by_lang.items()}
    out = []
    for t, lang in zip(texts, langs):
        proc = procs.get(lang) if lang in procs else procs.get("*")
        out.append(-1 if proc is None else len(proc.encode(t)))
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(langs=st.lists(st.sampled_from(["en", "de", "fr", None]), min_size=1, max_size=60),
       default=st.booleans(), as_series=st.booleans(), threads=st.sampled_from([0, 1, 2]))
def test_count_matches_one_encode_per_text(models, langs, default, as_series, threads) -> None:
    """Per-language models, a shared default, unknown languages (-1), any thread count."""
    _, texts, _ = sample_corpus(len(langs), seed=len(langs))
    by_lang = {"en": models["a"], "de": models["b"]}
    if default:
        by_lang["*"] = models["a"]
    toks = Tokenizers.from_specs([f"{k}={v}" if k != "*" else str(v) for k, v in by_lang.items()])
    got = toks.count(pl.Series(texts) if as_series else texts,
                     pl.Series(langs, dtype=pl.String) if as_series else langs, threads)
    assert got.dtype == np.int64
    assert got.tolist() == _expected(texts, langs, by_lang)


def test_count_empty_and_single_model_fast_path(models) -> None:
    toks = Tokenizers.from_specs([str(models["a"])])
    assert toks.count([], [], 1).tolist() == []
    _, texts, _ = sample_corpus(500, seed=3)
    got = toks.count(texts, ["en"] * 250 + [None] * 250, 2)
    assert got.tolist() == _expected(texts, ["x"] * 500, {"*": models["a"]})
    assert (got > 0).all()
