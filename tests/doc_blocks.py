"""The fenced code blocks of README.md and docs/*.md, each with its kind (see
:mod:`tests.test_docs_examples` for the convention), and README's "Start here" walk."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUN_LANGS = {"sh", "python"}
SAMPLE_LANGS = {"text"}
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_MARK = re.compile(r"<!-- doc-test: (.*?) -->")
_NOT_RUN = re.compile(r"not-run: (\S.*)")
FILE_MARK = re.compile(r"file (examples/[\w.]+\.py)")


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
            if FILE_MARK.fullmatch(self.mark):
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
    for m in FENCE.finditer(text):
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = _MARK.fullmatch(before.strip())
        out.append(Block(page, text.count("\n", 0, m.start()) + 1, m.group(1).strip(), m.group(2),
                         mark.group(1) if mark else None))
    return out


def all_blocks() -> list[Block]:
    return [b for p in PAGES for b in page_blocks(p)]


def readme_walk() -> Block:
    """README's first runnable block after "## Start here": the demo's steps by hand."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.count("\n", 0, text.index("## Start here"))
    return next(b for b in page_blocks(REPO / "README.md") if b.kind == "run" and start < b.line)
