"""``dataprep report`` as a user runs it: one self-contained page, equal bytes for equal
inputs, and the output rules (never an input, never a file this tool did not write)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import dataprep.analysis.stream_padding as stream_padding
import dataprep.report.stream_sections as stream_sections
from dataprep.cli import app
from dataprep.cli.app import parse_memory_limit
from dataprep.planning.build import build_plan
from dataprep.planning.options import PlanOptions
from dataprep.report.aggregates import collect_report
from dataprep.testing import write_plan_inputs

pytest.importorskip("altair", reason="the report extra (altair) is not installed")
runner = CliRunner()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("report-cli")
    kept, buckets = write_plan_inputs(folder, 2000, seed=5, num_buckets=6)
    build_plan(kept, buckets, folder / "plan", PlanOptions(world_size=2))
    return {"kept": kept, "buckets": buckets, "plan": folder / "plan"}


def _run(*args: object) -> tuple[int, str]:
    r = runner.invoke(app, ["report", *map(str, args)])
    return r.exit_code, r.output


def test_writes_one_self_contained_page_with_equal_bytes_for_equal_inputs(inputs: dict[str, Path], tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "r.html"
    args = (inputs["kept"], "--buckets", inputs["buckets"], "--plan", inputs["plan"], "--world-sizes", "2,4")
    code, text = _run(*args, "-o", out)
    assert code == 0, text
    assert str(out) in text
    page = out.read_text(encoding="utf-8")
    first = out.read_bytes()
    assert 500_000 < len(first) < 5 * 1024 * 1024
    markup = re.sub(r"(?s)(<script[^>]*>).*?</script>", r"\1</script>", page)  # tags, not script text
    assert markup.count("<script") == 3  # the data, Vega's bundle, the page's glue: all inline
    assert not re.search(r"<(script|img|iframe)[^>]*\ssrc=|<link\b", markup)  # nothing loaded from elsewhere
    specs = json.loads(re.search(r'<script type="application/json" id="report-specs">(.*?)</script>', page,
                                 re.S).group(1))
    assert len(specs) >= 8 and all("data" in json.dumps(s) for s in specs.values())
    for sid in ("corpus", "buckets", "plan"):
        assert f'id="{sid}"' in page
    code, text = _run(*args, "-o", out)  # its own page is replaced
    assert code == 0, text
    assert out.read_bytes() == first
    monkeypatch.setattr(stream_sections, "SHARE_RANGE_ROWS", 73)
    code, text = _run(*args, "--memory-limit", "80KiB", "-o", out)  # spilled, the plan joined in ranges of 73 rows
    assert code == 0, text
    assert out.read_bytes() == first


def test_only_the_manifest_is_required(inputs: dict[str, Path], tmp_path: Path) -> None:
    code, text = _run(inputs["kept"], "-o", tmp_path / "r.html")
    assert code == 0, text
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert 'id="corpus"' in page and 'id="buckets"' not in page and 'id="plan"' not in page


@pytest.mark.parametrize("case", ["input", "foreign", "in-plan", "sizes", "memory"])
def test_refuses_with_one_line(case: str, inputs: dict[str, Path], tmp_path: Path) -> None:
    foreign = tmp_path / "notes.html"
    foreign.write_text("<html>mine</html>")
    args = {"input": (inputs["kept"], "-o", inputs["kept"]),
            "foreign": (inputs["kept"], "-o", foreign),
            "in-plan": (inputs["kept"], "--plan", inputs["plan"], "-o", inputs["plan"] / "r.html"),
            "sizes": (inputs["kept"], "--world-sizes", "0,2", "-o", tmp_path / "r.html"),
            "memory": (inputs["kept"], "--plan", inputs["plan"], "--memory-limit", "lots",
                       "-o", tmp_path / "r.html")}[case]
    before = inputs["kept"].read_bytes() if case == "input" else None
    code, text = _run(*args)
    assert code == 2, text
    lines = text.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "Traceback" not in text
    if case == "foreign":
        assert foreign.read_text() == "<html>mine</html>"
    if case == "input":
        assert inputs["kept"].read_bytes() == before
    assert not (inputs["plan"] / "r.html").exists()


@pytest.mark.parametrize("limit", [None, "80KiB"])
def test_the_padding_figures_are_those_of_dataprep_padding(limit: str | None, inputs: dict[str, Path],
                                                           tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Section 2's padding is ``dataprep padding``'s of the same manifest and buckets, per
    scheme and per bucket (and its carried rows), held in memory or spilled to disk under the
    report's limit (``80KiB``), as ``dataprep padding``'s."""
    extra = [] if limit is None else ["--memory-limit", limit]
    res = runner.invoke(app, ["padding", str(inputs["kept"]), "--buckets", str(inputs["buckets"]),
                              "--json", str(tmp_path / "p.json"), *extra])
    assert res.exit_code == 0, res.output
    want = json.loads((tmp_path / "p.json").read_text())
    spills: list[Path] = []
    real = stream_padding.spill_dir
    monkeypatch.setattr(stream_padding, "spill_dir", lambda where: spills.append(real(where)) or spills[-1])
    got = collect_report(inputs["kept"], buckets=inputs["buckets"],
                         memory_limit=None if limit is None else parse_memory_limit(limit)).buckets
    assert len(spills) == (limit is not None)
    assert got is not None and got.measured_rows == got.rows == 2000
    assert {s["scheme"]: s for s in got.schemes} == {
        k: {"scheme": k, "audio_padding": v["audio_padding"], "token_padding": v["token_padding"],
            "batches": v["num_batches"], "mean_batch": v["mean_batch_size"], "excluded": v["excluded"]}
        for k, v in want["schemes"].items()}
    assert [(b["utterances"], b["audio_padding"], b["token_padding"], b["batches"]) for b in got.buckets] == \
        [(b["num_rows"], b["audio_padding"], b["token_padding"], b["num_batches"]) for b in want["per_bucket"]]
    assert got.carried == want["carried"]
