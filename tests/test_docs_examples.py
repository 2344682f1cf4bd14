"""Every code block of README.md and docs/*.md is either run here or marked as not meant to run.

Convention (one rule for every page):

- A ```` ```sh ```` or ```` ```python ```` block runs, in page order, in a copy of the folder
  ``python -m dataprep.demo`` writes (``train.jsonl``, ``audio/``, ``spm.model``,
  ``manifest.parquet``, ``kept.parquet``, ``buckets.json``, ``plan/`` ...), the one shared
  workspace of this module; ``examples/`` and ``benchmarks/`` are linked into it. Blocks of one
  page share their copy, so a page reads as one session. ``dataprep`` there runs each command
  in a process of its own forked from one that imported the CLI once (:mod:`tests.cli_server`:
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
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli_server import write_shim
from tests.conftest import docs_demo_root
from tests.docs_demo import build
from tests.docs_demo import env as docs_env

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUN_LANGS = {"sh", "python"}
SAMPLE_LANGS = {"text"}
_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_MARK = re.compile(r"<!-- doc-test: (.*?) -->")
_NOT_RUN = re.compile(r"not-run: (\S.*)")
_FILE = re.compile(r"file (examples/[\w.]+\.py)")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    code: str
    mark: str | None  # the doc-test marker on the line before the fence, if any

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def kind(self) -> str:
        """``run``, ``not-run``, ``file`` or ``sample``; raises on a block no rule covers."""
        if self.mark is not None:
            if self.lang not in RUN_LANGS:
                raise AssertionError(f"{self.where}: a doc-test marker on a ```{self.lang} block")
            if _NOT_RUN.fullmatch(self.mark):
                return "not-run"
            if _FILE.fullmatch(self.mark):
                return "file"
            raise AssertionError(f"{self.where}: unknown marker {self.mark!r} (not-run: REASON | file examples/X.py)")
        if self.lang in RUN_LANGS:
            return "run"
        if self.lang in SAMPLE_LANGS:
            return "sample"
        raise AssertionError(f"{self.where}: fence ```{self.lang or '(none)'}: use sh, python (run) or text (sample)")


def page_blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page`` in order, each with the marker on the line before it."""
    text = page.read_text(encoding="utf-8")
    out = []
    for m in _FENCE.finditer(text):
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = _MARK.fullmatch(before.strip())
        out.append(Block(page, text.count("\n", 0, m.start()) + 1, m.group(1).strip(), m.group(2),
                         mark.group(1) if mark else None))
    return out


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
    assert {_FILE.fullmatch(b.mark).group(1) for b in files} == {  # type: ignore[union-attr]
        f"examples/{p.name}" for p in (REPO / "examples").glob("*.py")}
    for b in files:
        path = REPO / _FILE.fullmatch(b.mark).group(1)  # type: ignore[union-attr]
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
    """``python -m dataprep.demo`` once per run: the corpus, tokenizer, manifests, buckets and
    plan. The workers share it (:mod:`tests.docs_demo`: built under a file lock, started in the
    background when the pages are collected); pages never write into it."""
    ws, failed = build(docs_demo_root(tmp_path_factory))
    assert not failed, failed
    return ws


PAGES_WITH_RUNS = [p for p in PAGES if any(b.kind == "run" for b in page_blocks(p))]


@pytest.mark.parametrize("page", [pytest.param(p, marks=pytest.mark.xdist_group(f"docs:{p.name}"))
                                  for p in PAGES_WITH_RUNS], ids=lambda p: str(p.relative_to(REPO)))
def test_page_blocks_run(page: Path, demo_workspace: Path, tmp_path: Path) -> None:
    """The page's runnable blocks, in order, in its own copy of the demo workspace; each
    ``dataprep`` a process forked by a server that imported the CLI once (:mod:`tests.cli_server`)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sock = Path(tempfile.mkdtemp(prefix="cli-", dir="/tmp")) / "s"  # short: a socket path has 107 bytes
    write_shim(bin_dir / "dataprep", str(sock))
    env = docs_env(bin_dir)
    server = subprocess.Popen([sys.executable, "-m", "tests.cli_server", str(sock)], env=env, cwd=REPO,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    try:
        ws = tmp_path / "ws"
        shutil.copytree(demo_workspace, ws, ignore=shutil.ignore_patterns("audio"))
        (ws / "audio").symlink_to(demo_workspace / "audio")
        for name in ("examples", "benchmarks"):
            (ws / name).symlink_to(REPO / name)
        (tmp_path / "examples").symlink_to(REPO / "examples")  # README's walk: demo-out/ beside examples/
        assert server.stdout is not None and server.stdout.readline() == "ready\n", "the CLI server did not start"
        for b in page_blocks(page):
            if b.kind != "run":
                continue
            cmd = ["bash", "-euo", "pipefail", "-c", b.code] if b.lang == "sh" else [sys.executable, "-c", b.code]
            res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ws, timeout=600, check=False)
            assert res.returncode == 0, \
                f"{b.where} failed ({res.returncode}):\n{b.code}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    finally:
        server.terminate()
        server.wait(timeout=60)
        shutil.rmtree(sock.parent, ignore_errors=True)


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_between_pages_resolve() -> None:
    """Every relative link of README.md and docs/ names an existing file, and its #anchor a heading there."""
    for page in PAGES:
        text = _FENCE.sub("", page.read_text(encoding="utf-8"))
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            file, _, anchor = target.partition("#")
            path = (page.parent / file) if file else page
            assert path.exists(), f"{page.relative_to(REPO)}: link to missing {target}"
            if anchor:
                headings = re.findall(r"^#+ (.*)$", _FENCE.sub("", path.read_text(encoding="utf-8")), re.MULTILINE)
                assert anchor in {_anchor(h) for h in headings}, f"{page.relative_to(REPO)}: no heading for {target}"
