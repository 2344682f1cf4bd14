"""``.ci/nemo-venv`` run from inside a user's venv builds the NeMo venv on that venv's
interpreter and sees that venv's packages (``.pth`` files included), not only the base
interpreter's. ``NEMO_VENV_SETUP_ONLY=1`` makes the venv without installing NeMo (seconds)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _site(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def test_nemo_venv_from_inside_a_venv_sees_that_venvs_packages(tmp_path: Path) -> None:
    user = tmp_path / "user-venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--system-site-packages", "--without-pip", str(user)], check=True)
    (_site(user) / "user_venv_marker.py").write_text("WHERE = 'user-venv'\n", encoding="utf-8")
    editable = tmp_path / "src"  # as an editable install adds its folder: a .pth file in the venv
    editable.mkdir()
    (editable / "user_venv_editable.py").write_text("WHERE = 'editable'\n", encoding="utf-8")
    (_site(user) / "__editable__.pth").write_text(f"{editable}\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "PYTHONPATH", "PYTHONHOME")}
    env.update(VIRTUAL_ENV=str(user), PATH=f"{user / 'bin'}:{env.get('PATH', '')}",
               SPEECH_DATAPREP_CACHE=str(tmp_path / "cache"), NEMO_VENV_SETUP_ONLY="1")
    run = subprocess.run(["bash", str(REPO / ".ci" / "nemo-venv")], capture_output=True, text=True, env=env, check=False,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    venv = Path(run.stdout.strip().splitlines()[-1])
    assert venv.parent == tmp_path / "cache" and venv.name.startswith("venv-nemo-setup-")
    probe = ("import sys, user_venv_marker, user_venv_editable; "
             "print(user_venv_marker.WHERE, user_venv_editable.WHERE, sys.prefix, sys.base_prefix)")
    got = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, check=False,
                         env={k: v for k, v in env.items() if k != "VIRTUAL_ENV"}, timeout=60)
    assert got.returncode == 0, got.stderr
    marker, editable_where, prefix, base_prefix = got.stdout.split()
    assert (marker, editable_where, prefix) == ("user-venv", "editable", str(venv))
    cfg = (venv / "pyvenv.cfg").read_text(encoding="utf-8")
    assert "include-system-site-packages = true" in cfg
    # the key names the interpreter it was built on: another venv gets another NeMo venv
    other = tmp_path / "other-venv"
    subprocess.run([base, "-m", "venv", "--system-site-packages", "--without-pip", str(other)], check=True)
    env2 = {**env, "VIRTUAL_ENV": str(other), "PATH": f"{other / 'bin'}:{os.environ.get('PATH', '')}"}
    run2 = subprocess.run(["bash", str(REPO / ".ci" / "nemo-venv")], capture_output=True, text=True, env=env2,
                          timeout=120)
    assert run2.returncode == 0, run2.stderr
    assert Path(run2.stdout.strip().splitlines()[-1]) != venv
