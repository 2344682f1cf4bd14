"""The demo's report opened in a real browser (Debian's headless chromium, driven by
playwright): no JavaScript error, every section draws its charts and tables, nothing
overflows the window at a desktop and a phone size, step charts tick at whole steps up to
the last, bucket ids get a categorical legend, tables sort, the --max-tps slider moves,
hover shows values, opening the file requests nothing, and the docs' picture is drawn."""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dataprep.cli import app
from dataprep.demo import demo_steps, make_demo_corpus

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "pipeline"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
SECTIONS = ("corpus", "buckets", "plan")
#: a laptop and a phone (CSS pixels)
VIEWPORTS = ({"width": 1366, "height": 768}, {"width": 390, "height": 844})
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img" / "report_png.py"


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's steps on a 300-utterance corpus (the golden test's tokenizer), report included."""
    pytest.importorskip("altair", reason="the report extra (altair) is not installed")
    out = tmp_path_factory.mktemp("demo")
    make_demo_corpus(out, num_utterances=300)
    shutil.copy(GOLDEN / "spm.model", out / "spm.model")
    runner = CliRunner()
    for step in demo_steps(out):
        if step[0] == "train-tokenizer":
            continue
        result = runner.invoke(app, step)
        assert result.exit_code == 0, f"dataprep {' '.join(step)}\n{result.output}"
    return out / "report.html"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (the dev extra) is not installed")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} not found: Debian's chromium is not installed (.ci/run installs it with apt-get "
                    "as root; it could not here)")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def _open(browser: Any, path: Path, viewport: dict[str, int] | None = None) -> tuple[Any, list[str], list[str]]:
    page = browser.new_page(viewport=viewport or {"width": 1100, "height": 900})
    errors: list[str] = []
    requests: list[str] = []
    page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    page.on("request", lambda r: requests.append(r.url))
    page.route("**/*", lambda route: route.continue_() if route.request.url == path.as_uri() else route.abort())
    page.goto(path.as_uri())
    page.wait_for_function("window.__report && window.__report.ready", timeout=60_000)
    return page, errors, requests


def test_the_demo_report_renders_every_section_without_error(demo_report: Path, browser: Any,
                                                             tmp_path: Path) -> None:
    page, errors, _ = _open(browser, demo_report)
    state = page.evaluate("window.__report")
    assert state["errors"] == [] and errors == []
    figures = page.evaluate("""() => Array.from(document.querySelectorAll('details.section')).map(s => ({
        id: s.id,
        figs: Array.from(s.querySelectorAll('figure.fig')).map(f => ({
            title: f.querySelector('figcaption').textContent, kind: f.dataset.kind,
            marks: f.querySelectorAll('svg g.role-mark > [role="graphics-symbol"]').length,
            rows: f.querySelectorAll('tbody tr').length}))}))""")
    assert [s["id"] for s in figures] == list(SECTIONS)
    for section in figures:
        assert section["figs"], section["id"]
        for f in section["figs"]:
            assert (f["marks"] if f["kind"] == "chart" else f["rows"]) > 0, (section["id"], f)
    assert state["charts"] == sum(f["kind"] == "chart" for s in figures for f in s["figs"])
    page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    assert (tmp_path / "report.png").stat().st_size > 10_000
    page.close()


def test_tables_sort_the_slider_moves_and_hover_shows_values(demo_report: Path, browser: Any) -> None:
    page, errors, _ = _open(browser, demo_report)
    table = page.get_by_role("figure", name="Per bucket", exact=True).locator("table")
    header = table.locator("th", has_text="utterances")
    col = header.evaluate("th => th.cellIndex")

    def column() -> list[float]:
        return table.evaluate(f"t => Array.from(t.tBodies[0].rows).map(r => parseFloat(r.cells[{col}].dataset.v))")

    header.click()
    assert column() == sorted(column())
    header.click()
    assert column() == sorted(column(), reverse=True)

    slider = page.locator("input[type=range]")
    label = page.get_by_role("figure", name="TPS cutoff", exact=False).locator("text", has_text="keeps")
    before = label.text_content()
    slider.evaluate("el => { el.value = el.min; el.dispatchEvent(new Event('input', {bubbles: true})); }")
    page.wait_for_function(f"() => !document.body.textContent.includes({before!r})", timeout=10_000)
    assert "keeps" in label.text_content() and label.text_content() != before

    schemes = page.get_by_role("figure", name="Padding per batching scheme", exact=True)
    bar = schemes.locator('svg g.role-mark > [role="graphics-symbol"]').first
    bar.hover()
    tip = page.locator("#vg-tooltip-element")
    tip.wait_for(state="visible", timeout=10_000)
    assert "scheme" in tip.text_content()
    assert errors == []
    page.close()


def test_opening_the_report_requests_nothing_but_itself(demo_report: Path, browser: Any) -> None:
    page, errors, requests = _open(browser, demo_report)
    assert requests == [demo_report.as_uri()]
    assert page.evaluate("window.__report.errors") == [] and errors == []
    assert demo_report.stat().st_size < 5 * 1024 * 1024
    page.close()


@pytest.mark.parametrize("viewport", VIEWPORTS, ids=lambda v: f"{v['width']}x{v['height']}")
def test_nothing_overflows_and_every_chart_draws_at_desktop_and_phone_sizes(demo_report: Path, browser: Any,
                                                                            viewport: dict[str, int]) -> None:
    page, errors, _ = _open(browser, demo_report, viewport)
    assert page.evaluate("window.__report.errors") == [] and errors == []
    width = viewport["width"]
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    figs = page.evaluate("""() => Array.from(document.querySelectorAll('figure.fig, .kpis, p, dl')).map(f => {
        const r = f.getBoundingClientRect(), svg = f.querySelector('svg');
        return {what: (f.querySelector('figcaption') || f).textContent.slice(0, 60), left: r.left, right: r.right,
                scroll: f.scrollWidth, client: f.clientWidth,
                svg: svg ? svg.getBoundingClientRect().right : null,
                marks: f.querySelectorAll('svg g.role-mark > [role="graphics-symbol"]').length,
                chart: f.dataset.kind === 'chart'}; })""")
    for f in figs:
        assert f["left"] >= 0 and f["right"] <= width, f
        assert f["scroll"] <= f["client"] + 1, f  # nothing cut inside a figure (tables scroll in their box)
        if f["chart"]:
            assert f["svg"] is not None and f["svg"] <= f["right"] + 0.5 and f["marks"] > 0, f
    page.close()


def test_step_charts_tick_whole_steps_to_the_last_and_buckets_get_categories(demo_report: Path,
                                                                             browser: Any) -> None:
    page, errors, _ = _open(browser, demo_report)
    steps = int(page.get_by_role("figure", name="Steps over epoch 0", exact=True).locator(".note").text_content()
                .split("(")[1].split(" steps")[0].replace(",", ""))
    axes = page.evaluate("""() => {
        const f = Array.from(document.querySelectorAll('figure.fig'))
            .find(x => x.querySelector('figcaption').textContent === 'Steps over epoch 0');
        return {x: Array.from(f.querySelectorAll('g[aria-label^="X-axis"]')).map(a =>
                    Array.from(a.querySelectorAll('.role-axis-label text')).map(t => t.textContent)),
                legends: Array.from(f.querySelectorAll('g[aria-label*="legend"]')).map(g => g.getAttribute('aria-label'))};
    }""")
    assert len(axes["x"]) == 3
    for labels in axes["x"]:
        assert all(t.isdigit() for t in labels), labels  # whole steps, never 0.2 or 0.5
        assert int(labels[0]) == 0 and int(labels[-1]) == steps  # the last step drawn to its end
    bucket = [g for g in axes["legends"] if "bucket (rank 0)" in g]
    assert bucket and bucket[0].startswith("Symbol legend"), axes["legends"]  # categories, not a gradient
    assert errors == []
    page.close()


def test_the_docs_picture_is_drawn_from_the_report(demo_report: Path, browser: Any, tmp_path: Path) -> None:
    """docs/img/report.png is written by docs/img/report_png.py; its drawing runs here."""
    spec = importlib.util.spec_from_file_location("report_png", DOCS_IMG)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.screenshot(browser, demo_report, tmp_path / "report.png")
    from PIL import Image

    with Image.open(tmp_path / "report.png") as im:
        assert im.size[0] == mod.VIEWPORT["width"] and im.size[1] > 3000 and im.mode == "P"
