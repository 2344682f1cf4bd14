"""What the report page says, read from its HTML and chart specs: corpora named by the
``corpus`` column, a blend's target against achieved shares, padding per bucket drawn, empty
buckets explained, step charts on whole steps up to the last, bucket ids on categorical
colours, no empty rejects frame, every figure name defined on the page."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from bucketing.allocate import assign
from bucketing.fit import grid_from_spec
from dataprep.analysis.padding import batch_sizes_for
from dataprep.planning.build import build_plan
from dataprep.planning.options import PlanOptions
from dataprep.report.aggregates import collect_report
from dataprep.report.buckets_section import bucket_rows, bucket_section
from dataprep.report.page_assets import GLOSSARY, term_id
from dataprep.report.stream_sections import RowBlock
from dataprep.testing import write_plan_inputs
from manifests.buckets_file import read_buckets
from manifests.manifest_write import write_manifest, write_rejects
from manifests.plan_meta import read_plan_meta

pytest.importorskip("altair", reason="the report extra (altair) is not installed")
from dataprep.report.page import render_page

WEIGHTS = {"c0": 3.0, "c1": 1.0, "c2": 1.0}


@pytest.fixture(scope="module")
def blend(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A three-corpus manifest (``corpus`` column; origins are file paths), its buckets, a
    weighted W=2 plan over 2 epochs, an empty rejects file, and the report's data and page."""
    folder = tmp_path_factory.mktemp("blend")
    kept, buckets = write_plan_inputs(folder, 1500, seed=5, num_buckets=8, corpora=3, budget=600.0)
    df = pl.read_parquet(kept)
    df = df.with_columns(pl.Series("origin", [f"/data/shards/part{i % 2}.jsonl:{i + 1}" for i in range(df.height)]))
    write_manifest(df, kept)
    build_plan(kept, buckets, folder / "plan", PlanOptions(world_size=2, epochs=2, weights=WEIGHTS))
    write_rejects(df.head(0).with_columns(pl.lit("x").alias("reason"), pl.lit("x").alias("detail")),
                  folder / "rejects.parquet")
    data = collect_report(kept, rejects=[folder / "rejects.parquet"], buckets=buckets, plan=folder / "plan")
    return {"kept": kept, "buckets": buckets, "plan": folder / "plan", "df": df, "data": data,
            "html": render_page(data)}


def charts(page: str) -> dict[str, dict[str, Any]]:
    """Each chart's Vega-Lite spec by its caption."""
    specs = json.loads(re.search(r'<script type="application/json" id="report-specs">(.*?)</script>', page,
                                 re.DOTALL).group(1))
    return {html.unescape(t): specs[cid] for t, cid in
            re.findall(r'<figcaption>([^<]*)</figcaption><div class="chart" id="(chart-\d+)">', page)}


def table(page: str, caption: str) -> tuple[list[str], list[list[str]]]:
    """A table's headers and cells (text) by its caption."""
    m = re.search(re.escape(caption) + r"</figcaption>.*?<thead>(.*?)</thead><tbody>(.*?)</tbody>", page, re.DOTALL)
    assert m, caption
    heads = [html.unescape(h) for h in re.findall(r"<th[^>]*>(.*?)</th>", m.group(1))]
    rows = [[html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", r)] for r in re.findall(r"<tr>(.*?)</tr>",
                                                                                                  m.group(2))]
    return heads, rows


def test_corpora_are_named_by_the_corpus_column(blend: dict[str, Any]) -> None:
    c = blend["data"].corpus
    assert c.corpus_column
    assert {g["corpus"] for g in c.groups} == {"c0", "c1", "c2"}
    heads, rows = table(blend["html"], "Per corpus, language and task (largest first)")
    assert heads[0] == "corpus" and {r[0] for r in rows} == {"c0", "c1", "c2"}
    assert "/data/shards" not in blend["html"] and "part0.jsonl" not in blend["html"]
    assert {s["corpus"] for s in blend["data"].plan.shares} == {"c0", "c1", "c2"}


def test_a_blend_shows_each_corpus_target_against_its_achieved_share(blend: dict[str, Any]) -> None:
    meta = read_plan_meta(blend["plan"])
    corpora = {c["corpus"]: c for c in meta.extra["weights"]["corpora"]}
    targets = {t["corpus"]: t for t in blend["data"].plan.targets}
    assert set(targets) == set(WEIGHTS)
    epoch0 = read_plan_rows_per_corpus(blend)
    for name, t in targets.items():
        assert t["target"] == pytest.approx(corpora[name]["probability"], abs=1e-6)
        assert t["weight"] == f"{WEIGHTS[name]:g}"
        assert t["quota"] == corpora[name]["quota"]
        assert t["achieved"] == pytest.approx(epoch0[name], abs=1e-6)  # counted from the plan's own rows
        assert t["achieved_min"] <= t["achieved"] <= t["achieved_max"]
        assert t["difference"] == pytest.approx(t["achieved"] - t["target"], abs=2e-6)
    spec = charts(blend["html"])["Blend: target against achieved share per corpus"]
    assert {v["what"] for v in spec["data"]["values"]} == {"target", "achieved (epoch 0)"}
    heads, rows = table(blend["html"], "Blend: target and achieved per corpus")
    assert heads[:4] == ["corpus", "weight", "target", "achieved (epoch 0)"]
    assert {r[0] for r in rows} == set(WEIGHTS)


def read_plan_rows_per_corpus(blend: dict[str, Any]) -> dict[str, float]:
    """Epoch 0's share of planned utterances per corpus, from every rank's shard."""
    from dataprep.planning.simulate import read_epoch_batches

    ranks = read_epoch_batches(blend["plan"], 0)["rows"]
    flat = np.concatenate([r.flatten().to_numpy() for r in ranks])  # type: ignore[attr-defined]
    corpus = blend["df"]["corpus"].to_numpy()[flat]
    names, counts = np.unique(corpus, return_counts=True)
    return {str(n): c / flat.shape[0] for n, c in zip(names, counts)}


def test_padding_per_bucket_is_drawn_and_all_empty_columns_are_left_out(blend: dict[str, Any]) -> None:
    spec = charts(blend["html"])["Padding per bucket"]
    drawn = {(v["bucket"], v["kind"]): v["padding"] for v in spec["data"]["values"]}
    for b in blend["data"].buckets.buckets:
        if b["utterances"]:
            assert drawn[b["bucket"], "audio"] == b["audio_padding"] and drawn[b["bucket"], "token"] == b["token_padding"]
        else:
            assert (b["bucket"], "audio") not in drawn
    heads, rows = table(blend["html"], "Per bucket")
    assert "peak (GiB)" not in heads  # no bucket has a measured peak: the column would be all "-"
    assert all(any(r[i] != "-" for r in rows) for i in range(len(heads)))


def test_step_charts_end_at_the_last_step_on_whole_step_ticks(blend: dict[str, Any]) -> None:
    p = blend["data"].plan
    steps = p.summary["epoch0"]["steps"]
    assert [s["step"] for s in p.steps] == list(range(steps))
    assert [s["end"] for s in p.steps] == list(range(1, steps + 1))
    spec = charts(blend["html"])["Steps over epoch 0"]
    xs = [e["encoding"]["x"] for e in _marks(spec) if e["encoding"].get("x", {}).get("field") == "step"]
    assert len(xs) >= 4
    for x in xs:
        assert x["scale"]["domain"] == [0, steps] and x["scale"]["nice"] is False
        assert x["axis"]["tickMinStep"] == 1 and x["axis"]["format"] == "d"
    colours = [e["encoding"]["color"] for e in _marks(spec) if e["encoding"].get("color", {}).get("field") == "bucket"]
    assert colours and all(c["type"] == "nominal" for c in colours)  # categorical, not a continuous ramp


def _marks(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Every unit view of a (layered / concatenated) spec that has an encoding."""
    out = [spec] if "encoding" in spec else []
    for k in ("layer", "vconcat", "hconcat", "concat"):
        for sub in spec.get(k, []):
            out += _marks(sub)
    return out


def test_nothing_rejected_is_one_line_not_an_empty_frame(blend: dict[str, Any]) -> None:
    page = blend["html"]
    assert "No rows rejected: rejects.parquet holds no rows." in page
    assert "rejected rows" not in page and "Rejected rows by reason" not in page
    without = render_page(collect_report(blend["kept"]))
    assert "rejected rows" not in without and "No rows rejected" not in without  # no --rejects: nothing said


def test_empty_buckets_are_explained_with_the_rows_carried(blend: dict[str, Any]) -> None:
    b = blend["data"].buckets
    df = blend["df"]
    spec = read_buckets(blend["buckets"])
    _, bs = batch_sizes_for(spec)
    grid = grid_from_spec(spec)
    d, t = df["duration"].to_numpy(), df["num_tokens"].to_numpy().astype(np.int64)
    a = assign(d, t, grid, bs)
    before = np.bincount(a.allocation.bucket[a.allocation.bucket >= 0], minlength=grid.num_buckets)
    after = np.bincount(a.bucket[a.bucket >= 0], minlength=grid.num_buckets)
    assert b.carried == a.carried > 0
    assert b.emptied == int(((after == 0) & (before > 0)).sum()) > 0
    assert b.unfilled == int((before == 0).sum())
    empty = int((after == 0).sum())
    assert b.empty == empty
    assert (f"{empty} of {len(b.buckets)} buckets hold no utterances: {b.emptied} lost all their rows to carrying "
            f"({b.carried:,} rows carried up in all") in html.unescape(blend["html"])


def test_streamed_empty_bucket_counts_equal_the_in_memory_ones(blend: dict[str, Any]) -> None:
    """Past the padding's sample (every row allocated block by block), the carried rows and
    empty buckets are those of all rows at once."""
    df = blend["df"]
    spec = read_buckets(blend["buckets"])
    d, t = df["duration"].to_numpy(), df["num_tokens"].to_numpy().astype(np.int64)

    def blocks() -> list[RowBlock]:
        return [RowBlock(a, d[a:a + 200], t[a:a + 200]) for a in range(0, d.shape[0], 200)]

    held, streamed = bucket_rows(d.shape[0], spec), bucket_rows(d.shape[0], spec, sample=300)
    for blk in blocks():
        held.add(blk)
        streamed.add(blk)
    one = bucket_section(held, spec, blend["kept"], blocks)
    two = bucket_section(streamed, spec, blend["kept"], blocks)
    assert streamed.exact and not held.exact
    assert (one.carried, one.empty, one.emptied, one.unfilled) == (two.carried, two.empty, two.emptied, two.unfilled)


def test_every_figure_name_is_defined_on_the_page(blend: dict[str, Any]) -> None:
    page = blend["html"]
    for term in ("fill", "straggler", "balance", "idle", "same-bucket steps", "carried rows", "target", "achieved",
                 "audio padding", "token padding", "sync saves", "representative", "TPS"):
        assert f'<dt id="{term_id(term)}">{html.escape(term)}</dt><dd>{html.escape(GLOSSARY[term])}</dd>' in page, term
    for label in ("fill", "straggler", "balance (max/mean)", "idle", "same-bucket steps", "dropped rows"):
        term = label.split(" (")[0]
        assert (f'<a class="term" href="#{term_id(term)}" title="{html.escape(GLOSSARY[term])}">'
                f'{html.escape(label)}</a>') in page, label
    assert '<a href="#terms">Terms</a>' in page


def test_a_manifest_without_a_corpus_column_names_its_source_files(tmp_path: Path) -> None:
    kept, _ = write_plan_inputs(tmp_path, 300, seed=1, num_buckets=4)
    df = pl.read_parquet(kept).with_columns(
        pl.Series("origin", [f"/data/{'a' if i % 2 else 'b'}/train.jsonl:{i + 1}" for i in range(300)]))
    write_manifest(df, kept)
    page = render_page(collect_report(kept))
    heads, rows = table(page, "Per corpus, language and task (largest first)")
    assert heads[0] == "corpus (source file)" and {r[0] for r in rows} == {"a/train.jsonl", "b/train.jsonl"}
    assert "The manifest has no corpus column" in page


def test_the_vega_bundle_is_kept_in_the_cache_and_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vl-convert's bundle is built once per cache: the next process reads it, if its versions and
    SHA-256 check; an edited or truncated one is not used."""
    import hashlib

    from dataprep.report import page

    monkeypatch.setenv("SPEECH_DATAPREP_CACHE", str(tmp_path))
    page.vega_bundle.cache_clear()
    built = page.vega_bundle()
    folder = tmp_path / "vega"
    (kept,) = folder.iterdir()
    record = json.loads(kept.read_text(encoding="utf-8"))
    key, bundle = record["context"], record["value"]
    assert bundle["js"].replace("</script", "<\\/script") == built and "vega" in bundle["js"]

    def keep(js: str, sha: str, context: dict = key) -> None:
        kept.write_text(json.dumps({"context": context, "value": {"js": js, "sha256": sha}}))

    edited = bundle["js"] + "\n// kept"
    keep(edited, hashlib.sha256(edited.encode()).hexdigest())
    page.vega_bundle.cache_clear()
    assert page.vega_bundle().endswith("// kept")  # a later process reads the kept bundle
    keep(edited, bundle["sha256"])  # the SHA-256 no longer checks
    assert page._kept_bundle(folder, key) is None
    kept.write_text(json.dumps(record)[:1000])  # truncated
    assert page._kept_bundle(folder, key) is None
    keep(bundle["js"], bundle["sha256"], {**key, "vl_convert": "0.0"})  # another vl-convert's
    assert page._kept_bundle(folder, key) is None
    assert page._kept_bundle(tmp_path / "missing", key) is None
    page.vega_bundle.cache_clear()
