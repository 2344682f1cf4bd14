"""Every code block of README.md and docs/*.md is either run here or marked as not meant to run.

Convention (one rule for every page):

- A ```` ```sh ```` or ```` ```python ```` block runs, in page order, in a copy of the folder
  ``python -m dataprep.demo`` writes (``train.jsonl``, ``audio/``, ``spm.model``,
  ``manifest.parquet``, ``kept.parquet``, ``buckets.json``, ``plan/`` ...), the one shared
  workspace of this module; ``examples/`` and ``benchmarks/`` are linked into it. Blocks of one
  page share their copy, so a page reads as one session. ``dataprep`` there runs each command
  in a process of its own forked from one that imported the CLI once (:mod:`tests.warm_python`:
  the same output and exit status, without an interpreter's start per command).
- ``<!-- doc-test: not-run: REASON -->`` on the line before a fence: not run (a GPU, a cluster,
  an install, a full-size benchmark); the reason is required.
- ``<!-- doc-test: file examples/NAME.py -->``: the block is that file verbatim; the file is
  run by ``tests/test_readme_examples.py``.
- ```` ```text ```` blocks are samples (output, diagrams, file layouts) and never run.

Any other fence (no language, ``json``, ``bash`` ...) fails the test, so no block escapes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import docs_demo_root
from tests.doc_blocks import (
    FENCE,
    FILE_MARK,
    PAGES,
    REPO,
    Block,
    page_blocks,
    readme_walk,
)
from tests.docs_demo import build, serving
from tests.warm_python import COMMANDS, run_python


def all_blocks() -> list[Block]:
    return [b for p in PAGES for b in page_blocks(p)]


def test_every_block_is_run_or_marked() -> None:
    """Every block has a kind (a ```json or bare fence fails), and every marker sits on a block."""
    kinds = [b.kind for b in all_blocks()]
    assert kinds.count("run") >= 20
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        marks = len(re.findall(r"^[ \t]*<!-- doc-test: .*-->[ \t]*$", text, re.MULTILINE))
        assert marks == sum(b.mark is not None for b in page_blocks(page)), f"{page}: a marker not right before a fence"


def test_marked_files_are_verbatim() -> None:
    files = [b for b in all_blocks() if b.kind == "file"]
    assert {FILE_MARK.fullmatch(b.mark).group(1) for b in files} == {  # type: ignore[union-attr]
        f"examples/{p.name}" for p in (REPO / "examples").glob("*.py")}
    for b in files:
        path = REPO / FILE_MARK.fullmatch(b.mark).group(1)  # type: ignore[union-attr]
        assert b.code == path.read_text(encoding="utf-8"), b.where


def test_the_classifier_catches_an_unmarked_block(tmp_path: Path) -> None:
    """A bare fence, a ```bash fence, an unknown marker and a marker on a sample all fail."""
    page = tmp_path / "page.md"
    page.write_text("```\nls\n```\n\n```bash\nls\n```\n\n<!-- doc-test: skip -->\n```sh\nls\n```\n\n"
                    "<!-- doc-test: not-run: why -->\n```text\nout\n```\n\n<!-- doc-test: not-run: a GPU -->\n"
                    "```sh\nls\n```\n", encoding="utf-8")
    blocks = [Block(REPO / "README.md", b.line, b.lang, b.code, b.mark) for b in page_blocks(page)]
    assert len(blocks) == 5
    for b in blocks[:4]:
        with pytest.raises(AssertionError):
            _ = b.kind
    assert blocks[4].kind == "not-run"


@pytest.fixture(scope="session")
def demo_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo workspace, once per run: the demo corpus, then README's "Start here" walk run as
    written and ``dataprep report`` (:mod:`tests.docs_demo`: built under a file lock, started in
    the background when the pages are collected, shared by the workers); pages never write into it."""
    ws, failed = build(docs_demo_root(tmp_path_factory))
    assert not failed, failed
    return ws


def _page_runs(page: Path) -> list[Block]:
    """The page's blocks this module runs: README's walk is the demo workspace's build."""
    walk = readme_walk()
    return [b for b in page_blocks(page) if b.kind == "run" and b != walk]


def test_readme_walk_built_the_demo_workspace(demo_workspace: Path) -> None:
    """README's walk ran to its end (the build fails on the first failing command): its last
    outputs are there, and the demo's last step, the report page."""
    assert readme_walk().code.rstrip().splitlines()[-1].startswith("python ../examples/pytorch_sampler.py")
    for name in ("plan/plan.json", "padding.json", "stats.json", "report.html", "walk.out"):
        assert (demo_workspace / name).is_file(), name
    assert "step" in (demo_workspace / "walk.out").read_text()  # the sampler example's lines


PAGES_WITH_RUNS = [p for p in PAGES if _page_runs(p)]


@pytest.mark.parametrize("page", [pytest.param(p, marks=pytest.mark.xdist_group(f"docs:{p.name}"))
                                  for p in PAGES_WITH_RUNS], ids=lambda p: str(p.relative_to(REPO)))
def test_page_blocks_run(page: Path, demo_workspace: Path, tmp_path: Path) -> None:
    """The page's runnable blocks, in order, in its own copy of the demo workspace; each
    ``dataprep`` a process forked by a server that imported the CLI once (:mod:`tests.warm_python`)."""
    ws = tmp_path / "ws"
    shutil.copytree(demo_workspace, ws, ignore=shutil.ignore_patterns("audio"))
    (ws / "audio").symlink_to(demo_workspace / "audio")
    for name in ("examples", "benchmarks"):
        (ws / name).symlink_to(REPO / name)
    (tmp_path / "examples").symlink_to(REPO / "examples")  # demo-out/ beside examples/, as in the repository
    env = serving(tmp_path / "bin")
    for b in _page_runs(page):
        if b.lang == "sh":
            res = subprocess.run(["bash", "-euo", "pipefail", "-c", b.code], capture_output=True, text=True, env=env,
                                 cwd=ws, timeout=600, check=False)
        else:
            res = run_python(["-c", b.code], env=env, cwd=ws, preload=COMMANDS)
        assert res.returncode == 0, \
            f"{b.where} failed ({res.returncode}):\n{b.code}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_between_pages_resolve() -> None:
    """Every relative link of README.md and docs/ names an existing file, and its #anchor a heading there."""
    for page in PAGES:
        text = FENCE.sub("", page.read_text(encoding="utf-8"))
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            file, _, anchor = target.partition("#")
            path = (page.parent / file) if file else page
            assert path.exists(), f"{page.relative_to(REPO)}: link to missing {target}"
            if anchor:
                headings = re.findall(r"^#+ (.*)$", FENCE.sub("", path.read_text(encoding="utf-8")), re.MULTILINE)
                assert anchor in {_anchor(h) for h in headings}, f"{page.relative_to(REPO)}: no heading for {target}"
