"""The dependency direction of DESIGN.md, checked in fresh interpreters:
dataprep -> bucketing, oom -> manifests; the core runs without torch."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest

import bucketing
import manifests


def _modules(pkg) -> list[str]:
    return [pkg.__name__] + [f"{pkg.__name__}.{m.name}" for m in pkgutil.walk_packages(pkg.__path__)]


def _loaded_after(imports: list[str]) -> set[str]:
    code = "import sys\n" + "".join(f"import {m}\n" for m in imports) + \
        "print(' '.join(sorted({n.split('.')[0] for n in sys.modules})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


@pytest.mark.parametrize("pkg,forbidden", [(manifests, {"dataprep", "bucketing", "oom", "torch"}),
                                           (bucketing, {"dataprep", "oom", "torch"})])
def test_lower_layers_import_nothing_above_them(pkg, forbidden) -> None:
    assert not _loaded_after(_modules(pkg)) & forbidden


def test_the_cli_starts_without_torch() -> None:
    assert "torch" not in _loaded_after(["dataprep.cli", "dataprep.compile", "dataprep.planning"])
