"""``compile --prompt-format``: token counts of NeMo's Canary prompt formats, from the pieces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sentencepiece as spm
from typer.testing import CliRunner

from dataprep.cli import app
from dataprep.testing import WORDS, write_nemo_manifest
from dataprep.tokenize import train_model
from manifests.manifest_read import read_manifest, read_metadata

runner = CliRunner()


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("prompt")
    rows = [{"audio_filepath": f"a{i}.wav", "duration": 1.0 + i / 10, "text": " ".join(WORDS[i:i + 3 + i % 4]),
             "source_lang": "en", "target_lang": "en", "pnc": "yes"} for i in range(12)]
    rows[3]["decodercontext"] = "of the and"
    rows[4]["decodercontext"] = ""
    src = write_nemo_manifest(root / "src.jsonl", rows)
    model = root / "spm.model"
    train_model([" ".join(WORDS)] * 4, model, vocab_size=60, threads=1)
    return src, model


#: the special tokens NeMo's formatters put around every transcript, written out by hand from
#: their templates (nemo/collections/common/prompts/canary.py, canary2.py) for an English
#: transcription row with pnc, not taken from dataprep.compile.prompts
HAND_COUNTED = {
    "canary": ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|en|>", "<|pnc|>", "<|endoftext|>"],
    "canary2": ["<|startofcontext|>", "<|startoftranscript|>", "<|emo:undefined|>", "<|en|>", "<|en|>", "<|pnc|>",
                "<|noitn|>", "<|notimestamp|>", "<|nodiarize|>", "<|endoftext|>"],
    "none": [],
}


def _compile(source: tuple[Path, Path], out: Path, fmt: str) -> None:
    src, model = source
    res = runner.invoke(app, ["compile", str(src), "--tokenizer", str(model), "--probe", "never",
                              "--prompt-format", fmt, "-o", str(out)])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("fmt", ["canary2", "canary", "none"])
def test_prompt_format_counts(source: tuple[Path, Path], tmp_path: Path, fmt: str) -> None:
    src, model = source
    out = tmp_path / "m.parquet"
    _compile(source, out, fmt)
    df = read_manifest(out)
    fixed = len(HAND_COUNTED[fmt])
    assert fixed == {"canary2": 10, "canary": 6, "none": 0}[fmt]  # the counts the README states
    sp = spm.SentencePieceProcessor(model_file=str(model))
    for text, extra, n in zip(df["text"], df["extra"], df["num_tokens"]):
        ctx = json.loads(extra).get("decodercontext") or ""
        context = len(sp.encode(ctx)) if fmt == "canary2" and ctx else 0
        assert n == len(sp.encode(text)) + fixed + context
    assert read_metadata(out)["provenance"]["prompt_format"] == fmt
    assert read_metadata(out)["provenance"]["prompt_tokens"] == fixed


@pytest.mark.nemo
@pytest.mark.parametrize("fmt", ["canary2", "canary"])
def test_prompt_format_counts_equal_nemos_formatter(source: tuple[Path, Path], tmp_path: Path, fmt: str) -> None:
    """NeMo's own formatter (``tokenize_with_prompt``, what its buckets and TPS filter measure) on
    this source's rows, decoder contexts included, gives our ``num_tokens`` row for row."""
    pytest.importorskip("nemo.collections.asr", reason="nemo_toolkit is not installed")
    from lhotse import MonoCut, SupervisionSegment
    from nemo.collections.common.data.lhotse.dataloader import tokenize_with_prompt

    from tests.integrations._nemo import canary_tokenizer

    out = tmp_path / "m.parquet"
    _compile(source, out, fmt)
    df = read_manifest(out)
    tok = canary_tokenizer(source[1], ["en"], tmp_path / "spl")
    for row in df.iter_rows(named=True):
        extra = json.loads(row["extra"])
        cut = MonoCut(row["id"], start=0.0, duration=row["duration"], channel=0, supervisions=[
            SupervisionSegment(row["id"], row["id"], 0.0, row["duration"], text=row["text"], language="en")],
            custom={"source_lang": "en", "target_lang": "en", "pnc": "yes", "task": "asr", **extra})
        assert len(tokenize_with_prompt(cut, tok, fmt).input_ids) == row["num_tokens"], (row["id"], extra)


def test_prompt_format_errors(source: tuple[Path, Path], tmp_path: Path) -> None:
    src, model = source
    for extra, msg in ((["--prompt-format", "whisper"], "--prompt-format must be one of"),
                       (["--prompt-format", "canary2", "--prompt-tokens", "9"], "not both")):
        res = runner.invoke(app, ["compile", str(src), "--tokenizer", str(model), "--probe", "never",
                                  "-o", str(tmp_path / "x.parquet"), *extra])
        assert res.exit_code == 2 and msg in res.output and res.output.count("\n") == 1
