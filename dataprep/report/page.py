"""The HTML page of ``dataprep report``: one self-contained file (no network when opened).

Charts are Vega-Lite specs built with Altair and drawn in the browser by Vega, whose
JavaScript (vega, vega-lite, vega-embed: about 0.9 MB) comes inline from vl-convert's bundle;
the data are the small tables of :mod:`dataprep.report.aggregates`, inline too. Tables are
plain HTML (a few lines of script sort them); sections are ``<details>`` (collapsible, all
opened for printing); a print stylesheet lays the page out for PDF. Equal inputs give equal
bytes (no timestamps). Altair and vl-convert are the ``report`` extra, imported lazily.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import html
import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dataprep.report.aggregates import CorpusAggregates, RejectsAggregates, ReportData
from dataprep.report.buckets_section import REPORT_PACK, BucketAggregates, batch_size_origin
from dataprep.report.learn_page import run_section, windows_section
from dataprep.report.page_assets import CSS, GLOSSARY, JS, term_id
from dataprep.report.plan_section import MAX_SHARE_EPOCHS, PlanAggregates
from manifests.atomic_files import atomic_path, output_kind
from manifests.errors import DataprepError
from manifests.hash_cache import default_cache_dir, keep_value, kept_value
from manifests.optional import require

#: the marker of a page this tool wrote (an existing -o without it is not replaced)
GENERATOR = "speech-dataprep report"
#: width of a full-width chart, CSS pixels
WIDE = 900


def _libs() -> Any:
    """``altair``, or a one-line error naming the extra to install."""
    require("vl_convert", "dataprep report")
    return require("altair", "dataprep report")


@functools.lru_cache(maxsize=1)
def vega_bundle() -> str:
    """vega + vega-lite + vega-embed as one script, for the Vega-Lite version Altair writes:
    vl-convert's bundle (about 2 s to build), kept under ``<cache>/vega/`` by vl-convert's and
    Vega-Lite's versions (:func:`~manifests.hash_cache.default_cache_dir`); a kept one is used only
    where its versions and SHA-256 check, and a cache that cannot be written is no error."""
    alt = _libs()
    import vl_convert as vlc

    want = ".".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])
    vega_lite = want if want in vlc.get_vegalite_versions() else "default"
    key = {"vl_convert": str(getattr(vlc, "__version__", "unknown")), "vega_lite": vega_lite}
    folder = default_cache_dir() / "vega"
    js = _kept_bundle(folder, key)
    if js is None:
        js = vlc.javascript_bundle(vl_version=want) if vega_lite != "default" else vlc.javascript_bundle()
        with contextlib.suppress(OSError, DataprepError):  # a cache that cannot be written costs 2 s again
            keep_value(folder, key, {"sha256": hashlib.sha256(js.encode()).hexdigest(), "js": js})
    return js.replace("</script", "<\\/script").replace("</SCRIPT", "<\\/SCRIPT")


def _kept_bundle(folder: Path, key: dict[str, str]) -> str | None:
    """The bundle kept in ``folder`` for ``key``, or None (missing, another version, corrupt)."""
    kept = kept_value(folder, key)
    js = kept.get("js") if isinstance(kept, dict) else None
    if not isinstance(js, str) or kept.get("sha256") != hashlib.sha256(js.encode()).hexdigest():
        return None
    return js


@dataclass
class Page:
    """The page being assembled: HTML fragments per section and the chart specs by element id."""

    parts: list[str] = field(default_factory=list)
    specs: dict[str, dict[str, Any]] = field(default_factory=dict)

    def chart(self, chart: Any, title: str, note: str = "") -> None:
        cid = f"chart-{len(self.specs)}"
        self.specs[cid] = chart.to_dict()
        self.parts.append(f'<figure class="fig" data-kind="chart"><figcaption>{_e(title)}</figcaption>'
                          f'<div class="chart" id="{cid}"></div>{_note(note)}</figure>')

    def table(self, title: str, columns: Sequence[tuple[str, str]], rows: Iterable[dict[str, Any]],
              note: str = "", percent: Sequence[str] = ()) -> None:
        """A sortable table; ``columns`` are (key, header); numbers right-aligned, the keys in
        ``percent`` (shares 0..1) shown as percentages. A column with no value in any row is
        left out."""
        rows = list(rows)
        columns = [(k, h) for k, h in columns if any(r.get(k) is not None for r in rows)]
        head = "".join(f'<th scope="col">{_e(h)}</th>' for _, h in columns)
        body = "".join("<tr>" + "".join(_td(r.get(k), k in percent) for k, _ in columns) + "</tr>" for r in rows)
        self.parts.append(f'<figure class="fig" data-kind="table"><figcaption>{_e(title)}</figcaption>'
                          f'<div class="scroll"><table class="sortable"><thead><tr>{head}</tr></thead>'
                          f'<tbody>{body}</tbody></table></div>{_note(note)}</figure>')

    def figures(self, items: Sequence[tuple[str, Any]]) -> None:
        """A row of headline figures (label, value); a label of the glossary links to its
        definition and shows it on hover."""
        cells = "".join(f'<div class="kpi"><div class="v">{_e(_fmt(v))}</div><div class="k">{_term(k)}</div></div>'
                        for k, v in items)
        self.parts.append(f'<div class="kpis">{cells}</div>')

    def line(self, text: str, cls: str = "line") -> None:
        """A line of text in the section."""
        self.parts.append(f'<p class="{cls}">{_e(text)}</p>')

    def open_section(self, sid: str, title: str, intro: str) -> None:
        self.parts.append(f'<details open class="section" id="{sid}"><summary><h2>{_e(title)}</h2></summary>'
                          f'<p class="intro">{_e(intro)}</p>')

    def close_section(self) -> None:
        self.parts.append("</details>")


def _e(s: Any) -> str:
    return html.escape(str(s), quote=True)


def _term(label: str) -> str:
    """``label``, linked to its glossary entry (definition as the tooltip) when it has one;
    a label "term (detail)" links its term."""
    term = label.split(" (")[0]
    if term not in GLOSSARY:
        return _e(label)
    return f'<a class="term" href="#{term_id(term)}" title="{_e(GLOSSARY[term])}">{_e(label)}</a>'


def glossary(terms: Sequence[str] = tuple(GLOSSARY)) -> str:
    """The page's glossary: each term and its definition, visible."""
    items = "".join(f'<dt id="{term_id(t)}">{_e(t)}</dt><dd>{_e(GLOSSARY[t])}</dd>' for t in terms)
    return (f'<section class="terms" id="terms"><h2>Terms</h2><p class="intro">What the figures on this page '
            f'mean.</p><dl class="terms">{items}</dl></section>')


def _note(note: str) -> str:
    return f'<p class="note">{_e(note)}</p>' if note else ""


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "-"
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    return str(v)


def _td(v: Any, percent: bool = False) -> str:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return f'<td class="n" data-v="{v}">{_e(_pct(v) if percent else _fmt(v))}</td>'
    return f"<td>{_e(_fmt(v))}</td>"


def _pct(x: float | None) -> str:
    """A share 0..1 as a percentage (2 decimals; never "-0.00%")."""
    return "-" if x is None else f"{100 * x + 0.0:.2f}%".replace("-0.00%", "0.00%")


def _data(alt: Any, rows: list[dict[str, Any]]) -> Any:
    return alt.Data(values=rows)


# --- section 1: corpus ---------------------------------------------------------------------

def corpus_section(page: Page, c: CorpusAggregates, rejects: list[RejectsAggregates]) -> None:
    alt = _libs()
    page.open_section("corpus", "Corpus",
                      f"{c.manifest} (content hash {c.content_hash[:12]}...): what the manifest holds, "
                      "its distributions, what a TPS cutoff would keep, and what was rejected.")
    rejected = sum(r.rows for r in rejects)
    page.figures([("utterances", c.totals["utterances"]), ("hours", c.totals["hours"]),
                  ("tokens", c.totals["tokens"]), ("corpus / lang / task groups", len(c.groups)),
                  *([("rejected rows", rejected)] if rejected else [])])
    named = "corpus" if c.corpus_column else "corpus (source file)"
    page.table("Per corpus, language and task (largest first)",
               [("corpus", named), ("lang", "lang"), ("task", "task"), ("utterances", "utterances"),
                ("hours", "hours"), ("tokens", "tokens"), ("share", "share of hours")], c.groups,
               "" if c.corpus_column else "The manifest has no corpus column: corpora are named by the file "
               "each row was compiled from (the shortest end of its path that tells the files apart).",
               percent=("share",))
    groups = [{**g, "group": f"{g['corpus']} · {g['lang']} · {g['task']}"} for g in c.groups]
    page.chart(alt.Chart(_data(alt, groups)).mark_bar().encode(
        x=alt.X("hours:Q", title="hours"), y=alt.Y("group:N", sort="-x", title=None),
        color=alt.Color("lang:N", title="lang"),
        tooltip=["corpus:N", "lang:N", "task:N", alt.Tooltip("utterances:Q", format=","),
                 alt.Tooltip("hours:Q", format=",.2f"), alt.Tooltip("tokens:Q", format=",")],
    ).properties(width=WIDE - 300, height=max(60, min(18 * len(groups), 600))), "Hours per group")

    units = {"duration": "duration (s)", "num_tokens": "tokens (incl. prompt)", "tps": "tokens per second"}
    hists = []
    for h in c.histograms:
        hists.append(alt.Chart(_data(alt, h.bins)).mark_bar(color="#3b75af").encode(
            x=alt.X("lo:Q", title=units[h.column]), x2="hi:Q", y=alt.Y("n:Q", title="utterances"), y2=alt.datum(0),
            tooltip=[alt.Tooltip("lo:Q", title="from"), alt.Tooltip("hi:Q", title="to"),
                     alt.Tooltip("n:Q", title="utterances", format=","), alt.Tooltip("hours:Q", format=",.3f"),
                     alt.Tooltip("overflow:N", title="overflow bin")],
        ).properties(width=270, height=180, title=units[h.column]))
    page.chart(alt.hconcat(*hists), "Distributions",
               "The last bar of each histogram gathers everything above the 99.9th percentile.")
    q = c.stats.quantiles
    levels = list(next(iter(q.values())).keys()) if q else []
    page.table("Quantiles", [("column", "column")] + [(lv, lv) for lv in levels],
               [{"column": units.get(col, col), **{lv: (None if v is None else round(v, 3)) for lv, v in qs.items()}}
                for col, qs in q.items()])
    page.table("TPS by duration", [("bin", "duration (s)"), ("count", "utterances"), ("hours", "hours"),
                                   ("p10", "TPS p10"), ("p50", "TPS median"), ("p90", "TPS p90")],
               [{"bin": b.label, "count": b.count, "hours": round(b.hours, 4), "p10": _round(b.tps_p10),
                 "p50": _round(b.tps_median), "p90": _round(b.tps_p90)} for b in c.stats.tps_by_duration])
    if c.tps_cut:
        tps_cut_chart(page, alt, c)
    if rejected:
        rejects_part(page, alt, rejects)
    elif rejects:
        page.line(f"No rows rejected: {', '.join(r.file for r in rejects)} "
                  f"{'holds' if len(rejects) == 1 else 'hold'} no rows.", "line rejects-none")
    page.close_section()



def _round(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def tps_cut_chart(page: Page, alt: Any, c: CorpusAggregates) -> None:
    """What ``filter --max-tps X`` keeps, with X on a slider (a Vega-Lite parameter)."""
    xs = [r["max_tps"] for r in c.tps_cut]
    start = min(xs, key=lambda x: abs(x - 25.0))
    step = round(xs[1] - xs[0], 6) if len(xs) > 1 else 0.5
    cut = alt.param(name="max_tps", value=start,
                    bind=alt.binding_range(min=xs[0], max=xs[-1], step=step, name="filter --max-tps "))
    base = alt.Chart(_data(alt, c.tps_cut))
    lines = base.transform_fold(["share", "hours_share"], as_=["of", "kept"]).transform_calculate(
        what="datum.of == 'share' ? 'utterances' : 'hours'").mark_line().encode(
        x=alt.X("max_tps:Q", title="--max-tps (tokens/s)"),
        y=alt.Y("kept:Q", title="kept", axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("what:N", title="share of", legend=alt.Legend(orient="right"),
                        scale=alt.Scale(domain=["utterances", "hours"], range=["#3b75af", "#e4572e"])))
    points = base.mark_point(size=80, filled=True, color="#111").encode(
        x="max_tps:Q", y="share:Q",
        tooltip=[alt.Tooltip("max_tps:Q", title="--max-tps"), alt.Tooltip("kept:Q", format=","),
                 alt.Tooltip("share:Q", format=".2%", title="utterances kept"),
                 alt.Tooltip("kept_hours:Q", format=",.2f", title="hours kept"),
                 alt.Tooltip("hours_share:Q", format=".2%", title="hours kept (share)")],
    ).transform_filter(alt.datum.max_tps == cut)
    label = base.mark_text(align="right", baseline="bottom", dx=-6, dy=-8, fontSize=13, fontWeight="bold").encode(
        x=alt.value("width"), y=alt.value("height"), text=alt.Text("label:N"),
    ).transform_filter(alt.datum.max_tps == cut).transform_calculate(
        label="'keeps ' + format(datum.kept, ',') + ' utterances (' + format(datum.share, '.2%') + '), '"
              " + format(datum.kept_hours, ',.1f') + ' h'")
    rule = alt.Chart(_data(alt, [{"x": 0}])).mark_rule(color="#111", strokeDash=[4, 3]).encode(
        x=alt.X("v:Q")).transform_calculate(v=cut.name)
    tps = next(h for h in c.histograms if h.column == "tps")
    hist = alt.Chart(_data(alt, tps.bins)).mark_bar().encode(
        x=alt.X("lo:Q", title="tokens per second"), x2="hi:Q", y=alt.Y("n:Q", title="utterances"), y2=alt.datum(0),
        color=alt.condition(alt.datum.hi <= cut, alt.value("#3b75af"), alt.value("#e4572e")),
        tooltip=[alt.Tooltip("lo:Q", title="from"), alt.Tooltip("hi:Q", title="to"),
                 alt.Tooltip("n:Q", format=",", title="utterances")])
    chart = alt.vconcat(
        alt.layer(lines, rule, points, label).properties(width=WIDE - 150, height=220),
        alt.layer(hist, rule).properties(width=WIDE - 150, height=140),
    ).add_params(cut)
    page.chart(chart, "TPS cutoff: what `filter --max-tps X` keeps",
               "Move the slider below the chart; red bars would be rejected (TPS > X). Kept = tps <= X, exactly "
               "as the filter counts (rows without a TPS are never kept).")


def rejects_part(page: Page, alt: Any, rejects: list[RejectsAggregates]) -> None:
    rows = [{"file": r.file, **x} for r in rejects for x in r.reasons if x["rows"]]
    page.chart(alt.Chart(_data(alt, rows)).mark_bar().encode(
        x=alt.X("rows:Q", title="rejected rows"), y=alt.Y("reason:N", sort="-x", title=None),
        color=alt.Color("file:N", title="rejects file"),
        tooltip=["file:N", "reason:N", alt.Tooltip("rows:Q", format=","), alt.Tooltip("hours:Q", format=",.3f")],
    ).properties(width=WIDE - 350, height=max(40, 22 * len(rows))), "Rejected rows by reason")
    ex = [{"file": r["file"], "reason": r["reason"], "rows": r["rows"], "hours": r["hours"],
           "id": e["id"], "origin": e["origin"], "detail": e["detail"]} for r in rows for e in r["examples"]]
    page.table("Rejects: examples (the first rows of each reason)",
               [("file", "file"), ("reason", "reason"), ("rows", "rows"), ("id", "id"), ("origin", "origin"),
                ("detail", "detail")], ex)


# --- section 2: buckets --------------------------------------------------------------------

def buckets_section(page: Page, b: BucketAggregates, c: CorpusAggregates) -> None:
    alt = _libs()
    page.open_section("buckets", "Buckets",
                      f"{b.file}: {len(b.buckets)} buckets; batch sizes from {_source_text(b.source)}.")
    g = c.grid2d
    heat = alt.Chart(_data(alt, g["cells"])).mark_rect().encode(
        x=alt.X("d0:Q", title="duration (s)", scale=alt.Scale(domain=[0, g["max_duration"]], nice=False)),
        x2="d1:Q",
        y=alt.Y("t0:Q", title="tokens (incl. prompt)", scale=alt.Scale(domain=[0, g["max_tokens"]], nice=False)),
        y2="t1:Q",
        color=alt.Color("n:Q", title="utterances", scale=alt.Scale(type="log", scheme="blues")),
        tooltip=[alt.Tooltip("d0:Q", title="duration from"), alt.Tooltip("d1:Q", title="to"),
                 alt.Tooltip("t0:Q", title="tokens from"), alt.Tooltip("t1:Q", title="to"),
                 alt.Tooltip("n:Q", format=",", title="utterances")])
    layers = [heat]
    if g["boxes"]:
        info = {x["bucket"]: x for x in b.buckets}
        boxes = [{**x, "batch_size": info[x["bucket"]]["batch_size"], "utterances": info[x["bucket"]]["utterances"]}
                 for x in g["boxes"]]
        layers.append(alt.Chart(_data(alt, boxes)).mark_rect(fillOpacity=0, stroke="#d62728", strokeWidth=1).encode(
            x="d0:Q", x2="d1:Q", y="t0:Q", y2="t1:Q",
            tooltip=[alt.Tooltip("bucket:Q"), alt.Tooltip("d0:Q", title="duration from"),
                     alt.Tooltip("d1:Q", title="duration to"), alt.Tooltip("t1:Q", title="max tokens"),
                     alt.Tooltip("batch_size:Q", title="batch size"), alt.Tooltip("utterances:Q", format=",")]))
    page.chart(alt.layer(*layers).properties(width=WIDE - 150, height=420),
               "Duration x tokens, with the bucket grid",
               "Cells: utterances (log colour). Red boxes: the buckets (hover for bounds and batch size). "
               "Axes stop at the 99.9th percentile.")
    page.chart(alt.Chart(_data(alt, b.buckets)).mark_bar().encode(
        x=alt.X("bucket:O", title="bucket", axis=alt.Axis(labelOverlap=True)),
        y=alt.Y("batch_size:Q", title="batch size (utterances)"), color=alt.Color("source:N", title="source"),
        tooltip=["bucket:Q", "min_duration:Q", "max_duration:Q", "max_tokens:Q", "batch_size:Q", "source:N",
                 alt.Tooltip("utterances:Q", format=","), alt.Tooltip("audio_padding:Q", format=".2%"),
                 alt.Tooltip("token_padding:Q", format=".2%")],
    ).properties(width=WIDE - 150, height=200), "Batch size per bucket")
    nonempty = [x for x in b.buckets if x["utterances"]]
    padding = [{**x, "kind": k, "padding": x[f"{k}_padding"]} for x in nonempty for k in ("audio", "token")]
    page.chart(alt.Chart(_data(alt, padding)).mark_bar().encode(
        x=alt.X("bucket:O", title="bucket (those holding utterances)", axis=alt.Axis(labelOverlap=True)),
        xOffset=alt.XOffset("kind:N", sort=["audio", "token"]),
        y=alt.Y("padding:Q", title="padding", axis=alt.Axis(format="%")),
        color=alt.Color("kind:N", title="padding of", scale=alt.Scale(domain=["audio", "token"],
                                                                      range=["#3b75af", "#f58518"])),
        tooltip=["bucket:Q", "kind:N", alt.Tooltip("padding:Q", format=".2%"), "min_duration:Q", "max_duration:Q",
                 "max_tokens:Q", alt.Tooltip("utterances:Q", format=","), "batch_size:Q", "batches:Q"],
    ).properties(width=WIDE - 150, height=220), "Padding per bucket",
               "Audio and token padding of each bucket's batches (2D scheme). Audio padding: "
               + GLOSSARY["audio padding"])
    if b.empty:
        page.line(_empty_buckets_text(b), "line empty-buckets")
    page.table("Per bucket", [("bucket", "bucket"), ("min_duration", "> duration (s)"),
                              ("max_duration", "<= duration (s)"), ("max_tokens", "<= tokens"),
                              ("utterances", "utterances"), ("hours", "hours"), ("batch_size", "batch size"),
                              ("source", "batch size from"), ("peak_gib", "peak (GiB)"),
                              ("audio_padding", "audio padding"), ("token_padding", "token padding"),
                              ("batches", "batches")], b.buckets,
               "Padding: 1 - real / (batch size x longest in batch), over the 2D scheme's batches.",
               percent=("audio_padding", "token_padding"))
    if b.breakdown:
        page.chart(alt.Chart(_data(alt, b.breakdown)).mark_bar().encode(
            x=alt.X("bucket:O"), y=alt.Y("gib:Q", title="GiB at the peak"), color=alt.Color("class:N"),
            tooltip=["bucket:Q", "class:N", alt.Tooltip("gib:Q", format=".3f")],
        ).properties(width=WIDE - 150, height=220), "OOM breakdown per bucket (oomptimize --explain)")
    schemes = [{**s, "kind": k, "padding": s[f"{k}_padding"]} for s in b.schemes for k in ("audio", "token")]
    page.chart(alt.Chart(_data(alt, schemes)).mark_bar().encode(
        x=alt.X("scheme:N", title=None, sort=None), xOffset="kind:N",
        y=alt.Y("padding:Q", title="padding", axis=alt.Axis(format="%")), color=alt.Color("kind:N", title=None),
        tooltip=["scheme:N", "kind:N", alt.Tooltip("padding:Q", format=".2%"), "batches:Q",
                 alt.Tooltip("mean_batch:Q", format=".1f"), "excluded:Q"],
    ).properties(width=WIDE - 250, height=220), "Padding per batching scheme")
    sampled = (f" Measured on a uniform sample of {b.measured_rows:,} of the {b.rows:,} rows (batches, rows "
               "excluded and the per-bucket padding too; rows and hours per bucket are exact)."
               if b.measured_rows < b.rows else "")
    page.table("Padding per scheme", [("scheme", "scheme"), ("audio_padding", "audio padding"),
                                      ("token_padding", "token padding"), ("batches", "batches"),
                                      ("mean_batch", "mean batch"), ("excluded", "rows excluded")], b.schemes,
               "fixed-Ls: one bucket padded to L seconds; 1d-*: duration buckets; 2d: these buckets; "
               "2d-dynamic-resolution: the same batches featurized at their own rates (frame padding left)." + sampled,
               percent=("audio_padding", "token_padding"))
    if b.currencies:
        page.table("Fixed, 2D and packed in each currency",
                   [("scheme", "scheme"), ("audio_padding", "audio"), ("token_padding", "tokens"),
                    ("te_padding", "token-equivalents"), ("excluded", "rows left out")], b.currencies,
                   f"packed: each 2D bucket's rows in sequences of at most {REPORT_PACK} token-equivalents "
                   "(ceil(duration x 12.5) + tokens; `plan-batches --pack`); its audio padding pads members to the "
                   "longest of their sequence, its token padding is the sequences' empty slots. Fixed and 2D: each "
                   "row padded to its batch's longest audio and most tokens." + sampled,
                   percent=("audio_padding", "token_padding", "te_padding"))
    page.close_section()


def _empty_buckets_text(b: BucketAggregates) -> str:
    """Why some buckets hold no utterances: carried rows, or none in their range."""
    why = []
    if b.emptied:
        why.append(f"{b.emptied} lost all their rows to carrying ({b.carried:,} rows carried up in all: a bucket's "
                   "tail beyond a multiple of its batch size, when at most half a batch, moves to the next "
                   "sub-bucket of its duration that holds its tokens, so no small batch is formed; on a small "
                   "corpus a whole sub-bucket is such a tail)")
    if b.unfilled:
        why.append(f"{b.unfilled} have no utterance in their duration x tokens range")
    return f"{b.empty} of {len(b.buckets)} buckets hold no utterances: " + "; ".join(why) + \
        ". They are left out of the padding chart; a larger corpus fills them."


def _source_text(src: dict[str, Any]) -> str:
    what = batch_size_origin(src)
    extra = {"budget": f" (padded budget {src.get('max_duration', '?')} s per batch)",
             "estimate": f" ({src.get('model', '?')} on {src.get('gpu', '?')})",
             "device probe": f" ({src.get('model', '?')} on {src.get('gpu', '?')})"}.get(what, "")
    return what + extra


# --- section 3: plan -----------------------------------------------------------------------

def plan_section(page: Page, p: PlanAggregates) -> None:
    alt = _libs()
    s = p.summary
    e0 = s["epoch0"]
    page.open_section("plan", "Plan",
                      f"World size {s['world_size']}, {s['epochs']} epoch(s), {s['steps']:,} steps, seed {s['seed']}, "
                      f"balance tolerance {s['balance_tolerance']:g} (plan hash {s['plan_hash'][:12]}...). "
                      "Step times are predicted by the cost model (seconds; relative figures).")
    page.figures([("steps / epoch 0", e0["steps"]), ("fill", _pct(e0["fill"])), ("straggler", _pct(e0["straggler"])),
                  ("idle", _pct(e0["idle"])), ("same-bucket steps", _pct(e0["same_bucket"])),
                  ("balance (max/mean)", round(e0["balance_mean"], 3)), ("audio padding", _pct(s["padding_audio"])),
                  ("token padding", _pct(s["padding_tokens"])), ("dropped rows", s["dropped_rows"])])
    steps_chart(page, alt, p)
    page.chart(alt.Chart(_data(alt, p.ranks)).mark_bar().encode(
        x=alt.X("rank:O", axis=alt.Axis(labelOverlap=True)), y=alt.Y("predicted_s:Q", title="predicted busy time (s)"),
        tooltip=["rank:Q", "batches:Q", alt.Tooltip("utterances:Q", format=","),
                 alt.Tooltip("padded_hours:Q", format=",.3f"), alt.Tooltip("predicted_s:Q", format=",.2f")],
    ).properties(width=WIDE - 150, height=160), "Per rank, epoch 0")
    page.table("Per rank totals, epoch 0", [("rank", "rank"), ("batches", "batches"), ("utterances", "utterances"),
                                            ("padded_hours", "padded hours"), ("predicted_s", "predicted busy (s)")],
               p.ranks)
    if p.targets:
        targets_part(page, alt, p)
    if p.shares:
        page.chart(alt.Chart(_data(alt, p.shares)).mark_bar().encode(
            x=alt.X("epoch:O"), y=alt.Y("hours_share:Q", title="share of hours", axis=alt.Axis(format="%")),
            color=alt.Color("corpus:N"),
            tooltip=["epoch:Q", "corpus:N", alt.Tooltip("share:Q", format=".2%", title="share of utterances"),
                     alt.Tooltip("hours_share:Q", format=".2%", title="share of hours")],
        ).properties(width=WIDE - 350, height=200), "Per-corpus shares per epoch")
    sims = [{**x, "mode": m, "idle": x[f"idle_{m}"]} for x in p.simulate for m in ("sync", "unsync")]
    page.chart(alt.Chart(_data(alt, sims)).mark_bar().encode(
        x=alt.X("world_size:O", title="world size"), xOffset="mode:N",
        y=alt.Y("idle:Q", title="idle share of rank time", axis=alt.Axis(format="%")), color=alt.Color("mode:N"),
        tooltip=["world_size:Q", "mode:N", alt.Tooltip("idle:Q", format=".2%"),
                 alt.Tooltip("speedup:Q", format=".2%", title="sync saves"), "representative:N"],
    ).properties(width=WIDE - 400, height=200), "simulate: synchronized vs unsynchronized at several world sizes")
    page.table("simulate", [("world_size", "world size"), ("steps_sync", "steps (sync)"),
                            ("time_sync", "epoch s (sync)"), ("time_unsync", "epoch s (unsync)"),
                            ("idle_sync", "idle (sync)"), ("idle_unsync", "idle (unsync)"),
                            ("speedup", "sync saves"), ("representative", "representative")], p.simulate,
               "The first row is the plan's own world size and step layout; the others re-deal the same batches. "
               "Not representative: fewer batches per bucket than ranks.",
               percent=("idle_sync", "idle_unsync", "speedup"))
    if p.store:
        page.table("Store reads per step, epoch 0", [
            ("rank", "rank"), ("requests_mean", "requests / step"), ("requests_max", "max requests"),
            ("mb_mean", "MB / step"), ("mb_max", "max MB"), ("objects_mean", "objects / step"),
            ("fetched_per_used", "fetched / used"), ("first_batch_s", "first batch (s)"),
            ("utt_per_s", "utterances/s")], p.store,
            "What each rank's step reads (a step's ranges of one object within 4 KiB are one request, as the "
            "prefetch reads them), priced by the default store model (as simulate --reads).")
    page.close_section()


def targets_part(page: Page, alt: Any, p: PlanAggregates) -> None:
    """A weighted blend: each corpus's target probability against the share it got."""
    bars = [{"corpus": t["corpus"], "what": what, "share": t[key], "weight": t["weight"], "target": t["target"],
             "achieved": t["achieved"]}
            for t in p.targets for what, key in (("target", "target"), ("achieved (epoch 0)", "achieved"))]
    page.chart(alt.Chart(_data(alt, bars)).mark_bar().encode(
        x=alt.X("corpus:N", title=None, sort=None), xOffset=alt.XOffset("what:N", sort=["target", "achieved (epoch 0)"]),
        y=alt.Y("share:Q", title="share of the epoch's utterances", axis=alt.Axis(format="%")),
        color=alt.Color("what:N", title=None, scale=alt.Scale(domain=["target", "achieved (epoch 0)"],
                                                              range=["#9aa5b1", "#3b75af"])),
        tooltip=["corpus:N", "weight:N", alt.Tooltip("target:Q", format=".2%"),
                 alt.Tooltip("achieved:Q", format=".2%", title="achieved (epoch 0)")],
    ).properties(width=WIDE - 350, height=200), "Blend: target against achieved share per corpus")
    page.table("Blend: target and achieved per corpus",
               [("corpus", "corpus"), ("weight", "weight"), ("target", "target"), ("achieved", "achieved (epoch 0)"),
                ("achieved_min", "fewest (epochs)"), ("achieved_max", "most (epochs)"),
                ("difference", "achieved - target"), ("quota", "quota / epoch"), ("rows", "rows"),
                ("hours_share", "share of hours (epoch 0)")], p.targets,
               "Target: the corpus's probability in the blend (weights down its path, raised to each level's "
               "temperature, normalized); achieved: its share of the utterances each epoch planned "
               f"(fewest and most over {_epochs(p)}).",
               percent=("target", "achieved", "achieved_min", "achieved_max", "difference", "hours_share"))


def _epochs(p: PlanAggregates) -> str:
    n = min(p.summary["epochs"], MAX_SHARE_EPOCHS)
    return "its epoch" if n == 1 else f"the {'first ' if n < p.summary['epochs'] else ''}{n} epochs"


def steps_chart(page: Page, alt: Any, p: PlanAggregates) -> None:
    """Epoch 0 step by step: predicted step times, mean batch coloured by rank 0's bucket
    (categorical colours) and balance; every step (or window) spans [step, end) on an axis
    of whole steps from 0 to the epoch's last step's end."""
    unit = "step" if p.step_window == 1 else f"window of {p.step_window} steps"
    last = p.steps[-1]["end"] if p.steps else 1
    # the step lines end at the last step's end: its values repeated there
    ends = p.steps + ([{**p.steps[-1], "step": last}] if p.steps else [])
    tips = [alt.Tooltip("step:Q", title="first step" if p.step_window > 1 else "step"), "bucket:N",
            alt.Tooltip("buckets:Q", title="buckets at the step"), alt.Tooltip("batch:Q", title="mean batch"),
            alt.Tooltip("time_max:Q", title="step time (s)", format=".3f"),
            alt.Tooltip("time_mean:Q", title="mean rank time (s)", format=".3f"),
            alt.Tooltip("balance:Q", title="balance", format=".3f")]
    x = alt.X("step:Q", title="step of epoch 0", scale=alt.Scale(domain=[0, last], nice=False),
              axis=alt.Axis(tickMinStep=1, format="d"))
    lines = alt.Chart(_data(alt, ends))
    times = lines.transform_fold(["time_max", "time_mean"], as_=["figure", "seconds"]).transform_calculate(
        rank="datum.figure == 'time_max' ? 'slowest rank' : 'mean rank'").mark_line(
        interpolate="step-after").encode(x=x, y=alt.Y("seconds:Q", title="predicted time (s)"),
                                         color=alt.Color("rank:N", title=None))
    base = alt.Chart(_data(alt, p.steps))
    hover = base.mark_rect(opacity=0).encode(x=x, x2="end:Q", tooltip=tips)
    batch = base.mark_rect(stroke="white", strokeWidth=0.5).encode(
        x=x, x2="end:Q", y=alt.Y("batch:Q", title="mean batch"), y2=alt.datum(0),
        color=alt.Color("bucket:N", title="bucket (rank 0)", scale=alt.Scale(scheme="tableau20"),
                        legend=alt.Legend(columns=3, symbolLimit=60)), tooltip=tips)
    bal = lines.mark_line(color="#e4572e", interpolate="step-after").encode(
        x=x, y=alt.Y("balance:Q", title="balance (max/mean)", scale=alt.Scale(zero=False)))
    page.chart(alt.vconcat(alt.layer(times, hover).properties(width=WIDE - 150, height=180),
                           batch.properties(width=WIDE - 150, height=120),
                           alt.layer(bal, hover).properties(width=WIDE - 150, height=100)
                           ).resolve_scale(color="independent"),
               "Steps over epoch 0",
               f"One bar or level per {unit}, from its first step to the next ({last:,} steps in all): step time = "
               "slowest rank; colour = rank 0's bucket; balance = max / mean padded audio seconds "
               "(batch size x longest utterance) over the ranks.")


# --- the page ------------------------------------------------------------------------------

def render_page(data: ReportData, title: str = "speech-dataprep report") -> str:
    """The whole page as a string."""
    page = Page()
    corpus_section(page, data.corpus, data.rejects)
    if data.buckets is not None:
        buckets_section(page, data.buckets, data.corpus)
    if data.plan is not None:
        plan_section(page, data.plan)
    if data.windows is not None:
        windows_section(page, data.windows)
    if data.step_times is not None:
        run_section(page, data.step_times)
    nav = [("corpus", "Corpus")] + ([("buckets", "Buckets")] if data.buckets else []) + \
        ([("plan", "Plan")] if data.plan else []) + ([("windows", "Windows")] if data.windows else []) + \
        ([("run", "Run")] if data.step_times else []) + [("terms", "Terms")]
    inputs = [f"manifest {data.corpus.manifest}"] + [f"rejects {r.file}" for r in data.rejects] + \
        ([f"buckets {data.buckets.file}"] if data.buckets else [])
    specs = json.dumps(page.specs, separators=(",", ":"), sort_keys=True, ensure_ascii=False).replace("<", "\\u003c")
    return "".join([
        '<!doctype html><html lang="en"><head><meta charset="utf-8">',
        f'<meta name="generator" content="{GENERATOR}">',
        '<meta name="viewport" content="width=device-width,initial-scale=1">',
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>",
        f"<header><h1>{_e(title)}</h1><p>{_e(' · '.join(inputs))}</p></header>",
        "<nav>" + "".join(f'<a href="#{i}">{_e(t)}</a>' for i, t in nav) + "</nav>",
        *page.parts,
        glossary(),
        f'<script type="application/json" id="report-specs">{specs}</script>',
        f"<script>{vega_bundle()}</script><script>{JS}</script></body></html>\n",
    ])


def is_report(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a page this tool wrote (its generator marker in the first 4 KiB)."""
    try:
        with open(path, "rb") as fh:
            return f'<meta name="generator" content="{GENERATOR}">'.encode() in fh.read(4096)
    except OSError:
        return False


def write_page(data: ReportData, output: str | os.PathLike[str]) -> int:
    """Write the page atomically; an existing file is replaced only when this tool wrote it.
    Returns the page's size in bytes."""
    if os.path.isdir(output) or (os.path.lexists(output) and output_kind(output) == "file" and not is_report(output)):
        raise DataprepError(f"{output}: -o: exists and is not a report this tool wrote; refusing to replace it")
    text = render_page(data).encode("utf-8")
    with atomic_path(output) as tmp:
        tmp.write_bytes(text)
    return len(text)
