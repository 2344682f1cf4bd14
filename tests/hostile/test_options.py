"""Option values out of range: one line naming the option, exit 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hostile.conftest import refused
from tests.training._consumer import Corpus


@pytest.mark.parametrize("option,value,problem", [
    ("--prompt-tokens", "-100", "must be >= 0"),
    ("--mismatch-tolerance", "-1", "must be >= 0"),
    ("--mismatch-tolerance", "nan", "finite"),
    ("--max-plausible-duration", "0", "must be > 0"),
    ("--max-plausible-duration", "inf", "finite"),
    ("--threads", "0", "must be >= 1"),
    ("--workers", "0", "must be >= 1"),
    ("--num-parts", "0", "must be >= 1"),
    ("--part-index", "-1", "must be >= 0"),
])
def test_compile_options(corpus: Corpus, tmp_path: Path, option: str, value: str, problem: str) -> None:
    out = tmp_path / "m.parquet"
    refused("compile", corpus.source, "--tokenizer", corpus.spm, "-o", out, option, value, match=(option, problem))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("option,value,problem", [
    ("--max-duration-budget", "0", "must be > 0"),
    ("--max-duration-budget", "-10", "must be > 0"),
    ("--max-duration-budget", "nan", "finite"),
    ("--max-duration-budget", "inf", "finite"),
    ("--max-frames-budget", "0", "must be > 0"),
    ("--max-tokens-budget", "-5", "must be > 0"),
    ("--frame-shift", "0", "must be > 0"),
    ("--frame-shift", "nan", "finite"),
    ("--min-duration", "-1", "must be >= 0"),
    ("--token-fence", "nan", "finite"),
])
def test_fit_buckets_options(corpus: Corpus, tmp_path: Path, option: str, value: str, problem: str) -> None:
    out = tmp_path / "b.json"
    refused("fit-buckets", corpus.manifest, "-o", out, option, value, match=(option, problem))
    assert not out.exists()


@pytest.mark.parametrize("option,value,problem", [
    ("--row-group-steps", "0", "must be >= 1"),
    ("--world-size", "0", "must be >= 1"),
    ("--epochs", "0", "must be >= 1"),
])
def test_plan_batches_options(corpus: Corpus, tmp_path: Path, option: str, value: str, problem: str) -> None:
    args = {"--world-size": "1", "--epochs": "1", option: value}
    flat = [x for kv in args.items() for x in kv]
    refused("plan-batches", corpus.manifest, "--buckets", corpus.buckets, "-o", tmp_path / "p", *flat,
            match=(option, problem))
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("option,value", [("--max-tps", "nan"), ("--min-duration", "-1"), ("--max-tokens", "-3")])
def test_filter_options(corpus: Corpus, tmp_path: Path, option: str, value: str) -> None:
    refused("filter", corpus.manifest, "-o", tmp_path / "k.parquet", option, value, match=option)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("option,value,problem", [
    ("--lr", "0", "must be > 0"), ("--lr", "nan", "finite"), ("--nproc", "0", "must be >= 1"),
    ("--steps", "-1", "must be >= 0"), ("--timeout", "0", "must be > 0"), ("--device", "tpu", "auto, cpu or cuda"),
])
def test_train_options(corpus: Corpus, plan: Path, tmp_path: Path, option: str, value: str, problem: str) -> None:
    refused("train", plan, "--manifest", corpus.manifest, "--tokenizer", corpus.spm, "--checkpoint-dir",
            tmp_path / "ck", option, value, match=(option, problem))
    assert not (tmp_path / "ck").exists()


def test_padding_and_simulate_options(corpus: Corpus, plan: Path) -> None:
    refused("padding", corpus.manifest, "--buckets", corpus.buckets, "--budget", "-1", match="--budget")
    refused("padding", corpus.manifest, "--buckets", corpus.buckets, "--window", "0", match="--window")
    refused("simulate", plan, "--world-sizes", "2,0", match="--world-sizes")
    refused("simulate", plan, "--epoch", "-1", match="--epoch")
    refused("padding", corpus.manifest, "--buckets", corpus.buckets, "--balance", "-1", match="--balance")
    refused("simulate", plan, "--exchange", "nan", match="--exchange")
    refused("simulate", plan, "--strategy", "hybrid", "--group-size", "0", match="--group-size")
    refused("plan-batches", corpus.manifest, "--buckets", corpus.buckets, "--world-size", "1", "-o", plan.parent / "p9",
            "--coef", "overhead=nan", match="overhead=nan")


def test_rejects_default_shown_by_help_is_the_real_one(corpus: Corpus, tmp_path: Path) -> None:
    from tests.training._consumer import runner
    from dataprep.cli import app

    help_text = runner.invoke(app, ["compile", "--help"], env={"COLUMNS": "300"}).stdout
    assert "<output stem>.rejects.parquet" in " ".join(help_text.replace("│", " ").split())
    res = runner.invoke(app, ["compile", str(corpus.source), "--tokenizer", str(corpus.spm), "--probe", "never",
                              "-o", str(tmp_path / "out.parquet")])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.parquet", "out.rejects.parquet"]
