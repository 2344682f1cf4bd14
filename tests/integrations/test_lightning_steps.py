"""The Lightning step log (:class:`dataprep.integrations.lightning.StepTimeLog`) on a tiny NeMo
Canary trained by Lightning over ``get_plan_dataloader``: one row per step with its three times,
and ``dataprep calibrate`` fits a cost model from it. Marked ``nemo``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dataprep.training.loop import STEP_TIMES_SCHEMA
from manifests.plan_meta import read_plan_meta
from tests.conftest import needs_module
from tests.integrations._rich import Rich, rich_corpus
from tests.training._consumer import invoke, run_cli
from tests.warm_python import TRAINERS, run_python

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.nemo,
              needs_module("nemo.collections.asr", "nemo_toolkit is not installed (make test-nemo)")]


@pytest.fixture(scope="module")
def rich(tmp_path_factory: pytest.TempPathFactory) -> Rich:
    return rich_corpus(tmp_path_factory)


def test_a_tiny_canary_runs_step_log_calibrates(rich: Rich, tmp_path: Path) -> None:
    plan = tmp_path / "plan"
    invoke("plan-batches", str(rich.manifest), "--buckets", str(rich.buckets), "--world-size", "1", "--seed", "0",
           "--epochs", "3", "-o", str(plan))
    steps = read_plan_meta(plan).num_steps
    logs = tmp_path / "steps"
    (tmp_path / "run").mkdir()
    run = run_python(["-m", "tests.integrations._canary_train", str(plan), str(rich.manifest), str(rich.spm),
                      str(tmp_path / "run"), str(steps), str(logs)], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                     preload=TRAINERS)
    assert run.returncode == 0, run.stderr[-3000:]
    trained = [json.loads(x)["step"] for x in run.stdout.splitlines() if x.startswith("{")]
    assert trained == list(range(steps)) and steps >= 8
    table = pq.read_table(logs / "steps-rank-00000.parquet")
    assert table.schema.remove_metadata() == STEP_TIMES_SCHEMA
    rows = table.to_pylist()
    assert [r["step"] for r in rows] == list(range(steps)) and {r["rank"] for r in rows} == {0}
    assert all(r["forward_backward_s"] > 0 and r["optimizer_s"] > 0 and r["data_wait_s"] >= 0 for r in rows)
    res = run_cli("calibrate", str(plan), str(logs), "-o", str(tmp_path / "costmodel.json"))
    assert res.returncode == 0, res.stderr
    model = json.loads((tmp_path / "costmodel.json").read_text())
    assert model["fit"]["rows"] == steps and "median error" in res.stdout
