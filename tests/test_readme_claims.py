"""The README's claims about what the tests check, each mapped to its tests in ``docs/claims.md``:
``test_readme_claim[<key>]`` fails when a quoted claim is gone from the docs or a named test no
longer exists (so neither can drift from the other), and the claims with no other home are
checked here."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "docs" / "claims.md"
ROW = re.compile(r"^\| ([\w-]+) \| \"(.+)\" \| (.+) \|$")


def _claims() -> dict[str, tuple[str, list[str]]]:
    """key -> (quoted claim, test node ids) from the table in docs/claims.md."""
    out = {}
    for line in TABLE.read_text(encoding="utf-8").splitlines():
        m = ROW.match(line)
        if m:
            out[m.group(1)] = (m.group(2), re.findall(r"`([^`]+::\w+)`", m.group(3)))
    return out


def _docs_text() -> str:
    """README.md and every docs/ page except the table itself, whitespace collapsed."""
    pages = [REPO / "README.md", *sorted(p for p in (REPO / "docs").glob("*.md") if p != TABLE)]
    return " ".join(" ".join(p.read_text(encoding="utf-8").split()) for p in pages if p.exists())


def _test_names(path: Path) -> set[str]:
    return {n.name for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(n, ast.FunctionDef) and n.name.startswith("test")}


CLAIMS = _claims()


def test_the_table_lists_claims() -> None:
    assert len(CLAIMS) >= 15, sorted(CLAIMS)


@pytest.mark.parametrize("key", sorted(CLAIMS))
def test_readme_claim(key: str) -> None:
    """The claim is still in the docs, word for word, and each test named for it exists."""
    claim, tests = CLAIMS[key]
    assert " ".join(claim.split()) in _docs_text(), f"docs/claims.md [{key}]: {claim!r} is no longer in the docs"
    assert tests, key
    for node in tests:
        file, name = node.split("::")
        assert (REPO / file).is_file(), node
        assert name in _test_names(REPO / file), f"docs/claims.md [{key}]: {node} does not exist"


_drawn: list[list[int]] = []


@settings(max_examples=5)
@given(st.lists(st.integers()))
def _draw(xs: list[int]) -> None:
    _drawn[-1].append(xs)


def test_property_tests_draw_a_fixed_set_of_examples() -> None:
    """Under the repository's hypothesis profile (the default; ``HYPOTHESIS_PROFILE=explore``
    draws new examples) two runs of one property see the same examples."""
    if os.environ.get("HYPOTHESIS_PROFILE", "repo") != "repo":
        pytest.skip("HYPOTHESIS_PROFILE selects another profile (explore draws new examples)")
    for _ in range(2):
        _drawn.append([])
        _draw()
    assert _drawn[-1] == _drawn[-2] and len(_drawn[-1]) >= 2
