"""The README's "Using a plan in your trainer" examples: each code block is an ``examples/`` file
(verbatim), and each file runs on a real-audio corpus and prints exactly the plan's batches."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from manifests.plan_files import open_shard
from tests.integrations._rich import Rich, rich_corpus

REPO = Path(__file__).resolve().parents[1]
SECTION = "## Using a plan in your trainer"
#: example -> the modules it needs (skipped, with the reason, where one is absent)
EXAMPLES = {
    "pytorch_sampler.py": ("torch",),
    "hf_datasets.py": ("torch", "datasets"),
    "lightning_datamodule.py": ("torch", "lightning"),
    "lhotse_sampler.py": ("torch", "lhotse"),
    "nemo_canary.py": ("torch", "lhotse", "nemo.collections.asr"),
}


def readme_blocks() -> dict[str, str]:
    """``examples/NAME`` -> the code block following its mention in the README's section."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index(SECTION):]
    section = section[:section.find("\n## ", len(SECTION))]
    return {m.group(1): m.group(2) for m in
            re.finditer(r"`examples/([\w.]+)`[^\n]*\n+```python\n(.*?)```", section, flags=re.DOTALL)}


def test_every_example_is_in_the_readme_verbatim() -> None:
    blocks = readme_blocks()
    assert set(blocks) == set(EXAMPLES) == {p.name for p in (REPO / "examples").glob("*.py")}
    for name, code in blocks.items():
        assert code == (REPO / "examples" / name).read_text(encoding="utf-8"), name


@pytest.fixture(scope="module")
def rich(tmp_path_factory: pytest.TempPathFactory) -> Rich:
    return rich_corpus(tmp_path_factory)


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.nemo] if "nemo" in n else [])
                                  for n in EXAMPLES])
def test_example_runs_and_replays_the_plan(rich: Rich, name: str) -> None:
    for mod in EXAMPLES[name]:
        if importlib.util.find_spec(mod.split(".")[0]) is None:
            pytest.skip(f"{mod} is not installed")
    args = [str(rich.plan), str(rich.manifest)] + ([str(rich.spm)] if name == "nemo_canary.py" else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, str(REPO / "examples" / name), *args], capture_output=True, text=True,
                         check=False, env=env, cwd=REPO, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    got = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("[\"")]
    plan = [b.ids for b in open_shard(rich.plan, 0)]
    assert got == (plan + plan if name == "lhotse_sampler.py" else plan)
