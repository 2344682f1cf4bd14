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
from manifests.io import read_manifest, read_metadata

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


@pytest.mark.parametrize(("fmt", "fixed"), [("canary2", 10), ("canary", 6), ("none", 0)])
def test_prompt_format_counts(source: tuple[Path, Path], tmp_path: Path, fmt: str, fixed: int) -> None:
    src, model = source
    out = tmp_path / "m.parquet"
    res = runner.invoke(app, ["compile", str(src), "--tokenizer", str(model), "--probe", "never",
                              "--prompt-format", fmt, "-o", str(out)])
    assert res.exit_code == 0, res.output
    df = read_manifest(out)
    sp = spm.SentencePieceProcessor(model_file=str(model))
    for text, extra, n in zip(df["text"], df["extra"], df["num_tokens"]):
        ctx = json.loads(extra).get("decodercontext") or ""
        context = len(sp.encode(ctx)) if fmt == "canary2" and ctx else 0
        assert n == len(sp.encode(text)) + fixed + context
    assert read_metadata(out)["provenance"]["prompt_format"] == fmt
    assert read_metadata(out)["provenance"]["prompt_tokens"] == fixed


def test_prompt_format_errors(source: tuple[Path, Path], tmp_path: Path) -> None:
    src, model = source
    for extra, msg in ((["--prompt-format", "whisper"], "--prompt-format must be one of"),
                       (["--prompt-format", "canary2", "--prompt-tokens", "9"], "not both")):
        res = runner.invoke(app, ["compile", str(src), "--tokenizer", str(model), "--probe", "never",
                                  "-o", str(tmp_path / "x.parquet"), *extra])
        assert res.exit_code == 2 and msg in res.output and res.output.count("\n") == 1
