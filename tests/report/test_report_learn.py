"""The report's run sections: a step log timed by a known cost model (one rank 1.5x slower) is
shown per bucket and per rank against the model ``calibrate`` fits (measured = predicted) or a
given costmodel.json (the slow rank above it); a ``--weight-window`` plan's shares per window
give plan.json's worst gap; the CLI takes ``--steps`` / ``--cost-model`` and refuses them without
a plan in one line; the page opens in chromium without an error, every chart drawn."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from bucketing.costmodel import CostModel
from dataprep.cli import app
from dataprep.planning.build import build_plan
from dataprep.planning.options import PlanOptions
from dataprep.report.aggregates import ReportData, collect_report
from dataprep.report.learn_section import step_time_aggregates
from manifests.plan_files import PlanShard
from tests.planning.test_weight_window import WEIGHTS, three_corpus_blend

pytest.importorskip("altair", reason="the report extra (altair) is not installed")

W, K, TOL = 2, 8, 0.1
TRUE = CostModel(overhead=0.05, per_frame=3e-6, per_frame2=0.0, per_token=4e-5, per_token2=0.0)
SLOW = 1.5


class Run:
    def __init__(self, root: Path) -> None:
        self.manifest, self.buckets, self.codes = three_corpus_blend(root, 1200)
        self.plan = root / "plan"
        self.meta = build_plan(self.manifest, self.buckets, self.plan,
                               PlanOptions(world_size=W, epochs=2, weights=WEIGHTS, weight_window=K,
                                           weight_tolerance=TOL))
        frames = []
        for r in range(W):
            t = PlanShard(self.plan, r).read(columns=["step", "size", "max_duration", "max_tokens"])
            sec = TRUE.step_time(t["size"].to_numpy(), t["max_duration"].to_numpy(), t["max_tokens"].to_numpy())
            frames.append(pl.DataFrame({"rank": np.full(sec.shape[0], r), "step": t["step"].to_numpy(),
                                        "step_s": sec * (SLOW if r == 1 else 1.0)}))
        self.log = root / "steps.parquet"
        pl.concat(frames).write_parquet(self.log)
        self.cost = root / "costmodel.json"  # the true model, without rank speeds
        self.cost.write_text(json.dumps({"kind": "speech-dataprep cost model", "cost_model": {
            "overhead": 0.05, "per_frame": 3e-6, "per_frame2": 0.0, "per_token": 4e-5, "per_token2": 0.0,
            "frame_shift": TRUE.frame_shift}}))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return Run(tmp_path_factory.mktemp("learn"))


@pytest.fixture(scope="module")
def data(run: Run) -> ReportData:
    return collect_report(run.manifest, plan=run.plan, steps=run.log, world_sizes=[W])


@pytest.fixture(scope="module")
def page(run: Run, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CLI's page with --steps and --cost-model."""
    out = tmp_path_factory.mktemp("page") / "r.html"
    res = CliRunner().invoke(app, ["report", str(run.manifest), "--plan", str(run.plan), "--steps", str(run.log),
                                   "--cost-model", str(run.cost), "--world-sizes", str(W), "-o", str(out)])
    assert res.exit_code == 0, res.output
    return out


def test_step_times_against_the_fitted_model_and_a_given_one(run: Run, data: ReportData) -> None:
    fitted = data.step_times
    assert fitted is not None and fitted.rows == W * run.meta.num_steps and fitted.median_rel_error < 1e-3
    for b in fitted.per_bucket:
        assert b["predicted_s"] == pytest.approx(b["measured_s"], rel=1e-3)
    assert [r["ratio"] for r in fitted.per_rank] == pytest.approx([1.0, 1.0], abs=1e-3)
    assert fitted.per_rank[1]["time_factor"] / fitted.per_rank[0]["time_factor"] == pytest.approx(SLOW, rel=1e-3)
    given = step_time_aggregates(run.plan, run.log, run.cost)
    assert given.model == "costmodel.json"
    assert [r["ratio"] for r in given.per_rank] == pytest.approx([1.0, SLOW], rel=1e-6)
    assert sum(b["batches"] for b in given.per_bucket) == given.rows


def test_window_shares_give_the_plans_worst_gap(run: Run, data: ReportData) -> None:
    w = data.windows
    assert w is not None and (w.window, w.tolerance, w.epoch) == (K, TOL, 0)
    rec = run.meta.extra["weight_window"]
    counts = np.zeros((run.meta.steps_per_epoch[0], 3), np.int64)  # epoch 0 from the shards, directly
    for r in range(W):
        for b in PlanShard(run.plan, r):
            if b.epoch == 0:
                counts[b.step_in_epoch] += np.bincount(run.codes[b.rows], minlength=3)
    share = counts.sum(0) / counts.sum()
    by = {c["corpus"]: c for c in w.corpora}
    for i, name in enumerate(WEIGHTS):
        assert by[name]["epoch_share"] == pytest.approx(share[i], abs=1e-6)
        assert by[name]["target"] is not None
    assert max(c["worst_gap"] for c in w.corpora) <= rec["worst_gap"] + 1e-6  # epoch 0's worst <= the plan's
    first = counts[:K].sum(0) / counts[:K].sum()
    got = {x["corpus"]: x["share"] for x in w.windows if x["window"] == 0}
    assert [got[n] for n in WEIGHTS] == pytest.approx(first.tolist(), abs=1e-6)


def test_cli_writes_both_sections_and_refuses_steps_without_a_plan(run: Run, page: Path, tmp_path: Path) -> None:
    text = page.read_text()
    assert 'id="run"' in text and 'id="windows"' in text and 'href="#run"' in text
    res = CliRunner().invoke(app, ["report", str(run.manifest), "--steps", str(run.log), "-o", str(tmp_path / "x.html")])
    assert res.exit_code == 2 and "need --plan" in res.output and len(res.output.strip().splitlines()) == 1
    res = CliRunner().invoke(app, ["report", str(run.manifest), "--plan", str(run.plan), "--cost-model", str(run.cost),
                                   "-o", str(tmp_path / "y.html")])
    assert res.exit_code == 2 and "needs --steps" in res.output


def test_the_page_draws_every_chart_in_chromium(page: Path) -> None:
    import shutil

    from tests.report.test_report_browser import ARGS, CHROMIUM, _open

    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (the dev extra) is not installed")
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.skip(f"{CHROMIUM} not found: Debian's chromium is not installed")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            tab, errors, _ = _open(b, page)
            assert tab.evaluate("window.__report")["errors"] == [] and errors == []
            figs = tab.evaluate("""() => ['run', 'windows'].map(id => Array.from(
                document.querySelectorAll('#' + id + ' figure.fig')).map(f => ({kind: f.dataset.kind,
                marks: f.querySelectorAll('svg g.role-mark > [role="graphics-symbol"]').length,
                rows: f.querySelectorAll('tbody tr').length})))""")
            for section in figs:
                assert len(section) >= 2
                for f in section:
                    assert (f["marks"] if f["kind"] == "chart" else f["rows"]) > 0, f
        finally:
            b.close()
