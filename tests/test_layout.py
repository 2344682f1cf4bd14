"""The layering of CONTRIBUTING's map: every row's "may import" (:data:`MAY_IMPORT`, checked
equal to the file's table) over the import graph (imports at any level); in fresh
interpreters, ``dataprep -> bucketing -> manifests``, only ``training/`` and ``integrations/``
load torch, and ``cli/`` is loaded by no stage. Also: every module opens with a docstring
saying what it is for (at most 15 lines; no module over 600 lines, benchmarks included),
``__all__`` in every package, and no import circles."""

from __future__ import annotations

import ast
import functools
import pkgutil
import re
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


def _loaded_after(*stages: list[str]) -> list[set[str]]:
    """Top-level packages (and ``dataprep`` sub-packages) loaded in one fresh interpreter after
    importing each of ``stages`` in turn (a set per stage: what that stage and those before it
    loaded, so a rule checked on a later stage is checked on more than it names)."""
    names = "{'.'.join(n.split('.')[:2]) if n.startswith('dataprep.') else n.split('.')[0] for n in sys.modules}"
    code = "import sys\n" + "".join("".join(f"import {m}\n" for m in stage) + f"print(' '.join(sorted({names})))\n"
                                    for stage in stages)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    return [set(line.split()) for line in out.stdout.splitlines()]


def _torch_free(mods: list[str]) -> list[str]:
    """``mods`` without the packages that may import torch (``dataprep.training_config`` stays)."""
    return [m for m in mods if not any(m == p or m.startswith(p + ".")
                                       for p in ("dataprep.training", "dataprep.integrations"))]


@functools.cache
def _torch_free_loads() -> dict[str, set[str]]:
    """In one fresh interpreter, what is loaded after manifests, then bucketing, then every
    torch-free dataprep module but the CLI's (the stages), then the CLI's."""
    stages = [m for m in _torch_free(_modules(dataprep)) if not m.startswith("dataprep.cli")]
    cli = [m for m in _torch_free(_modules(dataprep)) if m.startswith("dataprep.cli")]
    loaded = _loaded_after(_modules(manifests), _modules(bucketing), stages, cli)
    return dict(zip(("manifests", "bucketing", "stages", "cli"), loaded))


@functools.cache
def _torch_loads() -> dict[str, set[str]]:
    """In one fresh interpreter, what is loaded after oom, then the training stage."""
    return dict(zip(("oom", "training"), _loaded_after(_modules(oom), ["dataprep.training"])))


@pytest.mark.parametrize("pkg,forbidden", [
    (manifests, {"dataprep", "bucketing", "oom", "torch"}),
    (bucketing, {"dataprep", "oom", "torch"}),
])
def test_lower_layers_import_nothing_above_them(pkg: ModuleType, forbidden: set[str]) -> None:
    assert not _torch_free_loads()[pkg.__name__] & forbidden


def test_oom_never_imports_dataprep() -> None:
    assert "dataprep" not in _torch_loads()["oom"]


def test_only_training_and_integrations_import_torch() -> None:
    """Every dataprep module outside training/ and integrations/ (CLI included) loads without torch."""
    loaded = _torch_free_loads()["cli"]
    assert "torch" not in loaded
    assert not {"dataprep.training", "dataprep.integrations"} & loaded


def test_stages_never_import_the_cli() -> None:
    assert "dataprep.cli" not in _torch_free_loads()["stages"]


def test_the_training_stage_does_not_load_the_cli() -> None:
    assert "dataprep.cli" not in _torch_loads()["training"]


def _source_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in Path(pkg.__path__[0]).rglob("*.py"))


@pytest.mark.parametrize("path", _source_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_module_opens_with_a_docstring(path: Path) -> None:
    assert ast.get_docstring(ast.parse(path.read_text())), f"{path} has no module docstring"


MAX_DOCSTRING_LINES = 15
MAX_MODULE_LINES = 600


def _project_files() -> list[Path]:
    """Every module of the packages and every script of ``benchmarks/``."""
    return _source_files() + sorted((REPO / "benchmarks").rglob("*.py"))


@pytest.mark.parametrize("path", _project_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_module_docstrings_are_short(path: Path) -> None:
    """The opening docstring says what the module holds, its units and invariants, in at most
    15 source lines (quotes included); the rest belongs in docs/."""
    tree = ast.parse(path.read_text())
    doc = tree.body[0] if ast.get_docstring(tree, clean=False) is not None else None
    lines = doc.end_lineno - doc.lineno + 1 if doc and doc.end_lineno else 0
    assert lines <= MAX_DOCSTRING_LINES, \
        f"{path.relative_to(REPO)}: module docstring of {lines} lines (> {MAX_DOCSTRING_LINES})"


@pytest.mark.parametrize("path", _project_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_module_is_over_600_lines(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{path.relative_to(REPO)}: {lines} lines (> {MAX_MODULE_LINES}): split it by job"


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


@functools.cache
def _repo_graph() -> dict[str, set[str]]:
    """The project's import graph, parsed once per session (read-only to the tests)."""
    return import_graph(REPO, [pkg.__name__ for pkg in PACKAGES])


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
    circle = find_circle(_repo_graph())
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
    graph = _repo_graph()
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


#: CONTRIBUTING's map, row by row: each folder (a room: a top-level package, a ``dataprep``
#: sub-package or module) -> the rooms it may import, at any level. A row of many rooms lets
#: them import each other; the package root ``dataprep`` is open to every room inside it.
BELOW_CLI = "everything below the CLI"
STAGES = "the stages"
MAY_IMPORT: dict[tuple[str, ...], frozenset[str] | str] = {
    ("manifests",): frozenset(),
    ("bucketing",): frozenset({"manifests"}),
    ("oom",): frozenset({"manifests", "bucketing"}),
    ("dataprep.compile",): frozenset({"manifests", "dataprep.tokenize"}),
    ("dataprep.analysis",): frozenset({"bucketing", "manifests", "dataprep.planning"}),
    ("dataprep.report",): frozenset({"dataprep.analysis", "dataprep.planning", "bucketing", "manifests"}),
    ("dataprep.planning",): frozenset({"bucketing", "manifests"}),
    ("dataprep.training", "dataprep.training_config"): BELOW_CLI,
    ("dataprep.integrations",): BELOW_CLI,
    ("dataprep.cli",): STAGES,
    ("dataprep.tokenize",): frozenset({"manifests"}),
    ("dataprep.testing", "dataprep.testing_store", "dataprep.demo"): frozenset({"bucketing", "manifests"}),
}


def _room(module: str) -> str:
    """The room of CONTRIBUTING's map a module lives in (``dataprep`` alone: the package root)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "dataprep" else parts[0]


def _rooms_of(cell: str) -> list[str]:
    """The rooms a cell of the table names: backticked folders and modules, outside parentheses."""
    return [re.sub(r"\.py$", "", name.rstrip("/")).replace("/", ".")
            for name in re.findall(r"`([^`]+)`", re.sub(r"\([^)]*\)", "", cell))]


def _allowed(row: tuple[str, ...]) -> set[str]:
    """The rooms ``row`` may import: its own, what its cell names, the package root inside ``dataprep``."""
    rule = MAY_IMPORT[row]
    every = {room for r in MAY_IMPORT for room in r}
    if rule == STAGES:
        names = every
    elif rule == BELOW_CLI:
        names = every - {"dataprep.cli"}
    else:
        names = set(rule)
    return names | set(row) | ({"dataprep"} if row[0].startswith("dataprep.") else set())


def test_contributing_states_the_same_table() -> None:
    """Each row of CONTRIBUTING's map (its folders and "may import") is a row of MAY_IMPORT."""
    text = (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8")
    rows: dict[tuple[str, ...], frozenset[str] | str] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        last = cells[2]
        rule: frozenset[str] | str = (BELOW_CLI if last == BELOW_CLI else STAGES if last == STAGES
                                      else frozenset() if last == "nothing of ours"
                                      else frozenset(r for r in _rooms_of(last)))
        row = tuple(_rooms_of(cells[0]))
        if isinstance(rule, frozenset) and "each other" in last:
            rule = rule | frozenset(row)
        rows[row] = rule
    want = {row: (rule | frozenset(row) if len(row) > 1 and isinstance(rule, frozenset) else rule)
            for row, rule in MAY_IMPORT.items()}
    assert rows == want


def test_the_table_covers_every_room() -> None:
    rooms = {room for row in MAY_IMPORT for room in row}
    graph = _repo_graph()
    assert {_room(m) for m in graph} - {"dataprep"} <= rooms


@pytest.mark.parametrize("row", list(MAY_IMPORT), ids=lambda r: "+".join(r))
def test_each_row_imports_only_what_it_may(row: tuple[str, ...]) -> None:
    """Every import of the row's modules (at any level, ``__main__`` files included) lands in
    its own rooms or in one its "may import" names."""
    graph = _repo_graph()
    allowed = _allowed(row)
    wrong = sorted(f"{m} -> {d}" for m, deps in graph.items() if _room(m) in row
                   for d in deps if _room(d) not in allowed)
    assert not wrong, f"{'+'.join(row)} may import {sorted(allowed - set(row))}, not: {wrong}"


def test_the_row_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    """An import inside a function of a room not allowed by its row is caught."""
    for pkg, body in (("manifests", "def f():\n    from bucketing import x\n"), ("bucketing", "x = 1\n")):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text(f'"""{pkg}."""\n' + body)
    graph = import_graph(tmp_path, ["manifests", "bucketing"])
    allowed = _allowed(("manifests",))
    assert [d for m, deps in graph.items() if _room(m) == "manifests" for d in deps if _room(d) not in allowed] \
        == ["bucketing"]


def _fixtures_of(path: Path) -> set[str]:
    """Names of the functions ``path`` decorates with ``pytest.fixture``."""
    def is_fixture(d: ast.expr) -> bool:
        d = d.func if isinstance(d, ast.Call) else d
        return isinstance(d, ast.Attribute) and d.attr == "fixture"
    return {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)
            and any(is_fixture(d) for d in n.decorator_list)}


def test_no_test_module_imports_a_conftest_fixture() -> None:
    """A fixture imported from a conftest is defined twice: a session fixture (the loopback
    store) then starts twice in one process, and the second takes over the environment."""
    fixtures = {".".join(p.relative_to(REPO).with_suffix("").parts): _fixtures_of(p)
                for p in (REPO / "tests").rglob("conftest.py")}
    offenders = [f"{p.relative_to(REPO)}: {a.name}" for p in sorted((REPO / "tests").rglob("*.py"))
                 for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.ImportFrom)
                 for a in node.names if a.name in fixtures.get(node.module or "", set())]
    assert offenders == []
