"""NeMo's Canary tokenizer over our sentencepiece model (for tests marked ``nemo``)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any


def canary_tokenizer(spm_model: Path, langs: Iterable[str], workdir: Path) -> Any:
    """A ``CanaryTokenizer``: the special tokens Canary and Canary2 prompts use, and ``spm_model``
    as every language's tokenizer."""
    from nemo.collections.common.tokenizers.canary_tokenizer import CanaryTokenizer
    from nemo.collections.common.tokenizers.sentencepiece_tokenizer import SentencePieceTokenizer

    langs = sorted(set(langs))
    special = ["<|startofcontext|>", "<|emo:undefined|>", "<|transcribe|>", "<|translate|>", "<|itn|>", "<|noitn|>",
               "<|timestamp|>", "<|notimestamp|>", "<|diarize|>", "<|nodiarize|>", *[f"<|{x}|>" for x in langs]]
    spl = CanaryTokenizer.build_special_tokenizer(special, workdir)
    return CanaryTokenizer({"spl_tokens": spl, **{x: SentencePieceTokenizer(str(spm_model)) for x in langs}})
