"""The demo workspace the docs pages share (``python -m dataprep.demo``), built once per run
under a file lock in the run's common temporary folder, and the environment the pages' blocks
run in. ``python -m tests.docs_demo ROOT`` builds it (what ``tests/conftest.py`` starts in the
background as soon as the docs pages are collected, so no worker waits for it idle)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

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


def build(root: Path) -> tuple[Path, str]:
    """``root/ws``, built unless another process built it: ``(workspace, "")``, or the failed
    build's output tail as the second item (nothing marked ready)."""
    ws = root / "ws"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / "ready").exists():
            return ws, ""
        shutil.rmtree(ws, ignore_errors=True)
        (root / "bin").mkdir(exist_ok=True)
        res = subprocess.run([sys.executable, "-m", "dataprep.demo", str(ws)], capture_output=True, text=True,
                             env=env(root / "bin"), cwd=REPO, timeout=600, check=False)
        if res.returncode != 0:
            return ws, res.stdout[-2000:] + res.stderr[-3000:]
        (root / "ready").touch()
    return ws, ""


if __name__ == "__main__":
    raise SystemExit(1 if build(Path(sys.argv[1]))[1] else 0)
