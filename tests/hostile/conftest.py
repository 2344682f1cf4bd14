"""Shared pieces of the hostile-input suite: a small real corpus (real audio, a real
sentencepiece model, compiled, bucketed and planned through the CLI), a trained checkpoint,
and :func:`refused`, the assertion every refusal case makes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dataprep.cli import app
from tests.training._consumer import Corpus, build_corpus, invoke

runner = CliRunner()


def refused(*args: object, match: str | tuple[str, ...] = ()) -> str:
    """Run ``dataprep ARGS``; assert exit status 2 with exactly one line ``error: ...`` on stderr
    (holding every ``match`` fragment) and no traceback. Returns the line."""
    res = runner.invoke(app, [str(a) for a in args])
    detail = f"dataprep {' '.join(map(str, args))} -> {res.exit_code}\nstdout: {res.stdout}\nstderr: {res.stderr}"
    assert res.exit_code == 2, detail
    assert res.exception is None or isinstance(res.exception, SystemExit), f"{detail}\n{res.exception!r}"
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), detail
    assert "Traceback" not in res.output, detail
    for m in (match,) if isinstance(match, str) else match:
        assert m in lines[0], f"{m!r} not in {lines[0]!r}"
    return lines[0]


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    """16 real clips (WAV/FLAC, several rates, some segments), compiled and fitted (3x2 buckets)."""
    return build_corpus(tmp_path_factory.mktemp("hostile-corpus"), num_tones=16, shared_limit=0)


@pytest.fixture(scope="session")
def plan(corpus: Corpus) -> Path:
    """A one-rank, one-epoch plan of the corpus."""
    return corpus.plan(1)


@pytest.fixture()
def plan_copy(plan: Path, tmp_path: Path) -> Path:
    """A copy of :func:`plan` this test may damage."""
    dst = tmp_path / "plan"
    shutil.copytree(plan, dst)
    return dst


@pytest.fixture(scope="session")
def trained(corpus: Corpus, plan: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint directory of a 2-step run on :func:`plan` (its ``last.pt`` is real)."""
    ckpt = tmp_path_factory.mktemp("hostile-ckpt") / "run"
    invoke(*train_args(corpus, plan, ckpt, "--steps", "2"))
    return ckpt


def train_args(c: Corpus, plan: Path, ckpt: Path, *extra: str) -> list[str]:
    return ["train", str(plan), "--manifest", str(c.manifest), "--tokenizer", str(c.spm), "--checkpoint-dir",
            str(ckpt), "--cache-dir", str(c.root / "cache"), "--timeout", "60", "--quiet", "--device", "cpu", *extra]
