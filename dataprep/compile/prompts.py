"""Decoder prompt formats: how many tokens NeMo's prompt formatter adds around a transcript.

NeMo's Lhotse dataloader measures an utterance's tokens as ``len(input_ids)`` of its prompt
format (``nemo.collections.common.data.lhotse.sampling._measure_tokens``), which is what its
2D buckets and ``max_tps`` filter see. For the formats here that is the transcript's pieces
plus a fixed number of special tokens:

``canary2`` (``Canary2PromptFormatter``)
    ``<|startofcontext|>`` decoder context ``<|startoftranscript|>`` emotion, source language,
    target language, pnc, itn, timestamp, diarize (9 special tokens), then the transcript and
    ``<|endoftext|>``: pieces + 10, plus the pieces of a non-empty ``decodercontext`` field
    (tokenized with the target language's model, as NeMo's ``CanaryTokenizer`` does).
``canary`` (``CanaryPromptFormatter``, Canary v1)
    ``<|startoftranscript|>`` source language, task, target language, pnc (5), the transcript,
    ``<|endoftext|>``: pieces + 6.
``none``
    no prompt formatter: NeMo counts the supervision's tokens, i.e. the pieces alone.
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
