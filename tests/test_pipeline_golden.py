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
    from manifests.content_hash import file_sha256
    from manifests.hash_cache import manifest_hash

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


def _step_seconds(size: int, max_duration: float, max_tokens: int) -> float:
    """The default cost model (bucketing/costmodel.py's formula) written out: 0.02 s per step
    plus, per utterance, 5e-6 s per frame, 6e-10 s per frame^2, 2e-5 s per token, 5e-8 s per
    token^2 (10 ms frames)."""
    f = max_duration / 0.01
    return 0.02 + size * (5e-6 * f + 6e-10 * f * f + 2e-5 * max_tokens + 5e-8 * max_tokens * max_tokens)


def _busy_matches(seconds: str, idle: str, world: int, busy: float) -> bool:
    """Printed epoch seconds (0.1 s) and idle share (0.1 %) agree with ``busy`` rank-seconds:
    epoch = busy / (world * (1 - idle)), within the printed precision."""
    i = float(idle.rstrip("%")) / 100
    want = busy / (world * (1 - i))
    return abs(float(seconds) - want) <= 0.05 + want * 0.0006 / (1 - i) + 1e-9


def test_demo_stats_and_simulate_run(pipeline: Path) -> None:
    stats = json.loads((pipeline / "stats.json").read_text())
    assert stats["totals"]["utterances"] == pl.read_parquet(pipeline / "manifest.parquet").height
    assert (pipeline / "padding.json").exists()
    # simulate's figures at the plan's own world size, recomputed from the shards' row lists and
    # the manifest: epoch 0's steps, each step as long as its slowest rank's batch
    kept = pl.read_parquet(pipeline / "kept.parquet", columns=["duration", "num_tokens"])
    dur, tok = kept["duration"].to_list(), kept["num_tokens"].to_list()
    shards = sorted((pipeline / "plan").glob("rank-*.parquet"))
    world = len(shards)
    per_rank = [[_step_seconds(len(rows), max(dur[i] for i in rows), max(tok[i] for i in rows))
                 for rows in pl.read_parquet(s).filter(pl.col("epoch") == 0).sort("step")["rows"].to_list()]
                for s in shards]
    steps = len(per_rank[0])
    assert all(len(r) == steps for r in per_rank) and steps > 0
    epoch_s = sum(max(r[k] for r in per_rank) for k in range(steps))
    busy = sum(map(sum, per_rank))
    idle = 1 - busy / (world * epoch_s)
    res = runner.invoke(app, ["simulate", str(pipeline / "plan"), "--world-sizes", "2"])
    assert res.exit_code == 0, res.output
    assert f"plan's steps (world size {world}): {steps} steps" in res.stdout
    rows = {int(c[0]): c for c in (ln.split() for ln in res.stdout.splitlines()) if c and c[0].isdigit()}
    assert sorted(rows) == [2, world]
    ws, steps_sync, steps_unsync, idle_sync, idle_unsync, s_sync, s_unsync, speedup = rows[world][:8]
    assert int(steps_sync) == steps and idle_sync == f"{idle:.1%}"
    assert abs(float(s_sync) - epoch_s) <= 0.05 + 1e-9, (s_sync, epoch_s)
    # unsynchronized: the same batches dealt to free ranks; the same busy time, whole steps
    assert int(steps_unsync) == -(-steps * world // world)
    assert _busy_matches(s_unsync, idle_unsync, world, busy)
    t_unsync = busy / (world * (1 - float(idle_unsync.rstrip("%")) / 100))
    assert abs(float(speedup.rstrip("%")) - 100 * (1 - epoch_s / t_unsync)) < 0.2, (speedup, epoch_s, t_unsync)
    # at 2 ranks the same batches are dealt out unsynchronized: the same busy time, whole steps
    _, _, st_u, _, i_u, _, t_u, _ = rows[2][:8]
    assert int(st_u) == -(-steps * world // 2) and _busy_matches(t_u, i_u, 2, busy)
