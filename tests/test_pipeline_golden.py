"""The demo's steps end to end on a small generated corpus, as a user types them, compared
with outputs checked in under ``tests/golden/pipeline/``.

The fixtures were produced by the code before ``dataprep/`` was split into one package per
stage; they pin behaviour across restructuring: the compiled manifest's values, the rejects,
``buckets.json`` and the plan (``plan.json`` and every rank shard, byte for byte). ``plan/`` is
the demo's plan (balanced steps, the default since ``--balance 0.05`` became it);
``plan-balance0/`` is the same ``plan-batches`` with ``--balance 0``, one bucket per step: the
demo's plan from before balanced steps existed, byte for byte.
Paths and hashes that depend on where the corpus was written (absolute audio paths, and the
content hash of a manifest holding them) are normalized before comparing.

Regenerate only on purpose: ``SPEECH_DATAPREP_REGEN_GOLDEN=1 python -m pytest tests/test_pipeline_golden.py``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from typer.testing import CliRunner

from dataprep.cli import app
from dataprep.demo import demo_steps, make_demo_corpus

GOLDEN = Path(__file__).parent / "golden" / "pipeline"
PLANS = ("plan", "plan-balance0")  # the demo's plan; the same with --balance 0
REGEN = os.environ.get("SPEECH_DATAPREP_REGEN_GOLDEN") == "1"
NUM_UTTERANCES = 300
runner = CliRunner()


def _normalized_table(path: Path, root: Path) -> pl.DataFrame:
    """The Parquet's rows with the corpus folder written as ``<corpus>``."""
    df = pl.read_parquet(path)
    prefix = str(root)
    return df.with_columns(pl.col(c).str.replace_all(prefix, "<corpus>", literal=True)
                           for c in ("audio_path", "origin", "detail") if c in df.columns)


def _normalized_json(path: Path, hashes: dict[str, str]) -> dict[str, Any]:
    text = path.read_text()
    for real, name in hashes.items():
        text = text.replace(real, name)
    return json.loads(text)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("golden")
    make_demo_corpus(out, num_utterances=NUM_UTTERANCES)
    # the checked-in tokenizer: sentencepiece training is not promised to be identical
    # across library versions, and the outputs below depend on its pieces
    shutil.copy(GOLDEN / "spm.model", out / "spm.model")
    for step in demo_steps(out):
        if step[0] == "train-tokenizer":
            continue
        result = runner.invoke(app, step)
        assert result.exit_code == 0, f"dataprep {' '.join(step)}\n{result.output}"
        if step[0] == "plan-batches":  # and the same plan with one bucket per step
            zero = [*step[:step.index("-o")], "--balance", "0", "-o", str(out / "plan-balance0")]
            result = runner.invoke(app, zero)
            assert result.exit_code == 0, f"dataprep {' '.join(zero)}\n{result.output}"
    return out


def _hashes(out: Path) -> dict[str, str]:
    from manifests.io import file_sha256, manifest_hash

    return {manifest_hash(out / "manifest.parquet"): "<manifest-hash>",
            manifest_hash(out / "kept.parquet"): "<kept-hash>",
            file_sha256(out / "buckets.json"): "<buckets-sha256>",
            **{json.loads((out / p / "plan.json").read_text())["plan_hash"]: "<plan-hash>" for p in PLANS}}


def test_demo_steps_reproduce_the_golden_outputs(pipeline: Path) -> None:
    out = pipeline
    hashes = _hashes(out)
    tables = ["manifest.parquet", "compile-rejects.parquet", "kept.parquet", "rejects.parquet"]
    jsons = ["buckets.json", *(f"{p}/plan.json" for p in PLANS)]
    shards = sorted(f"{p}/{s.name}" for p in PLANS for s in (out / p).glob("rank-*.parquet"))
    if REGEN:
        for p in PLANS:
            (GOLDEN / p).mkdir(parents=True, exist_ok=True)
        for name in tables:
            _normalized_table(out / name, out).write_parquet(GOLDEN / name)
        for name in jsons:
            (GOLDEN / name).write_text(json.dumps(_normalized_json(out / name, hashes), indent=1, sort_keys=True))
        for name in shards:
            shutil.copy(out / name, GOLDEN / name)
        pytest.skip("golden files regenerated")
    for name in tables:
        got, want = _normalized_table(out / name, out), pl.read_parquet(GOLDEN / name)
        assert got.schema == want.schema, name
        assert got.equals(want), name
    for name in jsons:
        assert _normalized_json(out / name, hashes) == json.loads((GOLDEN / name).read_text()), name
    assert shards == sorted(f"{p}/{s.name}" for p in PLANS for s in (GOLDEN / p).glob("rank-*.parquet"))
    for name in shards:
        assert (out / name).read_bytes() == (GOLDEN / name).read_bytes(), name


def test_demo_stats_and_simulate_run(pipeline: Path) -> None:
    stats = json.loads((pipeline / "stats.json").read_text())
    assert stats["totals"]["utterances"] == pl.read_parquet(pipeline / "manifest.parquet").height
    assert (pipeline / "padding.json").exists()
