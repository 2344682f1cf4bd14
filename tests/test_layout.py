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
    """``mods`` without the packages that may import torch (``dataprep.training_config`` stays)."""
    return [m for m in mods if not any(m == p or m.startswith(p + ".")
                                       for p in ("dataprep.training", "dataprep.integrations"))]


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


def _module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def _imports(tree: ast.AST, mod: str, is_package: bool) -> set[str]:
    """Every module an import statement anywhere in ``tree`` names (module level, inside
    functions and classes, under ``if TYPE_CHECKING``), relative imports resolved."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = mod.split(".")
                parts = parts if is_package else parts[:-1]
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            found |= {base} | {f"{base}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found


def import_graph(root: Path, packages: list[str]) -> dict[str, set[str]]:
    """Module -> the modules of ``packages`` (under ``root``) it imports, at any level,
    ``__main__`` files included. A package's ``__init__`` importing its own submodules is left
    out (that is how a package exports its names, not a circle)."""
    files = sorted(p for pkg in packages for p in (root / pkg).rglob("*.py"))
    names = {_module_name(p, root) for p in files}
    graph: dict[str, set[str]] = {}
    for path in files:
        mod = _module_name(path, root)
        deps = {d for d in _imports(ast.parse(path.read_text()), mod, path.name == "__init__.py") if d in names}
        graph[mod] = {d for d in deps if d != mod and not d.startswith(mod + ".")}
    return graph


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (modules, first = last), or None. An edge to a module of
    an enclosing package is not followed into that package's ``__init__`` re-exports."""
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> list[str] | None:
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1 and d in stack:
                cycle = stack[stack.index(d):] + [d]
                if not any(x.startswith(y + ".") or y.startswith(x + ".") for x, y in zip(cycle, cycle[1:])):
                    return cycle
            elif state.get(d) is None:
                found = visit(d, stack + [d])
                if found:
                    return found
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m, [m])
            if found:
                return found
    return None


def test_no_import_circles() -> None:
    """Imports between our modules, function-level ones and ``__main__`` files included, form no cycle."""
    circle = find_circle(import_graph(REPO, [pkg.__name__ for pkg in PACKAGES]))
    assert circle is None, "import circle: " + " -> ".join(circle or [])


def test_the_circle_check_sees_function_level_imports(tmp_path: Path) -> None:
    """A circle made only of imports inside functions (the kind that once joined oom.models
    and oom.transducer) is reported; removing one of them clears it."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""pkg."""\n')
    (pkg / "a.py").write_text('"""a."""\n\ndef f():\n    from pkg.b import g\n    return g\n')
    (pkg / "b.py").write_text('"""b."""\n\ndef g():\n    from . import a\n    return a\n')
    (pkg / "__main__.py").write_text('"""main."""\nfrom pkg.a import f\n')
    assert find_circle(import_graph(tmp_path, ["pkg"])) in (["pkg.a", "pkg.b", "pkg.a"], ["pkg.b", "pkg.a", "pkg.b"])
    (pkg / "b.py").write_text('"""b."""\n\ndef g():\n    return 1\n')
    assert find_circle(import_graph(tmp_path, ["pkg"])) is None


def test_entry_points_import_no_cli_but_their_own() -> None:
    """A ``__main__`` outside ``dataprep/cli`` must not import the CLI (the training stage
    is run as ``torchrun -m dataprep.cli train``)."""
    graph = import_graph(REPO, [pkg.__name__ for pkg in PACKAGES])
    for mod, deps in graph.items():
        if mod.endswith("__main__") and not mod.startswith("dataprep.cli"):
            assert not any(d.startswith("dataprep.cli") for d in deps), mod


@pytest.mark.parametrize("init", sorted(p for pkg in PACKAGES for p in Path(pkg.__path__[0]).rglob("__init__.py")),
                         ids=lambda p: str(p.relative_to(REPO)))
def test_every_package_lists_its_public_names(init: Path) -> None:
    """``__all__`` in every package's ``__init__``; each name is defined there or is a submodule."""
    tree = ast.parse(init.read_text())
    listed = [n for node in tree.body if isinstance(node, ast.Assign)
              and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
              for n in ast.literal_eval(node.value)]
    assert listed, f"{init} has no __all__"
    defined = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
               for a in node.names}
    defined |= {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
                if isinstance(t, ast.Name)}
    defined |= {node.target.id for node in tree.body if isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)}
    defined |= {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    for name in listed:
        assert name in defined or (init.parent / f"{name}.py").exists() or (init.parent / name).is_dir(), (init, name)
