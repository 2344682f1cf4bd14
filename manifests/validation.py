"""The one validation layer for the files the tool reads: typed checks with one-line errors.

:class:`Validator` checks decoded JSON values field by field and raises
:class:`~manifests.errors.ManifestError` as ``FILE: field: problem``. It never coerces: a
string is not a number, ``true`` is not 1, ``2.5`` is not an integer, and ``NaN`` /
``Infinity`` are refused already by :func:`load_json_file`. ``buckets.json``
(:mod:`manifests.buckets_file`) and ``plan.json`` (:mod:`manifests.plan_meta`) are read through it.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from manifests.errors import ManifestError


class Validator:
    """Type checks with one-line errors ``FILE: field: problem``; never coerces."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, name: str, problem: str) -> ManifestError:
        return ManifestError(f"{self.where}: {name}: {problem}")

    def key(self, obj: dict[str, Any], key: str, prefix: str = "") -> Any:
        if key not in obj:
            raise self.fail(prefix + key, "missing")
        return obj[key]

    def obj(self, x: Any, name: str) -> dict[str, Any]:
        if not isinstance(x, dict):
            raise self.fail(name, f"expected an object, got {type(x).__name__}")
        return x

    def list_(self, x: Any, name: str) -> list[Any]:
        if not isinstance(x, list):
            raise self.fail(name, f"expected a list, got {type(x).__name__}")
        return x

    def int_(self, x: Any, name: str, lo: int | None = None, hi: int | None = None) -> int:
        if isinstance(x, bool) or not isinstance(x, int):
            raise self.fail(name, f"expected an integer, got {_show(x)}")
        return self._within(x, name, lo, hi)

    def number(self, x: Any, name: str, positive: bool = False, lo: float | None = None,
               hi: float | None = None) -> float:
        """A finite JSON number (integer or fraction, never a bool or a string)."""
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise self.fail(name, f"expected a number, got {_show(x)}")
        v = float(x)
        if not math.isfinite(v):
            raise self.fail(name, f"must be finite, got {x!r}")
        if positive and v <= 0:
            raise self.fail(name, f"must be > 0, got {x!r}")
        return self._within(v, name, lo, hi)

    def _within(self, v: Any, name: str, lo: float | None, hi: float | None) -> Any:
        if lo is not None and v < lo:
            raise self.fail(name, f"must be >= {number_text(lo, 'g')}, got {number_text(v, 'g')}")
        if hi is not None and v > hi:
            raise self.fail(name, f"must be <= {number_text(hi, ',')}, got {number_text(v, ',')}")
        return v

    def float_(self, x: Any, name: str, lo: float | None = None) -> float:
        """A finite JSON number as a float (see :meth:`number`)."""
        return self.number(x, name, lo=lo)

    def str_(self, x: Any, name: str) -> str:
        if not isinstance(x, str) or not x:
            raise self.fail(name, f"expected a non-empty string, got {_show(x)}")
        return x

    def hex_(self, x: Any, name: str) -> str:
        s = self.str_(x, name)
        if len(s) != 64 or any(c not in "0123456789abcdef" for c in s):
            raise self.fail(name, f"expected a SHA-256 hex digest, got {s[:80]!r}")
        return s


def number_text(x: float, spec: str = "") -> str:
    """``format(x, spec)`` for a message; an integer too large for that (past a float or
    Python's 4300-digit limit) as its sign and size, e.g. ``-(an integer of 401 digits)``."""
    if isinstance(x, int) and x.bit_length() > 1000:
        digits = int(x.bit_length() * 0.30103) + 1
        return f"{'-' if x < 0 else ''}(an integer of about {digits} digits)"
    return format(x, spec)


def _show(x: Any) -> str:
    """A value for an error message: short, one line."""
    try:
        text = json.dumps(x, ensure_ascii=True, default=repr) if not isinstance(x, float) else repr(x)
    except (ValueError, TypeError, RecursionError):  # an integer past 4300 digits, a key JSON has no form for
        text = f"a {type(x).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _read_bytes(p: Path, missing: str, kind: str) -> bytes:
    try:
        return p.read_bytes()
    except FileNotFoundError:
        raise ManifestError(f"{p}: {missing}") from None
    except IsADirectoryError:
        raise ManifestError(f"{p}: is a directory, not a {kind} file") from None
    except OSError as exc:
        raise ManifestError(f"{p}: cannot be read ({exc.strerror or exc})") from None


def load_json_file(path: str | os.PathLike[str], missing: str = "no such file") -> Any:
    """Decode a JSON file strictly (UTF-8, no ``NaN`` / ``Infinity``); one-line errors."""
    p = Path(path)
    raw = _read_bytes(p, missing, "JSON")
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError, RecursionError) as exc:
        raise ManifestError(f"{p}: not valid JSON ({str(exc).splitlines()[0][:120] if str(exc) else 'too deeply nested'})") from None


#: Most nodes a YAML file may expand to, aliases counted at every place they stand (a few
#: thousand in any real config; a "billion laughs" of nested aliases is refused, not walked).
MAX_YAML_NODES = 100_000


def load_yaml_file(path: str | os.PathLike[str], missing: str = "no such file", loader: Any = None) -> Any:
    """Decode a YAML file with the safe loader (plain data only: no tags that build objects,
    ``NaN`` / ``.inf`` refused by the :class:`Validator` checks that follow); one-line errors.
    Aliases are allowed where the file expands to at most :data:`MAX_YAML_NODES` nodes; an alias
    inside the node it names (a cycle) is refused. ``loader``: a ``yaml.SafeLoader`` subclass
    (:mod:`manifests.nemo_yaml`'s reads OmegaConf's numbers)."""
    import yaml

    p = Path(path)
    raw = _read_bytes(p, missing, "YAML")
    if loader is not None and not issubclass(loader, yaml.SafeLoader):
        raise TypeError("loader must be a yaml.SafeLoader subclass")
    try:
        loader = (loader or yaml.SafeLoader)(raw.decode("utf-8"))
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            _check_yaml_nodes(node, p)
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except (UnicodeDecodeError, yaml.YAMLError, RecursionError) as exc:
        first = str(exc).splitlines()[0][:120] if str(exc) else "too deeply nested"
        raise ManifestError(f"{p}: not valid YAML ({first})") from None


def _check_yaml_nodes(root: Any, p: Path) -> None:
    """Refuse a composed YAML graph with a cycle or expanding to over :data:`MAX_YAML_NODES`
    nodes: an iterative walk, each distinct node once (its expanded size memoized)."""
    import yaml

    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        kids = ([x for pair in node.value for x in pair] if isinstance(node, yaml.MappingNode)
                else node.value if isinstance(node, yaml.SequenceNode) else [])
        if done:
            on_path.discard(key)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            if size[key] > MAX_YAML_NODES:
                raise ManifestError(f"{p}: its aliases expand to more than {MAX_YAML_NODES:,} nodes "
                                    f"(line {node.start_mark.line + 1}); refused")
            continue
        if key in size:
            continue
        on_path.add(key)
        stack.append((node, True))
        for k in kids:
            if id(k) in on_path:
                raise ManifestError(f"{p}: line {k.start_mark.line + 1}: an alias refers to a node that holds it "
                                    "(a cycle); refused")
            if id(k) not in size:
                stack.append((k, False))
