"""The demo workspace the docs pages share, built once per run under a file lock in the run's
common temporary folder: the demo corpus (:func:`dataprep.demo.make_demo_corpus`), README's
"Start here" walk run as written, then the demo's last step (``dataprep report``); and the
environment the pages' blocks run in. ``python -m tests.docs_demo ROOT`` builds it (what
``tests/conftest.py`` starts in the background as soon as the docs pages are collected, so no
worker waits for it idle)."""

from __future__ import annotations

import fcntl
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from tests.doc_blocks import readme_walk
from tests.warm_python import COMMANDS, server_for, write_shim

REPO = Path(__file__).resolve().parents[1]


def env(bin_dir: Path, cache: Path | None = None) -> dict[str, str]:
    """PATH with a ``dataprep`` that runs this checkout; PYTHONPATH to it; a private cache."""
    shim = bin_dir / "dataprep"
    if not shim.exists():
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m dataprep.cli "$@"\n')
        shim.chmod(0o755)
    out = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "PYTHONHASHSEED": "0", "COLUMNS": "120"}
    out["SPEECH_DATAPREP_CACHE"] = str(cache or bin_dir / "cache")
    return out


def serving(bin_dir: Path) -> dict[str, str]:
    """The environment of :func:`env` whose ``dataprep``, ``python`` and ``torchrun`` are processes
    forked by a server that imported :data:`tests.warm_python.COMMANDS` once (:mod:`tests.warm_python`,
    one per test process), and torchrun's ranks too (``PYTHON_EXEC``: the interpreter torchrun
    starts them with)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    sock = str(server_for(COMMANDS))
    write_shim(bin_dir / "dataprep", sock)
    write_shim(bin_dir / "python", sock, prefix=(), argv0=None)
    write_shim(bin_dir / "torchrun", sock, prefix=("-m", "torch.distributed.run"), argv0="torchrun")
    return {**env(bin_dir), "PYTHON_EXEC": str(bin_dir / "python")}


def build(root: Path) -> tuple[Path, str]:
    """``root/ws``, built unless another process built it: ``(workspace, "")``, or the failed
    command's output tail as the second item (nothing marked ready). The walk's output is kept
    in ``ws/walk.out``."""
    from dataprep.demo import demo_steps, make_demo_corpus

    ws = root / "ws"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / "ready").exists():
            return ws, ""
        shutil.rmtree(ws, ignore_errors=True)
        ws.mkdir()
        make_demo_corpus(ws)
        if not (root / "examples").exists():
            (root / "examples").symlink_to(REPO / "examples")  # the walk runs ../examples/, as demo-out/ does
        report = "dataprep " + shlex.join(demo_steps(Path("."))[-1])
        commands = serving(root / "bin")
        for code in (readme_walk().code, report):
            res = subprocess.run(["bash", "-euo", "pipefail", "-c", code], capture_output=True, text=True,
                                 env=commands, cwd=ws, timeout=600, check=False)
            if res.returncode != 0:
                return ws, f"{code}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
            with open(ws / "walk.out", "a", encoding="utf-8") as out:
                out.write(res.stdout)
        (root / "ready").touch()
    return ws, ""


if __name__ == "__main__":
    raise SystemExit(1 if build(Path(sys.argv[1]))[1] else 0)
