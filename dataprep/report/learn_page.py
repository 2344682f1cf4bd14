"""The report page's sections of a run against its plan (:mod:`dataprep.report.learn_section`):
measured against predicted step time per bucket and per rank, and a weight-window plan's
corpus shares per window. Drawn on the page of :mod:`dataprep.report.page` (passed in: this
module does not import it), Vega-Lite charts built with Altair. Seconds; shares in 0..1.
"""

from __future__ import annotations

from typing import Any

from dataprep.report.learn_section import MAX_WINDOW_POINTS, StepTimeAggregates, WindowShares
from manifests.optional import require

#: width of a full-width chart, CSS pixels (as the page's)
WIDE = 900
_KIND = {"measured": "#3b75af", "predicted": "#9aa5b1"}


def _alt() -> Any:
    require("vl_convert", "dataprep report")
    return require("altair", "dataprep report")


def _pairs(alt: Any, rows: list[dict[str, Any]], key: str, title: str, y_title: str) -> Any:
    """Bars of measured and predicted seconds side by side per ``key``."""
    bars = [{key: r[key], "what": w, "seconds": r[f"{w}_s"]} for r in rows for w in ("measured", "predicted")]
    return alt.Chart(alt.Data(values=bars)).mark_bar().encode(
        x=alt.X(f"{key}:O", title=title, axis=alt.Axis(labelOverlap=True)),
        xOffset=alt.XOffset("what:N", sort=list(_KIND)),
        y=alt.Y("seconds:Q", title=y_title),
        color=alt.Color("what:N", title=None, scale=alt.Scale(domain=list(_KIND), range=list(_KIND.values()))),
        tooltip=[f"{key}:Q", "what:N", alt.Tooltip("seconds:Q", format=",.4f")],
    ).properties(width=WIDE - 200, height=200)


def run_section(page: Any, t: StepTimeAggregates) -> None:
    """Measured against predicted step time (a step log of a run of the plan)."""
    alt = _alt()
    page.open_section("run", "Run: measured step times",
                      f"Step log {t.log}: {t.rows:,} rank-steps joined to the plan's batches. Measured: the rank's "
                      "own compute (forward + backward + optimizer; the all-reduce's wait and the data wait apart). "
                      f"Predicted: the cost model {t.model}, times each rank's time factor.")
    slow = max(t.per_rank, key=lambda r: r["ratio"] or 0.0) if t.per_rank else None
    page.figures([("rank-steps", t.rows), ("median error", f"{100 * t.median_rel_error:.1f}%"),
                  ("slowest rank (measured / predicted)", f"{slow['rank']}: {slow['ratio']:.3f}" if slow else "-")])
    page.chart(_pairs(alt, t.per_bucket, "bucket", "bucket", "median step time (s)"),
               "Step time per bucket: measured against predicted",
               "Median over the bucket's logged batches, every rank.")
    page.table("Step time per bucket", [("bucket", "bucket"), ("batches", "batches"), ("measured_s", "measured (s)"),
                                        ("predicted_s", "predicted (s)")], t.per_bucket)
    page.chart(_pairs(alt, t.per_rank, "rank", "rank", "summed step time (s)"),
               "Step time per rank: measured against predicted",
               "Summed over the rank's logged steps: a rank above its prediction is slower than the model says "
               "(another GPU type, a busy host); `dataprep calibrate` measures its speed and `replan --rank-speed` "
               "gives it smaller batches.")
    page.table("Step time per rank", [("rank", "rank"), ("steps", "steps"), ("measured_s", "measured (s)"),
                                      ("predicted_s", "predicted (s)"), ("ratio", "measured / predicted"),
                                      ("time_factor", "time factor in the model")], t.per_rank)
    page.close_section()


def windows_section(page: Any, w: WindowShares) -> None:
    """A weight-window plan: each corpus's share of every window of steps against its target."""
    alt = _alt()
    worst = max((c["worst_gap"] or 0.0 for c in w.corpora), default=0.0)
    over = sum(c["windows_over"] for c in w.corpora)
    page.open_section("windows", "Weight windows",
                      f"The plan keeps every {w.window} consecutive steps within {100 * w.tolerance:g} points of "
                      f"each corpus's share of the epoch (--weight-window), which is its blend target up to the "
                      f"quotas' rounding. Epoch {w.epoch}: each corpus's share of the "
                      "utterances per window of steps from the epoch's first.")
    page.figures([("window (steps)", w.window), ("tolerance", f"{100 * w.tolerance:g} points"),
                  ("worst gap", f"{100 * worst:.2f} points"), ("windows over", over)])
    targets = [{"corpus": c["corpus"], "epoch_share": c["epoch_share"]} for c in w.corpora]
    lines = alt.Chart(alt.Data(values=w.windows)).mark_line(interpolate="step-after").encode(
        x=alt.X("window:Q", title=f"window of {w.window} steps", axis=alt.Axis(tickMinStep=1, format="d")),
        y=alt.Y("share:Q", title="share of the window's utterances", axis=alt.Axis(format="%")),
        color=alt.Color("corpus:N"),
        tooltip=["window:Q", "corpus:N", alt.Tooltip("share:Q", format=".2%")])
    rules = alt.Chart(alt.Data(values=targets)).mark_rule(strokeDash=[4, 3]).encode(
        y="epoch_share:Q", color=alt.Color("corpus:N"),
        tooltip=["corpus:N", alt.Tooltip("epoch_share:Q", format=".2%", title="share of the epoch")])
    shown = len({r["window"] for r in w.windows})
    page.chart(alt.layer(lines, rules).properties(width=WIDE - 250, height=220), "Corpus shares per window",
               "Lines: each corpus's share per window; dashed: its share of the epoch."
               + (f" The first {MAX_WINDOW_POINTS} windows are drawn; the table covers all." if shown >= MAX_WINDOW_POINTS
                  else ""))
    page.table("Per corpus over the windows", [("corpus", "corpus"), ("target", "blend target"),
                                               ("epoch_share", "share of the epoch"), ("fewest", "fewest"),
                                               ("most", "most"), ("worst_gap", "worst gap (any window)"),
                                               ("windows_over", "windows over the tolerance")], w.corpora,
               f"Fewest and most: over the windows from the epoch's first step; worst gap: to the share of the "
               f"epoch, over every {w.window} consecutive steps.",
               percent=("target", "epoch_share", "fewest", "most", "worst_gap"))
    page.close_section()
