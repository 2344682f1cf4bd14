"""README's "Start here" walk is what ``make demo`` runs, and its last step reads as a user expects.

The docs pages' demo workspace is the walk's block run as written, in a folder beside
``examples/`` (as ``demo-out/`` lies in the repository: :mod:`tests.docs_demo`); here: the walk's commands equal
:func:`dataprep.demo.demo_steps` flag for flag (so token counts, padding and hashes in the docs
are the demo's), and the sampler example without torch says in one line what to install.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from dataprep.demo import demo_steps
from tests.doc_blocks import REPO, readme_walk


def _walk() -> list[list[str]]:
    """The commands of README's walk (:func:`tests.doc_blocks.readme_walk`), one argv each."""
    lines = re.sub(r"\\\n\s*", "", readme_walk().code).splitlines()
    return [shlex.split(line, comments=True) for line in lines if line.strip()]


def _norm(argv: list[str], folder: str = "") -> list[str]:
    return [a.removeprefix(folder).rstrip("/") for a in argv]


def test_readme_walk_and_make_demo_run_the_same_commands_with_the_same_flags() -> None:
    walk = _walk()
    dataprep = [argv[1:] for argv in walk if argv[0] == "dataprep"]
    demo = [_norm(step, "OUT/") for step in demo_steps(Path("OUT"))]
    assert [_norm(argv) for argv in dataprep] == [s for s in demo if s[0] != "report"]
    assert [s[0] for s in demo][len(dataprep):] == ["report"]  # the demo's one step more: its page
    assert walk[-1] == ["python", "../examples/pytorch_sampler.py", "plan/", "kept.parquet"]
    assert (REPO / "Makefile").read_text().count("DEMO_DIR ?= demo-out") == 1  # the folder README names


def test_the_sampler_example_without_torch_says_what_to_install_in_one_line(tmp_path: Path) -> None:
    code = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = ['pytorch_sampler.py', 'plan/', 'kept.parquet']; "
            f"runpy.run_path({str(REPO / 'examples' / 'pytorch_sampler.py')!r}, run_name='__main__')")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=120, check=False)
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.strip().splitlines() == [
        "this example needs torch: pip install torch==2.13.0 (the CPU build), then pip install -e '.[torch]'"]
