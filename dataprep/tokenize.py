"""Counting decoder tokens with sentencepiece: one model, or one per language.

``num_tokens`` = sentencepiece pieces of the text + the fixed prompt length (Canary-style
task prompt), as the decoder sees them.
"""

from __future__ import annotations

import io
import operator
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
import polars as pl
import sentencepiece as spm

from manifests.atomic_files import atomic_path
from manifests.content_hash import file_sha256
from manifests.errors import DataprepError
from manifests.manifest_read import read_metadata
from manifests.options import check_choice, check_int, check_number
from manifests.outputs import refuse_directory_outputs

#: key of the model used for rows whose language has no model of its own
DEFAULT_LANG = "*"


def load_model(path: str | os.PathLike[str]) -> spm.SentencePieceProcessor:
    """Load a sentencepiece model; a one-line error if it is missing or not a model."""
    p = Path(path)
    if not p.is_file():
        raise DataprepError(f"{p}: tokenizer model not found")
    proc = spm.SentencePieceProcessor()
    try:
        proc.Load(str(p))
    except (OSError, RuntimeError) as exc:
        raise DataprepError(f"{p}: not a sentencepiece model ({str(exc).splitlines()[0]})") from None
    return proc


@dataclass
class Tokenizers:
    """Sentencepiece models by language (``DEFAULT_LANG`` for all others)."""

    models: dict[str, spm.SentencePieceProcessor]
    hashes: dict[str, str] = field(default_factory=dict)  # language -> model file sha256

    @classmethod
    def from_specs(cls, specs: Sequence[str]) -> Tokenizers:
        """Parse ``--tokenizer`` values: ``spm.model`` or ``lang=spm_lang.model``."""
        models: dict[str, spm.SentencePieceProcessor] = {}
        hashes: dict[str, str] = {}
        for spec in specs:
            lang, sep, path = spec.partition("=")
            if not sep:
                lang, path = DEFAULT_LANG, spec
            if lang in models:
                raise DataprepError(f"--tokenizer: language {lang!r} given twice")
            models[lang] = load_model(path)
            hashes[lang] = file_sha256(path)
        if not models:
            raise DataprepError("no --tokenizer given")
        return cls(models=models, hashes=hashes)

    def model_for(self, lang: str | None) -> spm.SentencePieceProcessor | None:
        if lang is not None and lang in self.models:
            return self.models[lang]
        return self.models.get(DEFAULT_LANG)

    def count(
        self, texts: Sequence[str] | pl.Series, langs: Sequence[str | None] | pl.Series, threads: int = 0
    ) -> npt.NDArray[np.int64]:
        """Pieces per text (without the prompt); ``-1`` where no model covers the language.

        One batch-encode call per *model* (languages sharing a model are encoded together),
        handing sentencepiece the caller's strings as they are when one model covers every
        row, so throughput is that of sentencepiece itself.
        """
        out = np.full(len(texts), -1, dtype=np.int64)
        if not len(texts):
            return out
        lang_series = langs if isinstance(langs, pl.Series) else pl.Series("lang", list(langs), dtype=pl.String)
        groups: dict[int, tuple[spm.SentencePieceProcessor, list[str | None]]] = {}
        distinct = lang_series.unique(maintain_order=True).to_list()
        for lang in distinct:
            model = self.model_for(lang)
            if model is not None:
                groups.setdefault(id(model), (model, []))[1].append(lang)
        for model, group in groups.values():
            if len(group) == len(distinct):  # this model covers every row
                out[:] = count_pieces(model, _as_list(texts), threads)
                continue
            named = [lang for lang in group if lang is not None]
            mask = lang_series.is_in(named) if named else pl.Series(np.zeros(len(texts), dtype=bool))
            if None in group:
                mask = mask | lang_series.is_null()
            idx = np.flatnonzero(mask.fill_null(False).to_numpy())
            out[idx] = count_pieces(model, _take(texts, idx), threads)
        return out


def _as_list(texts: Sequence[str] | pl.Series) -> list[str]:
    if isinstance(texts, list):
        return texts
    return texts.to_list() if isinstance(texts, pl.Series) else list(texts)


def _take(texts: Sequence[str] | pl.Series, idx: npt.NDArray[np.intp]) -> list[str]:
    """``texts[idx]`` as a list, without a Python-level loop over the rows."""
    if isinstance(texts, pl.Series):
        return texts.gather(idx).to_list()
    if len(idx) == 1:
        return [texts[int(idx[0])]]
    return list(operator.itemgetter(*idx.tolist())(texts)) if len(idx) else []


def count_pieces(model: spm.SentencePieceProcessor, texts: list[str], threads: int = 0) -> npt.NDArray[np.int64]:
    """Number of sentencepiece pieces per text, by one batch ``encode`` call (``threads`` 0:
    sentencepiece's default, all cores)."""
    if not texts:
        return np.zeros(0, dtype=np.int64)
    ids = model.encode(texts, out_type=int, num_threads=threads or -1)
    return np.fromiter(map(len, ids), dtype=np.int64, count=len(texts))


#: sentencepiece model types :func:`train_model` trains
MODEL_TYPES = ("unigram", "bpe", "char", "word")


def train_model(
    texts: Iterable[str],
    output: str | os.PathLike[str],
    *,
    vocab_size: int = 1024,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
    input_sentence_size: int = 2_000_000,
    threads: int = 2,
    seed_sentencepiece_size: int = 1_000_000,
) -> Mapping[str, object]:
    """Train a sentencepiece model on ``texts`` and write it atomically to ``output``.

    Deterministic for equal input (sentencepiece shuffles with a fixed seed when sampling).
    ``model_type``: one of :data:`MODEL_TYPES`.
    """
    check_choice("model_type", model_type, MODEL_TYPES)
    check_int("vocab_size", vocab_size, ge=2)
    check_int("threads", threads, ge=1, le=1024)
    check_number("character_coverage", character_coverage, gt=0, le=1)
    check_int("input_sentence_size", input_sentence_size, ge=1, le=None)
    check_int("seed_sentencepiece_size", seed_sentencepiece_size, ge=1, le=None)
    refuse_directory_outputs({"-o": output})
    buf = io.BytesIO()
    texts = [t for t in texts if t]
    if not texts:
        raise DataprepError("no transcripts to train a tokenizer on")
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_writer=buf,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            input_sentence_size=input_sentence_size,
            shuffle_input_sentence=True,
            num_threads=threads,
            seed_sentencepiece_size=seed_sentencepiece_size,
            minloglevel=2,
        )
    except RuntimeError as exc:
        raise DataprepError(f"sentencepiece training failed: {str(exc).splitlines()[-1]}") from None
    with atomic_path(output) as tmp:
        tmp.write_bytes(buf.getvalue())
    return {"vocab_size": vocab_size, "model_type": model_type, "sentences": len(texts)}


def require_recorded_tokenizer(tokenizers: Tokenizers, manifest: str | os.PathLike[str], allow_other: bool) -> None:
    """Refuse tokenizers whose SHA-256 differs from the one the manifest records for the same
    language (its ``num_tokens`` were counted with that one): the batches' token counts would not
    be the manifest's. ``allow_other`` (``--allow-other-tokenizer``) permits it; a manifest that
    records no tokenizer is not checked."""
    recorded = read_metadata(manifest)["provenance"].get("tokenizers") or {}
    if allow_other or not isinstance(recorded, dict):
        return
    for lang, digest in sorted(tokenizers.hashes.items()):
        want = recorded.get(lang)
        if want is not None and want != digest:
            which = "" if lang == DEFAULT_LANG else f" for {lang!r}"
            raise DataprepError(f"{manifest}: provenance.tokenizers: the manifest was compiled with tokenizer "
                                f"{str(want)[:12]}...{which}, --tokenizer is {digest[:12]}...; pass "
                                f"--allow-other-tokenizer to train with it anyway")
