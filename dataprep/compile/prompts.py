"""Decoder prompt formats: how many tokens NeMo's prompt formatter adds around a transcript.

NeMo's Lhotse dataloader measures an utterance's tokens as ``len(input_ids)`` of its prompt
format, which its 2D buckets and ``max_tps`` filter see. Here that is the transcript's pieces
plus a fixed count:

``canary2`` (``Canary2PromptFormatter``)
    9 special tokens before the transcript and ``<|endoftext|>`` after: pieces + 10, plus the
    pieces of a non-empty ``decodercontext`` (the target language's model, as NeMo's).
``canary`` (``CanaryPromptFormatter``, Canary v1)
    5 special tokens before, ``<|endoftext|>`` after: pieces + 6.
``none``
    no prompt formatter: the pieces alone.
"""

from __future__ import annotations

from manifests.errors import DataprepError

#: special tokens each format adds to every utterance (prompt + end of text)
PROMPT_FORMAT_TOKENS = {"none": 0, "canary": 6, "canary2": 10}
#: source field (in ``extra``) whose pieces a format adds to the count
CONTEXT_FIELD = {"canary2": "decodercontext"}


def prompt_format_tokens(fmt: str) -> int:
    """Fixed tokens ``fmt`` adds to every utterance; a one-line error for an unknown format."""
    if fmt not in PROMPT_FORMAT_TOKENS:
        raise DataprepError(f"--prompt-format must be one of {', '.join(PROMPT_FORMAT_TOKENS)} (got {fmt!r})")
    return PROMPT_FORMAT_TOKENS[fmt]
