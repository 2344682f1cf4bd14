"""Lightning DDP on 2 ranks (gloo, CPU) over ``get_plan_dataloader``, both loaders (map-style and
``force_iterable_dataset``): Lightning's own checkpoints (``ModelCheckpoint``, ``fit(ckpt_path=)``)
resume at exactly the saved step, and NeMo's ``max_epochs: -1`` run ends at the plan's end with
``fit()`` returning, exit status 0 and one line (rank 0's). One pair of processes runs every
case (:mod:`tests.integrations._lightning_plan`). Marked ``nemo`` (the venv with Lightning)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from manifests.plan_files import open_shard
from tests.conftest import needs_module
from tests.integrations._rich import Rich, rich_corpus
from tests.warm_python import TRAINERS, run_ranks

pytestmark = [pytest.mark.nemo,
              needs_module("lightning.pytorch", "Lightning is not installed (make test-nemo)"),
              needs_module("nemo.collections.asr", "nemo_toolkit is not installed (make test-nemo)")]

REPO = Path(__file__).resolve().parents[2]
EVERY = 3


@pytest.fixture(scope="module")
def rich(tmp_path_factory: pytest.TempPathFactory) -> Rich:
    return rich_corpus(tmp_path_factory)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def runs(rich: Rich, tmp_path_factory: pytest.TempPathFactory) -> list[tuple[int, str, str]]:
    """``(exit status, stdout, stderr)`` of each rank's process."""
    work = tmp_path_factory.mktemp("lightning")
    env = {**os.environ, "PYTHONPATH": str(REPO), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_port()),
           "WORLD_SIZE": "2", "NODE_RANK": "0"}
    argv = ["-m", "tests.integrations._lightning_plan", str(rich.plan), str(rich.manifest), str(work), str(EVERY)]
    runs = run_ranks(2, lambda r: (argv, {**env, "LOCAL_RANK": str(r)}), cwd=REPO, preload=TRAINERS)
    return [(res.returncode, res.stdout, res.stderr) for res in runs]


def _lines(stdout: str) -> list[dict]:
    return [json.loads(x) for x in stdout.splitlines() if x.startswith("{")]


@pytest.mark.parametrize("mode", ["map", "iterable"])
def test_lightning_resumes_at_exactly_the_checkpointed_step(runs: list[tuple[int, str, str]], rich: Rich,
                                                            mode: str) -> None:
    for rank, (code, stdout, stderr) in enumerate(runs):
        assert code == 0, stderr[-3000:]
        want = [b.ids for b in open_shard(rich.plan, rank)]
        lines = [x for x in _lines(stdout) if x["mode"] == mode and x["rank"] == rank]
        steps = {run: [(x["step"], x["ids"]) for x in lines if x["run"] == run and "ids" in x]
                 for run in ("fresh", "resumed", "at-end")}
        assert steps["fresh"] == list(enumerate(want))
        assert steps["resumed"] == list(enumerate(want))[EVERY:]
        assert steps["at-end"] == []
        returned = [x for x in lines if "fit_returned" in x]  # fit() returned: no exception, no exit
        assert [x["fit_returned"] for x in returned] == [len(want)] * 3


def test_the_plans_end_is_one_line_of_rank_0(runs: list[tuple[int, str, str]], rich: Rich) -> None:
    num_steps = json.loads((rich.plan / "plan.json").read_text())["num_steps"]
    ends = [[x for x in stderr.splitlines() if "the plan's end" in x] for _, _, stderr in runs]
    assert len(ends[0]) == 6 and not ends[1]  # one line per run (the at-end runs on their first epoch)
    assert set(ends[0]) == {(f"{rich.plan}: the plan's end: rank 0 trained every batch up to step {num_steps} "
                             f"(plan.json num_steps {num_steps}); stopping the run")}
    assert all("Traceback" not in stderr for _, _, stderr in runs)
