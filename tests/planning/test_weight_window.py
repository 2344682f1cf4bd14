"""``--weight-window K``: a weighted plan's steps ordered so every K consecutive steps hold each
corpus within the tolerance of its share of the epoch, where the random step order does not
(corpora of different lengths fill different buckets, so a step's mix follows its bucket);
each epoch still holds each corpus's exact quota, every batch unchanged (only the steps'
order moves); plan.json counts the windows over the tolerance, and its figures are what the
shards hold; held in memory or spilled, the same bytes; replan keeps the windows; the option
is refused where it cannot apply."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from bucketing.quota import window_deviation, window_order
from dataprep.planning.build import build_plan
from dataprep.planning.options import PlanOptions
from dataprep.planning.replan import replan
from dataprep.planning.weights import check_quotas
from dataprep.testing import write_plan_inputs
from manifests.errors import DataprepError, OptionError
from manifests.manifest_write import write_manifest
from manifests.plan_files import PlanShard
from manifests.plan_meta import read_plan_meta
from tests.training._consumer import run_cli

W, EPOCHS, K, TOL = 4, 2, 16, 0.1
WEIGHTS = {"short": 1.0, "long": 2.0, "mid": 1.0}
NAMES = list(WEIGHTS)


def three_corpus_blend(root: Path, rows: int) -> tuple[Path, Path, np.ndarray]:
    """(manifest, buckets.json, each row's corpus code into :data:`NAMES`): ``rows`` planned
    utterances whose shortest 40% are corpus ``short`` and the rest ``long`` or ``mid`` at random,
    so corpora and buckets are correlated, as in a real blend."""
    manifest, buckets = write_plan_inputs(root, rows, seed=4, num_buckets=6)
    df = pl.read_parquet(manifest)
    d = df["duration"].to_numpy()
    rng = np.random.default_rng(0)
    corpus = np.where(d < np.quantile(d, 0.4), "short", np.where(rng.random(d.shape[0]) < 0.5, "long", "mid"))
    write_manifest(df.select("id", "duration", "num_tokens").with_columns(pl.Series("corpus", corpus)), manifest)
    return manifest, buckets, np.array([NAMES.index(c) for c in corpus])


class Inputs:
    def __init__(self, root: Path) -> None:
        self.manifest, self.buckets, self.codes = three_corpus_blend(root, 3000)
        self.plain = root / "plain"
        build_plan(self.manifest, self.buckets, self.plain, PlanOptions(world_size=W, epochs=EPOCHS, weights=WEIGHTS))
        self.windowed = root / "windowed"
        self.meta = build_plan(self.manifest, self.buckets, self.windowed,
                               PlanOptions(world_size=W, epochs=EPOCHS, weights=WEIGHTS, weight_window=K,
                                           weight_tolerance=TOL, row_group_steps=4))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Inputs:
    return Inputs(tmp_path_factory.mktemp("weight_window"))


def mixes(plan: Path, codes: np.ndarray) -> dict[int, np.ndarray]:
    """Per epoch: utterances per corpus per step, in step order."""
    meta = read_plan_meta(plan)
    out: dict[int, dict[int, np.ndarray]] = {}
    for r in range(meta.world_size):
        for b in PlanShard(plan, r):
            step = out.setdefault(b.epoch, {}).setdefault(b.step, np.zeros(len(NAMES), np.int64))
            step += np.bincount(codes[b.rows], minlength=len(NAMES))
    return {e: np.array([s[k] for k in sorted(s)]) for e, s in out.items()}


def worst(plan: Path, codes: np.ndarray) -> list[float]:
    return [float(window_deviation(m, m.sum(0) / m.sum(), K).max()) for m in mixes(plan, codes).values()]


def test_every_window_within_the_tolerance_where_random_order_is_not(inputs: Inputs) -> None:
    assert max(worst(inputs.windowed, inputs.codes)) <= TOL
    assert min(worst(inputs.plain, inputs.codes)) > 2 * TOL  # the need: random step order misses it
    rec = inputs.meta.extra["weight_window"]
    assert rec["window"] == K and rec["windows_over"] == 0 and rec["unordered_epochs"] == []
    assert rec["worst_gap"] == pytest.approx(max(worst(inputs.windowed, inputs.codes)), abs=1e-6)


def test_quotas_and_batches_unchanged_only_the_order_moves(inputs: Inputs) -> None:
    assert check_quotas(inputs.windowed, inputs.manifest) == EPOCHS
    def batches(plan: Path, epoch: int) -> list[tuple[int, ...]]:
        return sorted(tuple(sorted(b.rows.tolist())) for r in range(W) for b in PlanShard(plan, r) if b.epoch == epoch)

    for e in range(EPOCHS):
        assert batches(inputs.windowed, e) == batches(inputs.plain, e)


def test_spilled_gives_the_same_bytes(inputs: Inputs, tmp_path: Path) -> None:
    meta = build_plan(inputs.manifest, inputs.buckets, tmp_path / "spilled",
                      PlanOptions(world_size=W, epochs=EPOCHS, weights=WEIGHTS, weight_window=K,
                                  weight_tolerance=TOL, row_group_steps=4, memory_limit=1 << 16))
    assert meta.plan_hash == inputs.meta.plan_hash


def test_replan_keeps_the_windows(inputs: Inputs, tmp_path: Path) -> None:
    at = inputs.meta.steps_per_epoch[0]  # the second epoch, whole
    meta = replan(inputs.windowed, inputs.manifest, tmp_path / "re", PlanOptions(world_size=2), at_step=at)
    assert meta.extra["weight_window"]["window"] == K
    m = mixes(tmp_path / "re", inputs.codes)[1]
    assert float(window_deviation(m, m.sum(0) / m.sum(), K).max()) == pytest.approx(
        meta.extra["weight_window"]["worst_gap"], abs=1e-6)


def test_window_order_property() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        S, C = int(rng.integers(1, 300)), int(rng.integers(1, 5))
        counts = rng.integers(0, 30, (S, C)) * (rng.random((S, C)) < 0.5)
        target = counts.sum(0) / max(counts.sum(), 1)
        k = int(rng.integers(1, 40))
        pos, gaps = window_order(counts, target, k, np.random.default_rng(0))
        assert np.array_equal(np.sort(pos), np.arange(S))  # a permutation of the steps
        order = np.argsort(pos)
        assert np.allclose(gaps, window_deviation(counts[order], target, k))


def test_refused_where_it_cannot_apply(inputs: Inputs, tmp_path: Path) -> None:
    for kwargs, message in (({"balance": 0}, "balanced steps"), ({"interleave": "ascending"}, "interleave random"),
                            ({"sync_group": 2}, "sync-group"), ({"weight_tolerance": 0}, "> 0")):
        with pytest.raises(OptionError, match=message):
            PlanOptions(world_size=W, weight_window=K, **kwargs)
    with pytest.raises(DataprepError, match="not weighted"):
        build_plan(inputs.manifest, inputs.buckets, tmp_path / "x", PlanOptions(world_size=W, weight_window=K))
    res = run_cli("plan-batches", str(inputs.manifest), "-b", str(inputs.buckets), "-w", str(W), "--weights", "short=1",
                  "--weights", "long=2", "--weights", "mid=1", "--weight-window", str(K), "--weight-tolerance", str(TOL),
                  "-o", str(tmp_path / "cli"))
    assert res.returncode == 0 and "weight windows of 16 steps" in res.stdout, res.stderr
    res = run_cli("plan-batches", str(inputs.manifest), "-b", str(inputs.buckets), "-w", str(W), "--weight-tolerance",
                  "0.1", "-o", str(tmp_path / "c2"))
    assert res.returncode != 0 and "--weight-window" in res.stderr and "Traceback" not in res.stderr
