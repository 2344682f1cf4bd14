"""A translation row's token count with one tokenizer per language equals NeMo's canary2
formatter's (NeMo picks the tokenizer by ``lang`` first, then ``target_lang``). Marked ``nemo``."""

from __future__ import annotations

from pathlib import Path

import pytest
import sentencepiece as spm

from dataprep.testing import WORDS, write_nemo_manifest, write_tone
from dataprep.tokenize import train_model
from manifests.manifest_read import read_manifest
from tests.conftest import needs_module

pytestmark = [pytest.mark.nemo,
              needs_module("nemo.collections.asr", "nemo_toolkit is not installed (make test-nemo)")]

FRENCH = "le la les un une des et est dans que pour qui pas sur avec plus tout nous vous ils elle".split()


def test_translation_row_counts_as_nemos_canary2(tmp_path: Path) -> None:
    from nemo.collections.common.data.lhotse.dataloader import tokenize_with_prompt
    from nemo.collections.common.tokenizers.canary_tokenizer import CanaryTokenizer
    from nemo.collections.common.tokenizers.sentencepiece_tokenizer import SentencePieceTokenizer

    from dataprep.integrations.cuts import cuts_for_rows
    from tests.training._consumer import invoke

    en, fr = tmp_path / "en.model", tmp_path / "fr.model"
    train_model([" ".join(WORDS)] * 4, en, vocab_size=40, threads=1)
    train_model([" ".join(FRENCH)] * 4, fr, vocab_size=28, threads=1)
    rows = []
    for i in range(6):
        audio = write_tone(tmp_path / f"u{i}.flac", 1.0 + i / 4, sample_rate=16000, seed=i)
        text = " ".join(FRENCH[i:i + 6])
        rows.append({"audio_filepath": audio.name, "text": text, "lang": "en", "source_lang": "en",
                     "target_lang": "fr", "pnc": "yes"})
    rows.append({"audio_filepath": "u0.flac", "offset": 0.25, "duration": 0.5, "text": "the of and",
                 "target_lang": "en", "source_lang": "fr", "pnc": "no"})  # no lang: target_lang picks
    src = write_nemo_manifest(tmp_path / "ast.json", rows)
    manifest = tmp_path / "m.parquet"
    invoke("compile", str(src), "--tokenizer", f"en={en}", "--tokenizer", f"fr={fr}", "--prompt-format", "canary2",
           "-o", str(manifest))
    df = read_manifest(manifest)
    assert df.height == 7
    sp_en, sp_fr = spm.SentencePieceProcessor(model_file=str(en)), spm.SentencePieceProcessor(model_file=str(fr))
    assert len(sp_en.encode(df["text"][0])) != len(sp_fr.encode(df["text"][0]))  # the choice matters here
    special = ["<|startofcontext|>", "<|emo:undefined|>", "<|transcribe|>", "<|translate|>", "<|itn|>", "<|noitn|>",
               "<|timestamp|>", "<|notimestamp|>", "<|diarize|>", "<|nodiarize|>", "<|pnc|>", "<|nopnc|>",
               "<|en|>", "<|fr|>"]
    spl = CanaryTokenizer.build_special_tokenizer(special, tmp_path / "spl")
    tokenizer = CanaryTokenizer({"spl_tokens": spl, "en": SentencePieceTokenizer(str(en)),
                                 "fr": SentencePieceTokenizer(str(fr))})
    for cut, ours in zip(cuts_for_rows(df.to_arrow(), channel=0), df["num_tokens"]):
        assert len(tokenize_with_prompt(cut, tokenizer, "canary2").input_ids) == ours, cut.id
