"""A ``kill -9`` during a spilled plan or replan: its spill folder (and half-written plan
folder) stays until the next run next to that output, which sweeps what a dead process of this
tool left, on this machine, and nothing else."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dataprep.cli import app
from dataprep.testing import write_plan_inputs
from manifests.atomic_files import OWNER_FILE
from tests.training._consumer import Corpus

REPO = Path(__file__).resolve().parents[2]


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    return int(done.stdout)


def _is(p: Path, seen: str) -> bool:
    if seen == ".spill":
        return ".spill" in p.name
    try:  # the plan's temporary folder, its shards being written (not a spill folder being made)
        return p.name.endswith(".tmp") and any(q.name.startswith(".rank-") for q in p.iterdir())
    except OSError:
        return False


def _kill_while_spilling(args: list[str], where: Path, seen: str = ".spill") -> None:
    """Run ``dataprep ARGS``, SIGKILL it once a folder whose name holds ``seen`` appears in
    ``where`` (a spill folder; ``.tmp``: the plan being written)."""
    proc = subprocess.Popen([sys.executable, "-m", "dataprep.cli", *args], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if any(_is(p, seen) for p in where.iterdir()):
            break
        time.sleep(0.005)
    if proc.poll() is not None:
        pytest.skip("the run finished before it could be killed")
    proc.send_signal(signal.SIGKILL)
    proc.wait(60)


@pytest.mark.parametrize(("command", "seen"), [("plan-batches", ".spill"), ("replan", ".spill"),
                                             ("plan-batches", ".tmp")])
def test_a_killed_spilled_run_is_swept_by_the_next_one(tmp_path: Path, command: str, seen: str) -> None:
    m, b = write_plan_inputs(tmp_path, 60_000, seed=3, num_buckets=8)
    runner = CliRunner()
    out = tmp_path / "out"
    out.mkdir()
    if command == "plan-batches":
        args = ["plan-batches", str(m), "--buckets", str(b), "--world-size", "4", "--epochs", "3"]
    else:
        base = tmp_path / "base"
        res = runner.invoke(app, ["plan-batches", str(m), "--buckets", str(b), "--world-size", "4", "--epochs", "3",
                                  "-o", str(base)])
        assert res.exit_code == 0, res.output
        args = ["replan", str(base), "--manifest", str(m), "--at-step", "5", "--world-size", "3"]
    _kill_while_spilling([*args, "-o", str(out / "plan"), "--memory-limit", "1MiB"], out, seen)
    left = [p for p in out.iterdir() if ".spill" in p.name]
    assert left and all((p / OWNER_FILE).exists() for p in left)  # what SIGKILL leaves
    assert seen == ".spill" or any(p.name.endswith(".tmp") for p in out.iterdir())  # and the plan half-written
    dead = _dead_pid()
    foreign = out / f".plan.{dead}.mine.spill"  # not made by this tool (no owner file): kept
    foreign.mkdir()
    (foreign / "data").write_text("keep")
    elsewhere = out / f".plan.{dead}.node2.spill"  # made on another machine (shared disk): kept
    elsewhere.mkdir()
    (elsewhere / OWNER_FILE).write_text(json.dumps({"host": socket.gethostname() + "-other", "pid": dead}))
    res = runner.invoke(app, [*args, "-o", str(out / "plan")])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == sorted(["plan", foreign.name, elsewhere.name])
    assert (foreign / "data").read_text() == "keep"


def test_a_killed_exports_folders_are_swept_by_the_next_export(corpus: Corpus, tmp_path: Path) -> None:
    """An export folder is written beside ``-o`` and renamed into place: what a killed export
    left there (named with its pid) goes with the next export to that folder."""
    m, b = corpus.manifest, corpus.buckets  # real audio: an export reads it
    dead = _dead_pid()
    half = tmp_path / f".exp.{dead}.abc.tmp"
    half.mkdir()
    (half / "manifest.jsonl").write_text("half")
    res = CliRunner().invoke(app, ["export", "nemo", str(b), "--manifest", str(m), "-o", str(tmp_path / "exp")])
    assert res.exit_code == 0, res.output
    assert not half.exists() and (tmp_path / "exp" / "bucketing.yaml").exists()
