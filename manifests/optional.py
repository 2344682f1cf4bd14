"""Optional dependencies: import one by name, or raise :class:`MissingDependency`, a one-line
error naming what to install (the package extra, e.g. ``pip install 'speech-dataprep[lhotse]'``).

:data:`INSTALL` maps each optional top-level module to its install command; every import of an
optional module that a command needs goes through :func:`require` (or, for an import deep in
a library call, :func:`missing_dependency` turns the ``ImportError`` into the same line)."""

from __future__ import annotations

import importlib
from types import ModuleType

from manifests.errors import DataprepError

#: optional top-level module -> what to install (pyproject's extras; NeMo's own package)
INSTALL: dict[str, str] = {
    "torch": "pip install 'speech-dataprep[torch]'",
    "soxr": "pip install 'speech-dataprep[torch]'",
    "matplotlib": "pip install 'speech-dataprep[plots]'",
    "altair": "pip install 'speech-dataprep[report]'",
    "vl_convert": "pip install 'speech-dataprep[report]'",
    "lhotse": "pip install 'speech-dataprep[lhotse]'",
    "ray": "pip install 'speech-dataprep[ray]'",
    "nemo": "pip install 'nemo-toolkit[asr]'",
    "lightning": "pip install 'nemo-toolkit[asr]'",
    "datasets": "pip install datasets",
    "obstore": "pip install 'speech-dataprep[store]'",
}
#: pip's name where it is not the module's
_PACKAGE = {"vl_convert": "vl-convert-python", "nemo": "nemo-toolkit"}


class MissingDependency(DataprepError, ImportError):
    """An optional module a command needs is not installed (one line: what needs it, what to run)."""


def _message(module: str, purpose: str, exc: ImportError | None = None) -> str:
    top = module.split(".")[0]
    install = INSTALL.get(top, f"pip install {top}")
    why = "which is not installed" if exc is None else f"which cannot be imported ({exc})"
    return f"{purpose} needs {_PACKAGE.get(top, top)}, {why}: {install}"


def require(module: str, purpose: str) -> ModuleType:
    """``import module`` (an entry of :data:`INSTALL` or a submodule of one), or
    :class:`MissingDependency` saying that ``purpose`` (``"export lhotse"``) needs it and how to
    install it (also when it is there but fails to import, e.g. a dependency of its own missing)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependency(_message(module, purpose, None if _is_missing(exc, module) else exc)) from None


def missing_dependency(exc: ImportError, purpose: str) -> MissingDependency | None:
    """The one-line error for ``exc`` when it is a missing optional module (one of
    :data:`INSTALL`), else ``None``."""
    name = getattr(exc, "name", None) or ""
    top = name.split(".")[0]
    if top not in INSTALL:
        return None
    return MissingDependency(_message(top, purpose))


def _is_missing(exc: ImportError, module: str) -> bool:
    """Whether ``exc`` says ``module`` (or its package) is absent, not that it failed inside."""
    name = getattr(exc, "name", None) or ""
    return bool(name) and name.split(".")[0] == module.split(".")[0]
