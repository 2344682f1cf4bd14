"""Metadata-only manifests, as real corpora ship them: compile says what it did not check and
why; commands that work from durations use them, commands that read audio refuse in one line.

LibriSpeech metadata (no audio path at all) and Common Voice rows naming clips that are not
here, from ../shared/data; the CLI as a user runs it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from dataprep.cli import app
from dataprep.testing import write_nemo_manifest, write_tone
from tests.conftest import read_shared_csv

runner = CliRunner()

ROWS = 2000


def _run(*args: str) -> str:
    res = runner.invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return res.output


def _refused(*args: str) -> str:
    res = runner.invoke(app, list(args))
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1, res.output
    return res.output


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory, shared_spm_path: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("metadata")
    libri = root / "libri.csv"
    read_shared_csv("librispeech.train-clean-100.csv").head(ROWS).write_csv(libri)
    cv = read_shared_csv("commonvoice.id_ps.csv").head(ROWS)
    src = write_nemo_manifest(root / "cv.jsonl", [
        {"audio_filepath": f"clips/{r['id']}.mp3", "duration": r["duration"], "text": r["text"], "lang": r["lang"]}
        for r in cv.iter_rows(named=True)])
    out = {}
    for name, source in (("libri", libri), ("cv", src)):
        out[name] = root / f"{name}.parquet"
        out[f"{name}-log"] = _run("compile", str(source), "--tokenizer", str(shared_spm_path), "-o", str(out[name]))
        out[f"{name}-buckets"] = root / f"{name}-buckets.json"
        _run("fit-buckets", str(out[name]), "--num-buckets", "6", "-o", str(out[f"{name}-buckets"]))
    return out  # type: ignore[return-value]


def test_compile_says_how_many_rows_audio_it_did_not_check_and_why(corpora) -> None:
    assert (f"audio not checked: {ROWS:,} of {ROWS:,} kept rows name no audio file (metadata only)"
            in corpora["libri-log"])
    cv = corpora["cv-log"]
    assert f"audio not checked: {ROWS:,} of {ROWS:,} kept rows, headers not read" in cv and "--probe auto" in cv
    assert "audio missing: 1,000 of 1,000 sampled files do not exist" in cv and "--audio-root" in cv


@pytest.mark.parametrize("corpus", ["libri", "cv"])
def test_commands_that_read_audio_refuse_in_one_line_naming_the_fix(corpora, corpus: str, tmp_path: Path) -> None:
    m, b = str(corpora[corpus]), str(corpora[f"{corpus}-buckets"])
    fix = "metadata-only manifest" if corpus == "libri" else "--audio-root DIR"
    for cmd in (["export", "nemo", b, "-m", m, "-o", str(tmp_path / "n")],
                ["export", "lhotse", b, "-m", m, "-o", str(tmp_path / "l")],
                ["pack", m, "-o", str(tmp_path / "p"), "--layout", "nemo-tarred"]):
        out = _refused(*cmd)
        assert fix in out and ("pack" if cmd[0] == "pack" else f"export {cmd[1]}") + " reads the audio" in out
    # commands that work from durations use the manifest as it is
    _run("stats", m)
    _run("plan-batches", m, "--buckets", b, "--world-size", "2", "-o", str(tmp_path / "plan"))


def test_checked_audio_gives_no_note(tmp_path: Path, shared_spm_path: Path) -> None:
    wav = write_tone(tmp_path / "a.flac", 1.5)
    src = write_nemo_manifest(tmp_path / "t.jsonl", [{"audio_filepath": str(wav), "duration": 1.5, "text": "one"}])
    out = _run("compile", str(src), "--tokenizer", str(shared_spm_path), "--probe", "always",
               "-o", str(tmp_path / "m.parquet"))
    assert "not checked" not in out and "missing" not in out
    out = _run("compile", str(src), "--tokenizer", str(shared_spm_path), "-o", str(tmp_path / "m2.parquet"))
    assert "audio not checked: 1 of 1 kept rows, headers not read" in out and "audio missing" not in out
