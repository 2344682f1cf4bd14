"""The dependency direction, checked in fresh interpreters:
``dataprep -> bucketing, oom -> manifests``; inside ``dataprep/`` only ``training/`` and
``integrations/`` may import torch, and ``cli/`` imports the stages, never the reverse.
Also: every module opens with a docstring saying what it is for, and no import circles."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import bucketing
import dataprep
import manifests
import oom

REPO = Path(__file__).resolve().parents[1]
PACKAGES = (manifests, bucketing, oom, dataprep)


def _modules(pkg: ModuleType) -> list[str]:
    """The package and its modules, without ``__main__`` entry points (importing runs them)."""
    return [pkg.__name__] + [m.name for m in pkgutil.walk_packages(pkg.__path__, prefix=f"{pkg.__name__}.")
                             if not m.name.endswith("__main__")]


def _loaded_after(imports: list[str]) -> set[str]:
    """Top-level packages (and ``dataprep`` sub-packages) loaded by importing ``imports``."""
    code = "import sys\n" + "".join(f"import {m}\n" for m in imports) + \
        "print(' '.join(sorted({'.'.join(n.split('.')[:2]) if n.startswith('dataprep.') else n.split('.')[0] " \
        "for n in sys.modules})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    return set(out.stdout.split())


def _torch_free(mods: list[str]) -> list[str]:
    return [m for m in mods if not m.startswith(("dataprep.training", "dataprep.integrations", "dataprep.train"))
]


@pytest.mark.parametrize("pkg,forbidden", [
    (manifests, {"dataprep", "bucketing", "oom", "torch"}),
    (bucketing, {"dataprep", "oom", "torch"}),
])
def test_lower_layers_import_nothing_above_them(pkg: ModuleType, forbidden: set[str]) -> None:
    assert not _loaded_after(_modules(pkg)) & forbidden


def test_oom_never_imports_dataprep() -> None:
    assert "dataprep" not in _loaded_after(_modules(oom))


def test_only_training_and_integrations_import_torch() -> None:
    """Every dataprep module outside training/ and integrations/ (CLI included) loads without torch."""
    loaded = _loaded_after(_torch_free(_modules(dataprep)))
    assert "torch" not in loaded
    assert not {"dataprep.training", "dataprep.integrations"} & loaded


def test_stages_never_import_the_cli() -> None:
    stages = [m for m in _torch_free(_modules(dataprep)) if not m.startswith("dataprep.cli")]
    assert "dataprep.cli" not in _loaded_after(stages)


def test_the_training_stage_does_not_load_the_cli() -> None:
    assert "dataprep.cli" not in _loaded_after(["dataprep.training"])


def _source_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in Path(pkg.__path__[0]).rglob("*.py"))


@pytest.mark.parametrize("path", _source_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_module_opens_with_a_docstring(path: Path) -> None:
    assert ast.get_docstring(ast.parse(path.read_text())), f"{path} has no module docstring"


def test_no_import_circles() -> None:
    """Module-level imports between our modules form no cycle."""
    names = {m for pkg in PACKAGES for m in _modules(pkg)}
    graph: dict[str, set[str]] = {}
    for path in _source_files():
        rel = path.relative_to(REPO).with_suffix("")
        mod = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        deps = set()
        for node in ast.parse(path.read_text()).body:  # module level only: lazy imports are allowed
            if isinstance(node, ast.ImportFrom) and node.module:
                cands = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                cands = [a.name for a in node.names]
            else:
                continue
            deps |= {c for c in cands if c in names and c != mod}
        graph[mod] = deps
    # a package's __init__ importing its own submodules is not a circle
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in graph.get(m, ()):
            if d.startswith(m + "."):
                continue
            if state.get(d) == 1:
                cycle = stack[stack.index(d):] + [d] if d in stack else [m, d]
                if not any(x.startswith(y + ".") or y.startswith(x + ".") for x, y in zip(cycle, cycle[1:])):
                    pytest.fail("import circle: " + " -> ".join(cycle))
            elif state.get(d) is None:
                visit(d, stack + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
