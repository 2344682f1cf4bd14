"""The trainer examples of ``docs/trainers.md``: each block marked ``<!-- doc-test: file examples/NAME -->``
is that ``examples/`` file verbatim (``tests/test_docs_examples.py`` checks every page's markers),
and each file runs on a real-audio corpus and prints exactly the plan's batches (``pytorch_sampler.py``, the
README's last step: a readable summary of them, and one line naming the extra without torch)."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from manifests.plan_files import open_shard
from tests.doc_blocks import page_blocks
from tests.integrations._rich import Rich, rich_corpus
from tests.warm_python import TRAINERS, run_python

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "trainers.md"
#: example -> the modules it needs (skipped, with the reason, where one is absent)
EXAMPLES = {
    "pytorch_sampler.py": ("torch",),
    "hf_datasets.py": ("torch", "datasets"),
    "lightning_datamodule.py": ("torch", "lightning"),
    "lhotse_sampler.py": ("torch", "lhotse"),
    "nemo_canary.py": ("torch", "lhotse", "nemo.collections.asr"),
    "nemo_parakeet.py": ("torch", "lhotse", "nemo.collections.asr"),
}


def example_blocks() -> dict[str, str]:
    """``NAME`` -> the code block of ``docs/trainers.md`` marked as ``examples/NAME``."""
    return {b.mark.removeprefix("file examples/"): b.code for b in page_blocks(PAGE) if b.kind == "file" and b.mark}


def test_every_example_is_in_the_docs_verbatim() -> None:
    blocks = example_blocks()
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
    args = [str(rich.plan), str(rich.manifest)] + ([str(rich.spm)] if name.startswith("nemo_") else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    res = run_python([str(REPO / "examples" / name), *args], env=env, cwd=REPO, preload=TRAINERS)
    assert res.returncode == 0, res.stderr[-3000:]
    plan = [b.ids for b in open_shard(rich.plan, 0)]
    if name == "pytorch_sampler.py":  # a readable summary: three steps, then the resumed rest counted
        sizes = [len(ids) for ids in plan]
        assert res.stdout.splitlines() == [f"rank 0: {len(plan)} batches in the plan"] + [
            line for line in res.stdout.splitlines() if line.startswith("step ")] + [
            f"resumed at step 3: {len(plan) - 3} more batches, {sum(sizes[3:]):,} utterances, to the end of the plan"]
        assert [int(line.split()[2]) for line in res.stdout.splitlines()[1:4]] == sizes[:3]
        return
    got = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("[\"")]
    if name == "nemo_parakeet.py":  # each batch's transcripts, once per model class
        import polars as pl
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=str(rich.spm))
        text = dict(pl.read_parquet(rich.manifest, columns=["id", "text"]).iter_rows())
        assert got == [[sp.decode(sp.encode(text[i])) for i in ids] for ids in plan] * 3
        return
    assert got == (plan + plan if name == "lhotse_sampler.py" else plan)
