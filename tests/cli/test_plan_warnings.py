"""Warnings where a plan will be poor, computed by the library and printed by the CLI: few steps
an epoch, a world size beyond what the corpus fills (Common Voice metadata at W = 128: 2 steps an
epoch, a straggler over 30%), and ``simulate`` at world sizes its batches cannot fill."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from bucketing.step_figures import MIN_STEPS_PER_EPOCH, step_warnings
from dataprep.cli import app
from tests.conftest import read_shared_csv

runner = CliRunner()


def _run(*args: str) -> str:
    res = runner.invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return res.output


@pytest.fixture(scope="module")
def cv(tmp_path_factory: pytest.TempPathFactory, shared_spm_path: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cv")
    out = {}
    for name, rows in (("all", None), ("small", 400)):
        csv = root / f"{name}.csv"
        df = read_shared_csv("commonvoice.id_ps.csv")
        (df if rows is None else df.head(rows)).write_csv(csv)
        out[name] = root / f"{name}.parquet"
        _run("compile", str(csv), "--tokenizer", str(shared_spm_path), "-o", str(out[name]))
        out[f"{name}-buckets"] = root / f"{name}-buckets.json"
        _run("fit-buckets", str(out[name]), "-o", str(out[f"{name}-buckets"]))
    return out


def test_plan_batches_warns_at_a_world_size_beyond_the_corpus(cv, tmp_path: Path) -> None:
    big = _run("plan-batches", str(cv["all"]), "--buckets", str(cv["all-buckets"]), "--world-size", "128",
               "-o", str(tmp_path / "p128"))
    warnings = [line for line in big.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2, big
    assert warnings[0].startswith("warning: world size 128: only 2 step(s) an epoch")
    assert warnings[1].startswith("warning: world size 128: predicted straggler ")
    assert int(warnings[1].split("straggler ")[1].split("%")[0]) > 30
    few = _run("plan-batches", str(cv["all"]), "--buckets", str(cv["all-buckets"]), "--world-size", "2",
               "-o", str(tmp_path / "p2"))
    assert "warning" not in few  # enough steps, and ranks the corpus fills


def test_padding_world_sizes_warn_per_world_size(cv) -> None:
    out = _run("padding", str(cv["all"]), "--buckets", str(cv["all-buckets"]), "--world-sizes", "2,128")
    assert "warning: world size 128: only " in out and "warning: world size 2:" not in out


def test_simulate_skips_world_sizes_its_batches_cannot_fill_and_says_why(cv, tmp_path: Path) -> None:
    plan = tmp_path / "plan"
    _run("plan-batches", str(cv["small"]), "--buckets", str(cv["small-buckets"]), "--world-size", "2",
         "-o", str(plan))
    out = _run("simulate", str(plan))
    rows = [line.split()[0] for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert "128" not in rows and "2" in rows
    assert any(line.startswith("warning: world size 128 skipped: epoch 0 holds ") for line in out.splitlines())
    assert "describe this small corpus, not training at that scale" in out


def test_step_warnings_thresholds() -> None:
    assert step_warnings(8, MIN_STEPS_PER_EPOCH, 0.10) == []
    assert len(step_warnings(8, MIN_STEPS_PER_EPOCH - 1, 0.30)) == 2
